// EmbeddingTable: one table (one shard) of embeddings keyed by int64 ids.
//
// Its concerns have headers of their own: how rows are stored and named by 63-bit addresses
// (table_storage.h), admission by count and eviction by age (table_admission.h), the
// optimizer slots (table_slots.h), what checkpoints see (table_snapshot.h), and the SSD tier
// that keeps a tiered table's least recently used rows in a ColdTier on SSD (table_tier.h).
//
// Concurrency
//   Batch operations (find/insert, gather, lookup, upsert, optimizer updates) run concurrently
//   with each other under a shared lock; operations that free rows (remove, eviction,
//   restrict, clear, import, restore) and attaching slots run alone. An operation that takes
//   addresses validates them and uses the rows under one shared hold, so a row it validated
//   cannot be freed and reused for another key before it is done: it reaches the key it was
//   issued for, or fails as stale.
#ifndef REC_SDK_CORE_EMBEDDING_TABLE_H_
#define REC_SDK_CORE_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "tf_ops/core/cold_tier.h"
#include "tf_ops/core/hash_index.h"
#include "tf_ops/core/initializer.h"
#include "tf_ops/core/parallel.h"
#include "tf_ops/core/pending_keys.h"
#include "tf_ops/core/row_precision.h"
#include "tf_ops/core/status.h"
#include "tf_ops/core/table_admission.h"
#include "tf_ops/core/table_config.h"
#include "tf_ops/core/table_slots.h"
#include "tf_ops/core/table_snapshot.h"
#include "tf_ops/core/table_stats.h"
#include "tf_ops/core/table_storage.h"
#include "tf_ops/core/table_tier.h"

namespace rec_sdk {

class EmbeddingTable {
 public:
  static constexpr int kMaxDim = 8192;
  static constexpr int kMaxSlots = TableSlots::kMaxSlots;
  static constexpr int kRowBits = rec_sdk::kRowBits;
  static constexpr int kGenerationBits = rec_sdk::kGenerationBits;
  static constexpr int kTagBits = 11;
  static constexpr int64_t kMaxRows = int64_t{1} << kRowBits;
  // Rows a table can hold: the compact index keeps the last row id for an empty slot.
  static constexpr int64_t kMaxCapacity = kMaxRows - 1;
  // A full evict_when_full table without clocks evicts the rows of its last kProtectedTicks
  // training lookups (concurrent lookups of one step may still use their addresses) only
  // when older rows are not enough for the batch.
  static constexpr int64_t kProtectedTicks = 8;

  static Status Create(const TableConfig& config, std::unique_ptr<EmbeddingTable>* table);
  ~EmbeddingTable();

  const std::string& name() const { return config_.name; }
  const TableConfig& config() const { return config_; }
  int dim() const { return config_.dim; }
  // The element type of the stored embeddings (row_precision.h).
  RowDtype emb_dtype() const { return config_.emb_dtype; }
  bool dynamic_expansion() const { return config_.dynamic_expansion; }
  int64_t rows_per_chunk() const { return int64_t{1} << chunk_shift_; }
  int num_slots() const { return num_slots_; }
  // Floats per optimizer slot of a row: dim or 1 (table_slots.h).
  int slot_width() const { return slot_width_; }
  // Whether the table has an SSD tier.
  bool tiered() const { return tier_.store != nullptr; }
  // Reads the SSD records of keys[0, n) ahead of their training lookup (table_tier.h).
  Status PrefetchCold(const int64_t* keys, int64_t n, int64_t* read, const ParallelRunner& run);

  // Number of keys stored.
  int64_t Size() const { return size_.load(std::memory_order_relaxed); }
  // Rows the table can hold now without allocating: the fixed capacity, or the rows of the
  // chunks allocated so far in dynamic-expansion mode; a tiered table: its memory rows plus
  // its SSD rows (kMaxCapacity without an SSD bound).
  int64_t Capacity() const;
  // Bytes of memory reserved for rows, slots, metadata and the index.
  int64_t MemoryBytes();
  // The index's part of MemoryBytes (it varies a little with the table's random hash seed).
  int64_t IndexMemoryBytes() { return static_cast<int64_t>(index_.memory_bytes()); }

