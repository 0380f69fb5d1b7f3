// The table's checkpoints: save ids and commits, consistent snapshots of the rows (and of
// their changes, for delta checkpoints), restoring or applying checkpoint files. The
// whole-table export and import: table_export.cc.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

namespace {
// Ids of saves: random, positive, never 0.
int64_t NewSaveId() {
  static std::mutex mu;
  static std::mt19937_64 rng(
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::lock_guard<std::mutex> lock(mu);
  int64_t id;
  do {
    id = static_cast<int64_t>(rng() >> 2);
  } while (id == 0);
  return id;
}
}  // namespace

Status EmbeddingTable::CommitSave(int64_t save_id) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (save_id != changes_.snapshot_id) {
    return Status::FailedPrecondition("table '" + config_.name + "': save " +
                                      std::to_string(save_id) +
                                      " is not the table's last "
                                      "snapshot; it cannot be committed");
  }
  ResetChangesLocked(kCheckpointChanges);
  changes_.checkpoint_id = save_id;
  changes_.committed_version = changes_.snapshot_version;
  return Status::Ok();
}

bool EmbeddingTable::HoldsCheckpoint(int64_t save_id) const {
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  return save_id != 0 && changes_.checkpoint_id == save_id &&
         changes_.version.load(std::memory_order_relaxed) == changes_.committed_version;
}

Status EmbeddingTable::Snapshot(const std::function<Status(const SnapshotView&)>& fn) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  SnapshotView view;
  view.table_ = this;
  view.changes_ = &changes_;
  CheckpointInfo& info = view.info_;
  info.rows = size_.load();
  info.pending = pending_.size();
  info.num_slots = num_slots_;
  info.slot_width = slot_width_;
  info.emb_dtype = config_.emb_dtype;
  info.update_step = static_cast<int64_t>(update_step_.load(std::memory_order_relaxed));
  info.optimizer = slots_.optimizer;
  info.slot_initial.assign(slots_.initial_values, slots_.initial_values + num_slots_);
  const int64_t newest = admission_.newest_clock.load();
  info.has_clock = newest != kNoClock;
  info.newest_clock = info.has_clock ? newest : 0;
  info.tick = admission_.tick.load();
  info.admitted = admission_.admitted.load();
  info.rejected = admission_.rejected.load();
  info.evicted = admission_.evicted.load();
  info.save_id = changes_.snapshot_id = NewSaveId();
  info.parent_id = changes_.checkpoint_id;
  changes_.snapshot_version = changes_.version.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    view.next_row_ = next_row_;
  }
  return fn(view);
}

void EmbeddingTable::ResetChangesLocked(uint8_t sets) {
  if (!config_.track_changes) return;
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const uint8_t keep = static_cast<uint8_t>(~sets);
  for (int64_t c = 0; c < num_chunks_; ++c) {
    uint8_t* changed = ChunkOf(c << chunk_shift_)->changed.get();
    for (int64_t i = 0; i < rows_per_chunk(); ++i) changed[i] &= keep;
  }
  if (sets & kCheckpointChanges) {
    changes_.removed_keys.clear();
    changes_.removed_keys.shrink_to_fit();
    changes_.cleared_since_save = false;
  }
  if (sets & kPushChanges) {
    changes_.push_removed_keys.clear();
    changes_.push_removed_keys.shrink_to_fit();
    changes_.push_cleared = false;
  }
  if (tier_.store != nullptr) tier_.store->ClearMarks(sets);
}

Status EmbeddingTable::TakeChanges(bool full, const TakeChangesFn& fn, int64_t* since,
                                   int64_t* id) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (!config_.track_changes) {
    return Status::FailedPrecondition("table '" + config_.name +
                                      "' does not track changes: "
                                      "create it with track_changes to push its updates");
  }
  // A first push, or one after the table was cleared or replaced, is of every row.
  full = full || !changes_.push_active || changes_.push_cleared;
  SnapshotView view;
  view.table_ = this;
  view.changes_ = &changes_;
  view.set_ = kPushChanges;
  view.info_.rows = size_.load();
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    view.next_row_ = next_row_;
  }
  REC_SDK_RETURN_IF_ERROR(fn(view, full));
  *since = full ? 0 : changes_.push_id;
  *id = changes_.push_id = NewSaveId();
  ResetChangesLocked(kPushChanges);
  changes_.push_active = true;
  return Status::Ok();
}

