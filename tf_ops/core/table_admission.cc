// The table's admission and eviction: the insert pass of a training FindOrInsert (probe,
// touch, admit, place), pending admission counts (PendingShard), the threshold, eviction by
// age and of the least recently seen rows, and Restrict.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

namespace {
uint32_t SaturatingCount(int64_t count) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(count, 0), UINT32_MAX));
}
}  // namespace

// One shard's part of an insert pass, in two holds of the shard's lock: Prepare (probe, touch,
// admit), then, once the pass has handed out rows to the shards in shard order, Place.
class EmbeddingTable::ShardInsert {
 public:
  struct Pass {  // what every shard of the pass shares
    const int64_t* keys;
    int64_t* addresses;
    const KeyAccess& access;
    int64_t tick;
    bool count;         // counts grow (false: a retry of the same batch)
    int64_t threshold;  // the admission threshold for this pass
    int64_t tag_bits;
    bool touch_rows;  // found rows get their last-seen clock
    bool count_rows;  // found rows get their access count
    bool clocked;     // the pass raises the table's newest clock
  };

  // hashes: per key position of the pass; first: the position of one key of this shard.
  ShardInsert(EmbeddingTable* table, const Pass& pass, HashIndex::Shard& shard,
              const uint64_t* hashes, int64_t first)
      : t_(table),
        pass_(pass),
        shard_(shard),
        hashes_(hashes),
        pending_(table->pending_.ShardFor(hashes[first])) {}

  // Probe, touch and admit: afterwards admitted() keys want a row.
  void Prepare(const int64_t* positions, int64_t n) {
    Probe(positions, n);
    Touch();
    if (!missing_.empty()) Admit();
  }
  int64_t admitted() const { return static_cast<int64_t>(admit_.size()); }
  // The distinct keys among them (a batch may hold a key twice).
  int64_t distinct_admitted() const {
    std::vector<int64_t> keys;
    keys.reserve(admit_.size());
    for (int64_t i : admit_) keys.push_back(pass_.keys[i]);
    std::sort(keys.begin(), keys.end());
    return std::unique(keys.begin(), keys.end()) - keys.begin();
  }
  // The table has no rows for the batch: the admitted keys read address -1.
  void LeaveOut() {
    for (int64_t i : admit_) pass_.addresses[i] = -1;
  }
  // The rows the admitted keys get (up to admitted()); taken by Place.
  void GiveRows(const int64_t* rows, int64_t count) { rows_.assign(rows, rows + count); }

  // Place: admitted keys get the rows given, in their batch order. Returns how many found no
  // row (a full table).
  int64_t Place() {
    size_t used = 0;
    int64_t left_out = 0;
    for (size_t j = 0; j < admit_.size(); ++j) {
      const int64_t i = admit_[j];
      // The probes of Prepare are out of the cache by now: load the slots ahead.
      if (j + kPrefetchDistance < admit_.size()) {
        shard_.Prefetch(hashes_[admit_[j + kPrefetchDistance]]);
      }
      // Present already: a duplicate in the batch, or a key another lookup placed while this
      // one held no lock.
      int64_t entry = shard_.Find(pass_.keys[i], hashes_[i]);
      if (entry < 0) {
        if (used == rows_.size()) {
          ++left_out;
          pass_.addresses[i] = -1;
          continue;
        }
        const int64_t row = rows_[used++];
        t_->InitializeRowLocked(row, pass_.keys[i], Clock(i));
        t_->MetaOf(row).count = SaturatingCount(admit_count_[j]);
        entry = t_->IndexEntry(row, t_->MetaOf(row).generation);
        shard_.Insert(pass_.keys[i], hashes_[i], entry);
        if (pass_.threshold > 0 && pending_.Find(pass_.keys[i], hashes_[i]) != nullptr) {
          DropPending(i);
        }
      }
      pass_.addresses[i] = pass_.tag_bits | entry;
    }
    t_->size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
    t_->admission_.admitted.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
    if (used < rows_.size()) t_->ReleaseRows(rows_.data() + used, rows_.size() - used);
    return left_out;
  }

 private:
  int64_t Clock(int64_t i) const { return ClockOf(pass_.access, i, pass_.tick); }
  int64_t Increment(int64_t i) const {
    return pass_.count ? (pass_.access.counts ? pass_.access.counts[i] : 1) : 0;
  }

