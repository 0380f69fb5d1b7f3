// The SSD tier of a table larger than memory (TableTier, table_tier.h): promotion of a batch's
// cold keys, demotion of the least recently used rows, room and compaction of the record
// store, the cold-record helpers the table's other operations use, and PrefetchCold.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tf_ops/core/cold_store.h"
#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

namespace {
// A lookup that needs rows demotes at least 1/kDemoteShare of the memory rows, so that a
// table at its memory budget scans for victims once every few lookups, not on each.
constexpr int64_t kDemoteShare = 64;
}  // namespace

Status TableTier::OpenColdTier(size_t record_bytes, std::unique_ptr<ColdTier>* out) const {
  ColdStore::Options options;
  options.directories = t_->config_.ssd_paths;
  options.record_bytes = record_bytes;
  // Segments of about 1/8 of the memory rows (64 to 65536 records): compaction then moves a
  // bounded share of the records at a time.
  uint32_t per_segment = 64;
  while (per_segment < 65536 && per_segment < t_->config_.capacity / 8) per_segment *= 2;
  options.records_per_segment = per_segment;
  options.direct_io = t_->config_.ssd_direct_io;
  Status status = OpenFileColdTier(options, out);
  if (!status.ok()) {
    return Status(status.code(), "table '" + t_->config_.name + "': SSD tier: " + status.message());
  }
  return Status::Ok();
}

Status TableTier::ReadColdRecord(int64_t entry, int64_t key, char* record) const {
  uint64_t stored = 0;
  REC_SDK_RETURN_IF_ERROR(store->Read(IdOf(entry), record, &stored));
  REC_SDK_RETURN_IF_ERROR(CheckColdKey(key, stored));
  FillUnsetSlots(record);
  return Status::Ok();
}

Status TableTier::CheckColdKey(int64_t key, uint64_t stored) const {
  if (static_cast<int64_t>(stored) == key) return Status::Ok();
  return Status::DataLoss("table '" + t_->config_.name + "': the SSD record of key " +
                          std::to_string(key) + " holds key " +
                          std::to_string(static_cast<int64_t>(stored)));
}

void TableTier::FillUnsetSlots(char* record) const {
  RowMeta* meta = reinterpret_cast<RowMeta*>(record);
  if (!(meta->slots_unset && t_->slots_.values_known)) return;
  for (int s = 0; s < t_->num_slots_; ++s) {
    t_->FillSlot(record, s, t_->slots_.initial_values[s]);
  }
  meta->slots_unset = 0;
}

Status TableTier::GatherCold(int64_t address, float* out) const {
  const uint64_t id = static_cast<uint64_t>(address & (t_->kMaxRows - 1));
  if (!store->IsLive(id)) {
    return Status::InvalidArgument("address " + std::to_string(address) + " of table '" +
                                   t_->config_.name +
                                   "' is stale: its row left the SSD tier after "
                                   "the address was looked up");
  }
  thread_local std::vector<char> record;
  record.resize(t_->dir_.row_bytes);
  REC_SDK_RETURN_IF_ERROR(store->Read(id, record.data(), nullptr));
  t_->ReadEmbedding(record.data(), out);
  return Status::Ok();
}

Status TableTier::ForEachColdRecord(
    const std::function<Status(int64_t key, const char* record, uint8_t marks)>& fn) const {
  if (store == nullptr) return Status::Ok();
  std::vector<char> copy(t_->dir_.row_bytes);
  return store->ForEachLive([&](uint64_t key, uint64_t where, const void* record) {
    const RowMeta* meta = static_cast<const RowMeta*>(record);
    const uint8_t marks = store->marks(where);
    if (!(meta->slots_unset && t_->slots_.values_known)) {
      return fn(static_cast<int64_t>(key), static_cast<const char*>(record), marks);
    }
    std::memcpy(copy.data(), record, t_->dir_.row_bytes);
    FillUnsetSlots(copy.data());
    return fn(static_cast<int64_t>(key), copy.data(), marks);
  });
}

