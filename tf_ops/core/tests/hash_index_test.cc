// Tests of HashIndex: the sharded open-addressing key -> row map, checked against
// std::unordered_map models.
#include "tf_ops/core/hash_index.h"
#include "tf_ops/core/table_storage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rec_sdk {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The rows of a compact index's tests: row records (headers only) in chunks found through a
// RowDirectory, as a table's; each row holds its key and a generation (row % 5).
class FakeRows {
 public:
  static constexpr int kChunkShift = 12;
  FakeRows() : pages_(new std::atomic<DirectoryPage*>[kMaxPages]) {
    for (int64_t p = 0; p < kMaxPages; ++p) pages_[p].store(nullptr);
    pages_[0].store(&page_);
    for (auto& c : page_.chunks) c.store(nullptr);
    dir_.pages = pages_.get();
    dir_.chunk_shift = kChunkShift;
    dir_.row_bytes = sizeof(RowMeta);
  }
  ~FakeRows() {
    for (auto& c : page_.chunks) delete c.load();
  }
  static int64_t ValueOf(int64_t row) { return IndexEntry(row, static_cast<uint32_t>(row % 5)); }
  void Put(int64_t row, int64_t key) {
    const int64_t c = row >> kChunkShift;
    ASSERT_LT(c, kPageSize);
    if (page_.chunks[c].load() == nullptr) {
      Chunk* chunk = new Chunk;
      records_.emplace_back(new RowMeta[int64_t{1} << kChunkShift]());
      chunk->rows = reinterpret_cast<char*>(records_.back().get());
      page_.chunks[c].store(chunk);
    }
    RowMeta& meta = dir_.MetaOf(row);
    meta.key = key;
    meta.generation = static_cast<uint16_t>(row % 5);
  }
  const RowDirectory* directory() const { return &dir_; }

 private:
  std::unique_ptr<std::atomic<DirectoryPage*>[]> pages_;
  DirectoryPage page_;
  std::vector<std::unique_ptr<RowMeta[]>> records_;
  RowDirectory dir_;
};

// Drives a HashIndex the way EmbeddingTable does (Find before Insert, the shard picked by the
// top hash bits) and mirrors every operation in an unordered_map. A compact index reads keys
// back from FakeRows.
class ModelChecker {
 public:
  explicit ModelChecker(bool compact = false) : index_(new HashIndex) {
    if (compact) {
      for (int s = 0; s < HashIndex::kNumShards; ++s) {
        index_->shard(s).set_rows(rows_.directory());
      }
    }
  }

  ModelChecker(const ModelChecker&) = delete;  // the index points at rows_

  HashIndex::Shard& ShardFor(int64_t key) {
    return index_->shard(HashIndex::ShardOf(HashIndex::Hash(key, 0)));
  }

  // Inserts key -> row unless present; returns whether it was inserted.
  bool Insert(int64_t key, int64_t row) {
    const uint64_t h = HashIndex::Hash(key, 0);
    HashIndex::Shard& s = ShardFor(key);
    std::lock_guard<std::mutex> lock(s.mu());
    const int64_t found = s.Find(key, h);
    auto it = model_.find(key);
    EXPECT_EQ(found, it == model_.end() ? -1 : it->second) << "key " << key;
    if (found >= 0) return false;
    rows_.Put(row, key);
    s.Insert(key, h, FakeRows::ValueOf(row));
    model_[key] = FakeRows::ValueOf(row);
    return true;
  }

  void Erase(int64_t key) {
    const uint64_t h = HashIndex::Hash(key, 0);
    HashIndex::Shard& s = ShardFor(key);
    std::lock_guard<std::mutex> lock(s.mu());
    const int64_t erased = s.Erase(key, h);
    auto it = model_.find(key);
    EXPECT_EQ(erased, it == model_.end() ? -1 : it->second) << "key " << key;
    if (it != model_.end()) model_.erase(it);
    // No duplicate of the key may survive the erase.
    EXPECT_EQ(s.Find(key, h), -1) << "key " << key << " still found after Erase";
  }