  // Probe: keys the shard holds get their address; the others are missing. A compact shard
  // has just read a found row's header to check its key, so the row is touched at once;
  // otherwise Touch visits the found rows after the probes.
  void Probe(const int64_t* positions, int64_t n) {
    const bool touch_now = shard_.compact();
    int64_t newest = kNoClock;
    HashIndex::FindInOrder(shard_, pass_.keys, positions, n, hashes_,
                           [&](int64_t i, int64_t entry) {
                             if (entry >= 0) {
                               pass_.addresses[i] = pass_.tag_bits | entry;
                               if (pass_.touch_rows && touch_now) {
                                 TouchRow(t_->RowOfEntry(entry), i);
                               } else if (pass_.touch_rows) {
                                 found_.push_back(t_->RowOfEntry(entry));
                                 found_at_.push_back(i);
                               }
                             } else {
                               missing_.push_back(i);
                             }
                             if (pass_.clocked) newest = std::max(newest, Clock(i));
                           });
    if (pass_.clocked) t_->RaiseNewestClock(newest);
  }

  // The row of key position i was found: its last-seen clock (and access count).
  void TouchRow(int64_t row, int64_t i) {
    RowMeta& meta = t_->MetaOf(row);
    meta.last_seen = std::max(meta.last_seen, Clock(i));
    if (pass_.count_rows) meta.count = SaturatingCount(int64_t{meta.count} + Increment(i));
    t_->MarkChanged(row);
  }

  // Touch: rows found get their last-seen clock (and access count). The gather reads the
  // rows next, so touching their headers here costs little.
  void Touch() {
    for (size_t j = 0; j < found_.size(); ++j) {
      if (j + kPrefetchDistance < found_.size()) {
        __builtin_prefetch(t_->RecordOf(found_[j + kPrefetchDistance]), 1);
      }
      TouchRow(found_[j], found_at_[j]);
    }
  }

  // Admit: missing keys whose admission count reaches the threshold go on to Place; the
  // others read address -1 (and count as rejected).
  void Admit() {
    int64_t rejected = 0;
    for (size_t j = 0; j < missing_.size(); ++j) {
      const int64_t i = missing_[j];
      if (pass_.threshold > 0 && j + kPrefetchDistance < missing_.size()) {
        pending_.Prefetch(hashes_[missing_[j + kPrefetchDistance]]);
      }
      const int64_t add = Increment(i);
      if (pass_.threshold <= 0) {
        // Counts left from a time admission was on go with the key's new row.
        if (pending_.size() > 0 && pending_.Find(pass_.keys[i], hashes_[i]) != nullptr) {
          DropPending(i);
        }
        admit_.push_back(i);
        // The key's whole increment, also in a retry: nothing was recorded for a key that
        // found no row in the first pass.
        admit_count_.push_back(pass_.access.counts ? pass_.access.counts[i] : 1);
        continue;
      }
      PendingKey* p = pending_.Find(pass_.keys[i], hashes_[i]);
      if (p == nullptr) {
        if (!pass_.count) {  // a retry of a key that was never counted
          pass_.addresses[i] = -1;
          continue;
        }
        p = pending_.Add(pass_.keys[i], hashes_[i], Clock(i));
        t_->pending_.Added(1);
      }
      if (__builtin_add_overflow(p->count, add, &p->count)) p->count = INT64_MAX;
      p->last_seen = std::max(p->last_seen, Clock(i));
      if (p->count >= pass_.threshold) {
        admit_.push_back(i);
        admit_count_.push_back(p->count);
      } else {
        pass_.addresses[i] = -1;
        if (pass_.count) ++rejected;
      }
    }
    if (rejected > 0) t_->admission_.rejected.fetch_add(rejected, std::memory_order_relaxed);
  }

  void DropPending(int64_t i) {
    pending_.Remove(pass_.keys[i], hashes_[i]);
    t_->pending_.Removed(1);
  }

  EmbeddingTable* t_;
  const Pass& pass_;
  HashIndex::Shard& shard_;
  const uint64_t* hashes_;
  PendingShard& pending_;
  std::vector<int64_t> missing_;      // positions of keys the shard does not hold
  std::vector<int64_t> found_;        // rows of keys it holds (when touching rows)
  std::vector<int64_t> found_at_;     // their positions
  std::vector<int64_t> admit_;        // positions of missing keys admitted
  std::vector<int64_t> admit_count_;  // their admission counts
  std::vector<int64_t> rows_;         // the rows given for them
};