  // Maps keys to row addresses. With insert=true (training), absent keys get a new,
  // initialised row, subject to admission, and `access` updates counts and clocks; with
  // insert=false they map to -1 and nothing changes. Fails with kResourceExhausted when a
  // fixed-capacity table cannot give every new key a row, even after eviction where it
  // evicts: then no key of the batch got a row and no row was evicted (the keys' clocks and
  // admission counts did count the batch).
  // With `rows` (n * dim floats), also copies the rows of the addresses into it (zeros for
  // -1) in the same hold of the table: a lookup in one pass instead of FindOrInsert + Gather.
  Status FindOrInsert(const int64_t* keys, int64_t n, bool insert, int64_t* addresses,
                      const ParallelRunner& run, const KeyAccess& access = KeyAccess(),
                      float* rows = nullptr);

  // --- Admission and eviction (what these operations do in detail: table_admission.h) ---
  // Sets the thresholds; every later call must give the same values.
  Status ConfigureAdmission(const AdmissionConfig& wanted);
  // The configured thresholds (defaults before ConfigureAdmission), and whether it ran.
  AdmissionConfig admission() const;
  bool admission_configured() const;
  // Forgets the configuration (thresholds back to -1), for a graph that configures it anew.
  void ResetAdmission();
  // Changes the admission threshold in use, not the configured one.
  Status SetAccessThreshold(int64_t threshold);
  int64_t access_threshold() const {
    return admission_.access_threshold.load(std::memory_order_relaxed);
  }
  // Starts keeping access counts and last-seen clocks current on training passes.
  void TrackAccess() { admission_.track_access.store(true, std::memory_order_relaxed); }
  bool track_access() const { return admission_.track_access.load(std::memory_order_relaxed); }
  int64_t eviction_threshold() const {
    return admission_.eviction_threshold.load(std::memory_order_relaxed);
  }

  // Drops the rows and pending counts at least eviction_threshold older than the newest clock.
  Status Evict(int64_t* rows_evicted, int64_t* pending_evicted, const ParallelRunner& run);

  TableStats Stats() const;

  // Copies the rows at `addresses` to out[n, dim]; -1 gives zeros.
  Status Gather(const int64_t* addresses, int64_t n, float* out, const ParallelRunner& run);

  // Copies the rows of `keys` to out[n, dim] without inserting. Absent keys give zeros, or
  // the values a new row would get when init_missing is true. exists may be null. With
  // slot >= 0 the rows' optimizer slot `slot` is read instead of the embedding (absent keys:
  // the slot's initial value; a slot of one float per row fills the row's dim floats); before
  // any optimizer attached slots, every key reads slot_default.
  Status Lookup(const int64_t* keys, int64_t n, bool init_missing, float* out, bool* exists,
                const ParallelRunner& run, int slot = -1, float slot_default = 0.0f);

  // Inserts or overwrites the embeddings of keys with values[n, dim]. New rows get initial
  // slot values. With duplicate keys the last value wins. All or nothing: a fixed-capacity
  // table without rows for all the new keys fails with kResourceExhausted, unchanged (a
  // tiered table: each slice of half its memory rows is all or nothing).
  Status Upsert(const int64_t* keys, const float* values, int64_t n, const ParallelRunner& run);

  // Removes keys (absent keys are ignored); their rows go to the free list and any address
  // to them becomes stale. Runs alone (exclusive lock), as every operation that frees rows.
  // *removed (may be null) receives the number of keys removed.
  Status Remove(const int64_t* keys, int64_t n, int64_t* removed, const ParallelRunner& run);

