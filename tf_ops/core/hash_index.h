// HashIndex: the key -> value map of one table (the table stores a row id and the row's
// generation in the value, so a probe yields a full row address without touching the row).
//
// The index is split into kNumShards independent open-addressing tables (linear probing,
// backward-shift deletion, no tombstones), each behind its own mutex. A batch is bucketed by
// shard first so that each shard is locked once per batch and shards proceed in parallel; keys
// of one shard are handled in their batch order, so duplicates in a batch behave as if handled
// one after the other.
#ifndef REC_SDK_CORE_HASH_INDEX_H_
#define REC_SDK_CORE_HASH_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "tf_ops/core/parallel.h"

namespace rec_sdk {

class HashIndex {
 public:
  static constexpr int kShardBits = 6;
  static constexpr int kNumShards = 1 << kShardBits;

  // A 64-bit mix of the key under `seed` (SplitMix64's finalizer of key ^ seed): the top
  // kShardBits pick the shard, the low bits the slot. Keys come from user data, and the mix is
  // invertible, so without a secret seed keys can be crafted to share a probe run and make
  // every probe walk it; each table (and each process's dedup) uses a random seed.
  static inline uint64_t Hash(int64_t key, uint64_t seed) {
    uint64_t z = (static_cast<uint64_t>(key) ^ seed) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  static inline int ShardOf(uint64_t hash) { return static_cast<int>(hash >> (64 - kShardBits)); }
  // A seed from the system's random source.
  static uint64_t RandomSeed();

  // seed 0 gives the unseeded mix (tests); tables pass RandomSeed().
  explicit HashIndex(uint64_t seed = 0);
  uint64_t seed() const { return seed_; }
  uint64_t Hash(int64_t key) const { return Hash(key, seed_); }

  class Shard {
   public:
    Shard();
    // The seed of the hashes the shard is given (used when it rehashes); set before use.
    void set_seed(uint64_t seed) { seed_ = seed; }
    uint64_t Hash(int64_t key) const { return HashIndex::Hash(key, seed_); }
    // All methods require the caller to hold mu().
    // Returns the value of key (>= 0), or -1 when absent.
    int64_t Find(int64_t key, uint64_t hash) const;
    // Adds key -> value (value >= 0); key must be absent.
    void Insert(int64_t key, uint64_t hash, int64_t value);
    // Replaces the value of a present key (value >= 0); returns false when key is absent.
    bool Set(int64_t key, uint64_t hash, int64_t value);
    // Removes key; returns its value, or -1 when absent.
    int64_t Erase(int64_t key, uint64_t hash);
    // Starts loading the slot where a probe for `hash` begins (no lock needed: a hint only).
    void Prefetch(uint64_t hash) const { __builtin_prefetch(&entries_[hash & mask_]); }
    void Clear();
    // Makes room for `n` entries without growing (one rehash now instead of one per
    // doubling); never shrinks.
    void Reserve(size_t n);
    size_t size() const { return size_; }
    size_t memory_bytes() const { return entries_.capacity() * sizeof(Entry); }
    std::mutex& mu() { return mu_; }

   private:
    struct Entry {
      int64_t key;
      int64_t value;  // < 0: empty slot
    };
    void Grow() { Rehash(entries_.size() * 2); }
    void Rehash(size_t slots);

    std::mutex mu_;
    std::vector<Entry> entries_;
    size_t mask_;
    size_t size_ = 0;
    uint64_t seed_ = 0;
  };

  Shard& shard(int i) { return shards_[i]; }
  // Sum of the shards' memory; only for reporting.
  size_t memory_bytes();

  // Groups the positions [0, n) of `keys` by shard. On return, the positions of shard s are
  // order[begin[s] .. begin[s + 1]) in their original order, and hashes[i] is
  // Hash(keys[i], seed). Large batches are split into parts counted and scattered in parallel.
  static void BucketByShard(const int64_t* keys, int64_t n, uint64_t seed,
                            std::vector<uint64_t>* hashes, std::vector<int64_t>* order,
                            std::vector<int64_t>* begin,
                            const ParallelRunner& run = SerialRunner);

  // Buckets keys by shard and runs fn(shard, positions, count, hashes) once per shard that has
  // keys, in parallel, with the shard's lock held; positions are in batch order and
  // hashes[i] is the hash of keys[i].
  using ShardBatchFn = std::function<void(Shard&, const int64_t* positions, int64_t count,
                                          const uint64_t* hashes)>;
  void ForEachShard(const int64_t* keys, int64_t n, int64_t cost_per_key, const ShardBatchFn& fn,
                    const ParallelRunner& run);
  // Runs fn(shard, i, hash) for every key position i, shard by shard, in parallel, with the
  // shard's lock held.
  void ForEachKeyByShard(const int64_t* keys, int64_t n, int64_t cost_per_key,
                         const std::function<void(Shard&, int64_t, uint64_t)>& fn,
                         const ParallelRunner& run);
  // Calls f(i) for the positions of one shard in order, prefetching the probe slots of the
  // key kPrefetchDistance positions later (probes of different keys are independent, so their
  // cache misses overlap).
  static constexpr int64_t kPrefetchDistance = 16;
  template <typename F>
  static void ProbeInOrder(const Shard& shard, const int64_t* positions, int64_t count,
                           const uint64_t* hashes, F f) {
    for (int64_t j = 0; j < count; ++j) {
      if (j + kPrefetchDistance < count) shard.Prefetch(hashes[positions[j + kPrefetchDistance]]);
      f(positions[j]);
    }
  }

 private:
  const uint64_t seed_;
  Shard shards_[kNumShards];
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_HASH_INDEX_H_