  // Every key of `universe` is found exactly when the model has it, with the model's row, and
  // the shard sizes add up to the model's size.
  void CheckAll(const std::vector<int64_t>& universe) {
    for (int64_t key : universe) {
      const uint64_t h = HashIndex::Hash(key, 0);
      HashIndex::Shard& s = ShardFor(key);
      std::lock_guard<std::mutex> lock(s.mu());
      auto it = model_.find(key);
      ASSERT_EQ(s.Find(key, h), it == model_.end() ? -1 : it->second) << "key " << key;
    }
    size_t total = 0;
    for (int i = 0; i < HashIndex::kNumShards; ++i) total += index_->shard(i).size();
    ASSERT_EQ(total, model_.size());
    // FindInOrder (MatchEntries and CheckMatch in a compact shard) gives each shard's keys, in
    // order, what Find gives.
    std::vector<uint64_t> hashes;
    std::vector<int64_t> order, begin;
    HashIndex::BucketByShard(universe.data(), static_cast<int64_t>(universe.size()), 0, &hashes,
                             &order, &begin);
    for (int s = 0; s < HashIndex::kNumShards; ++s) {
      HashIndex::Shard& shard = index_->shard(s);
      std::lock_guard<std::mutex> lock(shard.mu());
      std::vector<int64_t> entries, at;
      HashIndex::FindInOrder(shard, universe.data(), order.data() + begin[s],
                             begin[s + 1] - begin[s], hashes.data(), [&](int64_t i, int64_t e) {
                               at.push_back(i);
                               entries.push_back(e);
                             });
      ASSERT_EQ(at, std::vector<int64_t>(order.begin() + begin[s], order.begin() + begin[s + 1]));
      for (size_t j = 0; j < entries.size(); ++j) {
        const int64_t key = universe[at[j]];
        auto it = model_.find(key);
        ASSERT_EQ(entries[j], it == model_.end() ? -1 : it->second) << "FindInOrder, key " << key;
      }
    }
  }

  HashIndex& index() { return *index_; }
  const std::unordered_map<int64_t, int64_t>& model() const { return model_; }

 private:
  FakeRows rows_;
  std::unique_ptr<HashIndex> index_;
  std::unordered_map<int64_t, int64_t> model_;
};

// Keys of one shard whose home slot under a table of `slots` slots is one of `homes`.
std::vector<int64_t> KeysWithHomes(int shard, size_t slots, const std::vector<size_t>& homes,
                                   size_t per_home, int64_t start) {
  std::vector<int64_t> keys;
  for (size_t home : homes) {
    size_t found = 0;
    for (int64_t k = start; found < per_home; ++k) {
      const uint64_t h = HashIndex::Hash(k, 0);
      if (HashIndex::ShardOf(h) == shard && (h & (slots - 1)) == home) {
        keys.push_back(k);
        ++found;
      }
    }
  }
  return keys;
}

// --- Hash and shard selection -------------------------------------------------------------

TEST(HashIndexTest, HashIsDeterministicAndShardInRange) {
  for (int64_t key : {int64_t{0}, int64_t{1}, int64_t{-1}, kMin, kMax, int64_t{123456789}}) {
    EXPECT_EQ(HashIndex::Hash(key, 0), HashIndex::Hash(key, 0));
    const int s = HashIndex::ShardOf(HashIndex::Hash(key, 0));
    EXPECT_GE(s, 0);
    EXPECT_LT(s, HashIndex::kNumShards);
  }
  // Sequential keys spread over every shard.
  std::vector<int> count(HashIndex::kNumShards, 0);
  for (int64_t k = 0; k < 64 * 200; ++k) ++count[HashIndex::ShardOf(HashIndex::Hash(k, 0))];
  for (int s = 0; s < HashIndex::kNumShards; ++s) EXPECT_GT(count[s], 100) << "shard " << s;
}

// --- Random operations against an unordered_map --------------------------------------------