Status TableSnapshotView::ForEachRow(const RowFn& fn, bool changed_only) const {
  changed_only = changed_only && table_->config_.track_changes;
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = table_->MetaOf(row);
    if (!meta.alive) continue;
    if (changed_only && !(table_->ChunkOf(row)->changed[table_->OffsetOf(row)] & set_)) continue;
    REC_SDK_RETURN_IF_ERROR(fn(meta.key, table_->RecordOf(row), meta.count, meta.last_seen));
  }
  return table_->tier_.ForEachColdRecord([&](int64_t key, const char* record, uint8_t marks) {
    if (changed_only && !(marks & set_)) return Status::Ok();
    const RowMeta& meta = *reinterpret_cast<const RowMeta*>(record);
    return fn(key, record, meta.count, meta.last_seen);
  });
}

const void* TableSnapshotView::Embedding(const char* record) const {
  return EmbeddingTable::EmbeddingIn(record);
}

size_t TableSnapshotView::embedding_bytes() const {
  return static_cast<size_t>(table_->config_.dim) * RowDtypeBytes(table_->config_.emb_dtype);
}

void TableSnapshotView::ReadEmbedding(const char* record, float* out) const {
  table_->ReadEmbedding(record, out);
}

void TableSnapshotView::ReadSlot(const char* record, int s, float* out) const {
  table_->ReadSlot(record, s, out);
}

Status TableSnapshotView::ForEachPending(const PendingFn& fn) const {
  return table_->pending_.ForEach(
      [&](const PendingKey& p) { return fn(p.key, p.count, p.last_seen); });
}

