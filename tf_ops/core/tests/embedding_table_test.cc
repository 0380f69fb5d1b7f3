// Tests of EmbeddingTable: addresses, gather/lookup/upsert/remove against reference models,
// address validation, fixed capacity, dynamic growth, export/import, slots, and concurrent use.
#include "tf_ops/core/embedding_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rec_sdk {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// A runner that really splits the work over std::threads (up to `parts` ranges at once).
ParallelRunner ThreadedRunner(int parts = 4) {
  return [parts](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& work) {
    if (total <= 0) return;
    const int64_t n = std::min<int64_t>(total, parts);
    std::vector<std::thread> threads;
    for (int64_t p = 0; p < n; ++p) {
      const int64_t first = total * p / n, last = total * (p + 1) / n;
      threads.emplace_back([&work, first, last] { work(first, last); });
    }
    for (auto& t : threads) t.join();
  };
}

InitializerSpec Normal(uint64_t seed = 1) {
  InitializerSpec s;
  s.kind = InitializerKind::kRandomNormal;
  s.mean = 0.0f;
  s.stddev = 0.5f;
  s.seed = seed;
  return s;
}

TableConfig Dynamic(const std::string& name, int dim, int64_t initial_capacity = 0) {
  TableConfig c;
  c.name = name;
  c.dim = dim;
  c.dynamic_expansion = true;
  c.initial_capacity = initial_capacity;
  c.initializer = Normal();
  return c;
}

TableConfig Fixed(const std::string& name, int dim, int64_t capacity) {
  TableConfig c = Dynamic(name, dim);
  c.dynamic_expansion = false;
  c.capacity = capacity;
  return c;
}

