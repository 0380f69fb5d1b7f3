// The SSD tier of a table larger than memory: promotion of a batch's cold keys, demotion of
// the least recently used rows, room and compaction of the record store, and the cold-record
// helpers the table's other operations use (see "The SSD tier" in embedding_table.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
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

Status EmbeddingTable::OpenColdTier(size_t record_bytes, std::unique_ptr<ColdTier>* out) const {
  ColdStore::Options options;
  options.directories = config_.ssd_paths;
  options.record_bytes = record_bytes;
  // Segments of about 1/8 of the memory rows (64 to 65536 records): compaction then moves a
  // bounded share of the records at a time.
  uint32_t per_segment = 64;
  while (per_segment < 65536 && per_segment < config_.capacity / 8) per_segment *= 2;
  options.records_per_segment = per_segment;
  options.direct_io = config_.ssd_direct_io;
  Status status = OpenFileColdTier(options, out);
  if (!status.ok()) {
    return Status(status.code(), "table '" + config_.name + "': SSD tier: " + status.message());
  }
  return Status::Ok();
}

int64_t EmbeddingTable::FreeRowCount() {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return static_cast<int64_t>(free_rows_.size()) + (max_rows_ - next_row_);
}

Status EmbeddingTable::ReadColdRecord(int64_t entry, int64_t key, char* record) const {
  uint64_t stored = 0;
  REC_SDK_RETURN_IF_ERROR(tier_.store->Read(IdOf(entry), record, &stored));
  REC_SDK_RETURN_IF_ERROR(CheckColdKey(key, stored));
  FillUnsetSlots(record);
  return Status::Ok();
}

Status EmbeddingTable::CheckColdKey(int64_t key, uint64_t stored) const {
  if (static_cast<int64_t>(stored) == key) return Status::Ok();
  return Status::DataLoss("table '" + config_.name + "': the SSD record of key " +
                          std::to_string(key) + " holds key " +
                          std::to_string(static_cast<int64_t>(stored)));
}

void EmbeddingTable::FillUnsetSlots(char* record) const {
  RowMeta* meta = reinterpret_cast<RowMeta*>(record);
  if (!(meta->slots_unset && slot_values_known_)) return;
  float* value = reinterpret_cast<float*>(record + sizeof(RowMeta));
  for (int s = 0; s < num_slots_; ++s) {
    std::fill_n(SlotOf(value, s), slot_width_, slot_initial_values_[s]);
  }
  meta->slots_unset = 0;
}

Status EmbeddingTable::GatherCold(int64_t address, float* out) const {
  const uint64_t id = static_cast<uint64_t>(address & (kMaxRows - 1));
  if (!tier_.store->IsLive(id)) {
    return Status::InvalidArgument("address " + std::to_string(address) + " of table '" +
                                   config_.name + "' is stale: its row left the SSD tier after "
                                   "the address was looked up");
  }
  thread_local std::vector<char> record;
  record.resize(row_bytes_);
  REC_SDK_RETURN_IF_ERROR(tier_.store->Read(id, record.data(), nullptr));
  std::memcpy(out, record.data() + sizeof(RowMeta), config_.dim * sizeof(float));
  return Status::Ok();
}

Status EmbeddingTable::ForEachColdRecord(
    const std::function<Status(int64_t key, const char* record, bool marked)>& fn) const {
  if (tier_.store == nullptr) return Status::Ok();
  std::vector<char> copy(row_bytes_);
  return tier_.store->ForEachLive([&](uint64_t key, uint64_t where, const void* record) {
    const RowMeta* meta = static_cast<const RowMeta*>(record);
    const bool marked = tier_.store->marked(where);
    if (!(meta->slots_unset && slot_values_known_)) {
      return fn(static_cast<int64_t>(key), static_cast<const char*>(record), marked);
    }
    std::memcpy(copy.data(), record, row_bytes_);
    FillUnsetSlots(copy.data());
    return fn(static_cast<int64_t>(key), copy.data(), marked);
  });
}

void EmbeddingTable::FillRecord(char* record, int64_t key, int64_t last_seen, uint32_t count,
                                const float* value, const float* const* slots,
                                bool slots_unset) const {
  std::memset(record, 0, row_bytes_);
  RowMeta* meta = reinterpret_cast<RowMeta*>(record);
  meta->key = key;
  meta->last_seen = last_seen;
  meta->count = count;
  meta->slots_unset = slots_unset;
  float* dst = reinterpret_cast<float*>(record + sizeof(RowMeta));
  std::memcpy(dst, value, config_.dim * sizeof(float));
  for (int s = 0; s < num_slots_; ++s) {
    if (slots != nullptr && slots[s] != nullptr) {
      std::memcpy(SlotOf(dst, s), slots[s], slot_width_ * sizeof(float));
    } else {
      std::fill_n(SlotOf(dst, s), slot_width_, slot_initial_values_[s]);
    }
  }
}