  // Applies a serving update under the exclusive lock, so a lookup sees the table all
  // before or all after it: removes `removed` (m keys), or with `replace` every key not
  // among `keys`, then upserts the n rows. Tiered tables bring the keys' cold rows in first.
  Status ApplyRows(const int64_t* keys, const float* values, int64_t n, const int64_t* removed,
                   int64_t m, bool replace, const ParallelRunner& run);

  // Removes every key. Memory stays reserved; all addresses become stale.
  void Clear();

  // Keeps the `keep` rows seen most recently (kLastSeen) or most often (kCount, which needs
  // track_access; ties: the more recent, then the larger key) and removes the others with
  // their slots (counted as evicted). *removed (may be null) receives how many rows went.
  // Addresses of removed rows become stale: run it between training steps.
  Status Restrict(int64_t keep, RestrictBy by, int64_t* removed);

  // --- Optimizer slots (what these operations do in detail: table_slots.h) ---
  // Declares the optimizer slots of this table (one sparse optimizer per table).
  Status EnsureSlots(const std::string& optimizer, const std::vector<float>& initial_values,
                     int width = 0);
  const std::string& slot_optimizer() const { return slots_.optimizer; }
  // Calls update(i, value, slots) for every valid address, in parallel, one update at a time.
  // value is the row's embedding in float32: for a half-precision table a decoded copy,
  // rounded back stochastically (row_precision.h) with the bits of (seed, key, update step).
  using RowUpdate = std::function<void(int64_t i, float* value, float* const* slots)>;
  Status UpdateRows(const int64_t* addresses, int64_t n, int64_t cost_per_row,
                    const RowUpdate& update, const ParallelRunner& run);
  using SlotLayout = TableSlotLayout;
  // UpdateRows for the optimizer of `layout`, attaching its slots first; all or nothing.
  Status ApplyUpdate(const SlotLayout& layout, const int64_t* addresses, int64_t n,
                     int64_t cost_per_row, const RowUpdate& update, const ParallelRunner& run);

  // Exports every stored row. allocate(n, &keys, &values, &slots) is called once with the
  // row count and must return buffers of n keys, n*dim values and num_slots()*n*slot_width()
  // slot values (layout [slot][row][slot_width]); the table is locked until Export returns.
  using ExportAllocator =
      std::function<Status(int64_t n, int64_t** keys, float** values, float** slots)>;
  Status Export(const ExportAllocator& allocate);
  // Every stored key with its access statistics (restrict policies' status): last-seen clock
  // and access count, in row order.
  Status ExportAccess(std::vector<int64_t>* keys, std::vector<int64_t>* last_seen,
                      std::vector<int64_t>* counts);
  // Sets the last-seen clock and access count of the stored keys among keys[0, n) (absent
  // keys are skipped; counts saturate at 2^32 - 1) and raises the table's clock to the newest
  // of them, so later training is newer: the statistics an export of ExportAccess saved.
  // InvalidArgument (nothing changed) for a negative clock or count.
  Status ImportAccess(const int64_t* keys, const int64_t* last_seen, const int64_t* counts,
                      int64_t n);

  // Replaces the table's contents with n rows. slots (layout [slot][row][slot_width], 0 for
  // dim) may be null (slots start from their initial values); otherwise it holds num_slots
  // arrays, which must match the slots already declared, if any.
  Status Import(const int64_t* keys, const float* values, const float* slots, int num_slots,
                int64_t n, int slot_width = 0);