std::unique_ptr<EmbeddingTable> MakeTable(const TableConfig& config) {
  std::unique_ptr<EmbeddingTable> t;
  Status s = EmbeddingTable::Create(config, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  return t;
}

std::vector<float> InitialRow(const EmbeddingTable& t, const InitializerSpec& spec, int64_t key) {
  std::vector<float> out(t.dim());
  InitializeRow(spec, key, t.dim(), out.data());
  return out;
}

// Thin vector wrappers around the pointer API.
std::vector<int64_t> FindOrInsert(EmbeddingTable* t, const std::vector<int64_t>& keys,
                                  bool insert, Status* status = nullptr,
                                  const ParallelRunner& run = SerialRunner) {
  std::vector<int64_t> addr(keys.size(), 12345);
  Status s = t->FindOrInsert(keys.data(), keys.size(), insert, addr.data(), run);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return addr;
}

std::vector<float> Gather(EmbeddingTable* t, const std::vector<int64_t>& addr,
                          Status* status = nullptr, const ParallelRunner& run = SerialRunner) {
  std::vector<float> out(addr.size() * t->dim(), std::nanf(""));
  Status s = t->Gather(addr.data(), addr.size(), out.data(), run);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return out;
}

std::vector<float> RowOf(const std::vector<float>& rows, int64_t i, int dim) {
  return std::vector<float>(rows.begin() + i * dim, rows.begin() + (i + 1) * dim);
}

// The whole table as key -> (values, slot values), via Export.
struct Exported {
  std::vector<int64_t> keys;
  std::vector<float> values, slots;
};
Exported ExportAll(EmbeddingTable* t) {
  Exported e;
  Status s = t->Export([&](int64_t n, int64_t** keys, float** values, float** slots) {
    e.keys.resize(n);
    e.values.resize(n * t->dim());
    e.slots.resize(t->num_slots() * n * t->dim());
    *keys = e.keys.data();
    *values = e.values.data();
    *slots = e.slots.data();
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.message();
  return e;
}
using RowContents = std::vector<std::vector<float>>;  // [0] value, [1 + s] slot s
std::map<int64_t, RowContents> ToMap(const Exported& e, int dim) {
  std::map<int64_t, RowContents> m;
  const int64_t n = e.keys.size();
  const int num_slots = n == 0 ? 0 : static_cast<int>(e.slots.size() / (n * dim));
  for (int64_t i = 0; i < n; ++i) {
    RowContents r;
    r.push_back(RowOf(e.values, i, dim));
    for (int s = 0; s < num_slots; ++s) r.push_back(RowOf(e.slots, s * n + i, dim));
    EXPECT_TRUE(m.emplace(e.keys[i], r).second) << "key " << e.keys[i] << " exported twice";
  }
  return m;
}

// Sets the value and slots of the rows at `addr` to f(key index, slot, element).
void WriteRows(EmbeddingTable* t, const std::vector<int64_t>& addr,
               const std::function<float(int64_t, int, int)>& f) {
  Status s = t->UpdateRows(
      addr.data(), addr.size(), 1,
      [&](int64_t i, float* value, float* const* slots) {
        for (int d = 0; d < t->dim(); ++d) {
          value[d] = f(i, -1, d);
          for (int k = 0; k < t->num_slots(); ++k) slots[k][d] = f(i, k, d);
        }
      },
      SerialRunner);
  ASSERT_TRUE(s.ok()) << s.message();
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// --- Create validation --------------------------------------------------------------------------

TEST(EmbeddingTableCreateTest, RejectsBadConfigs) {
  std::unique_ptr<EmbeddingTable> t;
  for (int dim : {0, -1, EmbeddingTable::kMaxDim + 1}) {
    Status s = EmbeddingTable::Create(Dynamic("t_dim", dim), &t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "dim " << dim;
    EXPECT_TRUE(Contains(s.message(), "t_dim")) << s.message();
    EXPECT_EQ(t, nullptr);
  }
  for (int64_t cap : {int64_t{0}, int64_t{-1}, EmbeddingTable::kMaxRows + 1}) {
    Status s = EmbeddingTable::Create(Fixed("t_cap", 4, cap), &t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "capacity " << cap;
    EXPECT_TRUE(Contains(s.message(), "capacity")) << s.message();
  }
  EXPECT_EQ(EmbeddingTable::Create(Dynamic("", 4), &t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingTable::Create(Dynamic("neg_initial", 4, -1), &t).code(),
            StatusCode::kInvalidArgument);
  TableConfig bad_init = Dynamic("bad_init", 4);
  bad_init.initializer.stddev = -1.0f;
  EXPECT_EQ(EmbeddingTable::Create(bad_init, &t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t, nullptr);
  TableConfig short_values = Dynamic("short_values", 4);
  short_values.initializer = InitializerSpec();
  short_values.initializer.values = {1.0f, 2.0f};
  Status s = EmbeddingTable::Create(short_values, &t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "2 values")) << s.message();
}

TEST(EmbeddingTableCreateTest, AcceptsLimits) {
  auto big = MakeTable(Fixed("max_dim", EmbeddingTable::kMaxDim, 1));
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->dim(), EmbeddingTable::kMaxDim);
  EXPECT_EQ(big->Capacity(), 1);
  auto one = MakeTable(Dynamic("dim1", 1));
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->Size(), 0);
  // A dynamic table ignores `capacity`; initial_capacity is reserved up front.
  TableConfig c = Dynamic("reserve", 8, 1000);
  auto r = MakeTable(c);
  EXPECT_GE(r->Capacity(), 1000);
  EXPECT_GT(r->MemoryBytes(), 1000 * 8 * 4);
}

// --- FindOrInsert and Gather ---------------------------------------------------------------------

TEST(EmbeddingTableTest, InsertGivesStableAddressesAndInitialValues) {
  auto t = MakeTable(Dynamic("basic", 8));
  const std::vector<int64_t> keys = {0, 1, -1, kMin, kMax, 42, 1LL << 50};
  std::vector<int64_t> addr = FindOrInsert(t.get(), keys, true);
  EXPECT_EQ(t->Size(), static_cast<int64_t>(keys.size()));
  std::set<int64_t> distinct(addr.begin(), addr.end());
  EXPECT_EQ(distinct.size(), keys.size());
  for (int64_t a : addr) EXPECT_NE(a, -1);
  // Same keys again, with insert on or off, in another order: same addresses.
  std::vector<int64_t> reversed(keys.rbegin(), keys.rend());
  std::vector<int64_t> again = FindOrInsert(t.get(), reversed, false);
  std::vector<int64_t> again_insert = FindOrInsert(t.get(), keys, true);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(again[keys.size() - 1 - i], addr[i]);
    EXPECT_EQ(again_insert[i], addr[i]);
  }
  EXPECT_EQ(t->Size(), static_cast<int64_t>(keys.size()));
  // New rows hold exactly the initializer's values for their key.
  std::vector<float> rows = Gather(t.get(), addr);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(RowOf(rows, i, 8), InitialRow(*t, Normal(), keys[i])) << "key " << keys[i];
  }
}

TEST(EmbeddingTableTest, FindWithoutInsertGivesMinusOneAndKeepsSize) {
  auto t = MakeTable(Dynamic("find_only", 4));
  FindOrInsert(t.get(), {10, 20}, true);
  std::vector<int64_t> addr = FindOrInsert(t.get(), {10, 11, 20, 21, kMin}, false);
  EXPECT_NE(addr[0], -1);
  EXPECT_EQ(addr[1], -1);
  EXPECT_NE(addr[2], -1);
  EXPECT_EQ(addr[3], -1);
  EXPECT_EQ(addr[4], -1);
  EXPECT_EQ(t->Size(), 2);
  // -1 gathers as zeros, mixed with real rows.
  std::vector<float> rows = Gather(t.get(), addr);
  EXPECT_EQ(RowOf(rows, 0, 4), InitialRow(*t, Normal(), 10));
  EXPECT_EQ(RowOf(rows, 1, 4), std::vector<float>(4, 0.0f));
  EXPECT_EQ(RowOf(rows, 3, 4), std::vector<float>(4, 0.0f));
}

TEST(EmbeddingTableTest, DuplicatesInABatchShareOneRow) {
  auto t = MakeTable(Dynamic("dups", 4));
  std::vector<int64_t> addr = FindOrInsert(t.get(), {7, 7, 8, 7, 8, 9, 7}, true);
  EXPECT_EQ(t->Size(), 3);
  EXPECT_EQ(addr[0], addr[1]);
  EXPECT_EQ(addr[0], addr[3]);
  EXPECT_EQ(addr[0], addr[6]);
  EXPECT_EQ(addr[2], addr[4]);
  EXPECT_NE(addr[0], addr[2]);
  EXPECT_NE(addr[5], addr[0]);
  // The same with a threaded runner over a larger batch.
  std::vector<int64_t> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back(1000 + i % 500);
  std::vector<int64_t> a = FindOrInsert(t.get(), keys, true, nullptr, ThreadedRunner());
  EXPECT_EQ(t->Size(), 503);
  for (size_t i = 500; i < keys.size(); ++i) EXPECT_EQ(a[i], a[i % 500]);
}

TEST(EmbeddingTableTest, EmptyBatchesAreFine) {
  auto t = MakeTable(Dynamic("empty", 4));
  int64_t removed = -5;
  EXPECT_TRUE(t->FindOrInsert(nullptr, 0, true, nullptr, SerialRunner).ok());
  EXPECT_TRUE(t->Gather(nullptr, 0, nullptr, SerialRunner).ok());
  EXPECT_TRUE(t->Lookup(nullptr, 0, true, nullptr, nullptr, SerialRunner).ok());
  EXPECT_TRUE(t->Upsert(nullptr, nullptr, 0, SerialRunner).ok());
  EXPECT_TRUE(t->Remove(nullptr, 0, &removed, SerialRunner).ok());
  EXPECT_EQ(removed, 0);
  EXPECT_EQ(t->Size(), 0);
}

// --- Lookup and Upsert ----------------------------------------------------------------------------

TEST(EmbeddingTableTest, LookupReportsExistenceAndNeverInserts) {
  auto t = MakeTable(Dynamic("lookup", 6));
  FindOrInsert(t.get(), {1, 3}, true);
  const std::vector<int64_t> keys = {1, 2, 3, 4, 1};
  for (bool init_missing : {false, true}) {
    std::vector<float> out(keys.size() * 6, std::nanf(""));
    bool exists[5];
    ASSERT_TRUE(t->Lookup(keys.data(), keys.size(), init_missing, out.data(), exists,
                          SerialRunner).ok());
    const bool want[] = {true, false, true, false, true};
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(exists[i], want[i]) << "key " << keys[i];
      std::vector<float> expected = (want[i] || init_missing)
                                        ? InitialRow(*t, Normal(), keys[i])
                                        : std::vector<float>(6, 0.0f);
      EXPECT_EQ(RowOf(out, i, 6), expected) << "key " << keys[i] << " init " << init_missing;
    }
    EXPECT_EQ(t->Size(), 2);
  }
  // exists may be null.
  std::vector<float> out(6);
  const int64_t k = 2;
  EXPECT_TRUE(t->Lookup(&k, 1, false, out.data(), nullptr, SerialRunner).ok());
}

TEST(EmbeddingTableTest, UpsertThenLookupAndGather) {
  auto t = MakeTable(Dynamic("upsert", 3));
  std::vector<int64_t> before = FindOrInsert(t.get(), {5}, true);
  // Key 5 exists (overwritten), 6 is new; 6 appears twice: the last value wins.
  const std::vector<int64_t> keys = {5, 6, 7, 6};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ASSERT_TRUE(t->Upsert(keys.data(), values.data(), keys.size(), SerialRunner).ok());
  EXPECT_EQ(t->Size(), 3);
  std::vector<float> out(9);
  bool exists[3];
  const std::vector<int64_t> q = {5, 6, 7};
  ASSERT_TRUE(t->Lookup(q.data(), 3, false, out.data(), exists, SerialRunner).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 10, 11, 12, 7, 8, 9}));
  EXPECT_TRUE(exists[0] && exists[1] && exists[2]);
  // The existing row kept its address; gathering it sees the new values.
  std::vector<int64_t> after = FindOrInsert(t.get(), {5}, false);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(Gather(t.get(), after), (std::vector<float>{1, 2, 3}));
}