void TableTier::FillRecord(char* record, int64_t key, int64_t last_seen, uint32_t count,
                           const float* value, const float* const* slots, bool slots_unset) const {
  std::memset(record, 0, t_->dir_.row_bytes);
  RowMeta* meta = reinterpret_cast<RowMeta*>(record);
  meta->key = key;
  meta->last_seen = last_seen;
  meta->count = count;
  meta->slots_unset = slots_unset;
  t_->WriteEmbedding(record, value);
  for (int s = 0; s < t_->num_slots_; ++s) {
    if (slots != nullptr && slots[s] != nullptr) {
      t_->WriteSlot(record, s, slots[s]);
    } else {
      t_->FillSlot(record, s, t_->slots_.initial_values[s]);
    }
  }
}

Status TableTier::TieredFindOrInsert(const int64_t* keys, int64_t n, int64_t* addresses,
                                     const ParallelRunner& run, const KeyAccess& access) {
  const int64_t tick = t_->admission_.tick.fetch_add(1, std::memory_order_relaxed) + 1;
  std::unique_lock<std::shared_mutex> structure(t_->structure_mu_);
  const int64_t recency = this->tick.fetch_add(1, std::memory_order_relaxed) + 1;
  REC_SDK_RETURN_IF_ERROR(PromoteLocked(keys, n, recency, run));
  // Every key of the batch is now in memory or absent: the lookup runs as in memory.
  auto touch = [&]() {
    run(n, 10, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        if (addresses[i] < 0) continue;
        const int64_t row = addresses[i] & (t_->kMaxRows - 1);
        // Rows the promotion did not see are new: they start on probation.
        if (t_->TickOf(row) != recency) t_->PriorityOf(row) = recency - kProbationTicks;
        t_->TickOf(row) = recency;
      }
    });
  };
  int64_t unplaced = 0;
  t_->InsertPass(keys, n, addresses, access, tick, /*count=*/true, &unplaced, run);
  touch();
  if (unplaced > 0) {
    // New keys found no free row: demote, then place them without counting them twice.
    REC_SDK_RETURN_IF_ERROR(
        DemoteLocked(unplaced, std::max<int64_t>(1, t_->config_.capacity / kDemoteShare), recency));
    unplaced = 0;
    t_->InsertPass(keys, n, addresses, access, tick, /*count=*/false, &unplaced, run);
    touch();
  }
  if (unplaced > 0) {
    return Status::ResourceExhausted(
        "table '" + t_->config_.name +
        "': a batch holds more keys than the table keeps in "
        "memory (" +
        std::to_string(t_->config_.capacity) + " rows, " + std::to_string(unplaced) +
        " keys left without one); raise device_vocabulary_size + host_vocabulary_size or use "
        "smaller batches");
  }
  // Compaction only gives disk space back: when it cannot write (a full disk), every record
  // stays where it was and the lookup has succeeded; it is tried again after the next one.
  CompactLocked();
  return Status::Ok();
}