  // --- Checkpoints (checkpoint.h; what these operations do in detail: table_snapshot.h) ---
  using CheckpointInfo = TableCheckpointInfo;
  using SnapshotView = TableSnapshotView;
  using RestoreSink = TableRestoreSink;
  // Runs fn(view) under the exclusive lock; the view's info carries a new save id.
  Status Snapshot(const std::function<Status(const SnapshotView&)>& fn);
  // Records that the save with this id is durable: later deltas are relative to it.
  Status CommitSave(int64_t save_id);
  int64_t checkpoint_id() const { return changes_.checkpoint_id; }
  bool tracks_changes() const { return config_.track_changes; }
  // Whether the table holds exactly checkpoint `save_id`, unchanged since.
  bool HoldsCheckpoint(int64_t save_id) const;
  // The changes since the last push, for serving updates (table_snapshot.h).
  using TakeChangesFn = std::function<Status(const SnapshotView&, bool whole)>;
  Status TakeChanges(bool full, const TakeChangesFn& fn, int64_t* since, int64_t* id);
  // Restore lanes: lane l takes the keys of the index shards s with s % kRestoreLanes == l.
  static constexpr int kRestoreLanes = 2;
  int RestoreLaneOf(int64_t key) const {
    return HashIndex::ShardOf(index_.Hash(key)) % kRestoreLanes;
  }
  // Replaces the contents with the rows feed(sink) adds; *note: what became of the slots.
  Status Restore(const CheckpointInfo& info, const std::function<Status(RestoreSink*)>& feed,
                 std::string* note);
  // Applies a delta checkpoint: clears when `cleared`, removes `removed`, upserts the rows.
  Status ApplyDelta(const CheckpointInfo& info, bool cleared, const std::vector<int64_t>& removed,
                    const std::function<Status(RestoreSink*)>& feed);
  // The notice of the last EnsureSlots, if any, cleared by the call.
  std::string TakeNotice();

  // Address encoding (public for tests and tools).
  int64_t EncodeAddress(int64_t row, uint32_t generation) const;

 private:
  // How many keys or rows ahead batch loops prefetch.
  static constexpr int64_t kPrefetchDistance = 16;

  explicit EmbeddingTable(const TableConfig& config);

  Chunk* ChunkOf(int64_t row) const { return dir_.ChunkOf(row); }
  // Slots of `width` values per row: one float per row stays float32, dim values take
  // config_.slot_dtype.
  RowDtype SlotDtypeFor(int width) const {
    return width == 1 ? RowDtype::kFloat32 : config_.slot_dtype;
  }
  size_t SlotBytesFor(int width) const {
    return size_t(width) * RowDtypeBytes(SlotDtypeFor(width));
  }
  // Bytes of one row record with num_slots slots of `width` values.
  size_t RowBytesFor(int num_slots, int width) const {
    const size_t bytes = sizeof(RowMeta) + emb_bytes_ + size_t(num_slots) * SlotBytesFor(width);
    return (bytes + 7) / 8 * 8;
  }
  size_t ChunkBytes() const { return (size_t{1} << chunk_shift_) * dir_.row_bytes; }
  int64_t OffsetOf(int64_t row) const { return dir_.OffsetOf(row); }
  char* RecordOf(int64_t row) const { return dir_.RecordOf(row); }
  RowMeta& MetaOf(int64_t row) const { return dir_.MetaOf(row); }
  // A record's embedding (dim elements of emb_dtype, padded to 4 bytes), then its slots.
  static char* EmbeddingIn(char* record) { return record + sizeof(RowMeta); }
  static const char* EmbeddingIn(const char* record) { return record + sizeof(RowMeta); }
  // Slot s of a record starts s * slot_width values of SlotDtypeFor(slot_width) after the
  // embedding.
  char* SlotIn(char* record, int s) const {
    return record + sizeof(RowMeta) + emb_bytes_ + s * SlotBytesFor(slot_width_);
  }
  const char* SlotIn(const char* record, int s) const {
    return SlotIn(const_cast<char*>(record), s);
  }
  // Slot s of a record in float32; float32 values written into it (rounded to nearest), or
  // one value in every element.
  void ReadSlot(const char* record, int s, float* out) const {
    DecodeRow(SlotDtypeFor(slot_width_), SlotIn(record, s), slot_width_, out);
  }
  void WriteSlot(char* record, int s, const float* in) const {
    EncodeRowNearest(SlotDtypeFor(slot_width_), in, slot_width_, SlotIn(record, s));
  }
  void FillSlot(char* record, int s, float value) const {
    FillRow(SlotDtypeFor(slot_width_), value, slot_width_, SlotIn(record, s));
  }
  // The embedding of a record in float32, and a float32 embedding written into a record
  // (rounded to nearest).
  void ReadEmbedding(const char* record, float* out) const {
    DecodeRow(config_.emb_dtype, EmbeddingIn(record), config_.dim, out);
  }
  void WriteEmbedding(char* record, const float* in) const {
    EncodeRowNearest(config_.emb_dtype, in, config_.dim, EmbeddingIn(record));
  }
  // Rounds dim float32 values in place to what the table's precision stores.
  void RoundToTable(float* values) const {
    if (config_.emb_dtype == RowDtype::kFloat32) return;
    uint16_t stored[kMaxDim];
    EncodeRowNearest(config_.emb_dtype, values, config_.dim, stored);
    DecodeRow(config_.emb_dtype, stored, config_.dim, values);
  }