// --- Remove and stale addresses ---------------------------------------------------------------

TEST(EmbeddingTableTest, RemoveMakesAddressStaleAndReinsertReinitialises) {
  auto t = MakeTable(Dynamic("remove", 4));
  ASSERT_TRUE(t->EnsureSlots("Opt", {0.5f, -2.0f}).ok());
  std::vector<int64_t> addr = FindOrInsert(t.get(), {100, 200}, true);
  // Overwrite the value and slots of key 100.
  WriteRows(t.get(), {addr[0]}, [](int64_t, int slot, int d) { return 9.0f + slot + d; });
  const std::vector<int64_t> victims = {100, 100, 300};  // duplicate and absent key
  int64_t removed = -1;
  ASSERT_TRUE(t->Remove(victims.data(), victims.size(), &removed, SerialRunner).ok());
  EXPECT_EQ(removed, 1);
  EXPECT_EQ(t->Size(), 1);
  EXPECT_EQ(FindOrInsert(t.get(), {100}, false)[0], -1);

  Status s;
  Gather(t.get(), {addr[1], addr[0]}, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "stale")) << s.message();
  EXPECT_EQ(Gather(t.get(), {addr[1]}), InitialRow(*t, Normal(), 200));

  // Reinserted, key 100 (probably on the same row) starts over: initial value and slots, and
  // its old address stays stale.
  std::vector<int64_t> re = FindOrInsert(t.get(), {100}, true);
  EXPECT_NE(re[0], addr[0]);
  Gather(t.get(), {addr[0]}, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  auto m = ToMap(ExportAll(t.get()), 4);
  ASSERT_EQ(m.count(100), 1u);
  EXPECT_EQ(m[100][0], InitialRow(*t, Normal(), 100));
  EXPECT_EQ(m[100][1], std::vector<float>(4, 0.5f));
  EXPECT_EQ(m[100][2], std::vector<float>(4, -2.0f));
}