Status TableTier::PromoteLocked(const int64_t* keys, int64_t n, int64_t tick,
                                const ParallelRunner& run) {
  // The batch's cold entries, per index shard (shards run in parallel).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cold_of(HashIndex::kNumShards);
  t_->index_.ForEachShard(
      keys, n, 60,
      [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
          const uint64_t* hashes) {
        auto& cold = cold_of[HashIndex::ShardOf(hashes[positions[0]])];
        HashIndex::ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) {
          const int64_t entry = shard.Find(keys[i], hashes[i]);
          if (entry < 0) return;
          if (IsCold(entry)) {
            cold.emplace_back(entry, keys[i]);
          } else {
            t_->TickOf(t_->RowOfEntry(entry)) = tick;
            t_->PriorityOf(t_->RowOfEntry(entry)) = tick;
          }
        });
      },
      run);
  std::vector<std::pair<int64_t, int64_t>> cold;  // (entry, key), in file order
  for (auto& part : cold_of) cold.insert(cold.end(), part.begin(), part.end());
  if (cold.empty()) return Status::Ok();
  std::sort(cold.begin(), cold.end());
  cold.erase(std::unique(cold.begin(), cold.end()), cold.end());  // keys repeated in the batch
  const int64_t m = static_cast<int64_t>(cold.size());
  const int64_t free_rows = t_->FreeRowCount();
  if (free_rows < m) {
    REC_SDK_RETURN_IF_ERROR(DemoteLocked(
        m - free_rows, std::max<int64_t>(1, t_->config_.capacity / kDemoteShare), tick));
  }
  std::vector<int64_t> rows;
  t_->AllocateRows(m, &rows);
  if (static_cast<int64_t>(rows.size()) < m) {
    t_->ReleaseRows(rows.data(), rows.size());
    return Status::ResourceExhausted(
        "table '" + t_->config_.name + "': a batch holds " + std::to_string(m) +
        " keys on SSD "
        "and the table keeps " +
        std::to_string(t_->config_.capacity) +
        " rows in memory; raise "
        "device_vocabulary_size + host_vocabulary_size or use smaller batches");
  }
  // Fill the rows (free: nothing else reads them) from the records read ahead, and read the
  // others from the store, many at once; each row keeps its generation.
  std::vector<uint16_t> generations(m);
  std::vector<uint64_t> to_read;
  std::vector<void*> into;
  std::vector<int64_t> read_at;
  int64_t hits = 0;
  for (int64_t j = 0; j < m; ++j) {
    generations[j] = t_->MetaOf(rows[j]).generation;
    if (TakeStaged(cold[j].second, cold[j].first, t_->RecordOf(rows[j]))) {
      ++hits;
      continue;
    }
    to_read.push_back(IdOf(cold[j].first));
    into.push_back(t_->RecordOf(rows[j]));
    read_at.push_back(j);
  }
  std::vector<uint64_t> stored(to_read.size());
  Status error = store->ReadMany(to_read.size(), to_read.data(), into.data(), stored.data());
  for (size_t r = 0; r < read_at.size() && error.ok(); ++r) {
    error = CheckColdKey(cold[read_at[r]].second, stored[r]);
  }
  for (int64_t j = 0; j < m && error.ok(); ++j) FillUnsetSlots(t_->RecordOf(rows[j]));
  if (!error.ok()) {
    for (int64_t j = 0; j < m; ++j) t_->MetaOf(rows[j]).generation = generations[j];
    t_->ReleaseRows(rows.data(), rows.size());
    return error;
  }
  for (int64_t j = 0; j < m; ++j) {
    const int64_t row = rows[j], entry = cold[j].first, key = cold[j].second;
    const uint64_t where = IdOf(entry);
    RowMeta& meta = t_->MetaOf(row);
    meta.generation = generations[j];
    __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
    if (t_->config_.track_changes) {
      t_->ChunkOf(row)->changed[t_->OffsetOf(row)] = store->marks(where);
    }
    t_->TickOf(row) = tick;
    t_->PriorityOf(row) = tick - kProbationTicks;
    const uint64_t hash = t_->index_.Hash(key);
    t_->index_.shard(HashIndex::ShardOf(hash)).Set(key, hash, t_->IndexEntry(row, meta.generation));
    store->Remove(where);
  }
  promotions.fetch_add(m, std::memory_order_relaxed);
  prefetch_hits.fetch_add(hits, std::memory_order_relaxed);
  return Status::Ok();
}

bool TableTier::TakeStaged(int64_t key, int64_t entry, char* record) {
  std::lock_guard<std::mutex> lock(staging_mu);
  auto found = staged.find(key);
  if (found == staged.end()) return false;
  const bool valid = found->second.number == IdOf(entry) &&
                     found->second.generation == staging_generation.load(std::memory_order_relaxed);
  if (valid) std::memcpy(record, found->second.record.data(), t_->dir_.row_bytes);
  staged.erase(found);  // used, or stale (the key moved since it was read)
  return valid;
}

void TableTier::DropStaged() {
  staging_generation.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(staging_mu);
  staged.clear();
  staged_order.clear();
}

