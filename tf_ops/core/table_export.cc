// The whole-table export and import of a table (its rows and slots, or its keys' access
// statistics), apart from checkpoints (table_snapshot.cc).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

Status EmbeddingTable::ImportAccess(const int64_t* keys, const int64_t* last_seen,
                                    const int64_t* counts, int64_t n) {
  int64_t newest = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (last_seen[i] < 0 || counts[i] < 0) {
      return Status::InvalidArgument("access statistics of table '" + config_.name + "': key " +
                                     std::to_string(keys[i]) + " has last_seen " +
                                     std::to_string(last_seen[i]) + " and count " +
                                     std::to_string(counts[i]) + "; both must be >= 0");
    }
    newest = std::max(newest, last_seen[i]);
  }
  ChangeScope change(&changes_);
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hash = index_.Hash(keys[i]);
    HashIndex::Shard& shard = index_.shard(HashIndex::ShardOf(hash));
    const int64_t entry = shard.Find(keys[i], hash);
    if (entry < 0) continue;
    const uint32_t count =
        static_cast<uint32_t>(std::min<int64_t>(counts[i], std::numeric_limits<uint32_t>::max()));
    if (TableTier::IsCold(entry)) {
      // A cold row's record is rewritten with the statistics (its tag is its clock).
      std::vector<char> record(dir_.row_bytes);
      REC_SDK_RETURN_IF_ERROR(tier_.ReadColdRecord(entry, keys[i], record.data()));
      RowMeta& meta = *reinterpret_cast<RowMeta*>(record.data());
      meta.last_seen = last_seen[i];
      meta.count = count;
      uint64_t where;
      REC_SDK_RETURN_IF_ERROR(
          tier_.store->Append(static_cast<uint64_t>(keys[i]), record.data(), last_seen[i], &where));
      tier_.store->Remove(TableTier::IdOf(entry));
      if (config_.track_changes) tier_.store->set_marks(where, kAllChanges);
      shard.Set(keys[i], hash, TableTier::ColdEntry(where));
      continue;
    }
    const int64_t row = RowOfEntry(entry);
    RowMeta& meta = MetaOf(row);
    meta.last_seen = last_seen[i];
    meta.count =
        static_cast<uint32_t>(std::min<int64_t>(counts[i], std::numeric_limits<uint32_t>::max()));
    MarkChanged(row);
  }
  if (newest >= 0) {
    int64_t tick = admission_.tick.load(std::memory_order_relaxed);
    while (newest > tick && !admission_.tick.compare_exchange_weak(tick, newest)) {
    }
    RaiseNewestClock(newest);
  }
  return Status::Ok();
}

Status EmbeddingTable::ExportAccess(std::vector<int64_t>* keys, std::vector<int64_t>* last_seen,
                                    std::vector<int64_t>* counts) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const int64_t n = size_.load();
  keys->clear();
  last_seen->clear();
  counts->clear();
  keys->reserve(n);
  last_seen->reserve(n);
  counts->reserve(n);
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    keys->push_back(meta.key);
    last_seen->push_back(meta.last_seen);
    counts->push_back(int64_t{meta.count});
  }
  // Cold rows (after the rows in memory).
  const Status status = tier_.ForEachColdRecord([&](int64_t key, const char* record, uint8_t) {
    const auto& meta = *reinterpret_cast<const RowMeta*>(record);
    keys->push_back(key);
    last_seen->push_back(meta.last_seen);
    counts->push_back(int64_t{meta.count});
    return Status::Ok();
  });
  return status;
}

Status EmbeddingTable::Export(const ExportAllocator& allocate) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const int64_t n = size_.load();
  int64_t* keys = nullptr;
  float* values = nullptr;
  float* slots = nullptr;
  REC_SDK_RETURN_IF_ERROR(allocate(n, &keys, &values, &slots));
  const int dim = config_.dim;
  const int width = slot_width_;
  int64_t out = 0;
  for (int64_t row = 0; row < next_row_ && out < n; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    const char* record = RecordOf(row);
    keys[out] = meta.key;
    ReadEmbedding(record, values + out * dim);
    for (int s = 0; s < num_slots_; ++s) {
      ReadSlot(record, s, slots + (s * n + out) * width);
    }
    ++out;
  }
  return tier_.ForEachColdRecord([&](int64_t key, const char* record, uint8_t) {
    if (out >= n) return Status::Ok();
    keys[out] = key;
    ReadEmbedding(record, values + out * dim);
    for (int s = 0; s < num_slots_; ++s) {
      ReadSlot(record, s, slots + (s * n + out) * width);
    }
    ++out;
    return Status::Ok();
  });
}