  // The index maps a key to its row id and generation (bits 0..51 of its address); the tag
  // is added when the address leaves the table.
  static int64_t IndexEntry(int64_t row, uint32_t generation) {
    return rec_sdk::IndexEntry(row, generation);
  }
  static int64_t RowOfEntry(int64_t entry) { return entry & (kMaxRows - 1); }
  int64_t TagBits() const { return static_cast<int64_t>(tag_) << (kRowBits + kGenerationBits); }
  // Starts loading the metadata and embedding of the row an address names (a hint only).
  void PrefetchRow(int64_t address) const;

  // An evaluation FindOrInsert (structure_mu_ held shared): addresses of stored keys (-1
  // for the others) and, when rows is not null, their rows (zeros for -1).
  Status FindRowsLocked(const int64_t* keys, int64_t n, int64_t* addresses,
                        const ParallelRunner& run, float* rows);
  // Copies the in-memory rows of addresses a FindOrInsert placed or found in this hold of
  // structure_mu_ (no validation needed: nothing can have freed them) into out[n, dim]; -1
  // gives zeros.
  void CopyRowsLocked(const int64_t* addresses, int64_t n, float* out,
                      const ParallelRunner& run) const;
  // Validates an address and returns its row id, or -1 for the "no row" address.
  Status DecodeAddress(int64_t address, int64_t* row) const;
  // DecodeAddress of every address, in parallel; the first error (structure_mu_ held).
  Status DecodeAddresses(const int64_t* addresses, int64_t n, int64_t* rows,
                         const ParallelRunner& run) const;
  // UpdateRows with structure_mu_ held (shared or exclusive), and its second half: the
  // update of rows already decoded (-1 skipped).
  Status UpdateRowsLocked(const int64_t* addresses, int64_t n, int64_t cost_per_row,
                          const RowUpdate& update, const ParallelRunner& run);
  void WriteRowsLocked(const int64_t* rows, int64_t n, int64_t cost_per_row,
                       const RowUpdate& update, const ParallelRunner& run);
  // The step whose bits a half-precision update rounds with: one per UpdateRows /
  // ApplyUpdate (update_mu_ held), saved in checkpoints so a restored table goes on alike.
  std::atomic<uint64_t> update_step_{0};
  // Whether the slots of `layout` are attached (structure_mu_ held), and attaching them
  // (structure_mu_ held exclusively); see EnsureSlots.
  bool SlotsReadyLocked(const std::string& optimizer, const std::vector<float>& initial_values,
                        int width) const;
  Status EnsureSlotsLocked(const std::string& optimizer, const std::vector<float>& initial_values,
                           int width);
  // The floats per slot `requested` asks for (0: dim) into *width; InvalidArgument naming
  // `what` unless that is dim or 1, the two widths a slot can have.
  Status ResolveSlotWidth(int requested, const std::string& what, int* width) const;