TEST(EmbeddingTableTest, RemoveAllowsNullCountAndThreads) {
  auto t = MakeTable(Dynamic("remove_mt", 2));
  std::vector<int64_t> keys(2000);
  std::iota(keys.begin(), keys.end(), -1000);
  FindOrInsert(t.get(), keys, true);
  std::vector<int64_t> odd;
  for (int64_t k : keys) if (k % 2 != 0) odd.push_back(k);
  int64_t removed = 0;
  ASSERT_TRUE(t->Remove(odd.data(), odd.size(), &removed, ThreadedRunner()).ok());
  EXPECT_EQ(removed, 1000);
  ASSERT_TRUE(t->Remove(odd.data(), odd.size(), nullptr, SerialRunner).ok());
  EXPECT_EQ(t->Size(), 1000);
  std::vector<int64_t> found = FindOrInsert(t.get(), keys, false);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(found[i] == -1, keys[i] % 2 != 0);
}

// --- Address validation --------------------------------------------------------------------------

TEST(EmbeddingTableTest, GarbageAddressesAreRejectedNotFollowed) {
  auto t = MakeTable(Dynamic("garbage", 4));
  std::vector<int64_t> good = FindOrInsert(t.get(), {1, 2, 3}, true);
  const int64_t unused_row = t->Capacity() - 1;  // allocated but never handed out
  const std::vector<int64_t> bad = {
      0, 1, 5, 1LL << 39, -2, -7, kMin, kMax, kMax - 1,
      good[0] + t->Capacity(),                // right tag, row past the allocated rows
      t->EncodeAddress(unused_row, 0),       // right tag, row never used
      t->EncodeAddress(t->Capacity(), 0),
      t->EncodeAddress(EmbeddingTable::kMaxRows - 1, 0),
      good[0] ^ (int64_t{1} << 40),          // right row, wrong generation
      good[0] | (int64_t{1} << 62),          // another tag
  };
  for (int64_t a : bad) {
    Status s;
    std::vector<float> out = Gather(t.get(), {good[0], a, good[1]}, &s);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "address " << a;
    EXPECT_TRUE(Contains(s.message(), "garbage")) << s.message();
    // UpdateRows rejects it too and touches no row.
    const std::vector<int64_t> batch = {good[0], good[1], a, good[2]};
    int calls = 0;
    s = t->UpdateRows(batch.data(), batch.size(), 1,
                      [&](int64_t, float* v, float* const*) { ++calls; v[0] = 1e9f; },
                      SerialRunner);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "address " << a;
    EXPECT_EQ(calls, 0);
  }
  std::vector<float> rows = Gather(t.get(), good);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(RowOf(rows, i, 4), InitialRow(*t, Normal(), i + 1));
}

