// Writes of a table outside training: upserting and removing keys, and clearing it.
#include "tf_ops/core/embedding_table.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "tf_ops/core/unique.h"

namespace rec_sdk {

Status EmbeddingTable::Upsert(const int64_t* keys, const float* values, int64_t n,
                              const ParallelRunner& run) {
  ChangeScope change(&changes_);
  if (n > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("table '" + config_.name + "': at most " +
                                   std::to_string(std::numeric_limits<int32_t>::max()) +
                                   " keys per upsert, got " + std::to_string(n));
  }
  if (tiered()) {
    std::unique_lock<std::shared_mutex> structure(structure_mu_);
    return UpsertTieredLocked(keys, values, n, run);
  }
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  return UpsertLocked(keys, values, n, run, 0);
}

Status EmbeddingTable::UpsertTieredLocked(const int64_t* keys, const float* values, int64_t n,
                                          const ParallelRunner& run) {
  // The keys' cold rows come into memory first (updates happen in memory only), in slices
  // of at most half the memory rows (an upsert may hold more keys than memory), in order:
  // a key repeated in a later slice still ends with its last value.
  const int64_t slice = std::max<int64_t>(1, config_.capacity / 2);
  for (int64_t first = 0; first < n; first += slice) {
    const int64_t count = std::min(slice, n - first);
    const int64_t recency = tier_.tick.fetch_add(1, std::memory_order_relaxed) + 1;
    REC_SDK_RETURN_IF_ERROR(tier_.PromoteLocked(keys + first, count, recency, run));
    REC_SDK_RETURN_IF_ERROR(
        UpsertLocked(keys + first, values + first * config_.dim, count, run, recency));
  }
  return Status::Ok();
}

Status EmbeddingTable::ApplyRows(const int64_t* keys, const float* values, int64_t n,
                                 const int64_t* removed, int64_t m, bool replace,
                                 const ParallelRunner& run) {
  ChangeScope change(&changes_);
  if (n > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("table '" + config_.name + "': at most " +
                                   std::to_string(std::numeric_limits<int32_t>::max()) +
                                   " rows per update, got " + std::to_string(n));
  }
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::vector<int64_t> others;
  if (replace) {
    // Every stored key that is not among the update's rows goes.
    std::vector<int64_t> wanted(keys, keys + n);
    std::sort(wanted.begin(), wanted.end());
    auto keep = [&](int64_t key) { return std::binary_search(wanted.begin(), wanted.end(), key); };
    {
      std::lock_guard<std::mutex> lock(alloc_mu_);
      for (int64_t row = 0; row < next_row_; ++row) {
        const RowMeta& meta = MetaOf(row);
        if (meta.alive && !keep(meta.key)) others.push_back(meta.key);
      }
    }
    REC_SDK_RETURN_IF_ERROR(tier_.ForEachColdRecord([&](int64_t key, const char*, uint8_t) {
      if (!keep(key)) others.push_back(key);
      return Status::Ok();
    }));
    removed = others.data();
    m = static_cast<int64_t>(others.size());
  }
  RemoveLocked(removed, m, nullptr, run);
  if (tiered()) return UpsertTieredLocked(keys, values, n, run);
  return UpsertLocked(keys, values, n, run, 0);
}

Status EmbeddingTable::UpsertLocked(const int64_t* keys, const float* values, int64_t n,
                                    const ParallelRunner& run, int64_t recency) {
  // All or nothing: rows for every distinct key without one are reserved before anything is
  // written, so a table too full for the batch fails unchanged. Keys found now keep their
  // rows until the lock is released (rows are freed only under the exclusive lock); keys
  // another thread inserts meanwhile need fewer reserved rows, never more.
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse(n);
  DeduplicateKeys(keys, n, &unique, inverse.data(), run);
  std::atomic<int64_t> missing{0};
  index_.ForEachKeyByShard(
      unique.data(), static_cast<int64_t>(unique.size()), 60,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        if (shard.Find(unique[i], hash) < 0) missing.fetch_add(1, std::memory_order_relaxed);
      },
      run);
  if (tiered()) {
    const int64_t free_rows = FreeRowCount();
    if (free_rows < missing.load()) {
      REC_SDK_RETURN_IF_ERROR(tier_.DemoteLocked(missing.load() - free_rows, 0, recency));
    }
  }
  std::vector<int64_t> reserved;
  AllocateRows(missing.load(), &reserved);
  if (static_cast<int64_t>(reserved.size()) < missing.load()) {
    ReleaseRows(reserved.data(), reserved.size());
    return Status::ResourceExhausted(FullMessage());
  }
  const int dim = config_.dim;
  std::atomic<int64_t> used{0};
  index_.ForEachKeyByShard(
      keys, n, 200 + 2 * dim,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Find(keys[i], hash);
        int64_t row = entry < 0 ? -1 : RowOfEntry(entry);
        if (row < 0) {
          row = reserved[used.fetch_add(1, std::memory_order_relaxed)];
          InitializeRowLocked(row, keys[i], ClockForNewRows());
          if (recency > 0) {
            TickOf(row) = recency;
            PriorityOf(row) = recency - TableTier::kProbationTicks;
          }
          size_.fetch_add(1, std::memory_order_relaxed);
          PendingShard& pending = pending_.ShardFor(hash);
          if (pending.size() > 0 && pending.Find(keys[i], hash) != nullptr) {
            pending.Remove(keys[i], hash);
            pending_.Removed(1);
          }
          shard.Insert(keys[i], hash, IndexEntry(row, MetaOf(row).generation));
        }
        WriteEmbedding(RecordOf(row), values + i * dim);
        MarkChanged(row);
      },
      run);
  if (used.load() < static_cast<int64_t>(reserved.size())) {
    ReleaseRows(reserved.data() + used.load(), reserved.size() - used.load());
  }
  return Status::Ok();
}

