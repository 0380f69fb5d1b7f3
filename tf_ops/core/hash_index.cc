#include "tf_ops/core/hash_index.h"

#include <algorithm>
#include <random>

namespace rec_sdk {
namespace {
constexpr size_t kInitialSlots = 16;  // per shard; a power of two
}  // namespace

HashIndex::Shard::Shard() : entries_(kInitialSlots, Entry{0, -1}), mask_(kInitialSlots - 1) {}

void HashIndex::Shard::set_rows(const RowDirectory* rows) {
  rows_ = rows;
  entries_.clear();
  entries_.shrink_to_fit();
  compact_.assign(kInitialSlots, kEmpty);
  mask_ = kInitialSlots - 1;
  size_ = 0;
}

int64_t HashIndex::Shard::FindCompact(int64_t key, uint64_t hash, int64_t* value) const {
  for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
    const uint64_t e = compact_[i];
    if (e == kEmpty) return -1;
    if (!HashBitsMatch(e, hash) || KeyOf(e) != key) continue;
    *value = static_cast<int64_t>(e & kValueMask);
    return static_cast<int64_t>(i);
  }
}

void HashIndex::Shard::MatchEntries(const int64_t* positions, int64_t count, const uint64_t* hashes,
                                    int64_t* matches) const {
  for (int64_t j = 0; j < count; ++j) {
    if (j + kPrefetchDistance < count) Prefetch(hashes[positions[j + kPrefetchDistance]]);
    const uint64_t hash = hashes[positions[j]];
    int64_t match = -1;
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const uint64_t e = compact_[i];
      if (e == kEmpty) break;
      if (HashBitsMatch(e, hash)) {
        match = static_cast<int64_t>(e & kValueMask);
        break;
      }
    }
    matches[j] = match;
  }
}

size_t HashIndex::Shard::HomeOf(size_t i, size_t mask) const {
  if (rows_ == nullptr) return Hash(entries_[i].key) & mask;
  return Hash(KeyOf(compact_[i])) & mask;
}

int64_t HashIndex::Shard::Find(int64_t key, uint64_t hash) const {
  if (rows_ != nullptr) {
    int64_t value = -1;
    return FindCompact(key, hash, &value) < 0 ? -1 : value;
  }
  for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
    const Entry& e = entries_[i];
    if (e.value < 0) return -1;
    if (e.key == key) return e.value;
  }
}

void HashIndex::Shard::Insert(int64_t key, uint64_t hash, int64_t value) {
  // Keep the load factor at most 1/2 so probe sequences stay short.
  if ((size_ + 1) * 2 > slots()) Grow();
  size_t i = hash & mask_;
  while (!Empty(i)) i = (i + 1) & mask_;
  if (rows_ != nullptr) {
    compact_[i] = Pack(hash, value);
  } else {
    entries_[i] = Entry{key, value};
  }
  ++size_;
}

bool HashIndex::Shard::Set(int64_t key, uint64_t hash, int64_t value) {
  if (rows_ != nullptr) {
    int64_t old;
    const int64_t i = FindCompact(key, hash, &old);
    if (i < 0) return false;
    compact_[i] = Pack(hash, value);
    return true;
  }
  for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.value < 0) return false;
    if (e.key == key) {
      e.value = value;
      return true;
    }
  }
}

int64_t HashIndex::Shard::Erase(int64_t key, uint64_t hash) {
  size_t i = hash & mask_;
  int64_t value = -1;
  if (rows_ != nullptr) {
    const int64_t at = FindCompact(key, hash, &value);
    if (at < 0) return -1;
    i = static_cast<size_t>(at);
  } else {
    for (;; i = (i + 1) & mask_) {
      if (entries_[i].value < 0) return -1;
      if (entries_[i].key == key) break;
    }
    value = entries_[i].value;
  }
  // Backward-shift deletion: move later entries of the probe run into the hole when their home
  // slot does not lie cyclically in (hole, position].
  size_t hole = i;
  for (size_t j = (hole + 1) & mask_; !Empty(j); j = (j + 1) & mask_) {
    const size_t home = HomeOf(j, mask_);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      if (rows_ != nullptr) {
        compact_[hole] = compact_[j];
      } else {
        entries_[hole] = entries_[j];
      }
      hole = j;
    }
  }
  if (rows_ != nullptr) {
    compact_[hole] = kEmpty;
  } else {
    entries_[hole].value = -1;
  }
  --size_;
  return value;
}

void HashIndex::Shard::Clear() {
  if (rows_ != nullptr) {
    compact_.assign(kInitialSlots, kEmpty);
    compact_.shrink_to_fit();
  } else {
    entries_.assign(kInitialSlots, Entry{0, -1});
    entries_.shrink_to_fit();
  }
  mask_ = kInitialSlots - 1;
  size_ = 0;
}

