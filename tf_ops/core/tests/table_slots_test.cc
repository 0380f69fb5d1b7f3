// Tests of optimizer slots (table_slots.cc): one optimizer per table, slot lookups, and the
// re-layout that attaches slots keeping rows and addresses.
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

// --- Slots
// ------------------------------------------------------------------------------------------------

TEST(EmbeddingTableTest, EnsureSlotsIsPerOptimizer) {
  auto t = MakeTable(Dynamic("slots", 4));
  std::vector<int64_t> addr = FindOrInsert(t.get(), {1, 2}, true);
  ASSERT_TRUE(t->EnsureSlots("Adagrad", {0.1f}).ok());
  EXPECT_EQ(t->num_slots(), 1);
  EXPECT_EQ(t->slot_optimizer(), "Adagrad");
  ASSERT_TRUE(t->EnsureSlots("Adagrad", {0.1f}).ok());  // idempotent
  // Existing rows got the initial slot value, new rows too.
  FindOrInsert(t.get(), {3}, true);
  auto m = ToMap(ExportAll(t.get()), 4);
  for (int64_t k : {1, 2, 3}) EXPECT_EQ(m[k][1], std::vector<float>(4, 0.1f)) << "key " << k;

  Status s = t->EnsureSlots("LazyAdam", {0.0f, 0.0f});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "Adagrad") && Contains(s.message(), "LazyAdam")) << s.message();
  EXPECT_FALSE(t->EnsureSlots("Other", {0.1f}).ok());  // same slot count, other optimizer
  EXPECT_EQ(t->slot_optimizer(), "Adagrad");
  EXPECT_EQ(t->num_slots(), 1);

  auto u = MakeTable(Dynamic("too_many", 4));
  EXPECT_EQ(u->EnsureSlots("Big", {0, 0, 0, 0, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(u->EnsureSlots("Four", {1, 2, 3, 4}).ok());
}

// Restrict keeps the most recently / most often seen rows (track_access keeps both current
// on training lookups) and removes the rest with their slots.

TEST(EmbeddingTableTest, LookupOfSlots) {
  auto t = MakeTable(Dynamic("slot_lookup", 3));
  std::vector<int64_t> keys = {5, 6};
  std::vector<float> out(6), ignored(6);
  FindOrInsert(t.get(), {5}, true);
  bool before[2];
  // No slots attached yet: every key reads the caller's default.
  ASSERT_TRUE(t->Lookup(keys.data(), 2, true, out.data(), before, SerialRunner, 0, 0.75f).ok());
  EXPECT_EQ(out, std::vector<float>(6, 0.75f));
  EXPECT_TRUE(before[0]);
  EXPECT_FALSE(before[1]);
  ASSERT_TRUE(t->EnsureSlots("Ftrl", {0.25f, 0.0f}).ok());
  std::vector<bool> unused;
  bool exists[2];
  ASSERT_TRUE(t->Lookup(keys.data(), 2, true, out.data(), exists, SerialRunner, 0).ok());
  EXPECT_EQ(out, std::vector<float>(6, 0.25f));  // 5: its slot; 6: absent, initial value
  EXPECT_TRUE(exists[0]);
  EXPECT_FALSE(exists[1]);
  ASSERT_TRUE(t->Lookup(keys.data(), 2, false, out.data(), nullptr, SerialRunner, 1).ok());
  EXPECT_EQ(out, std::vector<float>(6, 0.0f));
  EXPECT_EQ(t->Lookup(keys.data(), 2, false, out.data(), nullptr, SerialRunner, 2).code(),
            StatusCode::kInvalidArgument);
}

// Attaching slots re-lays out every row record: embeddings, keys and addresses handed out
// before must survive unchanged across many chunks (including removed and reused rows).
TEST(EmbeddingTableTest, AttachingSlotsKeepsRowsAndAddressesAcrossChunks) {
  const int dim = 3;
  auto t = MakeTable(Dynamic("relayout", dim));
  const int64_t n = t->rows_per_chunk() * 3 + 5;
  std::vector<int64_t> keys(n);
  std::iota(keys.begin(), keys.end(), 1000);
  std::vector<int64_t> addr = FindOrInsert(t.get(), keys, true);
  std::vector<int64_t> removed_keys(keys.begin(), keys.begin() + 10);
  ASSERT_TRUE(t->Remove(removed_keys.data(), removed_keys.size(), nullptr, SerialRunner).ok());
  std::vector<int64_t> live_keys(keys.begin() + 10, keys.end());
  std::vector<int64_t> live_addr(addr.begin() + 10, addr.end());
  const std::vector<float> before = Gather(t.get(), live_addr);

  ASSERT_TRUE(t->EnsureSlots("Ftrl", {0.25f, 0.0f}).ok());
  EXPECT_EQ(t->Size(), n - 10);
  EXPECT_EQ(Gather(t.get(), live_addr), before);
  EXPECT_EQ(FindOrInsert(t.get(), live_keys, false), live_addr);
  // Slots of the old rows and of rows inserted afterwards (reusing freed rows) are initial.
  std::vector<int64_t> fresh = {1, 2, 3};
  FindOrInsert(t.get(), fresh, true);
  auto m = ToMap(ExportAll(t.get()), dim);
  for (int64_t k : {live_keys.front(), live_keys.back(), int64_t{1}, int64_t{3}}) {
    EXPECT_EQ(m[k][1], std::vector<float>(dim, 0.25f)) << "key " << k;
    EXPECT_EQ(m[k][2], std::vector<float>(dim, 0.0f)) << "key " << k;
  }
}

// After a Clear, rows above the new high-water mark keep their bumped generations through a
// re-layout: an address taken before the Clear must stay stale when its row is reused.
TEST(EmbeddingTableTest, AddressesStayStaleAcrossClearAndRelayout) {
  auto t = MakeTable(Dynamic("clear_relayout", 4));
  const std::vector<int64_t> old_addr = FindOrInsert(t.get(), {1, 2}, true);
  t->Clear();
  FindOrInsert(t.get(), {1000}, true);  // reuses row 0
  ASSERT_TRUE(t->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  FindOrInsert(t.get(), {2000}, true);  // reuses row 1
  for (int64_t a : old_addr) {
    Status s;
    Gather(t.get(), {a}, &s);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "address " << a;
  }
}

// Import is one exclusive section: racing it with Remove and FindOrInsert never crashes and
// leaves a consistent table.

}  // namespace
}  // namespace rec_sdk
