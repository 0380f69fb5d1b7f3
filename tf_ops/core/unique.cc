#include "tf_ops/core/unique.h"

#include <algorithm>
#include <atomic>

#include "tf_ops/core/hash_index.h"

namespace rec_sdk {

namespace {

// Batches up to this size are deduplicated with open-addressing maps: measured ~2x faster
// than bucketing into shards first, for a 65,536-key batch on two threads.
constexpr int64_t kMapLimit = int64_t{1} << 20;
// From this size on, two threads may share a batch (below it the merge costs more than the
// share saves).
constexpr int64_t kSplitMin = 8192;

// The seed of the dedup's hashes: random per process, so that keys from user data cannot be
// crafted to collide (see HashIndex::Hash).
uint64_t DedupSeed() {
  static const uint64_t seed = HashIndex::RandomSeed();
  return seed;
}

// One open-addressing map (slots hold a position in `unique` + 1) and its distinct keys in
// first-occurrence order. Kept by the calling thread between batches: a fresh 512 KiB
// allocation per batch of 65,536 keys cost more in page faults than the dedup.
struct DedupMap {
  std::vector<int32_t> slots;
  std::vector<int64_t> unique;  // the distinct keys, unique[0, found)
  std::vector<uint32_t> homes;  // each key's first slot
  size_t mask = 0;
  int32_t found = 0;

  // Empties the map, sized for up to n keys.
  void Reset(int64_t n) {
    size_t capacity = 16;
    while (capacity < static_cast<size_t>(2 * n)) capacity <<= 1;
    mask = capacity - 1;
    slots.assign(capacity, 0);
    if (unique.size() < static_cast<size_t>(n)) unique.resize(n);
    if (homes.size() < static_cast<size_t>(n)) homes.resize(n);
    found = 0;
  }

  // Adds keys[0, n): inverse[i] = the index of keys[i] in unique.
  void Add(const int64_t* keys, int64_t n, uint64_t seed, int32_t* inverse) {
    int64_t* out = unique.data();
    // The slots a probe starts at are known up front: hashing them in one pass and
    // prefetching the slot of the key kPrefetchDistance ahead overlaps the probes' cache
    // misses (15-20% faster for the benchmark's 65,536 Zipf keys, a 512 KiB map).
    for (int64_t i = 0; i < n; ++i) {
      homes[i] = static_cast<uint32_t>(HashIndex::Hash(keys[i], seed) & mask);
    }
    constexpr int64_t kAhead = HashIndex::kPrefetchDistance;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&slots[homes[i + kAhead]]);
      const int64_t key = keys[i];
      size_t p = homes[i];
      while (slots[p] != 0 && out[slots[p] - 1] != key) p = (p + 1) & mask;
      if (slots[p] == 0) {
        out[found] = key;
        slots[p] = ++found;
      }
      inverse[i] = slots[p] - 1;
    }
  }

  // The index of key in unique, or -1; home: the slot its probe starts at.
  int32_t FindFrom(int64_t key, size_t home) const {
    size_t p = home;
    while (slots[p] != 0) {
      if (unique[slots[p] - 1] == key) return slots[p] - 1;
      p = (p + 1) & mask;
    }
    return -1;
  }
};