// Each model test runs on the full layout and the compact one.
class HashIndexLayoutTest : public ::testing::TestWithParam<bool> {
 protected:
  ModelChecker Make() const { return ModelChecker(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Layouts, HashIndexLayoutTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Compact" : "Full");
                         });

TEST_P(HashIndexLayoutTest, EmptyIndexFindsNothing) {
  ModelChecker m = Make();
  m.CheckAll({0, 1, -1, kMin, kMax});
  m.Erase(42);  // erasing an absent key is a no-op returning -1
  m.CheckAll({42});
}

TEST_P(HashIndexLayoutTest, RandomInsertFindEraseMatchesModel) {
  ModelChecker m = Make();
  std::mt19937_64 rng(7);
  // A pool mixing random 64-bit keys, small keys (0 included), negative keys and the extremes.
  std::vector<int64_t> pool = {0, 1, -1, kMin, kMin + 1, kMax, kMax - 1};
  for (int i = 0; i < 3000; ++i) pool.push_back(static_cast<int64_t>(rng()));
  for (int i = 0; i < 1000; ++i) pool.push_back(i - 500);
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  int64_t next_row = 0;
  for (int op = 0; op < 60000; ++op) {
    const int64_t key = pool[pick(rng)];
    if (rng() % 3 != 0) {
      m.Insert(key, next_row++);
    } else {
      m.Erase(key);
    }
    if (op % 5000 == 4999) {
      ASSERT_NO_FATAL_FAILURE(m.CheckAll(pool));
    }
  }
  ASSERT_NO_FATAL_FAILURE(m.CheckAll(pool));
  // Erase everything: the index must end up empty with no key left behind.
  for (int64_t key : pool) m.Erase(key);
  ASSERT_NO_FATAL_FAILURE(m.CheckAll(pool));
  EXPECT_TRUE(m.model().empty());
}

TEST_P(HashIndexLayoutTest, ExtremeKeysAndRowZero) {
  ModelChecker m = Make();
  // Key 0 with row 0 must not look like an empty slot (empty slots are {0, -1}).
  EXPECT_TRUE(m.Insert(0, 0));
  EXPECT_TRUE(m.Insert(kMin, 1));
  EXPECT_TRUE(m.Insert(kMax, 2));
  EXPECT_TRUE(m.Insert(-1, 3));
  EXPECT_FALSE(m.Insert(kMin, 99));  // already present: keeps row 1
  ASSERT_NO_FATAL_FAILURE(m.CheckAll({0, kMin, kMax, -1, 1, kMin + 1, kMax - 1}));
  m.Erase(kMin);
  m.Erase(0);
  ASSERT_NO_FATAL_FAILURE(m.CheckAll({0, kMin, kMax, -1}));
}

TEST_P(HashIndexLayoutTest, GrowthKeepsEveryKey) {
  ModelChecker m = Make();
  // Many keys per shard forces each shard through several doublings.
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 50000; ++i) keys.push_back(i * 7919 - 100000);
  for (size_t i = 0; i < keys.size(); ++i) m.Insert(keys[i], static_cast<int64_t>(i));
  ASSERT_NO_FATAL_FAILURE(m.CheckAll(keys));
  // Erase every other key after growth, then re-insert half of those with new rows.
  for (size_t i = 0; i < keys.size(); i += 2) m.Erase(keys[i]);
  ASSERT_NO_FATAL_FAILURE(m.CheckAll(keys));
  for (size_t i = 0; i < keys.size(); i += 4) m.Insert(keys[i], 1000000 + static_cast<int64_t>(i));
  ASSERT_NO_FATAL_FAILURE(m.CheckAll(keys));
}

// --- Backward-shift deletion across the end of the slot array ------------------------------

// For each table size, fills one shard up to that size with keys homed in the middle, then
// works a cluster of keys whose home slots straddle the wrap-around (last slots and first
// slots), erasing in every order and checking all keys after each step.
TEST_P(HashIndexLayoutTest, BackwardShiftAcrossWrapAroundAtSeveralSizes) {
  const int shard = 5;
  for (size_t slots : {size_t{16}, size_t{32}, size_t{64}, size_t{256}}) {
    SCOPED_TRACE("slots=" + std::to_string(slots));
    ModelChecker m = Make();
    // A table of `slots` slots holds between slots/4 + 1 (after growing to it) and slots/2
    // entries. Fillers are homed around slots/2 (far from the wrap), the cluster around 0.
    const size_t fillers = slots / 4 + 1;
    std::vector<int64_t> filler_keys =
        KeysWithHomes(shard, slots, {slots / 2 - 1, slots / 2}, (fillers + 1) / 2, 1000);
    filler_keys.resize(fillers);
    const size_t room = slots / 2 - fillers;
    ASSERT_GE(room, 3u);
    const size_t per_home = (room + 3) / 4;
    std::vector<int64_t> cluster =
        KeysWithHomes(shard, slots, {slots - 2, slots - 1, 0, 1}, per_home, 5000000);
    cluster.resize(std::min(cluster.size(), room));
    std::vector<int64_t> universe = filler_keys;
    universe.insert(universe.end(), cluster.begin(), cluster.end());

    int64_t row = 0;
    for (int64_t k : filler_keys) m.Insert(k, row++);
    const size_t bytes_before = m.index().shard(shard).memory_bytes();
    std::mt19937 rng(static_cast<unsigned>(slots));
    for (int round = 0; round < 30; ++round) {
      // Insert the cluster in a random order, then erase it in another random order.
      std::shuffle(cluster.begin(), cluster.end(), rng);
      for (int64_t k : cluster) m.Insert(k, row++);
      ASSERT_NO_FATAL_FAILURE(m.CheckAll(universe));
      std::shuffle(cluster.begin(), cluster.end(), rng);
      for (int64_t k : cluster) {
        m.Erase(k);
        ASSERT_NO_FATAL_FAILURE(m.CheckAll(universe));
      }
    }
    // The cluster never pushed the shard past `slots` slots, so the wrap case was exercised
    // at this size rather than after another growth.
    EXPECT_EQ(m.index().shard(shard).memory_bytes(), bytes_before);
    EXPECT_EQ(m.index().shard(shard).size(), fillers);
  }
}