Status EmbeddingTable::Import(const int64_t* keys, const float* values, const float* slots,
                              int num_slots, int64_t n, int slot_width) {
  ChangeScope change(&changes_);
  int width;
  REC_SDK_RETURN_IF_ERROR(ResolveSlotWidth(slot_width, "import", &width));
  if (slots != nullptr && (num_slots < 0 || num_slots > kMaxSlots)) {
    return Status::InvalidArgument(
        "import into table '" + config_.name + "': " + std::to_string(num_slots) +
        " slot arrays given, at most " + std::to_string(kMaxSlots) + " allowed");
  }
  if (slots == nullptr) num_slots = 0;
  const int64_t limit = !tiered()              ? max_rows_
                        : config_.ssd_rows > 0 ? max_rows_ + config_.ssd_rows
                                               : std::numeric_limits<int64_t>::max();
  if (n > limit) {
    return Status::ResourceExhausted("import of " + std::to_string(n) + " rows into table '" +
                                     config_.name + "' exceeds its capacity of " +
                                     std::to_string(limit) + " rows");
  }
  // One exclusive section: no other operation sees a half-imported table.
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (num_slots > 0 && slots_.values_known && (num_slots != num_slots_ || width != slot_width_)) {
    return Status::InvalidArgument("import into table '" + config_.name +
                                   "': " + std::to_string(num_slots) + " slot arrays of " +
                                   std::to_string(width) + " floats given but its optimizer '" +
                                   slots_.optimizer + "' has " + std::to_string(num_slots_) +
                                   " of " + std::to_string(slot_width_));
  }
  if (num_slots > num_slots_ || (num_slots > 0 && width != slot_width_)) {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    // Placeholder initial values: the imported rows get their slots below, and rows added
    // before the optimizer's EnsureSlots are marked slots_unset.
    const float zeros[kMaxSlots] = {0, 0, 0, 0};
    REC_SDK_RETURN_IF_ERROR(RelayoutLocked(num_slots, width, zeros));
  }
  ClearLocked();
  std::vector<int64_t> rows;
  AllocateRows(n, &rows);
  // Tiered: rows past the memory rows, written to the store at the end.
  std::unordered_map<int64_t, size_t> cold_at;
  std::vector<uint64_t> cold_keys;
  std::vector<char> cold_records;
  size_t used = 0;
  const int dim = config_.dim;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hash = index_.Hash(keys[i]);
    HashIndex::Shard& shard = index_.shard(HashIndex::ShardOf(hash));
    const int64_t entry = shard.Find(keys[i], hash);  // set when keys[i] repeats
    int64_t row;
    if (entry >= 0) {
      row = RowOfEntry(entry);
    } else {
      if (used == rows.size() && tiered()) {
        // Past the memory rows: the row goes to the SSD tier, in one batch at the end (a
        // repeated key overwrites its record: the last row wins).
        auto [at, added] = cold_at.emplace(keys[i], cold_keys.size());
        if (added) {
          cold_keys.push_back(static_cast<uint64_t>(keys[i]));
          cold_records.resize(cold_keys.size() * dir_.row_bytes);
        }
        std::vector<const float*> slot_values(num_slots_, nullptr);
        for (int s = 0; s < num_slots; ++s) slot_values[s] = slots + (s * n + i) * width;
        const bool slots_unset =
            num_slots_ > 0 && !slots_.values_known && !(num_slots > 0 && num_slots == num_slots_);
        tier_.FillRecord(cold_records.data() + at->second * dir_.row_bytes, keys[i],
                         ClockForNewRows(), 0, values + i * dim, slot_values.data(), slots_unset);
        continue;
      }
      if (used == rows.size()) {
        ReleaseRows(rows.data() + used, rows.size() - used);
        size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
        return Status::ResourceExhausted(FullMessage());
      }
      row = rows[used++];
      InitializeRowLocked(row, keys[i], ClockForNewRows());
      shard.Insert(keys[i], hash, IndexEntry(row, MetaOf(row).generation));
    }
    char* record = RecordOf(row);
    WriteEmbedding(record, values + i * dim);
    for (int s = 0; s < num_slots; ++s) {
      WriteSlot(record, s, slots + (s * n + i) * width);
    }
    if (num_slots > 0 && num_slots == num_slots_) MetaOf(row).slots_unset = 0;
  }
  size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
  if (used < rows.size()) ReleaseRows(rows.data() + used, rows.size() - used);
  if (cold_keys.empty()) return Status::Ok();
  const size_t m = cold_keys.size();
  REC_SDK_RETURN_IF_ERROR(tier_.ColdRoomLocked(static_cast<int64_t>(m)));
  std::vector<const void*> records(m);
  std::vector<int64_t> tags(m, ClockForNewRows());
  for (size_t j = 0; j < m; ++j) records[j] = cold_records.data() + j * dir_.row_bytes;
  std::vector<uint64_t> where(m);
  REC_SDK_RETURN_IF_ERROR(
      tier_.store->AppendBatch(m, cold_keys.data(), records.data(), tags.data(), where.data()));
  for (size_t j = 0; j < m; ++j) {
    const int64_t key = static_cast<int64_t>(cold_keys[j]);
    const uint64_t hash = index_.Hash(key);
    index_.shard(HashIndex::ShardOf(hash)).Insert(key, hash, TableTier::ColdEntry(where[j]));
  }
  size_.fetch_add(static_cast<int64_t>(m), std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace rec_sdk