void HashIndex::Shard::Reserve(size_t n) {
  size_t slots = this->slots();
  while (n * 2 > slots) slots *= 2;
  if (slots > this->slots()) Rehash(slots);
}

void HashIndex::Shard::Rehash(size_t slots) {
  const size_t mask = slots - 1;
  if (rows_ != nullptr) {
    std::vector<uint64_t> grown(slots, kEmpty);
    for (size_t i = 0; i <= mask_; ++i) {
      if (compact_[i] == kEmpty) continue;
      size_t j = HomeOf(i, mask);
      while (grown[j] != kEmpty) j = (j + 1) & mask;
      grown[j] = compact_[i];
    }
    compact_.swap(grown);
  } else {
    std::vector<Entry> grown(slots, Entry{0, -1});
    for (const Entry& e : entries_) {
      if (e.value < 0) continue;
      size_t j = Hash(e.key) & mask;
      while (grown[j].value >= 0) j = (j + 1) & mask;
      grown[j] = e;
    }
    entries_.swap(grown);
  }
  mask_ = mask;
}

size_t HashIndex::memory_bytes() {
  size_t total = 0;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu());
    total += s.memory_bytes();
  }
  return total;
}

uint64_t HashIndex::RandomSeed() {
  std::random_device source;
  return (static_cast<uint64_t>(source()) << 32) ^ static_cast<uint64_t>(source());
}

HashIndex::HashIndex(uint64_t seed) : seed_(seed) {
  for (Shard& shard : shards_) shard.set_seed(seed);
}

void HashIndex::set_rows(const RowDirectory* rows) {
  for (Shard& shard : shards_) shard.set_rows(rows);
}

void HashIndex::BucketByShard(const int64_t* keys, int64_t n, uint64_t seed,
                              std::vector<uint64_t>* hashes, std::vector<int64_t>* order,
                              std::vector<int64_t>* begin, const ParallelRunner& run) {
  hashes->resize(n);
  order->resize(n);
  // A fixed split into parts (not the runner's) keeps the output independent of threading:
  // within a shard, positions stay in input order.
  constexpr int64_t kPartSize = 4096;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(16, n / kPartSize));
  std::vector<int64_t> counts(parts * kNumShards, 0);  // [part][shard]
  run(parts, 8 * (n / parts + 1), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      int64_t* count = counts.data() + p * kNumShards;
      for (int64_t i = n * p / parts; i < n * (p + 1) / parts; ++i) {
        const uint64_t h = Hash(keys[i], seed);
        (*hashes)[i] = h;
        ++count[ShardOf(h)];
      }
    }
  });
  // Turn counts into each (part, shard)'s first output position.
  begin->assign(kNumShards + 1, 0);
  int64_t position = 0;
  for (int s = 0; s < kNumShards; ++s) {
    (*begin)[s] = position;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t c = counts[p * kNumShards + s];
      counts[p * kNumShards + s] = position;
      position += c;
    }
  }
  (*begin)[kNumShards] = position;
  run(parts, 4 * (n / parts + 1), [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      int64_t* next = counts.data() + p * kNumShards;
      for (int64_t i = n * p / parts; i < n * (p + 1) / parts; ++i) {
        (*order)[next[ShardOf((*hashes)[i])]++] = i;
      }
    }
  });
}

void HashIndex::ForEachShard(const int64_t* keys, int64_t n, int64_t cost_per_key,
                             const ShardBatchFn& fn, const ParallelRunner& run) {
  std::vector<uint64_t> hashes;
  std::vector<int64_t> order;
  std::vector<int64_t> begin;
  BucketByShard(keys, n, seed_, &hashes, &order, &begin, run);
  const int64_t per_shard_cost = std::max<int64_t>(1, cost_per_key * (n / kNumShards + 1));
  run(kNumShards, per_shard_cost, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      if (begin[s] == begin[s + 1]) continue;
      Shard& shard = shards_[s];
      std::lock_guard<std::mutex> lock(shard.mu());
      fn(shard, order.data() + begin[s], begin[s + 1] - begin[s], hashes.data());
    }
  });
}

void HashIndex::ForEachKeyByShard(const int64_t* keys, int64_t n, int64_t cost_per_key,
                                  const std::function<void(Shard&, int64_t, uint64_t)>& fn,
                                  const ParallelRunner& run) {
  ForEachShard(
      keys, n, cost_per_key,
      [&](Shard& shard, const int64_t* positions, int64_t count, const uint64_t* hashes) {
        ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) { fn(shard, i, hashes[i]); });
      },
      run);
}
}  // namespace rec_sdk
