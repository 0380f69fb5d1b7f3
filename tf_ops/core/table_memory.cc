// The rows' memory: chunks mapped straight from mmap, the check that a reservation fits the
// process's mappings, the re-layout of every row when an optimizer attaches its slots, and
// handing out and taking back rows; and what a table reports of itself (Capacity,
// MemoryBytes, Stats).
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Row memory comes straight from mmap: zero-filled and committed only when first written (so
// reserving a fixed-capacity table costs address space, not memory), aligned to 2 MiB and
// marked for transparent huge pages, so random row access rarely misses the TLB. The mapping
// ends with the block (rounded to 4 KiB pages): a block's last, partial huge page stays in
// small pages, since a huge page there would commit memory no row uses (up to 2 MiB a chunk).
constexpr size_t kSmallPage = size_t{4} << 10;
size_t BlockBytes(size_t bytes) { return (bytes + kSmallPage - 1) / kSmallPage * kSmallPage; }

void* AllocateBlock(size_t bytes) {
  const size_t size = BlockBytes(bytes);
  // Over-map by one huge page, then trim both ends to a 2 MiB-aligned block.
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t tail = start + size + kHugePage - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  const size_t huge = size / kHugePage * kHugePage;
  if (huge > 0) madvise(reinterpret_cast<void*>(aligned), huge, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void FreeBlock(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, BlockBytes(bytes));
}

// A chunk is up to two mappings (its huge-page part and its tail); reservations of at most
// kUncheckedChunks chunks are not checked (reading /proc costs more than they risk).
constexpr int64_t kMappingsPerChunk = 2;
constexpr int64_t kUncheckedChunks = 256;
constexpr double kMaxReservationBytes = double(int64_t{1} << 45);  // 32 TiB

// vm.max_map_count minus the mappings the process has, or -1 when unknown.
int64_t MappingsLeft() {
  FILE* limit_file = std::fopen("/proc/sys/vm/max_map_count", "r");
  if (limit_file == nullptr) return -1;
  long long limit = -1;
  const int read = std::fscanf(limit_file, "%lld", &limit);
  std::fclose(limit_file);
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (read != 1 || maps == nullptr) {
    if (maps != nullptr) std::fclose(maps);
    return -1;
  }
  int64_t used = 0;
  for (int c = std::fgetc(maps); c != EOF; c = std::fgetc(maps)) used += c == '\n';
  std::fclose(maps);
  return std::max<int64_t>(0, limit - used);
}

}  // namespace

EmbeddingTable::~EmbeddingTable() {
  // Newest chunk first: mmap hands out addresses downwards, so when the kernel merged
  // neighbouring chunks into one mapping, each unmap trims its end instead of splitting it (a
  // split needs a new mapping, which fails when the process is at vm.max_map_count).
  for (int64_t c = num_chunks_ - 1; c >= 0; --c) {
    DirectoryPage* page = pages_[c >> kPageBits].load();
    Chunk* chunk = page->chunks[c & (kPageSize - 1)].load();
    FreeBlock(chunk->rows, ChunkBytes());
    delete chunk;
  }
  for (int64_t p = 0; p < kMaxPages; ++p) delete pages_[p].load();
}

int64_t EmbeddingTable::FreeRowCount() {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return static_cast<int64_t>(free_rows_.size()) + (max_rows_ - next_row_);
}

Status EmbeddingTable::CheckReservation(int64_t rows) const {
  const int64_t chunks = (rows + rows_per_chunk() - 1) / rows_per_chunk();
  if (chunks <= kUncheckedChunks) return Status::Ok();
  const double bytes = static_cast<double>(chunks) * static_cast<double>(ChunkBytes());
  const int64_t mappings = kMappingsPerChunk * chunks;
  const int64_t left = MappingsLeft();
  std::string limit;
  if (chunks > kMaxPages * kPageSize) {
    limit = "a table holds at most " + std::to_string(kMaxPages * kPageSize) + " chunks";
  } else if (bytes > kMaxReservationBytes) {
    limit = "the address space a table may reserve is " +
            std::to_string(static_cast<int64_t>(kMaxReservationBytes) >> 40) + " TiB";
  } else if (left >= 0 && mappings > left / 2) {
    // Leave half of what is left: the process needs mappings for threads, arrays and other
    // tables too, and a process at vm.max_map_count fails or aborts wherever it maps memory.
    limit = "it would take " + std::to_string(mappings) + " memory mappings and this process " +
            "has " + std::to_string(left) + " left (vm.max_map_count)";
  }
  if (limit.empty()) return Status::Ok();
  return Status::ResourceExhausted(
      "table '" + config_.name + "': cannot reserve " + std::to_string(rows) + " rows of dim " +
      std::to_string(config_.dim) + " (" + std::to_string(static_cast<int64_t>(bytes)) +
      " bytes in " + std::to_string(chunks) + " chunks): " + limit +
      "; use a smaller capacity (device_vocabulary_size + host_vocabulary_size) or dynamic "
      "expansion");
}

bool EmbeddingTable::AddChunkLocked() {
  if (num_chunks_ >= kMaxPages * kPageSize) return false;
  const int64_t rows = rows_per_chunk();
  const int64_t p = num_chunks_ >> kPageBits;
  DirectoryPage* page = pages_[p].load(std::memory_order_relaxed);
  if (page == nullptr) {
    page = new DirectoryPage;
    for (auto& c : page->chunks) c.store(nullptr, std::memory_order_relaxed);
    pages_[p].store(page, std::memory_order_release);
  }
  std::unique_ptr<Chunk> chunk(new Chunk);
  chunk->rows = static_cast<char*>(AllocateBlock(rows * dir_.row_bytes));
  if (chunk->rows == nullptr) return false;
  if (config_.track_changes) chunk->changed.reset(new uint8_t[rows]());
  if (config_.tiered()) {
    chunk->ticks.reset(new int64_t[rows]());
    chunk->priority.reset(new int64_t[rows]());
  }
  page->chunks[num_chunks_ & (kPageSize - 1)].store(chunk.release(), std::memory_order_release);
  ++num_chunks_;
  allocated_rows_.store(num_chunks_ << chunk_shift_, std::memory_order_release);
  return true;
}

Status EmbeddingTable::RelayoutLocked(int num_slots, int width, const float* initial_values) {
  const size_t old_bytes = dir_.row_bytes;
  const size_t new_bytes = RowBytesFor(num_slots, width);
  const int64_t rows = rows_per_chunk();
  std::vector<char*> blocks(num_chunks_, nullptr);
  for (int64_t c = 0; c < num_chunks_; ++c) {
    blocks[c] = static_cast<char*>(AllocateBlock(rows * new_bytes));
    if (blocks[c] == nullptr) {
      for (int64_t d = 0; d < c; ++d) FreeBlock(blocks[d], rows * new_bytes);
      return Status::ResourceExhausted("table '" + config_.name +
                                       "': out of memory while adding optimizer slots");
    }
  }
  if (tier_.store != nullptr) {
    Status status =
        tier_.RelayoutColdLocked(num_slots, width, initial_values, /*reset_slots=*/false);
    if (!status.ok()) {
      for (int64_t c = 0; c < num_chunks_; ++c) FreeBlock(blocks[c], rows * new_bytes);
      return status;
    }
  }
  // Slots of another width cannot be kept: every slot starts from its initial value.
  const int kept_slots = width == slot_width_ ? std::min(num_slots_, num_slots) : 0;
  const size_t slots_at = sizeof(RowMeta) + emb_bytes_;
  const size_t slot_bytes = SlotBytesFor(width);
  const size_t kept = slots_at + size_t(kept_slots) * slot_bytes;
  for (int64_t c = 0; c < num_chunks_; ++c) {
    Chunk* chunk = ChunkOf(c << chunk_shift_);
    const int64_t used = std::min<int64_t>(rows, rows_touched_ - (c << chunk_shift_));
    for (int64_t r = 0; r < used; ++r) {
      char* dst = blocks[c] + r * new_bytes;
      std::memcpy(dst, chunk->rows + r * old_bytes, kept);
      for (int s = kept_slots; s < num_slots; ++s) {
        FillRow(SlotDtypeFor(width), initial_values[s], width, dst + slots_at + s * slot_bytes);
      }
    }
    FreeBlock(chunk->rows, rows * old_bytes);
    chunk->rows = blocks[c];
  }
  dir_.row_bytes = new_bytes;
  num_slots_ = num_slots;
  slot_width_ = width;
  return Status::Ok();
}

void EmbeddingTable::AllocateRows(int64_t count, std::vector<int64_t>* rows) {
  rows->clear();
  std::lock_guard<std::mutex> lock(alloc_mu_);
  while (static_cast<int64_t>(rows->size()) < count && !free_rows_.empty()) {
    rows->push_back(free_rows_.back());
    free_rows_.pop_back();
  }
  while (static_cast<int64_t>(rows->size()) < count && next_row_ < max_rows_) {
    if (next_row_ >= allocated_rows_.load(std::memory_order_relaxed) && !AddChunkLocked()) break;
    rows->push_back(next_row_++);
  }
  rows_touched_ = std::max(rows_touched_, next_row_);
}

void EmbeddingTable::ReleaseRows(const int64_t* rows, size_t count) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  free_rows_.insert(free_rows_.end(), rows, rows + count);
}