Status EmbeddingTable::TieredFindOrInsert(const int64_t* keys, int64_t n, int64_t* addresses,
                                          const ParallelRunner& run, const KeyAccess& access) {
  const int64_t tick = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  const int64_t recency = tier_.tick.fetch_add(1, std::memory_order_relaxed) + 1;
  REC_SDK_RETURN_IF_ERROR(PromoteLocked(keys, n, recency, run));
  // Every key of the batch is now in memory or absent: the lookup runs as in memory.
  auto touch = [&]() {
    run(n, 10, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        if (addresses[i] < 0) continue;
        const int64_t row = addresses[i] & (kMaxRows - 1);
        // Rows the promotion did not see are new: they start on probation.
        if (TickOf(row) != recency) PriorityOf(row) = recency - kProbationTicks;
        TickOf(row) = recency;
      }
    });
  };
  int64_t unplaced = 0;
  InsertPass(keys, n, addresses, access, tick, /*count=*/true, &unplaced, run);
  touch();
  if (unplaced > 0) {
    // New keys found no free row: demote, then place them without counting them twice.
    REC_SDK_RETURN_IF_ERROR(
        DemoteLocked(unplaced, std::max<int64_t>(1, config_.capacity / kDemoteShare), recency));
    unplaced = 0;
    InsertPass(keys, n, addresses, access, tick, /*count=*/false, &unplaced, run);
    touch();
  }
  if (unplaced > 0) {
    return Status::ResourceExhausted(
        "table '" + config_.name + "': a batch holds more keys than the table keeps in "
        "memory (" + std::to_string(config_.capacity) + " rows, " + std::to_string(unplaced) +
        " keys left without one); raise device_vocabulary_size + host_vocabulary_size or use "
        "smaller batches");
  }
  // Compaction only gives disk space back: when it cannot write (a full disk), every record
  // stays where it was and the lookup has succeeded; it is tried again after the next one.
  CompactLocked();
  return Status::Ok();
}