TEST(EmbeddingTableTest, AddressOfAnotherTableIsRejected) {
  auto a = MakeTable(Dynamic("table_a", 4));
  auto b = MakeTable(Dynamic("table_b", 4));
  std::vector<int64_t> addr_a = FindOrInsert(a.get(), {1}, true);
  std::vector<int64_t> addr_b = FindOrInsert(b.get(), {1}, true);
  ASSERT_NE(addr_a[0], addr_b[0]);  // same row and generation, different tags
  Status s;
  Gather(a.get(), addr_b, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "table_a")) << s.message();
  Gather(b.get(), addr_a, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// --- Fixed capacity -------------------------------------------------------------------------------

TEST(EmbeddingTableTest, FixedCapacityFullIsResourceExhausted) {
  auto t = MakeTable(Fixed("small_fixed", 4, 10));
  EXPECT_EQ(t->Capacity(), 10);
  std::vector<int64_t> keys(10);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<int64_t> addr = FindOrInsert(t.get(), keys, true);
  EXPECT_EQ(t->Size(), 10);

  // A batch with a known key and two new ones: the known key still maps, the new ones don't.
  Status s;
  std::vector<int64_t> more = FindOrInsert(t.get(), {3, 10, 11}, true, &s);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "small_fixed")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "10")) << s.message();
  EXPECT_EQ(more[0], addr[3]);
  EXPECT_EQ(more[1], -1);
  EXPECT_EQ(more[2], -1);
  EXPECT_EQ(t->Size(), 10);
  const std::vector<float> vals(4, 1.0f);
  const int64_t k = 99;
  EXPECT_EQ(t->Upsert(&k, vals.data(), 1, SerialRunner).code(), StatusCode::kResourceExhausted);
  // Overwriting an existing key still works when full.
  const int64_t k3 = 3;
  EXPECT_TRUE(t->Upsert(&k3, vals.data(), 1, SerialRunner).ok());

  // Freed rows are reused: remove three keys, three new keys fit, a fourth does not.
  const std::vector<int64_t> gone = {1, 4, 7};
  ASSERT_TRUE(t->Remove(gone.data(), gone.size(), nullptr, SerialRunner).ok());
  std::vector<int64_t> fresh = FindOrInsert(t.get(), {20, 21, 22}, true);
  EXPECT_EQ(t->Size(), 10);
  std::vector<float> rows = Gather(t.get(), fresh);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(RowOf(rows, i, 4), InitialRow(*t, Normal(), 20 + i));
  FindOrInsert(t.get(), {23}, true, &s);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  // The removed keys' old addresses are stale even though their rows were reused.
  Gather(t.get(), {addr[1]}, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // Untouched keys kept their rows and values.
  std::vector<float> kept = Gather(t.get(), {addr[0], addr[9]});
  EXPECT_EQ(RowOf(kept, 0, 4), InitialRow(*t, Normal(), 0));
  EXPECT_EQ(RowOf(kept, 1, 4), InitialRow(*t, Normal(), 9));
}

