// Tests of PendingKeys and PendingShard: the keys counting towards admission, on their own
// (table_admission_test.cc tests admission through EmbeddingTable).
#include "tf_ops/core/pending_keys.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace rec_sdk {
namespace {

constexpr uint64_t kSeed = 12345;

uint64_t HashOf(int64_t key) { return HashIndex::Hash(key, kSeed); }

TEST(PendingShardTest, AddFindRemove) {
  PendingShard shard;
  shard.set_seed(kSeed);
  EXPECT_EQ(shard.size(), 0);
  EXPECT_EQ(shard.Find(7, HashOf(7)), nullptr);
  PendingKey* p = shard.Add(7, HashOf(7), 100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->key, 7);
  EXPECT_EQ(p->count, 0);
  EXPECT_EQ(p->last_seen, 100);
  p->count += 3;
  EXPECT_EQ(shard.size(), 1);
  ASSERT_NE(shard.Find(7, HashOf(7)), nullptr);
  EXPECT_EQ(shard.Find(7, HashOf(7))->count, 3);
  shard.Remove(7, HashOf(7));
  EXPECT_EQ(shard.size(), 0);
  EXPECT_EQ(shard.Find(7, HashOf(7)), nullptr);
  shard.Remove(7, HashOf(7));  // absent: ignored
  EXPECT_EQ(shard.size(), 0);
}

TEST(PendingShardTest, ReusesFreedRecordsAndForEachSkipsThem) {
  PendingShard shard;
  shard.set_seed(kSeed);
  for (int64_t k = 0; k < 10; ++k) shard.Add(k, HashOf(k), k)->count = k + 1;
  for (int64_t k = 0; k < 10; k += 2) shard.Remove(k, HashOf(k));
  // Two new keys take freed records; the survivors keep their counts.
  shard.Add(100, HashOf(100), 5)->count = 7;
  shard.Add(101, HashOf(101), 6)->count = 8;
  std::map<int64_t, int64_t> seen;
  ASSERT_TRUE(shard
                  .ForEach([&](const PendingKey& p) {
                    seen[p.key] = p.count;
                    return Status::Ok();
                  })
                  .ok());
  const std::map<int64_t, int64_t> expected = {{1, 2},  {3, 4},   {5, 6},  {7, 8},
                                               {9, 10}, {100, 7}, {101, 8}};
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(shard.size(), 7);
}

TEST(PendingShardTest, ForEachStopsAtTheFirstError) {
  PendingShard shard;
  shard.set_seed(kSeed);
  for (int64_t k = 0; k < 5; ++k) shard.Add(k, HashOf(k), 0);
  int calls = 0;
  const Status status = shard.ForEach([&](const PendingKey&) {
    ++calls;
    return calls == 2 ? Status::DataLoss("stop") : Status::Ok();
  });
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(calls, 2);
}

TEST(PendingShardTest, RemoveSeenAtOrBeforeKeepsNewerKeysAndShrinks) {
  PendingShard shard;
  shard.set_seed(kSeed);
  // Enough records that dropping most of them gives memory back (rebuilds the shard).
  constexpr int64_t kKeys = 5000;
  for (int64_t k = 0; k < kKeys; ++k) shard.Add(k, HashOf(k), k)->count = 2 * k;
  EXPECT_EQ(shard.RemoveSeenAtOrBefore(kKeys - 101), kKeys - 100);
  EXPECT_EQ(shard.size(), 100);
  for (int64_t k = 0; k < kKeys; ++k) {
    const PendingKey* p = shard.Find(k, HashOf(k));
    if (k < kKeys - 100) {
      EXPECT_EQ(p, nullptr) << k;
    } else {
      ASSERT_NE(p, nullptr) << k;
      EXPECT_EQ(p->count, 2 * k);
      EXPECT_EQ(p->last_seen, k);
    }
  }
  EXPECT_EQ(shard.RemoveSeenAtOrBefore(-1), 0);
  shard.Clear();
  EXPECT_EQ(shard.size(), 0);
  EXPECT_EQ(shard.Find(kKeys - 1, HashOf(kKeys - 1)), nullptr);
}

TEST(PendingKeysTest, ShardsByHashAndCountsTheTotal) {
  PendingKeys pending;
  pending.set_seed(kSeed);
  EXPECT_EQ(pending.size(), 0);
  std::mt19937_64 rng(1);
  std::map<int64_t, int64_t> model;  // key -> last_seen
  while (model.size() < 2000) {
    const int64_t key = static_cast<int64_t>(rng());
    if (model.count(key)) continue;
    const int64_t clock = static_cast<int64_t>(model.size());
    const uint64_t hash = HashOf(key);
    PendingShard& shard = pending.ShardFor(hash);
    EXPECT_EQ(&shard, &pending.shard(HashIndex::ShardOf(hash)));
    shard.Add(key, hash, clock);
    pending.Added(1);
    model[key] = clock;
  }
  EXPECT_EQ(pending.size(), 2000);
  int64_t in_shards = 0;
  for (int s = 0; s < HashIndex::kNumShards; ++s) in_shards += pending.shard(s).size();
  EXPECT_EQ(in_shards, 2000);

  // Across shards: drop the keys seen at clocks 0..499.
  EXPECT_EQ(pending.RemoveSeenAtOrBefore(499), 500);
  EXPECT_EQ(pending.size(), 1500);
  std::map<int64_t, int64_t> left;
  ASSERT_TRUE(pending
                  .ForEach([&](const PendingKey& p) {
                    left[p.key] = p.last_seen;
                    return Status::Ok();
                  })
                  .ok());
  std::map<int64_t, int64_t> expected;
  for (const auto& [key, clock] : model) {
    if (clock > 499) expected[key] = clock;
  }
  EXPECT_EQ(left, expected);

  // Removing one key is counted by the caller.
  const int64_t key = expected.begin()->first;
  pending.ShardFor(HashOf(key)).Remove(key, HashOf(key));
  pending.Removed(1);
  EXPECT_EQ(pending.size(), 1499);

  for (int s = 0; s < HashIndex::kNumShards; ++s) pending.shard(s).Clear();
  pending.ResetSize();
  EXPECT_EQ(pending.size(), 0);
  int visited = 0;
  ASSERT_TRUE(pending
                  .ForEach([&](const PendingKey&) {
                    ++visited;
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_EQ(visited, 0);
}

}  // namespace
}  // namespace rec_sdk