Status EmbeddingTable::PromoteLocked(const int64_t* keys, int64_t n, int64_t tick,
                                     const ParallelRunner& run) {
  // The batch's cold entries, per index shard (shards run in parallel).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cold_of(HashIndex::kNumShards);
  ForEachShard(
      keys, n, 60,
      [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
          const uint64_t* hashes) {
        auto& cold = cold_of[HashIndex::ShardOf(hashes[positions[0]])];
        ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) {
          const int64_t entry = shard.Find(keys[i], hashes[i]);
          if (entry < 0) return;
          if (IsCold(entry)) {
            cold.emplace_back(entry, keys[i]);
          } else {
            TickOf(RowOfEntry(entry)) = tick;
            PriorityOf(RowOfEntry(entry)) = tick;
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
  const int64_t free_rows = FreeRowCount();
  if (free_rows < m) {
    REC_SDK_RETURN_IF_ERROR(
        DemoteLocked(m - free_rows, std::max<int64_t>(1, config_.capacity / kDemoteShare), tick));
  }
  std::vector<int64_t> rows;
  AllocateRows(m, &rows);
  if (static_cast<int64_t>(rows.size()) < m) {
    ReleaseRows(rows.data(), rows.size());
    return Status::ResourceExhausted(
        "table '" + config_.name + "': a batch holds " + std::to_string(m) + " keys on SSD "
        "and the table keeps " + std::to_string(config_.capacity) + " rows in memory; raise "
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
    generations[j] = MetaOf(rows[j]).generation;
    if (TakeStaged(cold[j].second, cold[j].first, RecordOf(rows[j]))) {
      ++hits;
      continue;
    }
    to_read.push_back(IdOf(cold[j].first));
    into.push_back(RecordOf(rows[j]));
    read_at.push_back(j);
  }
  std::vector<uint64_t> stored(to_read.size());
  Status error = tier_.store->ReadMany(to_read.size(), to_read.data(), into.data(), stored.data());
  for (size_t r = 0; r < read_at.size() && error.ok(); ++r) {
    error = CheckColdKey(cold[read_at[r]].second, stored[r]);
  }
  for (int64_t j = 0; j < m && error.ok(); ++j) FillUnsetSlots(RecordOf(rows[j]));
  if (!error.ok()) {
    for (int64_t j = 0; j < m; ++j) MetaOf(rows[j]).generation = generations[j];
    ReleaseRows(rows.data(), rows.size());
    return error;
  }
  for (int64_t j = 0; j < m; ++j) {
    const int64_t row = rows[j], entry = cold[j].first, key = cold[j].second;
    const uint64_t where = IdOf(entry);
    RowMeta& meta = MetaOf(row);
    meta.generation = generations[j];
    __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
    if (config_.track_changes) ChunkOf(row)->changed[OffsetOf(row)] = tier_.store->marked(where);
    TickOf(row) = tick;
    PriorityOf(row) = tick - kProbationTicks;
    const uint64_t hash = index_.Hash(key);
    index_.shard(HashIndex::ShardOf(hash)).Set(key, hash, IndexEntry(row, meta.generation));
    tier_.store->Remove(where);
  }
  tier_.promotions.fetch_add(m, std::memory_order_relaxed);
  tier_.prefetch_hits.fetch_add(hits, std::memory_order_relaxed);
  return Status::Ok();
}

bool EmbeddingTable::TakeStaged(int64_t key, int64_t entry, char* record) {
  std::lock_guard<std::mutex> lock(tier_.staging_mu);
  auto found = tier_.staged.find(key);
  if (found == tier_.staged.end()) return false;
  const bool valid =
      found->second.number == IdOf(entry) &&
      found->second.generation == tier_.staging_generation.load(std::memory_order_relaxed);
  if (valid) std::memcpy(record, found->second.record.data(), row_bytes_);
  tier_.staged.erase(found);  // used, or stale (the key moved since it was read)
  return valid;
}

void EmbeddingTable::DropStaged() {
  tier_.staging_generation.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(tier_.staging_mu);
  tier_.staged.clear();
  tier_.staged_order.clear();
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
    ForEachShard(
        keys, n, 60,
        [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
            const uint64_t* hashes) {
          std::vector<std::pair<int64_t, int64_t>> mine;
          ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) {
            const int64_t entry = shard.Find(keys[i], hashes[i]);
            if (entry >= 0 && IsCold(entry)) mine.emplace_back(keys[i], entry);
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
                                         found->second.number == IdOf(c.second);
                                }),
                 cold.end());
    }
    std::vector<uint64_t> ids(cold.size());
    for (size_t j = 0; j < cold.size(); ++j) ids[j] = IdOf(cold[j].second);
    REC_SDK_RETURN_IF_ERROR(tier_.store->PinMany(ids.size(), ids.data(), &pinned));
    generation = tier_.staging_generation.load(std::memory_order_relaxed);
    record_bytes = row_bytes_;
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
    staged.number = IdOf(cold[j].second);
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

Status EmbeddingTable::DemoteLocked(int64_t needed, int64_t extra, int64_t tick) {
  // The extra rows only while the SSD tier has room for them without evicting.
  int64_t count = needed + extra;
  if (config_.ssd_rows > 0) {
    const int64_t room = config_.ssd_rows - static_cast<int64_t>(tier_.store->live());
    count = std::max(needed, std::min(count, room));
  }
  std::vector<std::pair<int64_t, int64_t>> candidates, protected_rows;  // (priority, row)
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    for (int64_t row = 0; row < next_row_; ++row) {
      const int64_t used = TickOf(row);
      if (used == tick || !MetaOf(row).alive) continue;
      if (used >= tick - kProtectedTicks) {
        protected_rows.emplace_back(PriorityOf(row), row);
      } else {
        candidates.emplace_back(PriorityOf(row), row);
      }
    }
  }
  auto oldest = [](std::vector<std::pair<int64_t, int64_t>>& from, int64_t want) {
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
            [](const auto& a, const auto& b) { return a.second < b.second; });
  REC_SDK_RETURN_IF_ERROR(ColdRoomLocked(static_cast<int64_t>(m)));
  std::vector<uint64_t> keys(m);
  std::vector<const void*> records(m);
  std::vector<int64_t> tags(m);
  for (size_t j = 0; j < m; ++j) {
    const int64_t row = candidates[j].second;
    keys[j] = static_cast<uint64_t>(MetaOf(row).key);
    records[j] = RecordOf(row);
    tags[j] = MetaOf(row).last_seen;
  }
  std::vector<uint64_t> where(m);
  Status status = tier_.store->AppendBatch(m, keys.data(), records.data(), tags.data(), where.data());
  if (!status.ok()) {
    return Status(status.code(), "table '" + config_.name + "': cannot move " +
                                     std::to_string(m) + " rows to SSD (the step fails, no "
                                     "row is lost): " + status.message());
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (size_t j = 0; j < m; ++j) {
    const int64_t row = candidates[j].second;
    RowMeta& meta = MetaOf(row);
    if (config_.track_changes && ChunkOf(row)->changed[OffsetOf(row)]) {
      tier_.store->set_mark(where[j], true);
    }
    const uint64_t hash = index_.Hash(meta.key);
    index_.shard(HashIndex::ShardOf(hash)).Set(meta.key, hash, ColdEntry(where[j]));
    KillRowLocked(meta);
    free_rows_.push_back(row);
  }
  tier_.demotions.fetch_add(static_cast<int64_t>(m), std::memory_order_relaxed);
  return Status::Ok();
}

Status EmbeddingTable::ColdRoomLocked(int64_t count) {
  const int64_t live = static_cast<int64_t>(tier_.store->live());
  if (config_.ssd_rows == 0 || live + count <= config_.ssd_rows) return Status::Ok();
  if (!config_.evict_when_full) {
    return Status::ResourceExhausted(FullMessage());
  }
  // Evict the least recently seen records (their tags are last-seen clocks), about 1% of
  // the SSD rows more than needed.
  const int64_t want = std::min<int64_t>(
      live, live + count - config_.ssd_rows + std::max<int64_t>(1, config_.ssd_rows / 100));
  std::vector<std::pair<int64_t, uint64_t>> oldest;  // (last seen, record number)
  oldest.reserve(static_cast<size_t>(live));
  tier_.store->ForEachLiveTag([&](uint64_t id, int64_t tag) { oldest.emplace_back(tag, id); });
  if (want > 0) std::nth_element(oldest.begin(), oldest.begin() + (want - 1), oldest.end());
  for (int64_t j = 0; j < want; ++j) {
    uint64_t key = 0;
    REC_SDK_RETURN_IF_ERROR(tier_.store->ReadKey(oldest[j].second, &key));
    RemoveColdLocked(static_cast<int64_t>(key),
                     kColdEntry | static_cast<int64_t>(oldest[j].second), /*evicted=*/true);
  }
  if (live - want + count > config_.ssd_rows) return Status::ResourceExhausted(FullMessage());
  return Status::Ok();
}

void EmbeddingTable::RemoveColdLocked(int64_t key, int64_t entry, bool evicted) {
  const uint64_t hash = index_.Hash(key);
  index_.shard(HashIndex::ShardOf(hash)).Erase(key, hash);
  DropColdRecordLocked(key, entry, evicted);
}

void EmbeddingTable::DropColdRecordLocked(int64_t key, int64_t entry, bool evicted) {
  tier_.store->Remove(IdOf(entry));
  size_.fetch_sub(1, std::memory_order_relaxed);
  if (evicted) evicted_.fetch_add(1, std::memory_order_relaxed);
  // changes_.removed_keys is guarded by alloc_mu_ or the exclusive structure_mu_ held here.
  if (config_.track_changes) changes_.removed_keys.push_back(key);
}

Status EmbeddingTable::CompactLocked() {
  if (!tier_.store->NeedsCompaction()) return Status::Ok();
  return tier_.store->Compact([&](uint64_t key, uint64_t, uint64_t to) {
    const int64_t k = static_cast<int64_t>(key);
    const uint64_t hash = index_.Hash(k);
    index_.shard(HashIndex::ShardOf(hash)).Set(k, hash, ColdEntry(to));
  });
}

Status EmbeddingTable::RelayoutColdLocked(int num_slots, int width, const float* initial_values,
                                          bool reset_slots) {
  const size_t new_bytes = RowBytesFor(num_slots, width);
  std::unique_ptr<ColdTier> fresh;
  REC_SDK_RETURN_IF_ERROR(OpenColdTier(new_bytes, &fresh));
  const int dim = config_.dim;
  const int kept = reset_slots || width != slot_width_ ? 0 : std::min(num_slots_, num_slots);
  const size_t kept_bytes = sizeof(RowMeta) + sizeof(float) * (dim + size_t(kept) * width);
  std::vector<char> record(new_bytes);
  std::vector<std::pair<int64_t, uint64_t>> moved;
  moved.reserve(tier_.store->live());
  Status status = tier_.store->ForEachLive([&](uint64_t key, uint64_t from,
                                         const void* old) -> Status {
    std::memcpy(record.data(), old, kept_bytes);
    float* value = reinterpret_cast<float*>(record.data() + sizeof(RowMeta));
    for (int s = kept; s < num_slots; ++s) {
      std::fill_n(value + dim + s * width, width, initial_values[s]);
    }
    uint64_t to;
    REC_SDK_RETURN_IF_ERROR(fresh->Append(key, record.data(), tier_.store->tag(from), &to));
    if (tier_.store->marked(from)) fresh->set_mark(to, true);
    moved.emplace_back(static_cast<int64_t>(key), to);
    return Status::Ok();
  });
  if (!status.ok()) return status;  // the old store and index stay as they were
  for (const auto& [key, to] : moved) {
    const uint64_t hash = index_.Hash(key);
    index_.shard(HashIndex::ShardOf(hash)).Set(key, hash, ColdEntry(to));
  }
  tier_.store = std::move(fresh);
  DropStaged();
  return Status::Ok();
}

}  // namespace rec_sdk
