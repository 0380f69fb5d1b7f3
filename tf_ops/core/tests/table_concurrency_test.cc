// Tests of EmbeddingTable under concurrent use: threads on disjoint key ranges against
// per-thread models, and removals racing gathers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tf_ops/core/embedding_table.h"
#include "tf_ops/core/tests/table_test_util.h"

namespace rec_sdk {
namespace {

using namespace table_test;  // NOLINT(build/namespaces): the shared test helpers

// --- Concurrency
// ----------------------------------------------------------------------------------

// Several threads, each owning a disjoint key range, mix FindOrInsert, Upsert, Remove, Lookup
// and Gather on one table (the table's own work also split over threads). Every call must
// succeed (or, for a just-removed key's address, fail as stale), each thread's view must match
// its model throughout, and the final table must equal the union of the models.
TEST(EmbeddingTableConcurrencyTest, DisjointKeyRangesMatchModels) {
  const int dim = 8;
  const int kThreads = 4;
  auto t = MakeTable(Dynamic("concurrent", dim));
  std::vector<std::map<int64_t, std::vector<float>>> models(kThreads);
  std::atomic<int> failures{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(id + 100);
    auto& model = models[id];
    const int64_t base = (id - 2) * 1000000007LL;  // negative ranges too
    ParallelRunner run = id % 2 == 0 ? ThreadedRunner(3) : ParallelRunner(SerialRunner);
    auto fail = [&](const std::string& what) {
      if (failures.fetch_add(1) < 10) ADD_FAILURE() << "thread " << id << ": " << what;
    };
    for (int iter = 0; iter < 150; ++iter) {
      std::vector<int64_t> keys(64);
      for (auto& k : keys) k = base + static_cast<int64_t>(rng() % 400);
      switch (rng() % 4) {
        case 0: {  // insert
          std::vector<int64_t> addr(keys.size());
          Status s = t->FindOrInsert(keys.data(), keys.size(), true, addr.data(), run);
          if (!s.ok()) fail("FindOrInsert: " + s.message());
          for (int64_t k : keys) {
            if (!model.count(k)) {
              std::vector<float> v(dim);
              InitializeRow(Normal(), k, dim, v.data());
              model[k] = v;
            }
          }
          break;
        }
        case 1: {  // upsert (duplicates: last wins)
          std::vector<float> values(keys.size() * dim);
          for (auto& v : values) v = static_cast<float>(rng() % 1000) / 7.0f;
          Status s = t->Upsert(keys.data(), values.data(), keys.size(), run);
          if (!s.ok()) fail("Upsert: " + s.message());
          for (size_t i = 0; i < keys.size(); ++i) model[keys[i]] = RowOf(values, i, dim);
          break;
        }
        case 2: {  // remove a few keys; their addresses become stale
          keys.resize(8);
          std::vector<int64_t> addr(keys.size());
          t->FindOrInsert(keys.data(), keys.size(), false, addr.data(), run);
          int64_t removed = 0;
          Status s = t->Remove(keys.data(), keys.size(), &removed, run);
          if (!s.ok()) fail("Remove: " + s.message());
          std::set<int64_t> distinct_present;
          for (int64_t k : keys)
            if (model.count(k)) distinct_present.insert(k);
          if (removed != static_cast<int64_t>(distinct_present.size())) fail("removed count");
          for (int64_t k : keys) model.erase(k);
          for (int64_t a : addr) {
            if (a == -1) continue;
            std::vector<float> out(dim);
            if (t->Gather(&a, 1, out.data(), run).code() != StatusCode::kInvalidArgument) {
              fail("stale address accepted");
            }
          }
          break;
        }
        default: {  // find + gather + lookup must agree with the model
          std::vector<int64_t> addr(keys.size());
          Status s = t->FindOrInsert(keys.data(), keys.size(), false, addr.data(), run);
          if (!s.ok()) fail("FindOrInsert(false): " + s.message());
          std::vector<float> out(keys.size() * dim);
          s = t->Gather(addr.data(), addr.size(), out.data(), run);
          if (!s.ok()) fail("Gather: " + s.message());
          std::vector<float> looked(keys.size() * dim);
          std::unique_ptr<bool[]> exists(new bool[keys.size()]);
          s = t->Lookup(keys.data(), keys.size(), false, looked.data(), exists.get(), run);
          if (!s.ok()) fail("Lookup: " + s.message());
          for (size_t i = 0; i < keys.size(); ++i) {
            auto it = model.find(keys[i]);
            const bool present = it != model.end();
            if ((addr[i] != -1) != present || exists[i] != present) fail("presence mismatch");
            const std::vector<float> want = present ? it->second : std::vector<float>(dim, 0.0f);
            if (RowOf(out, i, dim) != want || RowOf(looked, i, dim) != want) fail("value mismatch");
          }
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);

  std::map<int64_t, std::vector<float>> all;
  for (const auto& m : models) all.insert(m.begin(), m.end());
  EXPECT_EQ(t->Size(), static_cast<int64_t>(all.size()));
  auto exported = ToMap(ExportAll(t.get()), dim);
  ASSERT_EQ(exported.size(), all.size());
  for (const auto& [k, v] : all) {
    ASSERT_EQ(exported.count(k), 1u) << "key " << k;
    EXPECT_EQ(exported[k][0], v) << "key " << k;
  }
}

// Threads gather addresses of keys that another thread keeps removing and reinserting, while a
// third keeps growing the table: every call returns OK or InvalidArgument (stale), nothing else,
// and never crashes.
TEST(EmbeddingTableConcurrencyTest, RacingRemoveAndGatherOnlyReportStale) {
  const int dim = 16;
  auto t = MakeTable(Fixed("racing", dim, 100000));
  std::vector<int64_t> hot(256);
  std::iota(hot.begin(), hot.end(), 0);
  std::vector<int64_t> hot_addr = FindOrInsert(t.get(), hot, true);
  std::atomic<bool> stop{false};
  std::atomic<int> unexpected{0};
  std::atomic<int64_t> stale_seen{0}, ok_seen{0};

  std::thread churn([&] {
    for (int i = 0; i < 300; ++i) {
      std::vector<int64_t> addr(hot.size());
      t->Remove(hot.data(), hot.size(), nullptr, ThreadedRunner(2));
      if (!t->FindOrInsert(hot.data(), hot.size(), true, addr.data(), SerialRunner).ok()) {
        ++unexpected;
      }
    }
    stop = true;
  });
  std::thread grow([&] {
    int64_t next = 1000000;
    // Stays far below the capacity, so that the churn's reinsertions always find rows.
    for (int batch = 0; batch < 300 && !stop; ++batch) {
      std::vector<int64_t> keys(128);
      std::iota(keys.begin(), keys.end(), next);
      next += 128;
      std::vector<int64_t> addr(keys.size());
      if (!t->FindOrInsert(keys.data(), keys.size(), true, addr.data(), SerialRunner).ok()) {
        ++unexpected;
      }
    }
  });
  auto reader = [&] {
    std::vector<float> out(hot.size() * dim);
    do {
      std::vector<int64_t> addr(hot.size());
      t->FindOrInsert(hot.data(), hot.size(), false, addr.data(), SerialRunner);
      for (const auto* a : {&addr, &hot_addr}) {
        Status s = t->Gather(a->data(), a->size(), out.data(), ThreadedRunner(2));
        if (s.ok()) {
          ++ok_seen;
        } else if (s.code() == StatusCode::kInvalidArgument) {
          ++stale_seen;
        } else {
          ++unexpected;
        }
      }
    } while (!stop);
  };
  std::thread r1(reader), r2(reader);
  churn.join();
  grow.join();
  r1.join();
  r2.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(ok_seen.load() + stale_seen.load(), 0);
  // The original addresses went stale at the first removal.
  Status s;
  Gather(t.get(), hot_addr, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // After the churn every hot key is present exactly once with its initial values.
  std::vector<int64_t> addr = FindOrInsert(t.get(), hot, false);
  std::vector<float> rows = Gather(t.get(), addr);
  for (size_t i = 0; i < hot.size(); ++i) {
    ASSERT_EQ(RowOf(rows, i, dim), InitialRow(*t, Normal(), hot[i])) << "key " << hot[i];
  }
  EXPECT_EQ(ExportAll(t.get()).keys.size(), static_cast<size_t>(t->Size()));
}

// Defect found by hostile use: an update validated its addresses and then, still under the
// shared lock, wrote the rows, while Remove (also shared) freed them and Upsert reused them for
// other keys, so the update landed on those keys' rows. Thread A trains keys K1 (find, then an
// update that adds 1, made slow so that the window between validation and write is wide) and
// gathers them; thread B removes K1, upserts K2 with zeros, reads K2 back and removes it. K2
// is never trained: any non-zero value is a foreign write. A gather of K1 must read K1's values
// (initial + updates, so never all zeros after the first update) or fail as stale.
TEST(EmbeddingTableConcurrencyTest, UpdatesAndGathersNeverTouchAnotherKeysRow) {
  const int dim = 4;
  const int64_t kKeys = 512;
  InitializerSpec ones;
  ones.kind = InitializerKind::kConstant;
  ones.value = 1.0f;
  TableConfig config = Dynamic("cross_key", dim);
  config.initializer = ones;
  auto t = MakeTable(config);
  std::vector<int64_t> k1(kKeys), k2(kKeys);
  std::iota(k1.begin(), k1.end(), 0);
  std::iota(k2.begin(), k2.end(), 1000000);
  const std::vector<float> zeros(kKeys * dim, 0.0f);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> foreign_rows{0}, bad_gathers{0}, updates{0}, unexpected{0};
  std::thread trainer([&] {
    std::vector<int64_t> addr(kKeys);
    std::vector<float> out(kKeys * dim);
    while (!stop) {
      if (!t->FindOrInsert(k1.data(), kKeys, true, addr.data(), SerialRunner).ok()) {
        ++unexpected;
        continue;
      }
      Status s = t->UpdateRows(
          addr.data(), kKeys, 1,
          [&](int64_t i, float* value, float* const*) {
            if (i % 64 == 0) std::this_thread::yield();  // widen the window
            for (int d = 0; d < dim; ++d) value[d] += 1.0f;
          },
          SerialRunner);
      if (s.ok()) {
        ++updates;
      } else if (s.code() != StatusCode::kInvalidArgument) {
        ++unexpected;
      }
      s = t->Gather(addr.data(), kKeys, out.data(), SerialRunner);
      if (s.ok()) {
        // K1 rows start at 1 and only grow: a zero is a row of K2 (upserted as zeros).
        for (int64_t i = 0; i < kKeys * dim; ++i) {
          if (out[i] < 1.0f) {
            ++bad_gathers;
            break;
          }
        }
      } else if (s.code() != StatusCode::kInvalidArgument) {
        ++unexpected;
      }
    }
  });
  std::thread churn([&] {
    std::vector<float> out(kKeys * dim);
    std::unique_ptr<bool[]> exists(new bool[kKeys]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < deadline) {
      t->Remove(k1.data(), kKeys, nullptr, SerialRunner);
      if (!t->Upsert(k2.data(), zeros.data(), kKeys, SerialRunner).ok()) ++unexpected;
      std::this_thread::yield();
      if (!t->Lookup(k2.data(), kKeys, false, out.data(), exists.get(), SerialRunner).ok()) {
        ++unexpected;
      }
      for (int64_t i = 0; i < kKeys; ++i) {
        for (int d = 0; d < dim; ++d) {
          if (out[i * dim + d] != 0.0f) {
            ++foreign_rows;
            break;
          }
        }
      }
      t->Remove(k2.data(), kKeys, nullptr, SerialRunner);
    }
    stop = true;
  });
  churn.join();
  trainer.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(updates.load(), 0);
  EXPECT_EQ(foreign_rows.load(), 0) << "rows of never-trained keys changed by updates of others";
  EXPECT_EQ(bad_gathers.load(), 0) << "gathers returned rows of other keys";
}

TEST(EmbeddingTableConcurrencyTest, ConcurrentUpdatesOfOneRowAreNeverLost) {
  // Training steps of several threads (or sessions) update the same rows at once; each
  // update must land: the rows end at exactly the number of updates applied.
  const int dim = 8;
  const int64_t kKeys = 256;
  const int kThreads = 4, kRounds = 300;
  InitializerSpec zeros;
  zeros.kind = InitializerKind::kConstant;
  TableConfig config = Dynamic("no_lost_update", dim);
  config.initializer = zeros;
  auto t = MakeTable(config);
  std::vector<int64_t> keys(kKeys);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<int64_t> addr(kKeys);
  ASSERT_TRUE(t->FindOrInsert(keys.data(), kKeys, true, addr.data(), SerialRunner).ok());
  std::atomic<int64_t> failed{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        Status s = t->UpdateRows(
            addr.data(), kKeys, 1,
            [&](int64_t, float* value, float* const*) {
              for (int d = 0; d < dim; ++d) {
                const float v = value[d];
                if (d == 0) std::this_thread::yield();  // widen the read-modify-write window
                value[d] = v + 1.0f;
              }
            },
            ThreadedRunner(2));
        if (!s.ok()) ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failed.load(), 0);
  std::vector<float> out(kKeys * dim);
  ASSERT_TRUE(t->Gather(addr.data(), kKeys, out.data(), SerialRunner).ok());
  int64_t lost = 0;
  for (float v : out) lost += static_cast<int64_t>(kThreads * kRounds - v);
  EXPECT_EQ(lost, 0) << "updates lost to concurrent updates of the same rows";
}

}  // namespace
}  // namespace rec_sdk