// A long run of random insert/erase on one shard restricted to keys homed near the wrap, with
// the size kept below the growth threshold: every shape of probe run that crosses the end.
TEST_P(HashIndexLayoutTest, RandomOpsOnWrappingClusterMatchModel) {
  const int shard = 17;
  const size_t slots = 16;
  std::vector<int64_t> pool = KeysWithHomes(shard, slots, {13, 14, 15, 0, 1, 2}, 3, -3000000);
  ModelChecker m = Make();
  std::mt19937 rng(3);
  int64_t row = 0;
  for (int op = 0; op < 20000; ++op) {
    const int64_t key = pool[rng() % pool.size()];
    if (m.model().size() < slots / 2 && rng() % 2 == 0) {
      m.Insert(key, row++);
    } else {
      m.Erase(key);
    }
    ASSERT_NO_FATAL_FAILURE(m.CheckAll(pool));
  }
  EXPECT_EQ(m.index().shard(shard).memory_bytes(), m.index().shard(0).memory_bytes())
      << "the shard should not have grown";
}

TEST_P(HashIndexLayoutTest, ClearEmptiesShard) {
  ModelChecker m = Make();
  for (int64_t k = 0; k < 1000; ++k) m.Insert(k, k);
  HashIndex::Shard& s = m.ShardFor(3);
  std::lock_guard<std::mutex> lock(s.mu());
  s.Clear();
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.Find(3, HashIndex::Hash(3, 0)), -1);
  s.Insert(3, HashIndex::Hash(3, 0), FakeRows::ValueOf(3));
  EXPECT_EQ(s.Find(3, HashIndex::Hash(3, 0)), FakeRows::ValueOf(3));
}

// A compact shard takes 8 bytes an entry; absent keys are not found, whatever row their
// probes pass (the hash bits and then the key tell them apart).
TEST(HashIndexCompactTest, HalfTheMemory) {
  ModelChecker full(false), compact(true);
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 20000; ++k) {
    full.Insert(k, k);
    compact.Insert(k, k);
    keys.push_back(k);
  }
  EXPECT_EQ(compact.index().memory_bytes() * 2, full.index().memory_bytes());
  for (int64_t k = 1000000; k < 1020000; ++k) keys.push_back(k);
  ASSERT_NO_FATAL_FAILURE(compact.CheckAll(keys));
}

// Keys of one shard whose hashes share the 12 bits a compact entry keeps: the hash bits
// match, and only the key read back from the row tells them apart.
TEST(HashIndexCompactTest, KeysSharingTheStoredHashBits) {
  std::unordered_map<uint64_t, int64_t> seen;  // shard, bits 40..51, home in 16 slots -> key
  int64_t a = 0, b = 0;
  for (int64_t k = 1;; ++k) {
    const uint64_t h = HashIndex::Hash(k, 0);
    const uint64_t bits = (h >> 58 << 16) | (((h >> 40) & 0xfff) << 4) | (h & 0xf);
    auto [it, added] = seen.emplace(bits, k);
    if (!added) {
      a = it->second;
      b = k;
      break;
    }
  }
  {
    ModelChecker m(true);
    m.Insert(a, 10);
    ASSERT_NO_FATAL_FAILURE(m.CheckAll({a, b}));  // b: a hash match, another key: absent
    m.Insert(b, 11);
    ASSERT_NO_FATAL_FAILURE(m.CheckAll({a, b}));
    m.Erase(a);
    ASSERT_NO_FATAL_FAILURE(m.CheckAll({a, b}));
    m.Insert(a, 12);
    m.Erase(b);
    ASSERT_NO_FATAL_FAILURE(m.CheckAll({a, b}));
  }
}