void EmbeddingTable::InsertPass(const int64_t* keys, int64_t n, int64_t* addresses,
                                const KeyAccess& access, int64_t tick, bool count,
                                int64_t* unplaced, const ParallelRunner& run) {
  // Rows of keys seen again get their last-seen clock only when eviction reads it; a row's
  // count is the one it was admitted with.
  const bool touch_rows = eviction_threshold() >= 0 || config_.evict_when_full || track_access();
  const ShardInsert::Pass pass{keys,
                               addresses,
                               access,
                               tick,
                               count,
                               admission_.access_threshold.load(std::memory_order_relaxed),
                               TagBits(),
                               touch_rows,
                               track_access() && count,
                               touch_rows || access.times != nullptr};
  // Prepare every shard at once; then rows for all admitted keys in one allocation, handed
  // out in shard order (each shard's keys in batch order); then place them, shards at once.
  // The rows a key gets therefore depend on the batch and the table, never on the threads.
  std::vector<uint64_t> hashes;
  std::vector<int64_t> order;
  std::vector<int64_t> begin;
  HashIndex::BucketByShard(keys, n, index_.seed(), &hashes, &order, &begin, run);
  constexpr int kShards = HashIndex::kNumShards;
  std::vector<std::optional<ShardInsert>> shards(kShards);
  const int64_t per_shard = (touch_rows ? 400 : 300) * (n / kShards + 1);
  run(kShards, per_shard, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      if (begin[s] == begin[s + 1]) continue;
      std::lock_guard<std::mutex> lock(index_.shard(s).mu());
      shards[s].emplace(this, pass, index_.shard(s), hashes.data(), order[begin[s]]);
      shards[s]->Prepare(order.data() + begin[s], begin[s + 1] - begin[s]);
    }
  });
  int64_t wanted = 0;
  for (const auto& shard : shards) wanted += shard ? shard->admitted() : 0;
  *unplaced = 0;
  std::vector<int64_t> rows;
  if (wanted > 0) AllocateRows(wanted, &rows);
  if (static_cast<int64_t>(rows.size()) < wanted) {
    // All or nothing: when the table cannot give every new key a row, no key gets one (the
    // caller evicts, or fails with the table's rows as they were).
    int64_t needed = 0;
    for (const auto& shard : shards) needed += shard ? shard->distinct_admitted() : 0;
    if (static_cast<int64_t>(rows.size()) < needed) {
      ReleaseRows(rows.data(), rows.size());
      for (auto& shard : shards) {
        if (shard) shard->LeaveOut();
      }
      *unplaced = needed - static_cast<int64_t>(rows.size());
      wanted = 0;
    }
  }
  if (wanted > 0) {
    size_t given = 0;
    for (auto& shard : shards) {
      if (!shard || shard->admitted() == 0) continue;
      const size_t take = std::min<size_t>(shard->admitted(), rows.size() - given);
      shard->GiveRows(rows.data() + given, static_cast<int64_t>(take));
      given += take;
    }
    std::atomic<int64_t> total_unplaced{0};
    run(kShards, 200 * (wanted / kShards + 1), [&](int64_t first, int64_t last) {
      for (int64_t s = first; s < last; ++s) {
        if (!shards[s] || shards[s]->admitted() == 0) continue;
        std::lock_guard<std::mutex> lock(index_.shard(s).mu());
        const int64_t left_out = shards[s]->Place();
        if (left_out > 0) total_unplaced.fetch_add(left_out, std::memory_order_relaxed);
      }
    });
    *unplaced = total_unplaced.load();
  }
  // One clock for the whole batch: the table has seen it even when the batch holds none of
  // its keys (a rank's shard in a step whose keys other ranks own), so that its rows age as
  // in one process.
  if (pass.clocked && !access.times_per_key) RaiseNewestClock(ClockOf(access, 0, tick));
}

Status EmbeddingTable::ConfigureAdmission(const AdmissionConfig& wanted) {
  for (const auto& [field, value] :
       {std::make_pair("access_threshold", wanted.access_threshold),
        std::make_pair("eviction_threshold", wanted.eviction_threshold)}) {
    if (value < -1) {
      return Status::InvalidArgument("table '" + config_.name + "': " + field +
                                     " must be >= -1, got " + std::to_string(value));
    }
  }
  std::lock_guard<std::mutex> lock(admission_.mu);
  if (admission_.configured) {
    const std::vector<std::string> differences = AdmissionDifferences(admission_.config, wanted);
    if (differences.empty()) return Status::Ok();
    std::string message = "table '" + config_.name +
                          "' already has other admission settings (existing vs asked for): ";
    for (size_t i = 0; i < differences.size(); ++i) {
      message += (i ? "; " : "") + differences[i];
    }
    return Status::InvalidArgument(message +
                                   "; every lookup of a table must use the same thresholds");
  }
  ChangeScope change(&changes_);
  admission_.config = wanted;
  admission_.configured = true;
  admission_.access_threshold.store(wanted.access_threshold, std::memory_order_relaxed);
  admission_.eviction_threshold.store(wanted.eviction_threshold, std::memory_order_relaxed);
  return Status::Ok();
}

