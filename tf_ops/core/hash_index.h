// HashIndex: the key -> value map of one table (the value is a row id and the row's
// generation, or for a tiered table's cold keys their SSD record).
//
// A shard keeps its entries in one of two layouts:
//  - full (16 bytes an entry: the key and the value): a probe yields the value without
//    touching the row; tiered tables (whose cold keys have no row in memory) and the pending
//    keys use it;
//  - compact (8 bytes an entry: the index entry -- row id and generation, 52 bits -- and 12
//    bits of the key's hash that neither pick the shard nor the slot, set_rows): the key is
//    read back from the row header (RowDirectory, table_storage.h) when the hash bits match,
//    so the index takes half the memory. A lookup reads the row next anyway, and the entry
//    it returns does not wait for that read (only the rare mismatch does); an absent key
//    touches a row about once in 4,096 probed entries. Moving entries (deletion, growth)
//    reads their keys back to find their home slots.
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
#include "tf_ops/core/table_storage.h"

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
  // Makes every shard compact, reading keys back through `rows` (see Shard::set_rows).
  void set_rows(const RowDirectory* rows);
  uint64_t Hash(int64_t key) const { return Hash(key, seed_); }

  class Shard {
   public:
    Shard();
    // The seed of the hashes the shard is given (used when it rehashes); set before use.
    void set_seed(uint64_t seed) { seed_ = seed; }
    uint64_t Hash(int64_t key) const { return HashIndex::Hash(key, seed_); }
    // Makes the shard compact (it must be empty): values are index entries (IndexEntry, row
    // ids below kMaxCompactRow). Rows must hold their key before they are inserted and keep
    // it until they are erased.
    void set_rows(const RowDirectory* rows);
    bool compact() const { return rows_ != nullptr; }
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
    void Prefetch(uint64_t hash) const {
      if (rows_ != nullptr) {
        __builtin_prefetch(&compact_[hash & mask_]);
      } else {
        __builtin_prefetch(&entries_[hash & mask_]);
      }
    }
    // Compact shards, the first pass of a lookup: matches[j] = the value of the first entry
    // whose hash bits match those of key positions[j], or -1 (the key is absent), unchecked.
    // The caller checks it (CheckMatch) when it reads the row, so a lookup reads each row
    // once, and prefetching the slots and then the rows ahead lets many keys' misses overlap.
    void MatchEntries(const int64_t* positions, int64_t count, const uint64_t* hashes,
                      int64_t* matches) const;
    // The value of `key` given its MatchEntries match: the match when its row holds the key,
    // else (another key's hash bits matched) what the whole probe finds.
    int64_t CheckMatch(int64_t key, uint64_t hash, int64_t match) const {
      if (match < 0 || __builtin_expect(KeyOf(match) == key, 1)) return match;
      return Find(key, hash);
    }
    // Starts loading the header and the start of the embedding of a match's row.
    void PrefetchRecord(int64_t match) const {
      const char* record = rows_->RecordOf(match & kRowIdMask);
      __builtin_prefetch(record);
      if (rows_->row_bytes > 64) __builtin_prefetch(record + 64);
    }
    void Clear();
    // Makes room for `n` entries without growing (one rehash now instead of one per
    // doubling); never shrinks.
    void Reserve(size_t n);
    size_t size() const { return size_; }
    size_t memory_bytes() const {
      return entries_.capacity() * sizeof(Entry) + compact_.capacity() * sizeof(uint64_t);
    }
    std::mutex& mu() { return mu_; }

    static constexpr int kRowIdBits = kRowBits;
    static constexpr int64_t kMaxCompactRow = (int64_t{1} << kRowIdBits) - 1;  // exclusive

   private:
    struct Entry {
      int64_t key;
      int64_t value;  // < 0: empty slot
    };
    // A compact entry: the value (IndexEntry) in bits 0..51, bits 40..51 of the key's hash
    // above (the shard takes the top bits, the slot the low ones); all ones: empty.
    static constexpr int kValueBits = kRowBits + kGenerationBits;
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static constexpr uint64_t kRowIdMask = (uint64_t{1} << kRowIdBits) - 1;
    static constexpr uint64_t kValueMask = (uint64_t{1} << kValueBits) - 1;
    static uint64_t FilterBits(uint64_t hash) { return (hash >> 40) & 0xfff; }
    static uint64_t Pack(uint64_t hash, int64_t value) {
      return (FilterBits(hash) << kValueBits) | (static_cast<uint64_t>(value) & kValueMask);
    }
    static bool HashBitsMatch(uint64_t entry, uint64_t hash) {
      return (entry >> kValueBits) == FilterBits(hash);
    }
    size_t slots() const { return mask_ + 1; }
    bool Empty(size_t i) const { return rows_ ? compact_[i] == kEmpty : entries_[i].value < 0; }
    // The key in the row of a compact entry.
    int64_t KeyOf(uint64_t entry) const {
      return rows_->MetaOf(static_cast<int64_t>(entry & kRowIdMask)).key;
    }
    // The slot of key in a compact shard (*value: its entry), or -1.
    int64_t FindCompact(int64_t key, uint64_t hash, int64_t* value) const;
    // Where the entry in slot i would be placed with `mask`.
    size_t HomeOf(size_t i, size_t mask) const;
    void Grow() { Rehash(slots() * 2); }
    void Rehash(size_t slots);

    std::mutex mu_;
    std::vector<Entry> entries_;     // full layout
    std::vector<uint64_t> compact_;  // compact layout
    const RowDirectory* rows_ = nullptr;
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
                            std::vector<int64_t>* begin, const ParallelRunner& run = SerialRunner);

  // Buckets keys by shard and runs fn(shard, positions, count, hashes) once per shard that has
  // keys, in parallel, with the shard's lock held; positions are in batch order and
  // hashes[i] is the hash of keys[i].
  using ShardBatchFn =
      std::function<void(Shard&, const int64_t* positions, int64_t count, const uint64_t* hashes)>;
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
  // Calls f(i, Find of key i) for the positions of one shard in order; a compact shard
  // matches their hash bits first (MatchEntries, in parts of kFindPart keys), and checks each
  // row's key just before f reads the row.
  static constexpr int64_t kFindPart = 4096;
  template <typename F>
  static void FindInOrder(const Shard& shard, const int64_t* keys, const int64_t* positions,
                          int64_t count, const uint64_t* hashes, F f) {
    if (!shard.compact()) {
      ProbeInOrder(shard, positions, count, hashes,
                   [&](int64_t i) { f(i, shard.Find(keys[i], hashes[i])); });
      return;
    }
    int64_t matches[kFindPart];
    for (int64_t first = 0; first < count; first += kFindPart) {
      const int64_t n = count - first < kFindPart ? count - first : kFindPart;
      shard.MatchEntries(positions + first, n, hashes, matches);
      for (int64_t j = 0; j < n; ++j) {
        if (j + kPrefetchDistance < n && matches[j + kPrefetchDistance] >= 0) {
          shard.PrefetchRecord(matches[j + kPrefetchDistance]);
        }
        const int64_t i = positions[first + j];
        f(i, shard.CheckMatch(keys[i], hashes[i], matches[j]));
      }
    }
  }
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
