// The SSD tier of a table (config.tiered(); table_tier.cc).
//
// A tiered table keeps at most `capacity` rows in memory; the others are records in a
// ColdTier (cold_tier.h; record files, ColdStore, are its back end): the row's record bytes as
// they are in memory (header, embedding and slots). A key lives in exactly one tier: its
// index entry holds either a row (hot) or, with kColdEntry set, the record's id (cold).
// Training lookups run under the exclusive lock: the batch's cold keys are promoted first
// (records read many at once, or taken from what PrefetchCold read ahead, into free rows:
// addresses and the graph unchanged), then the lookup runs as in memory; when rows run out,
// the rows of lowest priority are demoted (written as one batch, freed, generation bumped):
// never a row of the lookup, rows of the last kProtectedTicks lookups only when the others
// are not enough, rows that just came in (probation) before rows used again. The tier changes
// no value, count or clock: a tiered table trains exactly as an all-in-memory one. Evaluation
// lookups read cold rows without promoting them (their addresses carry the record id with
// generation kColdGeneration, which only Gather accepts). Updates happen only in memory, so
// optimizers never see a cold row.
//
// EmbeddingTable::PrefetchCold(keys, n, read, run) reads the SSD records of keys[0, n) ahead
// of the training lookup that will bring them into memory (the next batch's keys, while the
// current batch trains), so that it copies them from memory instead of waiting for the disk.
// It holds the table's lock only to find the records and keeps at most about capacity/16
// records (the oldest go first). *read (may be null): records read. It does nothing for a
// table without an SSD tier.
//
// TableTier is the tier of one table: its state (the ColdTier behind it, the records
// PrefetchCold read ahead, the tier's counters) and the operations that move rows between the
// tiers and read and write cold records. It belongs to its table (EmbeddingTable::tier_) and
// works on the table's index and rows, as a friend.
#ifndef REC_SDK_CORE_TABLE_TIER_H_
#define REC_SDK_CORE_TABLE_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tf_ops/core/cold_tier.h"
#include "tf_ops/core/parallel.h"
#include "tf_ops/core/status.h"
#include "tf_ops/core/table_stats.h"

namespace rec_sdk {

class EmbeddingTable;

class TableTier {
 public:
  explicit TableTier(EmbeddingTable* table) : t_(table) {}
  TableTier(const TableTier&) = delete;
  TableTier& operator=(const TableTier&) = delete;

  // --- State ---
  // Null: all in memory. Shared: PrefetchCold reads through it after releasing the table's
  // lock.
  std::shared_ptr<ColdTier> store;
  // Ticks of training lookups and upserts of a tiered table (the recency demotion goes by),
  // rows moved each way, and promotions served by records read ahead.
  std::atomic<int64_t> tick{0};
  std::atomic<int64_t> promotions{0};
  std::atomic<int64_t> demotions{0};
  std::atomic<int64_t> prefetch_hits{0};

  // Records read ahead by PrefetchCold: key -> (record number, record bytes), valid while the
  // key's index entry still names that record of the same store (staging_generation).
  struct Staged {
    uint64_t number;
    uint64_t generation;
    std::vector<char> record;
  };
  std::mutex staging_mu;
  std::unordered_map<int64_t, Staged> staged;  // guarded by staging_mu
  std::deque<int64_t> staged_order;            // oldest first; guarded by staging_mu
  std::atomic<uint64_t> staging_generation{1};

  // Demotion takes the rows of lowest priority. A row used again gets the lookup's tick; a
  // row that just came into memory (promoted or new) gets the tick minus kProbationTicks, so
  // it goes before rows used in the last kProbationTicks lookups unless it is used again:
  // keys seen once do not push out keys seen often (Zipf-like data is mostly such keys).
  static constexpr int64_t kProbationTicks = 16;

