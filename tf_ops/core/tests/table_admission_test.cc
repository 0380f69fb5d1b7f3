// Tests of admission and eviction (table_admission.cc) against a small reference model: counts
// and thresholds, their configuration, clocks, eviction by age, eviction of full tables,
// counters, access tracking and Restrict.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tf_ops/core/embedding_table.h"
#include "tf_ops/core/tests/table_test_util.h"

namespace rec_sdk {
namespace {

using namespace table_test;  // NOLINT(build/namespaces): the shared test helpers

// A table's configuration and the admission settings its lookups give it.
struct TableSetup {
  TableConfig table;
  AdmissionConfig admission;
};

TableSetup Config(int64_t access_threshold, int64_t eviction_threshold) {
  TableSetup c;
  c.table.name = "t";
  c.table.dim = 4;
  c.table.dynamic_expansion = true;
  c.table.initializer.kind = InitializerKind::kRandomUniform;
  c.table.initializer.minval = -1;
  c.table.initializer.maxval = 1;
  c.admission = {access_threshold, eviction_threshold};
  return c;
}

std::unique_ptr<EmbeddingTable> Make(const TableSetup& c) {
  std::unique_ptr<EmbeddingTable> t;
  EXPECT_TRUE(EmbeddingTable::Create(c.table, &t).ok());
  EXPECT_TRUE(t->ConfigureAdmission(c.admission).ok());
  return t;
}

// A fixed table of `capacity` rows without thresholds that evicts when full.
std::unique_ptr<EmbeddingTable> EvictingWhenFull(int64_t capacity) {
  TableSetup c = Config(-1, -1);
  c.table.dynamic_expansion = false;
  c.table.capacity = capacity;
  c.table.evict_when_full = true;
  return Make(c);
}

// Training lookup of unique keys with counts and one clock for all.
std::vector<int64_t> Train(EmbeddingTable* t, const std::vector<int64_t>& keys,
                           const std::vector<int64_t>& counts, int64_t clock) {
  std::vector<int64_t> addresses(keys.size());
  KeyAccess access;
  access.counts = counts.data();
  access.times = &clock;
  EXPECT_TRUE(
      t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), SerialRunner, access).ok());
  return addresses;
}

std::vector<int64_t> Find(EmbeddingTable* t, const std::vector<int64_t>& keys) {
  std::vector<int64_t> addresses(keys.size());
  EXPECT_TRUE(
      t->FindOrInsert(keys.data(), keys.size(), false, addresses.data(), SerialRunner).ok());
  return addresses;
}