Status EmbeddingTable::PrefetchCold(const int64_t* keys, int64_t n, int64_t* read,
                                    const ParallelRunner& run) {
  if (read != nullptr) *read = 0;
  if (tier_.store == nullptr) return Status::Ok();
  // Under the shared lock: which keys are cold, and their records pinned (a pinned record
  // stays readable if a compaction deletes its segment meanwhile).
  std::vector<std::pair<int64_t, int64_t>> cold;  // (key, entry)
  std::unique_ptr<ColdTier::Pinned> pinned;
  uint64_t generation;
  size_t record_bytes;
  std::shared_ptr<ColdTier> store;
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    std::mutex cold_mu;
    index_.ForEachShard(
        keys, n, 60,
        [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
            const uint64_t* hashes) {
          std::vector<std::pair<int64_t, int64_t>> mine;
          HashIndex::ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) {
            const int64_t entry = shard.Find(keys[i], hashes[i]);
            if (entry >= 0 && TableTier::IsCold(entry)) mine.emplace_back(keys[i], entry);
          });
          std::lock_guard<std::mutex> lock(cold_mu);
          cold.insert(cold.end(), mine.begin(), mine.end());
        },
        run);
    std::sort(cold.begin(), cold.end());
    cold.erase(std::unique(cold.begin(), cold.end()), cold.end());
    {
      std::lock_guard<std::mutex> lock(tier_.staging_mu);
      cold.erase(std::remove_if(cold.begin(), cold.end(),
                                [&](const std::pair<int64_t, int64_t>& c) {
                                  auto found = tier_.staged.find(c.first);
                                  return found != tier_.staged.end() &&
                                         found->second.number == TableTier::IdOf(c.second);
                                }),
                 cold.end());
    }
    std::vector<uint64_t> ids(cold.size());
    for (size_t j = 0; j < cold.size(); ++j) ids[j] = TableTier::IdOf(cold[j].second);
    REC_SDK_RETURN_IF_ERROR(tier_.store->PinMany(ids.size(), ids.data(), &pinned));
    generation = tier_.staging_generation.load(std::memory_order_relaxed);
    record_bytes = dir_.row_bytes;
    store = tier_.store;
  }
  const size_t m = cold.size();
  if (m == 0) return Status::Ok();
  std::vector<std::vector<char>> records(m, std::vector<char>(record_bytes));
  std::vector<void*> into(m);
  for (size_t j = 0; j < m; ++j) into[j] = records[j].data();
  std::vector<uint64_t> stored(m);
  REC_SDK_RETURN_IF_ERROR(store->ReadPinned(*pinned, into.data(), stored.data()));
  const size_t limit = static_cast<size_t>(std::max<int64_t>(1024, config_.capacity / 16));
  std::lock_guard<std::mutex> lock(tier_.staging_mu);
  for (size_t j = 0; j < m; ++j) {
    if (static_cast<int64_t>(stored[j]) != cold[j].first) continue;  // not ours any more
    TableTier::Staged& staged = tier_.staged[cold[j].first];
    staged.number = TableTier::IdOf(cold[j].second);
    staged.generation = generation;
    staged.record = std::move(records[j]);
    tier_.staged_order.push_back(cold[j].first);
  }
  // The oldest records read ahead go first (a key's order entry may outlive its record).
  while (tier_.staged.size() > limit && !tier_.staged_order.empty()) {
    tier_.staged.erase(tier_.staged_order.front());
    tier_.staged_order.pop_front();
  }
  if (tier_.staged_order.size() > 4 * limit) {
    std::deque<int64_t> kept;
    for (int64_t key : tier_.staged_order) {
      if (tier_.staged.count(key)) kept.push_back(key);
    }
    tier_.staged_order.swap(kept);
  }
  if (read != nullptr) *read = static_cast<int64_t>(m);
  return Status::Ok();
}