Status EmbeddingTable::Remove(const int64_t* keys, int64_t n, int64_t* removed,
                              const ParallelRunner& run) {
  ChangeScope change(&changes_);
  // Exclusive: a batch operation validates its addresses and then uses the rows under one
  // shared hold, so no row may be freed (and reused for another key) while one runs.
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  RemoveLocked(keys, n, removed, run);
  return Status::Ok();
}

void EmbeddingTable::RemoveLocked(const int64_t* keys, int64_t n, int64_t* removed,
                                  const ParallelRunner& run) {
  std::atomic<int64_t> count{0};
  std::mutex cold_mu;
  std::vector<std::pair<int64_t, int64_t>> cold;  // (key, entry) of cold keys removed
  index_.ForEachKeyByShard(
      keys, n, 100,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Erase(keys[i], hash);
        if (entry < 0) return;
        count.fetch_add(1, std::memory_order_relaxed);
        if (TableTier::IsCold(entry)) {
          std::lock_guard<std::mutex> lock(cold_mu);
          cold.emplace_back(keys[i], entry);
          return;
        }
        FreeRow(RowOfEntry(entry));
      },
      run);
  // The store is not thread-safe: its records go after the parallel part.
  for (const auto& [key, entry] : cold) {
    tier_.DropColdRecordLocked(key, entry, /*evicted=*/false);
  }
  if (removed != nullptr) *removed = count.load();
}

void EmbeddingTable::Clear() {
  ChangeScope change(&changes_);
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  ClearLocked();
}

void EmbeddingTable::ClearLocked() {
  // Also for restores and deltas, which hold the lock throughout: a save snapshotted before
  // them must not be committed as what the table holds.
  BumpVersion();
  // Lock order everywhere: structure_mu_, then a shard, then alloc_mu_.
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    std::lock_guard<std::mutex> shard_lock(index_.shard(s).mu());
    index_.shard(s).Clear();
    pending_.shard(s).Clear();
  }
  pending_.ResetSize();
  if (tier_.store != nullptr) {
    tier_.store->Clear();
    tier_.DropStaged();
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (int64_t row = 0; row < next_row_; ++row) {
    RowMeta& meta = MetaOf(row);
    if (meta.alive) KillRowLocked(meta);
  }
  free_rows_.clear();
  free_rows_.shrink_to_fit();
  next_row_ = 0;
  size_.store(0);
  if (config_.track_changes) {
    changes_.NoteCleared();
  }
}

}  // namespace rec_sdk