class EmbeddingTable::RowSink : public RestoreSink {
 public:
  RowSink(EmbeddingTable* t, bool keep_slots, bool upsert)
      : t_(t), keep_slots_(keep_slots), upsert_(upsert) {}
  Status AddRow(int lane, int64_t key, const float* value, const float* const* slots,
                uint32_t count, int64_t last_seen) override {
    std::vector<int64_t>& rows_ = rows_of_[lane];
    size_t& next_ = next_of_[lane];
    const uint64_t hash = t_->index_.Hash(key);
    HashIndex::Shard& shard = t_->index_.shard(HashIndex::ShardOf(hash));
    const int64_t existing = shard.Find(key, hash);
    if (existing >= 0 && !upsert_) {
      return Status::DataLoss("table '" + t_->config_.name + "': key " + std::to_string(key) +
                              " appears twice in the checkpoint");
    }
    // A key pending in one directory and stored in another (AddPending checks the other
    // order): the table would hold it twice, and its next checkpoint would not restore.
    if (!upsert_ && t_->pending_.size() > 0 &&
        t_->pending_.ShardFor(hash).Find(key, hash) != nullptr) {
      return Status::DataLoss("table '" + t_->config_.name + "': key " + std::to_string(key) +
                              " is both stored and pending admission in the checkpoint");
    }
    if (existing >= 0 && TableTier::IsCold(existing)) {
      // A delta's new values for a key on SSD: its record goes, the key is added anew.
      std::lock_guard<std::mutex> lock(cold_mu_);
      t_->tier_.store->Remove(TableTier::IdOf(existing));
      shard.Erase(key, hash);
      t_->size_.fetch_sub(1, std::memory_order_relaxed);
    } else if (existing >= 0) {  // a delta's new values for a stored key
      WriteRow(RowOfEntry(existing), value, slots, count, last_seen);
      return Status::Ok();
    }
    if (next_ == rows_.size() && memory_full_[lane]) {
      return AddCold(lane, key, value, slots, count, last_seen);
    }
    if (next_ == rows_.size()) {
      // A fixed-capacity table hands out exactly the rows announced by ExpectRows (a delta:
      // one at a time), so that no lane sits on rows another lane needs.
      int64_t block = 4096;
      if (!t_->config_.dynamic_expansion) {
        block = upsert_ ? 1 : std::max<int64_t>(1, std::min<int64_t>(block, expected_[lane]));
      }
      t_->AllocateRows(block, &rows_);
      expected_[lane] -= static_cast<int64_t>(rows_.size());
      next_ = 0;
      if (rows_.empty() && t_->tiered()) {
        // The memory rows are taken: the rest of the checkpoint goes to the SSD tier.
        memory_full_[lane] = true;
        return AddCold(lane, key, value, slots, count, last_seen);
      }
      if (rows_.empty()) {
        return Status::ResourceExhausted("restore into table '" + t_->config_.name +
                                         "': the checkpoint has more rows "
                                         "than the table's capacity of " +
                                         std::to_string(t_->Capacity()) + " rows");
      }
    }
    const int64_t row = rows_[next_++];
    WriteRow(row, value, slots, count, last_seen);
    RowMeta& meta = t_->MetaOf(row);
    meta.key = key;
    meta.slots_unset = 0;
    __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
    shard.Insert(key, hash, IndexEntry(row, meta.generation));
    t_->size_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  void WriteRow(int64_t row, const float* value, const float* const* slots, uint32_t count,
                int64_t last_seen) {
    char* dst = t_->RecordOf(row);
    t_->WriteEmbedding(dst, value);
    for (int s = 0; s < t_->num_slots_; ++s) {
      if (keep_slots_ && slots != nullptr && slots[s] != nullptr) {
        t_->WriteSlot(dst, s, slots[s]);
      } else {
        t_->FillSlot(dst, s, t_->slots_.initial_values[s]);
      }
    }
    RowMeta& meta = t_->MetaOf(row);
    meta.last_seen = last_seen;
    meta.count = count;
  }
  Status AddPending(int64_t key, int64_t count, int64_t last_seen) override {
    const uint64_t hash = t_->index_.Hash(key);
    PendingShard& pending = t_->pending_.ShardFor(hash);
    if (count < 0 || pending.Find(key, hash) != nullptr ||
        t_->index_.shard(HashIndex::ShardOf(hash)).Find(key, hash) >= 0) {
      return Status::DataLoss("table '" + t_->config_.name + "': pending key " +
                              std::to_string(key) + " is invalid or repeated in the checkpoint");
    }
    pending.Add(key, hash, last_seen)->count = count;
    t_->pending_.Added(1);
    return Status::Ok();
  }
  // Rows past the memory rows of a tiered table: batched per lane, appended to the store
  // under cold_mu_ (lanes run in parallel; each indexes only its own shards).
  Status AddCold(int lane, int64_t key, const float* value, const float* const* slots,
                 uint32_t count, int64_t last_seen) {
    ColdBatch& batch = cold_of_[lane];
    const size_t bytes = t_->dir_.row_bytes;
    batch.records.resize((batch.keys.size() + 1) * bytes);
    const float* const* kept = keep_slots_ ? slots : nullptr;
    t_->tier_.FillRecord(batch.records.data() + batch.keys.size() * bytes, key, last_seen, count,
                         value, kept, false);
    batch.keys.push_back(static_cast<uint64_t>(key));
    batch.tags.push_back(last_seen);
    if (batch.keys.size() >= kColdBatch) return FlushCold(lane);
    return Status::Ok();
  }
  Status FlushCold(int lane) {
    ColdBatch& batch = cold_of_[lane];
    const size_t n = batch.keys.size();
    if (n == 0) return Status::Ok();
    std::vector<uint64_t> where(n);
    {
      std::lock_guard<std::mutex> lock(cold_mu_);
      const int64_t ssd_rows = t_->config_.ssd_rows;
      if (ssd_rows > 0 && static_cast<int64_t>(t_->tier_.store->live() + n) > ssd_rows) {
        return Status::ResourceExhausted("restore into table '" + t_->config_.name +
                                         "': the checkpoint has more rows than "
                                         "the table holds: " +
                                         std::to_string(t_->config_.capacity) + " in memory and " +
                                         std::to_string(ssd_rows) + " on SSD");
      }
      std::vector<const void*> records(n);
      for (size_t j = 0; j < n; ++j) records[j] = batch.records.data() + j * t_->dir_.row_bytes;
      REC_SDK_RETURN_IF_ERROR(t_->tier_.store->AppendBatch(n, batch.keys.data(), records.data(),
                                                           batch.tags.data(), where.data()));
    }
    for (size_t j = 0; j < n; ++j) {
      const int64_t key = static_cast<int64_t>(batch.keys[j]);
      const uint64_t hash = t_->index_.Hash(key);
      HashIndex::Shard& shard = t_->index_.shard(HashIndex::ShardOf(hash));
      if (shard.Find(key, hash) >= 0) {
        return Status::DataLoss("table '" + t_->config_.name + "': key " + std::to_string(key) +
                                " appears twice in the checkpoint");
      }
      shard.Insert(key, hash, TableTier::ColdEntry(where[j]));
      t_->size_.fetch_add(1, std::memory_order_relaxed);
    }
    batch.keys.clear();
    batch.tags.clear();
    batch.records.clear();
    return Status::Ok();
  }
  // Writes the rows still batched (after the feed succeeded).
  Status Finish() {
    for (int l = 0; l < kRestoreLanes; ++l) REC_SDK_RETURN_IF_ERROR(FlushCold(l));
    return Status::Ok();
  }
  void ExpectRows(int lane, int64_t n) override { expected_[lane] += n; }
  int LaneOf(int64_t key) const override { return t_->RestoreLaneOf(key); }
  void Prefetch(int64_t key) const override {
    const uint64_t hash = t_->index_.Hash(key);
    t_->index_.shard(HashIndex::ShardOf(hash)).Prefetch(hash);
  }
  void ReleaseUnused() {
    for (int l = 0; l < kRestoreLanes; ++l) {
      if (next_of_[l] < rows_of_[l].size()) {
        t_->ReleaseRows(rows_of_[l].data() + next_of_[l], rows_of_[l].size() - next_of_[l]);
      }
      rows_of_[l].clear();
      next_of_[l] = 0;
    }
  }

 private:
  EmbeddingTable* t_;
  const bool keep_slots_;
  const bool upsert_;
  // Rows taken from the allocator, per lane.
  std::vector<int64_t> rows_of_[kRestoreLanes];
  size_t next_of_[kRestoreLanes] = {};
  int64_t expected_[kRestoreLanes] = {};  // rows announced and not yet allocated, per lane
  bool memory_full_[kRestoreLanes] = {};  // tiered: the lane's rows go to the SSD tier
  static constexpr size_t kColdBatch = 1024;
  struct ColdBatch {
    std::vector<uint64_t> keys;
    std::vector<int64_t> tags;
    std::vector<char> records;
  };
  ColdBatch cold_of_[kRestoreLanes];
  std::mutex cold_mu_;
};

Status EmbeddingTable::Restore(const CheckpointInfo& info,
                               const std::function<Status(RestoreSink*)>& feed, std::string* note) {
  if (info.num_slots < 0 || info.num_slots > kMaxSlots ||
      static_cast<int>(info.slot_initial.size()) != info.num_slots) {
    return Status::InvalidArgument("restore into table '" + config_.name +
                                   "': " + std::to_string(info.num_slots) + " slots (at most " +
                                   std::to_string(kMaxSlots) + ")");
  }
  int width;
  REC_SDK_RETURN_IF_ERROR(ResolveSlotWidth(info.slot_width, "restore", &width));
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::string what;
  bool keep_slots;
  if (slots_.values_known && !slots_.from_checkpoint) {
    // An optimizer already trains this table: keep its slots only if they are the same.
    keep_slots = info.num_slots == num_slots_ && info.optimizer == slots_.optimizer &&
                 (num_slots_ == 0 || width == slot_width_);
    if (keep_slots) {
      what = info.num_slots > 0 ? "slots of '" + info.optimizer + "' restored" : "";
    } else {
      what = "the checkpoint's slots" +
             (info.optimizer.empty() ? std::string() : " of optimizer '" + info.optimizer + "'") +
             " were dropped: the table is trained by '" + slots_.optimizer +
             "', whose slots start from their initial values";
    }
  } else {
    keep_slots = true;
    if (info.num_slots != num_slots_ || (info.num_slots > 0 && width != slot_width_)) {
      std::lock_guard<std::mutex> lock(alloc_mu_);
      REC_SDK_RETURN_IF_ERROR(RelayoutLocked(info.num_slots, width, info.slot_initial.data()));
    }
    for (int s = 0; s < info.num_slots; ++s) slots_.initial_values[s] = info.slot_initial[s];
    slots_.optimizer = info.optimizer;
    slots_.values_known = info.num_slots > 0;
    slots_.from_checkpoint = info.num_slots > 0;
    if (info.num_slots > 0) what = "slots of '" + info.optimizer + "' restored";
  }
  ClearLocked();
  changes_.checkpoint_id = 0;  // until the restore succeeds: an emptied table holds no checkpoint
  // Size the index for the rows to come (one rehash instead of one per doubling).
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    index_.shard(s).Reserve(static_cast<size_t>(info.rows / HashIndex::kNumShards * 11 / 10));
  }
  admission_.admitted.store(info.admitted);
  admission_.rejected.store(info.rejected);
  admission_.evicted.store(info.evicted);
  admission_.tick.store(info.tick);
  admission_.newest_clock.store(info.has_clock ? info.newest_clock : kNoClock);
  update_step_.store(static_cast<uint64_t>(info.update_step), std::memory_order_relaxed);