TEST(EmbeddingTableTest, FixedCapacityPartialBatch) {
  auto t = MakeTable(Fixed("partial", 2, 5));
  FindOrInsert(t.get(), {1, 2, 3, 4}, true);
  Status s;
  std::vector<int64_t> addr = FindOrInsert(t.get(), {50, 51, 52}, true, &s);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t->Size(), 5);
  // Exactly one of the new keys got the last row, and it is usable.
  int got = 0;
  for (size_t i = 0; i < addr.size(); ++i) {
    if (addr[i] == -1) continue;
    ++got;
    EXPECT_EQ(Gather(t.get(), {addr[i]}), InitialRow(*t, Normal(), 50 + i));
  }
  EXPECT_EQ(got, 1);
}

// --- Dynamic expansion ------------------------------------------------------------------------------

TEST(EmbeddingTableTest, DynamicExpansionKeepsEarlierRows) {
  const int dim = 1024;  // small chunks, so growth spans many of them
  auto t = MakeTable(Dynamic("grow", dim, 1));
  const int64_t chunk = t->rows_per_chunk();
  const int64_t initial = t->Capacity();
  ASSERT_GE(initial, 1);
  // First batch: give each row distinctive values.
  std::vector<int64_t> first_keys(chunk + 3);
  std::iota(first_keys.begin(), first_keys.end(), 1000000);
  std::vector<float> first_values(first_keys.size() * dim);
  for (size_t i = 0; i < first_values.size(); ++i) first_values[i] = 0.001f * (i % 9973);
  ASSERT_TRUE(t->Upsert(first_keys.data(), first_values.data(), first_keys.size(),
                        SerialRunner).ok());
  std::vector<int64_t> first_addr = FindOrInsert(t.get(), first_keys, false);
  std::vector<float> before = Gather(t.get(), first_addr);
  EXPECT_EQ(before, first_values);

  // Then grow by at least 12 more chunks in batches, threaded.
  std::vector<int64_t> later_keys;
  for (int64_t b = 0; b < 12; ++b) {
    std::vector<int64_t> keys(chunk);
    std::iota(keys.begin(), keys.end(), -(b + 1) * 10 * chunk);
    FindOrInsert(t.get(), keys, true, nullptr, ThreadedRunner());
    later_keys.insert(later_keys.end(), keys.begin(), keys.end());
  }
  EXPECT_EQ(t->Size(), static_cast<int64_t>(first_keys.size() + later_keys.size()));
  EXPECT_GE(t->Capacity(), initial + 12 * chunk);
  EXPECT_EQ(Gather(t.get(), first_addr, nullptr, ThreadedRunner()), before);
  EXPECT_EQ(FindOrInsert(t.get(), first_keys, false), first_addr);
  // Spot-check later rows against the initializer.
  std::vector<int64_t> sample = {later_keys.front(), later_keys[later_keys.size() / 2],
                                 later_keys.back()};
  std::vector<float> rows = Gather(t.get(), FindOrInsert(t.get(), sample, false));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(RowOf(rows, i, dim), InitialRow(*t, Normal(), sample[i]));
}