  // A cold key's index entry: kColdEntry set, and the id of its record in the store.
  static constexpr int64_t kColdEntry = int64_t{1} << 62;
  static bool IsCold(int64_t entry) { return (entry & kColdEntry) != 0; }
  static int64_t ColdEntry(uint64_t id) { return kColdEntry | static_cast<int64_t>(id); }
  static uint64_t IdOf(int64_t entry) { return static_cast<uint64_t>(entry & ~kColdEntry); }

  // --- Operations (table_tier.cc); "Locked": the table's structure_mu_ held exclusively ---
  // Opens a store for records of `record_bytes` bytes in the table's ssd_paths.
  Status OpenColdTier(size_t record_bytes, std::unique_ptr<ColdTier>* out) const;
  // The training FindOrInsert of a tiered table (exclusive lock throughout).
  Status TieredFindOrInsert(const int64_t* keys, int64_t n, int64_t* addresses,
                            const ParallelRunner& run, const KeyAccess& access);
  // Moves the cold keys among keys[0, n) into memory rows, demoting other rows when free rows
  // are not enough, and sets the tick of every hot row of the batch to `tick` (so demotion
  // spares them).
  Status PromoteLocked(const int64_t* keys, int64_t n, int64_t tick, const ParallelRunner& run);
  // Demotes `needed` least recently used memory rows whose tick is not `tick` (rows of the
  // lookups since tick - kProtectedTicks only when the older ones are not enough), and up to
  // `extra` more while the SSD tier has room for them (so that a table at its memory budget
  // does not demote on every lookup). Fewer only when fewer rows may go. All or nothing: when
  // the records cannot be written, no row moves.
  Status DemoteLocked(int64_t needed, int64_t extra, int64_t tick);
  // Makes room in the store for `count` more records: evicts the least recently seen records
  // with evict_when_full, otherwise fails with kResourceExhausted when ssd_rows would be
  // exceeded.
  Status ColdRoomLocked(int64_t count);
  // Compacts the store when a segment is more than half stale, updating the moved keys.
  Status CompactLocked();
  // Copies the embedding of a cold row an evaluation lookup returned (shared lock).
  Status GatherCold(int64_t address, float* out) const;
  // Reads the record of a cold entry into record (the table's row_bytes_ bytes) and checks
  // its key; rows saved before their optimizer's slot values were known get them.
  Status ReadColdRecord(int64_t entry, int64_t key, char* record) const;
  // DataLoss unless a record read for `key` holds that key.
  Status CheckColdKey(int64_t key, uint64_t stored) const;
  // Gives a record saved before its optimizer's slot values were known those values.
  void FillUnsetSlots(char* record) const;
  // Removes a cold key (index entry and record); counts it as evicted when `evicted`.
  void RemoveColdLocked(int64_t key, int64_t entry, bool evicted);
  // RemoveColdLocked of a key whose index entry is already erased.
  void DropColdRecordLocked(int64_t key, int64_t entry, bool evicted);
  // Rewrites every cold record for `num_slots` slots: slots it had keep their values unless
  // reset_slots, new or reset ones get initial_values. The new store replaces the old one
  // only once every record is written.
  Status RelayoutColdLocked(int num_slots, int width, const float* initial_values,
                            bool reset_slots);
  // Calls fn(key, record, marks) for every cold record (a row record: header, embedding,
  // slots; marks: its change-set bits, table_snapshot.h). Does nothing without a store.
  Status ForEachColdRecord(
      const std::function<Status(int64_t key, const char* record, uint8_t marks)>& fn) const;
  // Lays out a row record (row_bytes_ bytes) for the store; null slots (or null entries) get
  // the slots' initial values.
  void FillRecord(char* record, int64_t key, int64_t last_seen, uint32_t count, const float* value,
                  const float* const* slots, bool slots_unset) const;
  // Takes the staged record of (key, entry) into `record` (row_bytes_); false when none.
  bool TakeStaged(int64_t key, int64_t entry, char* record);
  // Forgets every staged record (the store was cleared or replaced).
  void DropStaged();

 private:
  EmbeddingTable* const t_;  // the table this tier belongs to
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_TIER_H_