AdmissionConfig EmbeddingTable::admission() const {
  std::lock_guard<std::mutex> lock(admission_.mu);
  return admission_.config;
}

bool EmbeddingTable::admission_configured() const {
  std::lock_guard<std::mutex> lock(admission_.mu);
  return admission_.configured;
}

void EmbeddingTable::ResetAdmission() {
  std::lock_guard<std::mutex> lock(admission_.mu);
  admission_.config = AdmissionConfig();
  admission_.configured = false;
  admission_.access_threshold.store(-1, std::memory_order_relaxed);
  admission_.eviction_threshold.store(-1, std::memory_order_relaxed);
}

Status EmbeddingTable::SetAccessThreshold(int64_t threshold) {
  ChangeScope change(&changes_);
  if (threshold < -1) {
    return Status::InvalidArgument("table '" + config_.name +
                                   "': access_threshold must be >= -1, got " +
                                   std::to_string(threshold));
  }
  admission_.access_threshold.store(threshold, std::memory_order_relaxed);
  return Status::Ok();
}

void EmbeddingTable::EvictRowLocked(int64_t row) {
  RowMeta& meta = MetaOf(row);
  if (config_.track_changes) changes_.NoteRemoved(meta.key);
  const uint64_t hash = index_.Hash(meta.key);
  index_.shard(HashIndex::ShardOf(hash)).Erase(meta.key, hash);
  KillRowLocked(meta);
  size_.fetch_sub(1, std::memory_order_relaxed);
  admission_.evicted.fetch_add(1, std::memory_order_relaxed);
}

Status EmbeddingTable::Evict(int64_t* rows_evicted, int64_t* pending_evicted,
                             const ParallelRunner& run) {
  ChangeScope change(&changes_);
  int64_t rows_out = 0, pending_out = 0;
  const int64_t threshold = eviction_threshold();
  const int64_t newest = admission_.newest_clock.load();
  if (threshold >= 0 && newest != kNoClock) {
    // Keys seen at or before `cutoff` are at least `threshold` older than the newest clock.
    int64_t cutoff;
    if (__builtin_sub_overflow(newest, threshold, &cutoff)) cutoff = INT64_MIN;
    std::unique_lock<std::shared_mutex> structure(structure_mu_);
    if (tier_.store != nullptr) {
      // Cold rows by the last-seen clocks the store keeps in memory (no disk reads but the
      // victims' keys).
      std::vector<uint64_t> old;
      tier_.store->ForEachLiveTag([&](uint64_t id, int64_t last_seen) {
        if (last_seen <= cutoff) old.push_back(id);
      });
      for (const uint64_t id : old) {
        uint64_t key = 0;
        REC_SDK_RETURN_IF_ERROR(tier_.store->ReadKey(id, &key));
        tier_.RemoveColdLocked(static_cast<int64_t>(key), TableTier::ColdEntry(id),
                               /*evicted=*/true);
        ++rows_out;
      }
    }
    std::lock_guard<std::mutex> lock(alloc_mu_);
    // Find the victims chunk by chunk in parallel, then unlink them.
    const int64_t chunks = (next_row_ + rows_per_chunk() - 1) >> chunk_shift_;
    std::vector<std::vector<int64_t>> victims(chunks);
    run(chunks, rows_per_chunk() * 10, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const int64_t end = std::min(next_row_, (c + 1) << chunk_shift_);
        for (int64_t row = c << chunk_shift_; row < end; ++row) {
          const RowMeta& meta = MetaOf(row);
          if (meta.alive && meta.last_seen <= cutoff) victims[c].push_back(row);
        }
      }
    });
    for (const auto& rows : victims) {
      for (const int64_t row : rows) {
        EvictRowLocked(row);
        free_rows_.push_back(row);
        ++rows_out;
      }
    }
    pending_out += pending_.RemoveSeenAtOrBefore(cutoff);
  }
  if (rows_evicted != nullptr) *rows_evicted = rows_out;
  if (pending_evicted != nullptr) *pending_evicted = pending_out;
  return Status::Ok();
}