  // Adds one chunk (alloc_mu_ held). Returns false when the memory cannot be allocated.
  bool AddChunkLocked();
  // Whether reserving `rows` up front stays within what the process can map: fails with
  // kResourceExhausted naming the table, the bytes and the limit otherwise, before anything
  // is mapped (a process left at vm.max_map_count fails wherever it maps memory next).
  Status CheckReservation(int64_t rows) const;
  // Re-lays out every chunk for `num_slots` slots of `width` floats (exclusive structure_mu_
  // and alloc_mu_ held): copies the header, embedding and existing slots (of the same width)
  // of every row handed out and sets new slots to initial_values[s]. Leaves the table
  // unchanged when memory runs out.
  Status RelayoutLocked(int num_slots, int width, const float* initial_values);
  // Takes `count` rows into *rows, reused ones first; fewer only when a fixed-capacity table
  // is full. Rows are not initialised.
  void AllocateRows(int64_t count, std::vector<int64_t>* rows);
  // Gives back rows taken by AllocateRows and never initialised.
  void ReleaseRows(const int64_t* rows, size_t count);
  // Rows that can still be handed out (alloc_mu_ not held).
  int64_t FreeRowCount();
  // Gives a row its key, initial embedding and initial slot values, clock `last_seen` and
  // count 0, and marks it alive (the caller counts it in size_).
  void InitializeRowLocked(int64_t row, int64_t key, int64_t last_seen);
  // One pass of a training FindOrInsert (structure_mu_ held: shared, or exclusive for the
  // retry after eviction). count=false leaves admission counts unchanged (a retry). When the
  // table cannot give a row to every admitted key, no key gets one and *unplaced receives
  // the number of rows missing (0 when the pass placed its keys).
  void InsertPass(const int64_t* keys, int64_t n, int64_t* addresses, const KeyAccess& access,
                  int64_t tick, bool count, int64_t* unplaced, const ParallelRunner& run);
  // One shard's part of an insert pass, in named steps: probe, touch, admit, place
  // (embedding_table.cc).
  class ShardInsert;
  // Removes the row of a live key (structure_mu_ exclusive) and counts it as evicted.
  void EvictRowLocked(int64_t row);
  // Evicts up to `count` least recently seen rows (structure_mu_ held exclusively), never
  // the rows of keys[0, n) (the batch being placed); when tick > 0, rows seen at a tick
  // >= tick - kProtectedTicks (rows concurrent lookups of the same step may be using) only
  // when the older rows are not enough.
  // Pending counts no newer than the newest evicted row go too. Evicts nothing and returns
  // false when fewer than `needed` rows could go (the batch cannot fit even after eviction).
  bool EvictLeastRecentLocked(int64_t count, int64_t needed, const int64_t* keys, int64_t n,
                              int64_t tick);
  // The clock a key is seen with in a training lookup.
  static int64_t ClockOf(const KeyAccess& access, int64_t i, int64_t tick) {
    if (access.times == nullptr) return tick;
    return access.times_per_key ? access.times[i] : access.times[0];
  }
  void RaiseNewestClock(int64_t clock);
  int64_t ClockForNewRows() const;
  void FreeRow(int64_t row);
  std::string FullMessage() const;
  // Clear with structure_mu_ held exclusively.
  void ClearLocked();
  // Remove with structure_mu_ held exclusively.
  void RemoveLocked(const int64_t* keys, int64_t n, int64_t* removed, const ParallelRunner& run);
  // Upsert of a tiered table with structure_mu_ held exclusively.
  Status UpsertTieredLocked(const int64_t* keys, const float* values, int64_t n,
                            const ParallelRunner& run);
  // Upsert with structure_mu_ held (exclusive for tiered tables, whose new rows get tick
  // `recency`).
  Status UpsertLocked(const int64_t* keys, const float* values, int64_t n,
                      const ParallelRunner& run, int64_t recency);
  // Marks a row dead and bumps its generation (its shard lock, or structure_mu_ exclusively,
  // held), so every address to it becomes stale.
  void KillRowLocked(RowMeta& meta);