TEST(AdmissionTest, KeyGetsARowWhenItsCountReachesTheThreshold) {
  auto t = Make(Config(3, -1));
  EXPECT_EQ(Train(t.get(), {7, 8}, {1, 2}, 1), (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(t->Size(), 0);
  EXPECT_EQ(t->Stats().pending, 2);
  EXPECT_EQ(t->Stats().rejected, 2);
  // 8 reaches 3 (2 + 1); 7 has 2.
  std::vector<int64_t> a = Train(t.get(), {7, 8}, {1, 1}, 2);
  EXPECT_EQ(a[0], -1);
  EXPECT_GE(a[1], 0);
  EXPECT_EQ(t->Size(), 1);
  EXPECT_EQ(t->Stats().pending, 1);
  EXPECT_EQ(t->Stats().admitted, 1);
  // Eval never counts nor inserts.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Find(t.get(), {7})[0], -1);
  EXPECT_EQ(Train(t.get(), {7}, {1}, 3)[0] >= 0, true);
  EXPECT_EQ(t->Stats().pending, 0);
}

TEST(AdmissionTest, ThresholdZeroAndMinusOneAdmitEveryKey) {
  for (int64_t threshold : {-1, 0}) {
    auto t = Make(Config(threshold, -1));
    std::vector<int64_t> a = Train(t.get(), {1, 2, 3}, {1, 1, 1}, 1);
    for (int64_t x : a) EXPECT_GE(x, 0);
    EXPECT_EQ(t->Stats().pending, 0);
  }
}

TEST(AdmissionTest, RaisingTheThresholdKeepsAdmittedKeys) {
  auto t = Make(Config(1, -1));
  const int64_t first = Train(t.get(), {5}, {1}, 1)[0];
  ASSERT_GE(first, 0);
  ASSERT_TRUE(t->SetAccessThreshold(10).ok());
  EXPECT_EQ(Train(t.get(), {5}, {1}, 2)[0], first);
  EXPECT_EQ(Train(t.get(), {6}, {9}, 2)[0], -1);
  EXPECT_GE(Train(t.get(), {6}, {1}, 2)[0], 0);
  EXPECT_FALSE(t->SetAccessThreshold(-2).ok());
}

TEST(EvictionTest, DropsRowsAndPendingCountsOlderThanTheThreshold) {
  auto t = Make(Config(2, 10));
  Train(t.get(), {1, 2}, {2, 1}, 100);  // 1 admitted, 2 pending
  Train(t.get(), {3}, {2}, 105);        // 3 admitted
  Train(t.get(), {4}, {2}, 110);        // newest clock 110: 1 and 2 are 10 old
  int64_t rows = -1, pending = -1;
  ASSERT_TRUE(t->Evict(&rows, &pending, SerialRunner).ok());
  EXPECT_EQ(rows, 1);
  EXPECT_EQ(pending, 1);
  EXPECT_EQ(Find(t.get(), {1})[0], -1);
  EXPECT_GE(Find(t.get(), {3})[0], 0);
  EXPECT_EQ(t->Stats().evicted, 1);
  // Key 1 starts from scratch: its count restarts below the threshold.
  EXPECT_EQ(Train(t.get(), {1}, {1}, 111)[0], -1);
  EXPECT_GE(Train(t.get(), {1}, {1}, 111)[0], 0);
}

TEST(EvictionTest, ABatchWithoutKeysStillMovesTheClockOn) {
  // A shard over ranks whose keys nobody looked up in a step still sees the step's clock:
  // its rows age as one process's do.
  auto t = Make(Config(0, 10));
  Train(t.get(), {1}, {1}, 100);
  Train(t.get(), {}, {}, 110);  // no key of this shard at clock 110
  int64_t rows = -1, pending = -1;
  ASSERT_TRUE(t->Evict(&rows, &pending, SerialRunner).ok());
  EXPECT_EQ(rows, 1);
  EXPECT_EQ(Find(t.get(), {1})[0], -1);
}

TEST(EvictionTest, EvictedRowIsReinitialisedWithFreshSlotsAndStaleAddress) {
  auto t = Make(Config(-1, 5));
  ASSERT_TRUE(t->EnsureSlots("Adagrad", {0.5f}).ok());
  const int64_t old_address = Train(t.get(), {9}, {1}, 1)[0];
  std::vector<float> initial(4);
  ASSERT_TRUE(t->Gather(&old_address, 1, initial.data(), SerialRunner).ok());
  ASSERT_TRUE(t->UpdateRows(
                   &old_address, 1, 1,
                   [](int64_t, float* v, float* const* slots) {
                     for (int d = 0; d < 4; ++d) {
                       v[d] += 3;
                       slots[0][d] = 7;
                     }
                   },
                   SerialRunner)
                  .ok());
  Train(t.get(), {10}, {1}, 6);
  int64_t rows = 0;
  ASSERT_TRUE(t->Evict(&rows, nullptr, SerialRunner).ok());
  EXPECT_EQ(rows, 1);
  std::vector<float> out(4);
  EXPECT_FALSE(t->Gather(&old_address, 1, out.data(), SerialRunner).ok());
  const int64_t address = Train(t.get(), {9}, {1}, 7)[0];
  ASSERT_TRUE(t->Gather(&address, 1, out.data(), SerialRunner).ok());
  EXPECT_EQ(out, initial);
  ASSERT_TRUE(t->UpdateRows(
                   &address, 1, 1,
                   [](int64_t, float*, float* const* slots) {
                     for (int d = 0; d < 4; ++d) EXPECT_EQ(slots[0][d], 0.5f);
                   },
                   SerialRunner)
                  .ok());
}

TEST(EvictionTest, PerKeyClocksKeepTheNewest) {
  auto t = Make(Config(-1, 10));
  std::vector<int64_t> keys = {1, 2}, counts = {1, 1}, times = {100, 50};
  std::vector<int64_t> addresses(2);
  KeyAccess access;
  access.counts = counts.data();
  access.times = times.data();
  access.times_per_key = true;
  ASSERT_TRUE(t->FindOrInsert(keys.data(), 2, true, addresses.data(), SerialRunner, access).ok());
  // An older clock does not move a key's last-seen time back.
  Train(t.get(), {1}, {1}, 20);
  int64_t rows = 0;
  ASSERT_TRUE(t->Evict(&rows, nullptr, SerialRunner).ok());
  EXPECT_EQ(rows, 1);  // key 2 (50 <= 100 - 10)
  EXPECT_GE(Find(t.get(), {1})[0], 0);
  EXPECT_EQ(Find(t.get(), {2})[0], -1);
}

TEST(EvictionTest, WithoutThresholdOrClockNothingIsEvicted) {
  auto t = Make(Config(-1, -1));
  Train(t.get(), {1}, {1}, 1);
  Train(t.get(), {2}, {1}, 1000);
  int64_t rows = -1;
  ASSERT_TRUE(t->Evict(&rows, nullptr, SerialRunner).ok());
  EXPECT_EQ(rows, 0);
  auto fresh = Make(Config(-1, 0));
  ASSERT_TRUE(fresh->Evict(&rows, nullptr, SerialRunner).ok());
  EXPECT_EQ(rows, 0);
}

TEST(EvictionTest, FullTableEvictsLeastRecentlySeenRows) {
  auto t = EvictingWhenFull(100);
  for (int64_t k = 0; k < 100; ++k) Train(t.get(), {k}, {1}, k);
  Train(t.get(), {0}, {1}, 200);  // key 0 is now the most recent
  const std::vector<int64_t> a = Train(t.get(), {1000, 1001}, {1, 1}, 201);
  EXPECT_GE(a[0], 0);
  EXPECT_GE(a[1], 0);
  EXPECT_LE(t->Size(), 100);
  EXPECT_GE(Find(t.get(), {0})[0], 0);
  EXPECT_EQ(Find(t.get(), {1})[0], -1);  // the oldest go first
  EXPECT_EQ(Find(t.get(), {2})[0], -1);
  EXPECT_GE(Find(t.get(), {99})[0], 0);
  EXPECT_EQ(t->Stats().evicted, 3);  // 2 needed + 1% of 100
  // A batch bigger than the capacity still fails clearly.
  std::vector<int64_t> many(150), counts(150, 1), addresses(150);
  for (int64_t i = 0; i < 150; ++i) many[i] = 5000 + i;
  int64_t clock = 300;
  KeyAccess access;
  access.counts = counts.data();
  access.times = &clock;
  Status s = t->FindOrInsert(many.data(), 150, true, addresses.data(), SerialRunner, access);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
}

// Rows seen at the same clock go by key, smallest first, whatever rows they got: which rows a
// batch gets depends on the index's seed and the threads, the keys a full table keeps must not.
TEST(EvictionTest, FullTableBreaksTiesOfLastSeenByKey) {
  auto t = EvictingWhenFull(100);
  std::vector<int64_t> keys, counts(100, 1);
  for (int64_t k = 0; k < 100; ++k) keys.push_back((k * 37) % 100 + 500);  // rows not in key order
  Train(t.get(), keys, counts, 10);
  Train(t.get(), {9000, 9001}, {1, 1}, 11);
  EXPECT_EQ(t->Stats().evicted, 3);
  for (int64_t k = 500; k < 503; ++k) EXPECT_EQ(Find(t.get(), {k})[0], -1) << k;
  for (int64_t k = 503; k < 600; ++k) EXPECT_GE(Find(t.get(), {k})[0], 0) << k;
}

TEST(EvictionTest, FullTableWithoutEvictionFails) {
  TableSetup c = Config(-1, -1);
  c.table.dynamic_expansion = false;
  c.table.capacity = 2;
  auto t = Make(c);
  std::vector<int64_t> keys = {1, 2, 3}, addresses(3);
  EXPECT_EQ(t->FindOrInsert(keys.data(), 3, true, addresses.data(), SerialRunner).code(),
            StatusCode::kResourceExhausted);
  // All or nothing: no key of the failed batch got a row.
  EXPECT_EQ(t->Size(), 0);
  EXPECT_EQ(Find(t.get(), {1, 2, 3}), (std::vector<int64_t>{-1, -1, -1}));
  const int64_t kept = Train(t.get(), {10}, {1}, 1)[0];
  // A batch holding a key twice and one present key needs 2 rows, and gets them: 2 keys
  // would not fit, and fail with the table as it was.
  EXPECT_GE(Train(t.get(), {10, 11, 11}, {1, 1, 1}, 2)[1], 0);
  keys = {10, 11, 12};
  EXPECT_EQ(t->FindOrInsert(keys.data(), 3, true, addresses.data(), SerialRunner).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t->Size(), 2);
  EXPECT_EQ(Find(t.get(), {10, 12})[0], kept);
  EXPECT_EQ(Find(t.get(), {10, 12})[1], -1);
}

// Random batches against a model of counts, rows and last-seen clocks.
TEST(AdmissionTest, RandomBatchesMatchTheModel) {
  std::mt19937_64 rng(3);
  const int64_t threshold = 4, age = 7;
  auto t = Make(Config(threshold, age));
  std::map<int64_t, int64_t> count, last;  // pending keys
  std::map<int64_t, int64_t> row_last;     // admitted keys
  int64_t newest = INT64_MIN;
  for (int64_t step = 0; step < 300; ++step) {
    std::set<int64_t> batch;
    const int size = 1 + rng() % 20;
    while (static_cast<int>(batch.size()) < size) batch.insert(rng() % 60);
    std::vector<int64_t> keys(batch.begin(), batch.end()), counts;
    for (size_t i = 0; i < keys.size(); ++i) counts.push_back(1 + rng() % 3);
    const int64_t clock = step / 2;
    const std::vector<int64_t> a = Train(t.get(), keys, counts, clock);
    newest = std::max(newest, clock);
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t k = keys[i];
      if (row_last.count(k)) {
        row_last[k] = std::max(row_last[k], clock);
        ASSERT_GE(a[i], 0);
        continue;
      }
      count[k] += counts[i];
      last[k] = std::max(last.count(k) ? last[k] : INT64_MIN, clock);
      if (count[k] >= threshold) {
        ASSERT_GE(a[i], 0) << "key " << k << " step " << step;
        row_last[k] = clock;
        count.erase(k);
        last.erase(k);
      } else {
        ASSERT_EQ(a[i], -1) << "key " << k << " step " << step;
      }
    }
    if (step % 10 == 9) {
      ASSERT_TRUE(t->Evict(nullptr, nullptr, SerialRunner).ok());
      for (auto it = row_last.begin(); it != row_last.end();) {
        it = newest - it->second >= age ? row_last.erase(it) : std::next(it);
      }
      for (auto it = last.begin(); it != last.end();) {
        if (newest - it->second >= age) {
          count.erase(it->first);
          it = last.erase(it);
        } else {
          ++it;
        }
      }
    }
    ASSERT_EQ(t->Size(), static_cast<int64_t>(row_last.size()));
    ASSERT_EQ(t->Stats().pending, static_cast<int64_t>(count.size()));
  }
}

TEST(EvictionTest, FullTableNeverEvictsTheBatchItPlaces) {
  auto t = EvictingWhenFull(10);
  for (int64_t k = 0; k < 10; ++k) Train(t.get(), {k}, {1}, k);
  // Keys 0..7 are the oldest, but this batch uses them: only 8 and 9 may go.
  const std::vector<int64_t> a =
      Train(t.get(), {0, 1, 2, 3, 4, 5, 6, 7, 100}, std::vector<int64_t>(9, 1), 50);
  for (int64_t x : a) EXPECT_GE(x, 0);
  for (int64_t k = 0; k < 8; ++k) EXPECT_GE(Find(t.get(), {k})[0], 0);
  EXPECT_GE(Find(t.get(), {100})[0], 0);
}

TEST(EvictionTest, FullTableOnItsOwnTickSparesRecentRows) {
  auto t = EvictingWhenFull(20);
  std::vector<int64_t> addresses(1);
  // 20 calls without clocks: ticks 1..20, one key each.
  for (int64_t k = 0; k < 20; ++k) {
    ASSERT_TRUE(t->FindOrInsert(&k, 1, true, addresses.data(), SerialRunner).ok());
  }
  const int64_t key = 1000;
  ASSERT_TRUE(t->FindOrInsert(&key, 1, true, addresses.data(), SerialRunner).ok());
  // Rows of the last kProtectedTicks calls stay; the oldest went.
  EXPECT_EQ(Find(t.get(), {0})[0], -1);
  for (int64_t k = 20 - EmbeddingTable::kProtectedTicks; k < 20; ++k) {
    EXPECT_GE(Find(t.get(), {k})[0], 0) << k;
  }
}

TEST(EvictionTest, ExtremeClocksDoNotWrapTheCutoff) {
  auto t = Make(Config(-1, 100));
  Train(t.get(), {1}, {1}, INT64_MIN + 5);
  int64_t rows = -1;
  ASSERT_TRUE(t->Evict(&rows, nullptr, SerialRunner).ok());
  EXPECT_EQ(rows, 0);
  EXPECT_GE(Find(t.get(), {1})[0], 0);
}

TEST(AdmissionTest, CountsSaturateAndRowsClearPendingCounts) {
  auto t = Make(Config(INT64_MAX, -1));
  Train(t.get(), {1}, {INT64_MAX - 1}, 1);
  Train(t.get(), {1}, {INT64_MAX - 1}, 1);  // saturates at INT64_MAX: admitted
  EXPECT_GE(Find(t.get(), {1})[0], 0);
  Train(t.get(), {2}, {5}, 1);
  EXPECT_EQ(t->Stats().pending, 1);
  ASSERT_TRUE(t->SetAccessThreshold(0).ok());
  Train(t.get(), {2}, {1}, 1);  // gets a row: its pending count goes
  EXPECT_EQ(t->Stats().pending, 0);
  ASSERT_TRUE(t->SetAccessThreshold(10).ok());
  Train(t.get(), {3}, {1}, 1);
  std::vector<float> v(4, 1.0f);
  const int64_t k3 = 3;
  ASSERT_TRUE(t->Upsert(&k3, v.data(), 1, SerialRunner).ok());
  EXPECT_EQ(t->Stats().pending, 0);
}

TEST(ConfigureAdmissionTest, FirstConfigurationHoldsAndAnotherIsAnError) {
  auto t = Make(Config(-1, -1));  // configured "off"
  std::unique_ptr<EmbeddingTable> fresh;
  ASSERT_TRUE(EmbeddingTable::Create(Config(-1, -1).table, &fresh).ok());
  EXPECT_FALSE(fresh->admission_configured());
  EXPECT_EQ(fresh->access_threshold(), -1);
  EXPECT_EQ(fresh->eviction_threshold(), -1);
  ASSERT_TRUE(fresh->ConfigureAdmission(AdmissionConfig{3, 50}).ok());
  EXPECT_TRUE(fresh->admission_configured());
  EXPECT_EQ(fresh->access_threshold(), 3);
  EXPECT_EQ(fresh->eviction_threshold(), 50);
  EXPECT_TRUE(fresh->ConfigureAdmission(AdmissionConfig{3, 50}).ok());  // the same: no change
  const Status other = fresh->ConfigureAdmission(AdmissionConfig{5, -1});
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("table 't' already has other admission settings"),
            std::string::npos)
      << other.message();
  EXPECT_NE(other.message().find("access_threshold: 3 vs 5; eviction_threshold: 50 vs -1"),
            std::string::npos)
      << other.message();
  EXPECT_EQ(fresh->access_threshold(), 3);  // unchanged by the refused configuration
  EXPECT_EQ(fresh->eviction_threshold(), 50);
  EXPECT_EQ(t->ConfigureAdmission(AdmissionConfig{0, -1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->ConfigureAdmission(AdmissionConfig{-2, -1}).code(), StatusCode::kInvalidArgument);
}

TEST(ConfigureAdmissionTest, RunTimeThresholdChangesSurviveTheSameConfiguration) {
  auto t = Make(Config(3, -1));
  ASSERT_TRUE(t->SetAccessThreshold(1).ok());
  // Every training step runs the configuration again: it must not undo the change.
  ASSERT_TRUE(t->ConfigureAdmission(AdmissionConfig{3, -1}).ok());
  EXPECT_EQ(t->access_threshold(), 1);
  EXPECT_EQ(t->admission().access_threshold, 3);
  EXPECT_EQ(Train(t.get(), {7}, {1}, 1)[0] >= 0, true);  // admitted at the changed threshold
}

TEST(ConfigureAdmissionTest, ResetLetsANewGraphConfigureTheTable) {
  auto t = Make(Config(3, 10));
  Train(t.get(), {7}, {3}, 1);
  t->ResetAdmission();
  EXPECT_FALSE(t->admission_configured());
  EXPECT_EQ(t->access_threshold(), -1);
  EXPECT_EQ(t->eviction_threshold(), -1);
  ASSERT_TRUE(t->ConfigureAdmission(AdmissionConfig{5, -1}).ok());
  EXPECT_EQ(t->access_threshold(), 5);
  EXPECT_GE(Find(t.get(), {7})[0], 0);  // rows stay
}

TEST(EmbeddingTableTest, RestrictKeepsMostRecentOrMostFrequentRows) {
  TableConfig config = Dynamic("restrict", 2);
  config.track_access = true;
  auto t = MakeTable(config);
  // Clock: one tick per training FindOrInsert. Key k is seen in steps 0..k-1 (k times),
  // except key 9, seen only in the last step; key 0 is upserted, never trained.
  for (int step = 0; step < 8; ++step) {
    std::vector<int64_t> keys;
    for (int64_t k = 1; k <= 8; ++k) {
      if (step < k) keys.push_back(k);
    }
    if (step == 7) keys.push_back(9);
    FindOrInsert(t.get(), keys, true);
  }
  std::vector<int64_t> zero = {0};
  std::vector<float> values = {1.0f, 2.0f};
  ASSERT_TRUE(t->Upsert(zero.data(), values.data(), 1, SerialRunner).ok());
  ASSERT_TRUE(t->EnsureSlots("Adagrad", {0.5f}).ok());
  ASSERT_EQ(t->Size(), 10);

  auto keys_of = [&](EmbeddingTable* table) {
    std::set<int64_t> keys;
    for (const auto& [k, v] : ToMap(ExportAll(table), 2)) keys.insert(k);
    return keys;
  };
  int64_t removed = -1;
  // By count: 8 (8x), 7 (7x), 6 (6x).
  ASSERT_TRUE(t->Restrict(3, RestrictBy::kCount, &removed).ok());
  EXPECT_EQ(removed, 7);
  EXPECT_EQ(keys_of(t.get()), (std::set<int64_t>{6, 7, 8}));
  EXPECT_EQ(t->Stats().evicted, 7);
  // Removed keys come back as new rows with fresh slots.
  FindOrInsert(t.get(), {1}, true);
  std::vector<int64_t> one = {1};
  std::vector<float> slot(2);
  ASSERT_TRUE(t->Lookup(one.data(), 1, false, slot.data(), nullptr, SerialRunner, 0).ok());
  EXPECT_EQ(slot, std::vector<float>(2, 0.5f));

  // By last seen: 1 was just seen, then 8 (the step before); 7 and 6 tie on their last
  // step (7 < 8 is not a tie: 8 was seen in step 7, 7 in step 6, 6 in step 5).
  ASSERT_TRUE(t->Restrict(2, RestrictBy::kLastSeen, &removed).ok());
  EXPECT_EQ(removed, 2);
  EXPECT_EQ(keys_of(t.get()), (std::set<int64_t>{1, 8}));
  // Keeping more than the table holds changes nothing.
  ASSERT_TRUE(t->Restrict(5, RestrictBy::kCount, &removed).ok());
  EXPECT_EQ(removed, 0);
  EXPECT_EQ(t->Size(), 2);
  EXPECT_EQ(t->Restrict(-1, RestrictBy::kCount, nullptr).code(), StatusCode::kInvalidArgument);
  auto untracked = MakeTable(Dynamic("untracked", 2));
  EXPECT_EQ(untracked->Restrict(1, RestrictBy::kCount, nullptr).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(t->Restrict(0, RestrictBy::kLastSeen, nullptr).ok());
  EXPECT_EQ(t->Size(), 0);
}

TEST(EmbeddingTableTest, TrackAccessCountsTrainingLookupsOnly) {
  TableConfig config = Dynamic("counts", 2);
  config.track_access = true;
  auto t = MakeTable(config);
  FindOrInsert(t.get(), {1, 2}, true);
  FindOrInsert(t.get(), {2}, true);
  for (int i = 0; i < 5; ++i) FindOrInsert(t.get(), {1}, false);  // eval lookups never count
  FindOrInsert(t.get(), {3}, true);
  int64_t removed = 0;
  // Counts 1, 2, 1: key 2 wins over the more recent key 3 and the often evaluated key 1.
  ASSERT_TRUE(t->Restrict(1, RestrictBy::kCount, &removed).ok());
  EXPECT_EQ(removed, 2);
  auto m = ToMap(ExportAll(t.get()), 2);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m.count(2), 1u);
}

TEST(EmbeddingTableTest, TrackAccessTurnedOnLaterCountsFromThen) {
  auto t = MakeTable(Dynamic("later", 2));
  FindOrInsert(t.get(), {1, 2}, true);
  EXPECT_FALSE(t->track_access());
  EXPECT_EQ(t->Restrict(1, RestrictBy::kCount, nullptr).code(), StatusCode::kInvalidArgument);
  t->TrackAccess();
  EXPECT_TRUE(t->track_access());
  FindOrInsert(t.get(), {2, 3}, true);
  FindOrInsert(t.get(), {2}, true);
  int64_t removed = 0;
  // Counts since tracking began: key 2 twice, key 3 once, key 1 never.
  ASSERT_TRUE(t->Restrict(2, RestrictBy::kCount, &removed).ok());
  EXPECT_EQ(removed, 1);
  auto m = ToMap(ExportAll(t.get()), 2);
  EXPECT_EQ(m.count(1), 0u);
  EXPECT_EQ(m.count(2), 1u);
  EXPECT_EQ(m.count(3), 1u);
  // Last-seen clocks are kept current for rows seen again: key 3 is now older than key 2.
  ASSERT_TRUE(t->Restrict(1, RestrictBy::kLastSeen, &removed).ok());
  EXPECT_EQ(ToMap(ExportAll(t.get()), 2).count(2), 1u);
}

TEST(EmbeddingTableTest, ImportAccessRestoresStatisticsAndMovesTheClockOn) {
  TableConfig config = Dynamic("stats", 2);
  config.track_access = true;
  auto t = MakeTable(config);
  FindOrInsert(t.get(), {1, 2, 3}, true);
  const std::vector<int64_t> keys = {1, 2, 9};  // 9 is absent: skipped
  const std::vector<int64_t> seen = {40, 7, 50};
  const std::vector<int64_t> counts = {5, int64_t{1} << 40, 3};
  const std::vector<int64_t> bad = {1, -1, 0};
  EXPECT_EQ(t->ImportAccess(keys.data(), bad.data(), counts.data(), 3).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(t->ImportAccess(keys.data(), seen.data(), counts.data(), 3).ok());
  std::vector<int64_t> k, s, c;
  t->ExportAccess(&k, &s, &c);
  std::map<int64_t, std::pair<int64_t, int64_t>> got;
  for (size_t i = 0; i < k.size(); ++i) got[k[i]] = {s[i], c[i]};
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1], std::make_pair(int64_t{40}, int64_t{5}));
  EXPECT_EQ(got[2], std::make_pair(int64_t{7}, int64_t{4294967295}));
  // The clock moved past the restored statistics: key 3, trained now, is the newest.
  FindOrInsert(t.get(), {3}, true);
  int64_t removed = 0;
  ASSERT_TRUE(t->Restrict(1, RestrictBy::kLastSeen, &removed).ok());
  EXPECT_EQ(removed, 2);
  EXPECT_EQ(ToMap(ExportAll(t.get()), 2).count(3), 1u);
}

// Defect found by hostile use: two lookups of one full evict_when_full table run at once (two
// features sharing it); each evicted rows for itself and the other took them, so steps failed
// with "more new keys than the table's capacity can take even after eviction" although the
// two batches together needed a tenth of the table.
TEST(EvictionTest, ConcurrentLookupsOfAFullTableNeverTakeEachOthersRows) {
  auto t = EvictingWhenFull(2000);
  std::atomic<int> failures{0};
  std::atomic<int64_t> next_key{0};
  auto lookup_loop = [&](int seed) {
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 300; ++step) {
      // 100 keys, most of them new: every step evicts once the table is full.
      std::vector<int64_t> keys(100);
      for (auto& k : keys) k = next_key.fetch_add(1) * 2 + (rng() % 2);
      std::vector<int64_t> addresses(keys.size());
      const Status s =
          t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), ThreadedRunner(2));
      if (!s.ok() && failures.fetch_add(1) < 3) ADD_FAILURE() << s.message();
    }
  };
  std::thread a(lookup_loop, 1), b(lookup_loop, 2);
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(t->Size(), 2000);
  EXPECT_GT(t->Stats().evicted, 0);
}

