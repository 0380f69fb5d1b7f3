// Tests of Export and Import (table_snapshot.cc): round trips with and without slots, rows
// inserted between an import and the first optimizer, capacity, and imports racing other
// operations. Checkpoint files are tested in checkpoint_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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

// --- Export / Import
// --------------------------------------------------------------------------------

TEST(EmbeddingTableTest, ExportImportRoundTripWithSlots) {
  const int dim = 5;
  auto src = MakeTable(Dynamic("src", dim));
  ASSERT_TRUE(src->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 300; ++i) keys.push_back(i * i * (i % 2 ? -1 : 1));
  keys.push_back(kMin);
  keys.push_back(kMax);
  std::vector<int64_t> addr = FindOrInsert(src.get(), keys, true);
  WriteRows(src.get(), addr, [](int64_t i, int slot, int d) { return i * 0.5f + slot * 100 + d; });
  // Remove some rows so that Export skips dead rows.
  std::vector<int64_t> gone(keys.begin(), keys.begin() + 40);
  ASSERT_TRUE(src->Remove(gone.data(), gone.size(), nullptr, SerialRunner).ok());
  Exported e = ExportAll(src.get());
  ASSERT_EQ(e.keys.size(), keys.size() - 40);
  const auto expected = ToMap(e, dim);
  for (size_t i = 40; i < keys.size(); ++i) {
    ASSERT_EQ(expected.count(keys[i]), 1u);
    EXPECT_EQ(expected.at(keys[i])[2][0], i * 0.5f + 100);
  }

  // Import a shuffled copy (rows permuted together with their slots) into a new table.
  const int64_t n = e.keys.size();
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  Exported shuffled;
  shuffled.values.resize(n * dim);
  shuffled.slots.resize(2 * n * dim);
  for (int64_t i = 0; i < n; ++i) {
    shuffled.keys.push_back(e.keys[perm[i]]);
    std::memcpy(&shuffled.values[i * dim], &e.values[perm[i] * dim], dim * sizeof(float));
    for (int s = 0; s < 2; ++s) {
      std::memcpy(&shuffled.slots[(s * n + i) * dim], &e.slots[(s * n + perm[i]) * dim],
                  dim * sizeof(float));
    }
  }
  auto dst = MakeTable(Dynamic("dst", dim));
  ASSERT_TRUE(
      dst->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 2, n).ok());
  EXPECT_EQ(dst->Size(), n);
  EXPECT_EQ(dst->num_slots(), 2);
  EXPECT_EQ(ToMap(ExportAll(dst.get()), dim), expected);
  // The restored table takes the first optimizer with a matching slot count, and keeps the
  // imported slot values.
  EXPECT_EQ(dst->EnsureSlots("Adagrad", {0.1f}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dst->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  EXPECT_FALSE(dst->EnsureSlots("Ftrl", {0.1f, 0.0f}).ok());
  EXPECT_EQ(ToMap(ExportAll(dst.get()), dim), expected);

  // Importing again into the trained source table replaces its contents.
  ASSERT_TRUE(
      src->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 2, n).ok());
  EXPECT_EQ(ToMap(ExportAll(src.get()), dim), expected);
  // A slot count that does not match the table's optimizer is rejected.
  EXPECT_EQ(
      src->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 1, n).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(ToMap(ExportAll(src.get()), dim), expected);  // and leaves the table as it was
}

TEST(EmbeddingTableTest, ImportWithoutSlotsUsesInitialSlotValues) {
  auto t = MakeTable(Dynamic("import_noslots", 2));
  ASSERT_TRUE(t->EnsureSlots("Ftrl", {0.1f, 0.0f}).ok());
  FindOrInsert(t.get(), {77}, true);  // replaced by the import
  const std::vector<int64_t> keys = {3, 1, 2};
  const std::vector<float> values = {3, 3, 1, 1, 2, 2};
  ASSERT_TRUE(t->Import(keys.data(), values.data(), nullptr, 0, 3).ok());
  auto m = ToMap(ExportAll(t.get()), 2);
  ASSERT_EQ(m.size(), 3u);
  for (int64_t k : {1, 2, 3}) {
    EXPECT_EQ(m[k][0], std::vector<float>(2, float(k)));
    EXPECT_EQ(m[k][1], std::vector<float>(2, 0.1f));
    EXPECT_EQ(m[k][2], std::vector<float>(2, 0.0f));
  }
}

// Rows inserted after a restore with slots but before the optimizer first runs must still get
// the optimizer's initial slot values (the training step looks keys up before it applies).
TEST(EmbeddingTableTest, RowsInsertedBetweenImportAndEnsureSlotsGetInitialSlots) {
  auto src = MakeTable(Dynamic("ckpt_src", 2));
  ASSERT_TRUE(src->EnsureSlots("Adagrad", {0.1f}).ok());
  std::vector<int64_t> addr = FindOrInsert(src.get(), {1, 2}, true);
  WriteRows(src.get(), addr, [](int64_t i, int slot, int) { return slot < 0 ? 1.0f : 5.0f + i; });
  Exported e = ExportAll(src.get());

  auto dst = MakeTable(Dynamic("ckpt_dst", 2));
  ASSERT_TRUE(dst->Import(e.keys.data(), e.values.data(), e.slots.data(), 1, e.keys.size()).ok());
  FindOrInsert(dst.get(), {3}, true);  // a new key before the optimizer's first step
  ASSERT_TRUE(dst->EnsureSlots("Adagrad", {0.1f}).ok());
  FindOrInsert(dst.get(), {4}, true);  // and one after
  auto m = ToMap(ExportAll(dst.get()), 2);
  EXPECT_EQ(m[1][1], std::vector<float>(2, 5.0f));
  EXPECT_EQ(m[2][1], std::vector<float>(2, 6.0f));
  EXPECT_EQ(m[3][1], std::vector<float>(2, 0.1f));
  EXPECT_EQ(m[4][1], std::vector<float>(2, 0.1f));
}

TEST(EmbeddingTableTest, ImportRejectsTooManyRowsForFixedTable) {
  auto t = MakeTable(Fixed("import_fixed", 2, 2));
  const std::vector<int64_t> keys = {1, 2, 3};
  const std::vector<float> values(6, 1.0f);
  Status s = t->Import(keys.data(), values.data(), nullptr, 0, 3);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "import_fixed")) << s.message();
  EXPECT_TRUE(t->Import(keys.data(), values.data(), nullptr, 0, 2).ok());
  EXPECT_EQ(t->Size(), 2);
}

TEST(EmbeddingTableConcurrencyTest, ImportRacingRemoveAndInsert) {
  const int dim = 4;
  auto t = MakeTable(Dynamic("import_race", dim));
  const int64_t n = 5000;
  std::vector<int64_t> keys(n);
  std::iota(keys.begin(), keys.end(), 1);
  std::vector<float> values(n * dim, 1.0f), slots(2 * n * dim, 0.5f);
  std::atomic<bool> stop{false};
  std::thread remover([&] {
    while (!stop.load()) {
      t->Remove(keys.data(), n, nullptr, SerialRunner);
      std::vector<int64_t> addr(n);
      t->FindOrInsert(keys.data(), n, true, addr.data(), SerialRunner);
    }
  });
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(t->Import(keys.data(), values.data(), slots.data(), 2, n).ok());
  }
  stop.store(true);
  remover.join();
  ASSERT_TRUE(t->Import(keys.data(), values.data(), slots.data(), 2, n).ok());
  EXPECT_EQ(t->Size(), n);
}

}  // namespace
}  // namespace rec_sdk