// Deduplicates keys[0, n) on up to two threads, with the one-map result. The thread that takes
// part 0 adds the batch to the first map (sized for the whole batch) chunk after chunk, from
// the front. A second thread arriving meanwhile (a pool thread can take 100 us to wake)
// takes the later half of what is left, into the second map; it is merged after: its keys
// absent from the first map are appended in their first-occurrence order, which is again the
// one-map result. So the output is the same whatever the threads and whenever they come.
void DeduplicateInHalves(const int64_t* keys, int64_t n, std::vector<int64_t>* unique,
                         int32_t* inverse, const ParallelRunner& run, DedupMap* maps) {
  const uint64_t seed = DedupSeed();
  constexpr int64_t kChunk = 2048;
  constexpr int64_t kMinChunksToShare = 4;  // fewer left: not worth a merge
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // front << 32 | back: the front thread has claimed chunks [0, front); chunks [back, chunks)
  // are the second thread's.
  std::atomic<uint64_t> bounds{static_cast<uint64_t>(chunks)};
  int64_t mid = n;  // where the second thread's part starts (n: it took none)
  run(2, 30 * n, [&](int64_t first, int64_t last) {
    for (int64_t part = first; part < last; ++part) {
      if (part == 0) {
        maps[0].Reset(n);
        for (uint64_t b = bounds.load();;) {
          const int64_t front = static_cast<int64_t>(b >> 32);
          if (front >= static_cast<int64_t>(b & 0xffffffff)) break;
          if (!bounds.compare_exchange_weak(b, b + (uint64_t{1} << 32))) continue;
          const int64_t begin = front * kChunk;
          const int64_t end = std::min(n, begin + kChunk);
          maps[0].Add(keys + begin, end - begin, seed, inverse + begin);
          b = bounds.load();
        }
        continue;
      }
      for (uint64_t b = bounds.load();;) {
        const int64_t front = static_cast<int64_t>(b >> 32);
        if (chunks - front < kMinChunksToShare) break;
        const int64_t start = front + (chunks - front) / 2;
        if (!bounds.compare_exchange_weak(b, (b & ~uint64_t{0xffffffff}) | start)) continue;
        mid = start * kChunk;
        maps[1].Reset(n - mid);
        maps[1].Add(keys + mid, n - mid, seed, inverse + mid);
        break;
      }
    }
  });
  const DedupMap& whole = maps[0];
  unique->assign(whole.unique.data(), whole.unique.data() + whole.found);
  if (mid == n) return;
  // Where the second part's distinct keys go: found in the first map, or appended (on the
  // calling thread: another parallel region would cost more than these probes).
  const DedupMap& second = maps[1];
  thread_local std::vector<int32_t> remap;
  remap.resize(second.found);
  int32_t* const to = remap.data();
  for (int32_t j = 0; j < second.found; ++j) {
    to[j] = static_cast<int32_t>(HashIndex::Hash(second.unique[j], seed) & whole.mask);
  }
  constexpr int64_t kAhead = HashIndex::kPrefetchDistance;
  for (int32_t j = 0; j < second.found; ++j) {
    if (j + kAhead < second.found) __builtin_prefetch(&whole.slots[to[j + kAhead]]);
    to[j] = whole.FindFrom(second.unique[j], to[j]);
    if (to[j] < 0) {
      to[j] = static_cast<int32_t>(unique->size());
      unique->push_back(second.unique[j]);
    }
  }
  for (int64_t i = mid; i < n; ++i) inverse[i] = to[inverse[i]];
}

}  // namespace

void DeduplicateKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* unique, int32_t* inverse,
                     const ParallelRunner& run) {
  if (n <= kMapLimit) {
    // The calling thread's maps (the threads sharing the batch write into them).
    thread_local DedupMap maps[2];
    if (n >= kSplitMin) {
      DeduplicateInHalves(keys, n, unique, inverse, run, maps);
    } else {
      maps[0].Reset(n);
      maps[0].Add(keys, n, DedupSeed(), inverse);
      unique->assign(maps[0].unique.data(), maps[0].unique.data() + maps[0].found);
    }
    return;
  }
  constexpr int kShards = HashIndex::kNumShards;
  std::vector<uint64_t> hashes;
  std::vector<int64_t> order;
  std::vector<int64_t> begin;
  HashIndex::BucketByShard(keys, n, DedupSeed(), &hashes, &order, &begin, run);

  // Pass 1, per shard: the shard's distinct keys go to shard_unique[begin[s] ...] and each
  // position gets its index among them.
  std::vector<int64_t> shard_unique(n);
  std::vector<int32_t> local_index(n);
  std::vector<int64_t> unique_count(kShards, 0);
  run(kShards, 60 * (n / kShards + 1), [&](int64_t first, int64_t last) {
    std::vector<int32_t> slots;  // position in the shard's unique list + 1; 0 = empty
    for (int64_t s = first; s < last; ++s) {
      const int64_t count = begin[s + 1] - begin[s];
      if (count == 0) continue;
      size_t capacity = 16;
      while (capacity < static_cast<size_t>(2 * count)) capacity <<= 1;
      const size_t mask = capacity - 1;
      slots.assign(capacity, 0);
      int64_t* out = shard_unique.data() + begin[s];
      int32_t found = 0;
      for (int64_t j = begin[s]; j < begin[s + 1]; ++j) {
        const int64_t i = order[j];
        const int64_t key = keys[i];
        size_t p = hashes[i] & mask;
        while (slots[p] != 0 && out[slots[p] - 1] != key) p = (p + 1) & mask;
        if (slots[p] == 0) {
          out[found] = key;
          slots[p] = ++found;
        }
        local_index[i] = slots[p] - 1;
      }
      unique_count[s] = found;
    }
  });

  // Pass 2: concatenate the shards' unique keys and turn local indices into global ones.
  std::vector<int64_t> offset(kShards + 1, 0);
  for (int s = 0; s < kShards; ++s) offset[s + 1] = offset[s] + unique_count[s];
  unique->resize(offset[kShards]);
  run(kShards, 4 * (n / kShards + 1), [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      std::copy_n(shard_unique.data() + begin[s], unique_count[s], unique->data() + offset[s]);
    }
  });
  run(n, 4, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      inverse[i] = static_cast<int32_t>(offset[HashIndex::ShardOf(hashes[i])] + local_index[i]);
    }
  });
}

}  // namespace rec_sdk