// --- BucketByShard --------------------------------------------------------------------------

// Checks the documented contract: hashes[i] = Hash(keys[i]); begin is a prefix sum; every
// position appears exactly once; positions of a shard are its positions in original order.
void CheckBuckets(const std::vector<int64_t>& keys) {
  std::vector<uint64_t> hashes;
  std::vector<int64_t> order;
  std::vector<int64_t> begin;
  const int64_t n = static_cast<int64_t>(keys.size());
  HashIndex::BucketByShard(keys.data(), n, 0, &hashes, &order, &begin);
  ASSERT_EQ(hashes.size(), keys.size());
  ASSERT_EQ(order.size(), keys.size());
  ASSERT_EQ(begin.size(), static_cast<size_t>(HashIndex::kNumShards + 1));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hashes[i], HashIndex::Hash(keys[i], 0));
  EXPECT_EQ(begin[0], 0);
  EXPECT_EQ(begin[HashIndex::kNumShards], n);

  // Reference: positions of each shard, in their original order.
  std::vector<std::vector<int64_t>> expected(HashIndex::kNumShards);
  for (int64_t i = 0; i < n; ++i)
    expected[HashIndex::ShardOf(HashIndex::Hash(keys[i], 0))].push_back(i);
  std::vector<int> seen(keys.size(), 0);
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    ASSERT_LE(begin[s], begin[s + 1]);
    std::vector<int64_t> got(order.begin() + begin[s], order.begin() + begin[s + 1]);
    EXPECT_EQ(got, expected[s]) << "shard " << s;
    for (int64_t i : got) ++seen[i];
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "position " << i;
}

TEST(HashIndexTest, BucketByShardEmpty) { CheckBuckets({}); }

TEST(HashIndexTest, BucketByShardRandomKeysWithDuplicates) {
  std::mt19937_64 rng(11);
  std::vector<int64_t> keys;
  for (int i = 0; i < 5000; ++i) keys.push_back(static_cast<int64_t>(rng()));
  // Duplicates (must stay in batch order within their shard) and extreme keys.
  for (int i = 0; i < 1000; ++i) keys.push_back(keys[rng() % keys.size()]);
  for (int64_t k : {kMin, kMax, int64_t{0}, int64_t{-1}, kMin, kMax}) keys.push_back(k);
  std::shuffle(keys.begin(), keys.end(), rng);
  CheckBuckets(keys);
}

TEST(HashIndexTest, BucketByShardSingleShardBatch) {
  // All keys in one shard: the order must be exactly 0..n-1.
  std::vector<int64_t> keys = KeysWithHomes(9, 16, {0, 1, 2, 3, 4, 5, 6, 7}, 4, 0);
  keys.push_back(keys[0]);
  CheckBuckets(keys);
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

// Large batches are bucketed in parallel parts; the result must equal the serial one.
TEST(HashIndexBucketTest, ThreadedBucketingEqualsSerial) {
  std::mt19937_64 rng(17);
  std::vector<int64_t> keys(100000);
  for (auto& k : keys) k = static_cast<int64_t>(rng() % 30000);
  std::vector<uint64_t> h1, h2;
  std::vector<int64_t> o1, o2, b1, b2;
  HashIndex::BucketByShard(keys.data(), keys.size(), 0, &h1, &o1, &b1);
  auto threaded = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& work) {
    std::vector<std::thread> threads;
    for (int64_t p = 0; p < total; ++p) threads.emplace_back([&work, p] { work(p, p + 1); });
    for (auto& t : threads) t.join();
  };
  HashIndex::BucketByShard(keys.data(), keys.size(), 0, &h2, &o2, &b2, threaded);
  EXPECT_EQ(h1, h2);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(b1, b2);
}

}  // namespace
}  // namespace rec_sdk