  RowSink sink(this, keep_slots, /*upsert=*/false);
  Status status = feed(&sink);
  if (status.ok()) status = sink.Finish();
  sink.ReleaseUnused();
  if (!status.ok()) {
    ClearLocked();
    return status;
  }
  ResetChangesLocked(kCheckpointChanges);  // the table now equals the checkpoint
  changes_.checkpoint_id = info.save_id;
  changes_.committed_version = changes_.version.load(std::memory_order_relaxed);
  if (note != nullptr) *note = what;
  return Status::Ok();
}

Status EmbeddingTable::ApplyDelta(const CheckpointInfo& info, bool cleared,
                                  const std::vector<int64_t>& removed,
                                  const std::function<Status(RestoreSink*)>& feed) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (info.num_slots != num_slots_ || (info.num_slots > 0 && info.optimizer != slots_.optimizer)) {
    return Status::FailedPrecondition(
        "delta checkpoint for table '" + config_.name + "' has " + std::to_string(info.num_slots) +
        " slots of optimizer '" + info.optimizer + "' but the table has " +
        std::to_string(num_slots_) + " of '" + slots_.optimizer +
        "': apply deltas onto the full checkpoint they follow, restored into a table of the "
        "same optimizer (a restore into a table of another optimizer drops the slots)");
  }
  if (info.parent_id != changes_.checkpoint_id) {
    return Status::FailedPrecondition("delta checkpoint " + std::to_string(info.save_id) +
                                      " of table '" + config_.name + "' follows checkpoint " +
                                      std::to_string(info.parent_id) + " but the table holds " +
                                      std::to_string(changes_.checkpoint_id) +
                                      ": restore the full checkpoint it follows and apply "
                                      "every delta in order");
  }
  if (changes_.version.load(std::memory_order_relaxed) != changes_.committed_version) {
    return Status::FailedPrecondition(
        "table '" + config_.name + "' changed after it got checkpoint " +
        std::to_string(changes_.checkpoint_id) +
        " (a training lookup, update, upsert, removal or "
        "eviction): delta checkpoint " +
        std::to_string(info.save_id) +
        " applies only onto "
        "that checkpoint unchanged; restore it again and apply the deltas before training");
  }
  if (cleared) ClearLocked();
  for (const int64_t key : removed) {
    const uint64_t hash = index_.Hash(key);
    const int64_t entry = index_.shard(HashIndex::ShardOf(hash)).Erase(key, hash);
    if (entry < 0) continue;
    if (TableTier::IsCold(entry)) {
      tier_.DropColdRecordLocked(key, entry, /*evicted=*/false);
      continue;
    }
    const int64_t row = RowOfEntry(entry);
    KillRowLocked(MetaOf(row));
    size_.fetch_sub(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(alloc_mu_);
    free_rows_.push_back(row);
  }
  // The delta carries the whole pending set.
  for (int s = 0; s < HashIndex::kNumShards; ++s) pending_.shard(s).Clear();
  pending_.ResetSize();
  admission_.admitted.store(info.admitted);
  admission_.rejected.store(info.rejected);
  admission_.evicted.store(info.evicted);
  admission_.tick.store(info.tick);
  admission_.newest_clock.store(info.has_clock ? info.newest_clock : kNoClock);
  update_step_.store(static_cast<uint64_t>(info.update_step), std::memory_order_relaxed);
  RowSink sink(this, /*keep_slots=*/true, /*upsert=*/true);
  Status status = feed(&sink);
  if (status.ok()) status = sink.Finish();
  sink.ReleaseUnused();
  if (!status.ok()) {
    ClearLocked();
    changes_.checkpoint_id = 0;  // emptied: it holds no checkpoint, no delta applies to it
    return status;
  }
  ResetChangesLocked(kCheckpointChanges);
  // The next push is of the whole table (the delta's rows are not marked as pushed changes).
  if (changes_.push_active) changes_.push_cleared = true;
  changes_.checkpoint_id = info.save_id;
  changes_.committed_version = changes_.version.load(std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace rec_sdk