int64_t EmbeddingTable::Capacity() const {
  if (config_.dynamic_expansion) return allocated_rows_.load();
  if (config_.tiered()) {
    // Without an SSD bound, the most rows any table holds.
    return config_.ssd_rows > 0 ? config_.capacity + config_.ssd_rows : kMaxCapacity;
  }
  return config_.capacity;
}

int64_t EmbeddingTable::MemoryBytes() {
  int64_t row_memory;
  {
    // dir_.row_bytes changes only in RelayoutLocked, which holds alloc_mu_ too.
    std::lock_guard<std::mutex> lock(alloc_mu_);
    row_memory = num_chunks_ * static_cast<int64_t>(ChunkBytes());
  }
  int64_t tier_memory = 0;
  if (tier_.store != nullptr) {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    tier_memory = static_cast<int64_t>(tier_.store->stats().memory_bytes) +
                  num_chunks_ * rows_per_chunk() * static_cast<int64_t>(sizeof(int64_t));
  }
  return row_memory + tier_memory + static_cast<int64_t>(index_.memory_bytes());
}

TableStats EmbeddingTable::Stats() const {
  TableStats stats;
  stats.size = Size();
  stats.capacity = Capacity();
  stats.admitted = admission_.admitted.load();
  stats.rejected = admission_.rejected.load();
  stats.evicted = admission_.evicted.load();
  stats.pending = pending_.size();
  stats.newest_clock = ClockForNewRows();
  if (tier_.store != nullptr) {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    const ColdTier::Stats cold = tier_.store->stats();
    stats.cold = static_cast<int64_t>(cold.live);
    stats.ssd_bytes_read = static_cast<int64_t>(cold.bytes_read);
    stats.ssd_bytes_written = static_cast<int64_t>(cold.bytes_written);
    stats.ssd_file_bytes = static_cast<int64_t>(cold.file_bytes);
  }
  stats.hot = stats.size - stats.cold;
  stats.promotions = tier_.promotions.load();
  stats.demotions = tier_.demotions.load();
  stats.prefetch_hits = tier_.prefetch_hits.load();
  return stats;
}

}  // namespace rec_sdk
