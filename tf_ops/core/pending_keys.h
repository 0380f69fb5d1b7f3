// PendingKeys: the keys of a table counting towards admission, without a row yet.
//
// With an access threshold >= 0, a training lookup of a key without a row adds its count
// (occurrences x faae_coefficient) to the key's pending entry, and the key gets a row once
// the count reaches the threshold; until then it maps to -1. An entry remembers the newest
// clock its key was seen with, so that eviction drops entries as old as the rows it drops.
//
// The entries are kept per index shard (PendingShard: an open-addressing map from key to a
// record, records reused through a free list), each guarded by the mutex of the table's index
// shard of the same number, so a training lookup handles a key's row and its pending entry
// under one lock. PendingKeys holds the shards and their total count.
#ifndef REC_SDK_CORE_PENDING_KEYS_H_
#define REC_SDK_CORE_PENDING_KEYS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "tf_ops/core/hash_index.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

// One key counting towards admission.
struct PendingKey {
  int64_t key;
  int64_t count;  // < 0: a free record
  int64_t last_seen;
};

// The pending keys of one index shard (guarded by that shard's mutex).
class PendingShard {
 public:
  // The record of key, or null.
  PendingKey* Find(int64_t key, uint64_t hash) {
    const int64_t i = map_.Find(key, hash);
    return i < 0 ? nullptr : &records_[i];
  }
  // Adds key (which must be absent) with count 0 and clock last_seen.
  PendingKey* Add(int64_t key, uint64_t hash, int64_t last_seen);
  // Removes key; absent keys are ignored.
  void Remove(int64_t key, uint64_t hash);
  // Removes every record with last_seen <= cutoff; returns how many.
  int64_t RemoveSeenAtOrBefore(int64_t cutoff);
  void Clear();
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  // Calls f(record) for every live record; the first error stops it.
  template <typename F>
  Status ForEach(F f) const {
    for (const PendingKey& p : records_) {
      if (p.count >= 0) REC_SDK_RETURN_IF_ERROR(f(p));
    }
    return Status::Ok();
  }
  void Prefetch(uint64_t hash) const { map_.Prefetch(hash); }
  void set_seed(uint64_t seed) { map_.set_seed(seed); }

 private:
  HashIndex::Shard map_;
  std::vector<PendingKey> records_;
  std::vector<int64_t> free_;
};

// The pending keys of a table: one PendingShard per index shard, and their total. A shard is
// used under its index shard's mutex; the whole-table operations (RemoveSeenAtOrBefore,
// ForEach) need the table to themselves.
class PendingKeys {
 public:
  PendingKeys() : shards_(new PendingShard[HashIndex::kNumShards]) {}
  // Hashes keys as the table's index does (the seed of its HashIndex).
  void set_seed(uint64_t seed) {
    for (int s = 0; s < HashIndex::kNumShards; ++s) shards_[s].set_seed(seed);
  }
  PendingShard& shard(int s) { return shards_[s]; }
  const PendingShard& shard(int s) const { return shards_[s]; }
  // The shard of a key with this hash (HashIndex::ShardOf).
  PendingShard& ShardFor(uint64_t hash) { return shards_[HashIndex::ShardOf(hash)]; }

  // Keys pending in all shards. A caller that adds or removes keys of a shard counts them.
  int64_t size() const { return size_.load(); }
  void Added(int64_t n) { size_.fetch_add(n, std::memory_order_relaxed); }
  void Removed(int64_t n) { size_.fetch_sub(n, std::memory_order_relaxed); }
  // After every shard was cleared.
  void ResetSize() { size_.store(0); }

  // Removes the keys last seen at or before cutoff from every shard; returns how many.
  int64_t RemoveSeenAtOrBefore(int64_t cutoff);
  // Calls f(key) for every pending key, shard by shard; the first error stops it.
  template <typename F>
  Status ForEach(F f) const {
    for (int s = 0; s < HashIndex::kNumShards; ++s) {
      REC_SDK_RETURN_IF_ERROR(shards_[s].ForEach(f));
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<PendingShard[]> shards_;
  std::atomic<int64_t> size_{0};
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_PENDING_KEYS_H_