Status TableTier::DemoteLocked(int64_t needed, int64_t extra, int64_t tick) {
  // The extra rows only while the SSD tier has room for them without evicting.
  int64_t count = needed + extra;
  if (t_->config_.ssd_rows > 0) {
    const int64_t room = t_->config_.ssd_rows - static_cast<int64_t>(store->live());
    count = std::max(needed, std::min(count, room));
  }
  // (priority, key, row): ties of priority go by key, and the rows move in key order, so that
  // which keys go to SSD, and the records they get, do not depend on the rows a batch got
  // (the index's seed and the threads decide those).
  using Candidate = std::tuple<int64_t, int64_t, int64_t>;
  std::vector<Candidate> candidates, protected_rows;
  {
    std::lock_guard<std::mutex> lock(t_->alloc_mu_);
    for (int64_t row = 0; row < t_->next_row_; ++row) {
      const int64_t used = t_->TickOf(row);
      if (used == tick || !t_->MetaOf(row).alive) continue;
      if (used >= tick - t_->kProtectedTicks) {
        protected_rows.emplace_back(t_->PriorityOf(row), t_->MetaOf(row).key, row);
      } else {
        candidates.emplace_back(t_->PriorityOf(row), t_->MetaOf(row).key, row);
      }
    }
  }
  auto oldest = [](std::vector<Candidate>& from, int64_t want) {
    want = std::min<int64_t>(want, static_cast<int64_t>(from.size()));
    if (want > 0) std::nth_element(from.begin(), from.begin() + (want - 1), from.end());
    from.resize(std::max<int64_t>(want, 0));
  };
  oldest(candidates, count);
  oldest(protected_rows, count - static_cast<int64_t>(candidates.size()));
  candidates.insert(candidates.end(), protected_rows.begin(), protected_rows.end());
  const size_t m = candidates.size();
  if (m == 0) return Status::Ok();
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
  REC_SDK_RETURN_IF_ERROR(ColdRoomLocked(static_cast<int64_t>(m)));
  std::vector<uint64_t> keys(m);
  std::vector<const void*> records(m);
  std::vector<int64_t> tags(m);
  for (size_t j = 0; j < m; ++j) {
    const int64_t row = std::get<2>(candidates[j]);
    keys[j] = static_cast<uint64_t>(t_->MetaOf(row).key);
    records[j] = t_->RecordOf(row);
    tags[j] = t_->MetaOf(row).last_seen;
  }
  std::vector<uint64_t> where(m);
  Status status = store->AppendBatch(m, keys.data(), records.data(), tags.data(), where.data());
  if (!status.ok()) {
    return Status(status.code(), "table '" + t_->config_.name + "': cannot move " +
                                     std::to_string(m) +
                                     " rows to SSD (the step fails, no "
                                     "row is lost): " +
                                     status.message());
  }
  std::lock_guard<std::mutex> lock(t_->alloc_mu_);
  for (size_t j = 0; j < m; ++j) {
    const int64_t row = std::get<2>(candidates[j]);
    RowMeta& meta = t_->MetaOf(row);
    if (t_->config_.track_changes && t_->ChunkOf(row)->changed[t_->OffsetOf(row)]) {
      store->set_marks(where[j], t_->ChunkOf(row)->changed[t_->OffsetOf(row)]);
    }
    const uint64_t hash = t_->index_.Hash(meta.key);
    t_->index_.shard(HashIndex::ShardOf(hash)).Set(meta.key, hash, ColdEntry(where[j]));
    t_->KillRowLocked(meta);
    t_->free_rows_.push_back(row);
  }
  demotions.fetch_add(static_cast<int64_t>(m), std::memory_order_relaxed);
  return Status::Ok();
}

