// How an EmbeddingTable stores its rows (table_memory.cc allocates them): the row record, the
// chunks of rows and the directory that finds a row's chunk, and how the graph names a row.
//
// Storage
//   A row is one contiguous record: a 24-byte header (RowMeta: key, last-seen clock,
//   admission count, generation, alive), the embedding (dim elements of the table's emb_dtype,
//   row_precision.h, padded to 4 bytes) and then each optimizer slot (slot_width() values
//   each: float32, or bfloat16 for slots of dim values of a table with slot_dtype bfloat16):
//     [ header | embedding | slot 0 | slot 1 | ... ]   (size rounded up to 8 bytes)
//   One hash probe per key therefore serves the embedding and every slot, and an optimizer
//   update touches one stretch of memory (slots kept in separate arrays at the same offsets
//   alias in the cache and made LazyAdam 4x slower). Rows live in chunks of rows_per_chunk()
//   rows; a row id never changes while its key is stored. The records are re-laid out once,
//   under the exclusive lock, when an optimizer first attaches its slots. A fixed-capacity
//   table reserves all its chunks up front (memory is committed only when a row is first
//   written); a dynamic-expansion table adds chunks as it grows. Row id r is in chunk
//   r / rows_per_chunk(), found through a directory of kMaxPages pages of kPageSize chunks.
//
// Row addresses
//   The graph refers to a row by a 63-bit address (see EmbeddingTable::EncodeAddress):
//     bits 52..62  table tag     (rejects an address of another table)
//     bits 40..51  generation    (bumped when the row is removed: rejects stale addresses)
//     bits  0..39  row id
//   -1 means "no row" (a key not found in eval, or not admitted). Every op that takes
//   addresses validates them before touching any row. The table's index maps a key to bits
//   0..51 of its address (a tiered table's cold keys: to their SSD record, table_tier.h).
#ifndef REC_SDK_CORE_TABLE_STORAGE_H_
#define REC_SDK_CORE_TABLE_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace rec_sdk {

// The header of a row record.
struct RowMeta {
  int64_t key;
  int64_t last_seen;  // newest clock of a training lookup (or the clock at insertion)
  uint16_t generation;
  uint8_t alive;
  // The row was initialised while the slot initial values were unknown (after an Import of
  // slots, before the first EnsureSlots); EnsureSlots gives it the initial values.
  uint8_t slots_unset;
  uint32_t count;  // admission count, saturating
};
static_assert(sizeof(RowMeta) == 24, "the row header is 24 bytes");

// rows_per_chunk() consecutive rows.
struct Chunk {
  char* rows = nullptr;                // rows_per_chunk() records of row_bytes_ bytes
  std::unique_ptr<uint8_t[]> changed;  // per row, with track_changes: changed since the save
  // Per row, tiered tables: the last tier tick that used it (spares it from demotion), and
  // its place in the demotion order (see TableTier::kProbationTicks).
  std::unique_ptr<int64_t[]> ticks;
  std::unique_ptr<int64_t[]> priority;
};

constexpr int kPageBits = 12;  // chunks per directory page
constexpr int64_t kPageSize = int64_t{1} << kPageBits;
constexpr int64_t kMaxPages = 4096;
struct DirectoryPage {
  std::atomic<Chunk*> chunks[kPageSize];
};

// Bits of a row address (see "Row addresses" above); an index entry is bits 0..51.
constexpr int kRowBits = 40;
constexpr int kGenerationBits = 12;
inline int64_t IndexEntry(int64_t row, uint32_t generation) {
  return (static_cast<int64_t>(generation & ((1u << kGenerationBits) - 1)) << kRowBits) | row;
}

// Where a row's record is: the table's chunk directory, its chunk size and its record size
// (changed only under the table's exclusive lock, when the records are re-laid out). The
// table and its compact index (hash_index.h) both find rows through it.
struct RowDirectory {
  std::atomic<DirectoryPage*>* pages = nullptr;
  int chunk_shift = 0;
  size_t row_bytes = 0;

  Chunk* ChunkOf(int64_t row) const {
    const int64_t c = row >> chunk_shift;
    return pages[c >> kPageBits]
        .load(std::memory_order_acquire)
        ->chunks[c & (kPageSize - 1)]
        .load(std::memory_order_acquire);
  }
  int64_t OffsetOf(int64_t row) const { return row & ((int64_t{1} << chunk_shift) - 1); }
  char* RecordOf(int64_t row) const { return ChunkOf(row)->rows + OffsetOf(row) * row_bytes; }
  RowMeta& MetaOf(int64_t row) const { return *reinterpret_cast<RowMeta*>(RecordOf(row)); }
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_STORAGE_H_