// --- Clear ---------------------------------------------------------------------------------------------

TEST(EmbeddingTableTest, ClearEmptiesTableAndStalesAddresses) {
  auto t = MakeTable(Fixed("clear", 4, 8));
  std::vector<int64_t> addr = FindOrInsert(t.get(), {1, 2, 3, 4, 5, 6, 7, 8}, true);
  t->Clear();
  EXPECT_EQ(t->Size(), 0);
  for (int64_t a : addr) {
    Status s;
    Gather(t.get(), {a}, &s);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(FindOrInsert(t.get(), {1, 2}, false), (std::vector<int64_t>{-1, -1}));
  // The whole capacity is available again.
  std::vector<int64_t> again = FindOrInsert(t.get(), {11, 12, 13, 14, 15, 16, 17, 1}, true);
  EXPECT_EQ(t->Size(), 8);
  for (size_t i = 0; i < again.size(); ++i) {
    EXPECT_TRUE(std::find(addr.begin(), addr.end(), again[i]) == addr.end());
  }
  EXPECT_EQ(RowOf(Gather(t.get(), again), 7, 4), InitialRow(*t, Normal(), 1));
  EXPECT_TRUE(ExportAll(t.get()).keys.size() == 8);
}

// --- Slots ------------------------------------------------------------------------------------------------

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
  EXPECT_TRUE(Contains(s.message(), "Adagrad") && Contains(s.message(), "LazyAdam"))
      << s.message();
  EXPECT_FALSE(t->EnsureSlots("Other", {0.1f}).ok());  // same slot count, other optimizer
  EXPECT_EQ(t->slot_optimizer(), "Adagrad");
  EXPECT_EQ(t->num_slots(), 1);

  auto u = MakeTable(Dynamic("too_many", 4));
  EXPECT_EQ(u->EnsureSlots("Big", {0, 0, 0, 0, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(u->EnsureSlots("Four", {1, 2, 3, 4}).ok());
}

// Restrict keeps the most recently / most often seen rows (track_access keeps both current
// on training lookups) and removes the rest with their slots.
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

// --- Export / Import --------------------------------------------------------------------------------

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
  ASSERT_TRUE(dst->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 2,
                          n).ok());
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
  ASSERT_TRUE(src->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 2,
                          n).ok());
  EXPECT_EQ(ToMap(ExportAll(src.get()), dim), expected);
  // A slot count that does not match the table's optimizer is rejected.
  EXPECT_EQ(src->Import(shuffled.keys.data(), shuffled.values.data(), shuffled.slots.data(), 1,
                        n).code(),
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

// --- Concurrency ----------------------------------------------------------------------------------

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
          for (int64_t k : keys) if (model.count(k)) distinct_present.insert(k);
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

}  // namespace
}  // namespace rec_sdk