Status TableTier::ColdRoomLocked(int64_t count) {
  const int64_t live = static_cast<int64_t>(store->live());
  if (t_->config_.ssd_rows == 0 || live + count <= t_->config_.ssd_rows) return Status::Ok();
  if (!t_->config_.evict_when_full) {
    return Status::ResourceExhausted(t_->FullMessage());
  }
  // Evict the least recently seen records (their tags are last-seen clocks), about 1% of
  // the SSD rows more than needed.
  const int64_t want = std::min<int64_t>(
      live, live + count - t_->config_.ssd_rows + std::max<int64_t>(1, t_->config_.ssd_rows / 100));
  std::vector<std::pair<int64_t, uint64_t>> oldest;  // (last seen, record number)
  oldest.reserve(static_cast<size_t>(live));
  store->ForEachLiveTag([&](uint64_t id, int64_t tag) { oldest.emplace_back(tag, id); });
  if (want > 0) std::nth_element(oldest.begin(), oldest.begin() + (want - 1), oldest.end());
  for (int64_t j = 0; j < want; ++j) {
    uint64_t key = 0;
    REC_SDK_RETURN_IF_ERROR(store->ReadKey(oldest[j].second, &key));
    RemoveColdLocked(static_cast<int64_t>(key), kColdEntry | static_cast<int64_t>(oldest[j].second),
                     /*evicted=*/true);
  }
  if (live - want + count > t_->config_.ssd_rows) {
    return Status::ResourceExhausted(t_->FullMessage());
  }
  return Status::Ok();
}

void TableTier::RemoveColdLocked(int64_t key, int64_t entry, bool evicted) {
  const uint64_t hash = t_->index_.Hash(key);
  t_->index_.shard(HashIndex::ShardOf(hash)).Erase(key, hash);
  DropColdRecordLocked(key, entry, evicted);
}

void TableTier::DropColdRecordLocked(int64_t key, int64_t entry, bool evicted) {
  store->Remove(IdOf(entry));
  t_->size_.fetch_sub(1, std::memory_order_relaxed);
  if (evicted) t_->admission_.evicted.fetch_add(1, std::memory_order_relaxed);
  // The table's changes_.removed_keys is guarded by its alloc_mu_ or the exclusive
  // structure_mu_ held here.
  if (t_->config_.track_changes) t_->changes_.NoteRemoved(key);
}

Status TableTier::CompactLocked() {
  if (!store->NeedsCompaction()) return Status::Ok();
  return store->Compact([&](uint64_t key, uint64_t, uint64_t to) {
    const int64_t k = static_cast<int64_t>(key);
    const uint64_t hash = t_->index_.Hash(k);
    t_->index_.shard(HashIndex::ShardOf(hash)).Set(k, hash, ColdEntry(to));
  });
}

Status TableTier::RelayoutColdLocked(int num_slots, int width, const float* initial_values,
                                     bool reset_slots) {
  const size_t new_bytes = t_->RowBytesFor(num_slots, width);
  std::unique_ptr<ColdTier> fresh;
  REC_SDK_RETURN_IF_ERROR(OpenColdTier(new_bytes, &fresh));
  const int kept =
      reset_slots || width != t_->slot_width_ ? 0 : std::min(t_->num_slots_, num_slots);
  const size_t slots_at = sizeof(RowMeta) + t_->emb_bytes_;
  const size_t slot_bytes = t_->SlotBytesFor(width);
  const size_t kept_bytes = slots_at + size_t(kept) * slot_bytes;
  std::vector<char> record(new_bytes);
  std::vector<std::pair<int64_t, uint64_t>> moved;
  moved.reserve(store->live());
  Status status = store->ForEachLive([&](uint64_t key, uint64_t from, const void* old) -> Status {
    std::memcpy(record.data(), old, kept_bytes);
    for (int s = kept; s < num_slots; ++s) {
      FillRow(t_->SlotDtypeFor(width), initial_values[s], width,
              record.data() + slots_at + s * slot_bytes);
    }
    uint64_t to;
    REC_SDK_RETURN_IF_ERROR(fresh->Append(key, record.data(), store->tag(from), &to));
    if (store->marks(from)) fresh->set_marks(to, store->marks(from));
    moved.emplace_back(static_cast<int64_t>(key), to);
    return Status::Ok();
  });
  if (!status.ok()) return status;  // the old store and index stay as they were
  for (const auto& [key, to] : moved) {
    const uint64_t hash = t_->index_.Hash(key);
    t_->index_.shard(HashIndex::ShardOf(hash)).Set(key, hash, ColdEntry(to));
  }
  store = std::move(fresh);
  DropStaged();
  return Status::Ok();
}

}  // namespace rec_sdk