bool EmbeddingTable::EvictLeastRecentLocked(int64_t count, int64_t needed, const int64_t* keys,
                                            int64_t n, int64_t tick) {
  std::vector<int64_t> batch(keys, keys + n);
  std::sort(batch.begin(), batch.end());
  std::lock_guard<std::mutex> lock(alloc_mu_);
  // (last_seen, key, row): rows of older lookups, and rows of the last kProtectedTicks
  // lookups, which go only when the others are not enough (oldest first either way): a batch
  // that fits in the table is always placed, and a concurrent lookup whose rows had to go
  // fails its update with a stale-address error, never touching another key's row. Ties of
  // last_seen go by key, not by row: which rows a batch got depends on the index's seed and
  // on the threads, and the keys a full table keeps must not.
  using Candidate = std::tuple<int64_t, int64_t, int64_t>;
  std::vector<Candidate> candidates, protected_rows;
  candidates.reserve(size_.load());
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    if (std::binary_search(batch.begin(), batch.end(), meta.key)) continue;
    if (tick > 0 && meta.last_seen >= tick - kProtectedTicks) {
      protected_rows.emplace_back(meta.last_seen, meta.key, row);
    } else {
      candidates.emplace_back(meta.last_seen, meta.key, row);
    }
  }
  if (static_cast<int64_t>(candidates.size() + protected_rows.size()) < needed) return false;
  int64_t newest_evicted = INT64_MIN;
  auto evict_oldest = [&](std::vector<Candidate>& from, int64_t want) {
    want = std::min<int64_t>(want, static_cast<int64_t>(from.size()));
    if (want <= 0) return int64_t{0};
    std::nth_element(from.begin(), from.begin() + (want - 1), from.end());
    std::sort(from.begin(), from.begin() + want);  // freed rows in a fixed order
    for (int64_t j = 0; j < want; ++j) {
      EvictRowLocked(std::get<2>(from[j]));
      free_rows_.push_back(std::get<2>(from[j]));
      newest_evicted = std::max(newest_evicted, std::get<0>(from[j]));
    }
    return want;
  };
  count -= evict_oldest(candidates, count);
  evict_oldest(protected_rows, count);
  if (newest_evicted == INT64_MIN) return true;
  // Keys still counting towards admission that were last seen before the rows that had to
  // go would not be kept either: this bounds the pending counts of a full table.
  pending_.RemoveSeenAtOrBefore(newest_evicted);
  return true;
}

Status EmbeddingTable::Restrict(int64_t keep, RestrictBy by, int64_t* removed) {
  if (keep < 0) {
    return Status::InvalidArgument("table '" + config_.name + "': num_reserved must be >= 0, got " +
                                   std::to_string(keep));
  }
  if (by == RestrictBy::kCount && !track_access()) {
    return Status::InvalidArgument("table '" + config_.name +
                                   "' does not count accesses (track_access): it cannot be "
                                   "restricted by count");
  }
  if (removed != nullptr) *removed = 0;
  if (Size() <= keep) return Status::Ok();  // nothing to do: the table stays unchanged
  ChangeScope change(&changes_);
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  struct Candidate {
    int64_t primary, secondary, key, row;  // row -1: a cold key
    int64_t entry;                         // its index entry (cold keys)
  };
  std::vector<Candidate> rows;
  rows.reserve(size_.load());
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    if (by == RestrictBy::kCount) {
      rows.push_back({int64_t{meta.count}, meta.last_seen, meta.key, row, 0});
    } else {
      rows.push_back({meta.last_seen, 0, meta.key, row, 0});
    }
  }
  if (tier_.store != nullptr) {
    REC_SDK_RETURN_IF_ERROR(
        tier_.store->ForEachLive([&](uint64_t key, uint64_t id, const void* record) {
          const RowMeta& meta = *static_cast<const RowMeta*>(record);
          const int64_t k = static_cast<int64_t>(key);
          if (by == RestrictBy::kCount) {
            rows.push_back({int64_t{meta.count}, meta.last_seen, k, -1, TableTier::ColdEntry(id)});
          } else {
            rows.push_back({meta.last_seen, 0, k, -1, TableTier::ColdEntry(id)});
          }
          return Status::Ok();
        }));
  }
  const int64_t drop = static_cast<int64_t>(rows.size()) - keep;
  if (removed != nullptr) *removed = std::max<int64_t>(drop, 0);
  if (drop <= 0) return Status::Ok();
  auto worse = [](const Candidate& a, const Candidate& b) {
    if (a.primary != b.primary) return a.primary < b.primary;
    if (a.secondary != b.secondary) return a.secondary < b.secondary;
    return a.key < b.key;
  };
  std::nth_element(rows.begin(), rows.begin() + (drop - 1), rows.end(), worse);
  for (int64_t j = 0; j < drop; ++j) {
    if (rows[j].row < 0) {
      tier_.RemoveColdLocked(rows[j].key, rows[j].entry, /*evicted=*/true);
      continue;
    }
    EvictRowLocked(rows[j].row);
    free_rows_.push_back(rows[j].row);
  }
  return Status::Ok();
}

}  // namespace rec_sdk