// Batches of new keys larger than capacity / (kProtectedTicks + 1) failed once the table was
// full: the rows of the last lookups were never evicted, even when nothing else was left.
TEST(EvictionTest, AFullTableTakesAnyBatchThatFits) {
  auto t = EvictingWhenFull(1000);
  int64_t next_key = 0;
  for (int64_t batch : {300, 600, 990, 1000, 450}) {
    for (int step = 0; step < 12; ++step) {
      std::vector<int64_t> keys(batch);
      for (auto& k : keys) k = next_key++;
      std::vector<int64_t> addresses(keys.size());
      const Status s =
          t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), ThreadedRunner(2));
      ASSERT_TRUE(s.ok()) << "batch of " << batch << ", step " << step << ": " << s.message();
      EXPECT_LE(t->Size(), 1000);
      for (int64_t a : addresses) ASSERT_GE(a, 0);
    }
  }
  // A batch larger than the table still fails, naming the table, and evicts nothing: the
  // table keeps the rows it had.
  const int64_t evicted = t->Stats().evicted, size = t->Size();
  const std::vector<int64_t> before = Find(t.get(), {next_key - 1, next_key - 450});
  std::vector<int64_t> keys(1001);
  for (auto& k : keys) k = next_key++;
  std::vector<int64_t> addresses(keys.size());
  const Status s = t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), SerialRunner);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("nothing was evicted"), std::string::npos) << s.message();
  EXPECT_EQ(t->Stats().evicted, evicted);
  EXPECT_EQ(t->Size(), size);
  EXPECT_EQ(Find(t.get(), {keys[0], keys[1000]}), (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(Find(t.get(), {next_key - 1002, next_key - 1451}), before);
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

using namespace table_test;  // NOLINT(build/namespaces): the shared test helpers

// The rows, row ids, admission outcome and evictions of a table do not depend on the threads:
// two tables with one index seed, trained on the same 100 batches, one on one thread and one
// on 8, return the same addresses at every step and end with the same contents and counters.
struct ThreadCase {
  const char* name;
  int64_t access_threshold, eviction_threshold;
  bool evict_when_full;
  RowDtype emb_dtype;
};

class SameRowsWhateverTheThreads : public ::testing::TestWithParam<ThreadCase> {};

TEST_P(SameRowsWhateverTheThreads, OneThreadAndEight) {
  const ThreadCase& c = GetParam();
  TableSetup setup = Config(c.access_threshold, c.eviction_threshold);
  setup.table.index_seed = 0x5eed;
  setup.table.emb_dtype = c.emb_dtype;
  if (c.evict_when_full) {
    setup.table.dynamic_expansion = false;
    setup.table.capacity = 3000;
    setup.table.evict_when_full = true;
  }
  std::unique_ptr<EmbeddingTable> serial = Make(setup), threaded = Make(setup);
  const ParallelRunner eight = ThreadedRunner(8);
  std::mt19937_64 rng(17);
  for (int64_t step = 0; step < 100; ++step) {
    // ~2,000 distinct keys a batch, skewed towards small ones, a third of them new.
    std::set<int64_t> batch;
    while (batch.size() < 2000) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      batch.insert(static_cast<int64_t>(u * u * 20000) + (rng() % 3 == 0 ? step * 1000 : 0));
    }
    std::vector<int64_t> keys(batch.begin(), batch.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    std::vector<int64_t> counts(keys.size());
    for (auto& n : counts) n = 1 + static_cast<int64_t>(rng() % 3);
    KeyAccess access;
    access.counts = counts.data();
    int64_t clock = step;
    access.times = &clock;
    std::vector<int64_t> a(keys.size()), b(keys.size());
    std::vector<float> rows_a(keys.size() * 4), rows_b(keys.size() * 4);
    ASSERT_TRUE(serial
                    ->FindOrInsert(keys.data(), keys.size(), true, a.data(), SerialRunner, access,
                                   rows_a.data())
                    .ok());
    ASSERT_TRUE(
        threaded
            ->FindOrInsert(keys.data(), keys.size(), true, b.data(), eight, access, rows_b.data())
            .ok());
    const int64_t no_tag = (int64_t{1} << (kRowBits + kGenerationBits)) - 1;
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(a[i] < 0, b[i] < 0) << c.name << " step " << step << " key " << keys[i];
      if (a[i] >= 0) ASSERT_EQ(a[i] & no_tag, b[i] & no_tag) << c.name << " step " << step;
    }
    ASSERT_EQ(rows_a, rows_b) << c.name << " step " << step;
    if (step % 10 == 9 && c.eviction_threshold >= 0) {
      int64_t rows_out[2], pending_out[2];
      ASSERT_TRUE(serial->Evict(&rows_out[0], &pending_out[0], SerialRunner).ok());
      ASSERT_TRUE(threaded->Evict(&rows_out[1], &pending_out[1], eight).ok());
      ASSERT_EQ(rows_out[0], rows_out[1]);
      ASSERT_EQ(pending_out[0], pending_out[1]);
    }
  }
  const Exported ea = ExportAll(serial.get()), eb = ExportAll(threaded.get());
  EXPECT_EQ(ea.keys, eb.keys) << c.name;  // row order: the same rows
  EXPECT_EQ(ea.values, eb.values) << c.name;
  EXPECT_EQ(serial->Stats().admitted, threaded->Stats().admitted);
  EXPECT_EQ(serial->Stats().rejected, threaded->Stats().rejected);
  EXPECT_EQ(serial->Stats().evicted, threaded->Stats().evicted);
  EXPECT_GT(serial->Size(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SameRowsWhateverTheThreads,
    ::testing::Values(ThreadCase{"plain", -1, -1, false, RowDtype::kFloat32},
                      ThreadCase{"admission_and_eviction", 3, 20, false, RowDtype::kFloat32},
                      ThreadCase{"evict_when_full", -1, -1, true, RowDtype::kFloat32},
                      ThreadCase{"half_rows_admission", 2, 30, false, RowDtype::kBFloat16}),
    [](const ::testing::TestParamInfo<ThreadCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace rec_sdk