  const TableConfig config_;
  const int chunk_shift_;
  const uint32_t tag_;
  const int64_t max_rows_;
  // Bytes of a record's embedding: dim elements of emb_dtype, padded to 4 (the slots follow).
  const size_t emb_bytes_;

  // Shared by batch operations, exclusive for structural ones.
  mutable std::shared_mutex structure_mu_;
  // Serializes the row updates of optimizers (UpdateRows, ApplyUpdate; taken before
  // structure_mu_): each update runs in parallel over its rows, and two updates of one table
  // (training steps of several threads or sessions) never interleave their read-modify-write
  // of a row, so no update is lost.
  std::mutex update_mu_;
  // Without an SSD tier every key has a row, so the index is compact: it reads a key and its
  // generation back from the row header through dir_.
  HashIndex index_;

  std::mutex alloc_mu_;
  std::unique_ptr<std::atomic<DirectoryPage*>[]> pages_;
  int64_t num_chunks_ = 0;                  // guarded by alloc_mu_
  std::atomic<int64_t> allocated_rows_{0};  // rows backed by chunks
  int64_t next_row_ = 0;                    // rows handed out since the last Clear; alloc_mu_
  // Rows ever handed out (Clear does not reset it): their headers keep the generations that
  // make old addresses stale, so a re-layout copies all of them. Guarded by alloc_mu_.
  int64_t rows_touched_ = 0;
  std::vector<int64_t> free_rows_;  // guarded by alloc_mu_
  std::atomic<int64_t> size_{0};

  // Admission and eviction (table_admission.h). pending_.shard(s) is guarded by
  // index_.shard(s).mu().
  TableAdmission admission_;
  PendingKeys pending_;

  // Changed only under an exclusive structure_mu_: dir_.row_bytes (dir_: the chunks'
  // directory pages_, the chunk size and the record size), num_slots_, slot_width_.
  RowDirectory dir_;
  int num_slots_ = 0;
  int slot_width_;    // dim until an optimizer with one float per row attaches its slots
  TableSlots slots_;  // the slots' optimizer and initial values (table_slots.h)
  // Changes since the last save (delta checkpoints, HoldsCheckpoint) and push.
  TableChangeSet changes_;
  void BumpVersion() { changes_.BumpVersion(); }
  using ChangeScope = TableChangeScope;
  friend class TableSnapshotView;
  class RowSink;  // the RestoreSink of Restore and ApplyDelta
  // Restarts the change sets of `sets` (kCheckpointChanges, kPushChanges).
  void ResetChangesLocked(uint8_t sets);
  void MarkChanged(int64_t row) {
    if (config_.track_changes) {
      // Writers of one row may race (shared lock): a relaxed atomic store keeps that defined.
      __atomic_store_n(&ChunkOf(row)->changed[OffsetOf(row)], kAllChanges, __ATOMIC_RELAXED);
    }
  }

  // --- The SSD tier (table_tier.h) ---
  static constexpr uint32_t kColdGeneration = (1u << kGenerationBits) - 1;
  // The address an evaluation lookup returns for a cold entry, and whether an address is one.
  int64_t ColdAddress(int64_t entry) const {
    return TagBits() | (static_cast<int64_t>(kColdGeneration) << kRowBits) |
           (entry & ~TableTier::kColdEntry);
  }
  bool IsColdAddress(int64_t address) const {
    return address >= 0 && static_cast<uint32_t>(address >> (kRowBits + kGenerationBits)) == tag_ &&
           ((address >> kRowBits) & ((int64_t{1} << kGenerationBits) - 1)) == kColdGeneration;
  }
  int64_t& TickOf(int64_t row) const { return ChunkOf(row)->ticks[OffsetOf(row)]; }
  int64_t& PriorityOf(int64_t row) const { return ChunkOf(row)->priority[OffsetOf(row)]; }
  // The SSD tier: its state and the operations that move rows between the tiers
  // (table_tier.h); tier_.store is null for an all-in-memory table.
  friend class TableTier;
  TableTier tier_;
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_EMBEDDING_TABLE_H_
