// Helpers shared by the EmbeddingTable googletests: configurations, a threaded runner, and
// vector wrappers over the table's pointer API.
#ifndef REC_SDK_CORE_TESTS_TABLE_TEST_UTIL_H_
#define REC_SDK_CORE_TESTS_TABLE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {
namespace table_test {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// A runner that really splits the work over std::threads (up to `parts` ranges at once).
inline ParallelRunner ThreadedRunner(int parts = 4) {
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

inline InitializerSpec Normal(uint64_t seed = 1) {
  InitializerSpec s;
  s.kind = InitializerKind::kRandomNormal;
  s.mean = 0.0f;
  s.stddev = 0.5f;
  s.seed = seed;
  return s;
}

// The index layout of the helpers' tables: REC_SDK_TEST_INDEX_LAYOUT ("auto", "full" or
// "compact"; unset: auto), so that the table tests run on both layouts (tf_ops/BUILD runs
// them once more with "compact").
inline TableConfig::IndexLayout TestIndexLayout() {
  const char* name = std::getenv("REC_SDK_TEST_INDEX_LAYOUT");
  TableConfig::IndexLayout layout = TableConfig::IndexLayout::kAuto;
  if (name != nullptr) {
    Status s = IndexLayoutFromName(name, &layout);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return layout;
}

inline TableConfig Dynamic(const std::string& name, int dim, int64_t initial_capacity = 0) {
  TableConfig c;
  c.index_layout = TestIndexLayout();
  c.name = name;
  c.dim = dim;
  c.dynamic_expansion = true;
  c.initial_capacity = initial_capacity;
  c.initializer = Normal();
  return c;
}

inline TableConfig Fixed(const std::string& name, int dim, int64_t capacity) {
  TableConfig c = Dynamic(name, dim);
  c.dynamic_expansion = false;
  c.capacity = capacity;
  return c;
}

inline std::unique_ptr<EmbeddingTable> MakeTable(const TableConfig& config) {
  std::unique_ptr<EmbeddingTable> t;
  Status s = EmbeddingTable::Create(config, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  return t;
}

inline std::vector<float> InitialRow(const EmbeddingTable& t, const InitializerSpec& spec,
                                     int64_t key) {
  std::vector<float> out(t.dim());
  InitializeRow(spec, key, t.dim(), out.data());
  return out;
}

// Thin vector wrappers around the pointer API.
inline std::vector<int64_t> FindOrInsert(EmbeddingTable* t, const std::vector<int64_t>& keys,
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

inline std::vector<float> Gather(EmbeddingTable* t, const std::vector<int64_t>& addr,
                                 Status* status = nullptr,
                                 const ParallelRunner& run = SerialRunner) {
  std::vector<float> out(addr.size() * t->dim(), std::nanf(""));
  Status s = t->Gather(addr.data(), addr.size(), out.data(), run);
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return out;
}

inline std::vector<float> RowOf(const std::vector<float>& rows, int64_t i, int dim) {
  return std::vector<float>(rows.begin() + i * dim, rows.begin() + (i + 1) * dim);
}

// The whole table as key -> (values, slot values), via Export.
struct Exported {
  std::vector<int64_t> keys;
  std::vector<float> values, slots;
  int slot_width = 0;  // floats per slot (the table's slot_width())
};
inline Exported ExportAll(EmbeddingTable* t) {
  Exported e;
  Status s = t->Export([&](int64_t n, int64_t** keys, float** values, float** slots) {
    e.keys.resize(n);
    e.values.resize(n * t->dim());
    e.slots.resize(t->num_slots() * n * t->slot_width());
    *keys = e.keys.data();
    *values = e.values.data();
    *slots = e.slots.data();
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.message();
  e.slot_width = t->slot_width();
  return e;
}
using RowContents = std::vector<std::vector<float>>;  // [0] value, [1 + s] slot s
inline std::map<int64_t, RowContents> ToMap(const Exported& e, int dim) {
  std::map<int64_t, RowContents> m;
  const int64_t n = e.keys.size();
  const int width = e.slot_width == 0 ? dim : e.slot_width;
  const int num_slots = n == 0 ? 0 : static_cast<int>(e.slots.size() / (n * width));
  for (int64_t i = 0; i < n; ++i) {
    RowContents r;
    r.push_back(RowOf(e.values, i, dim));
    for (int s = 0; s < num_slots; ++s) r.push_back(RowOf(e.slots, s * n + i, width));
    EXPECT_TRUE(m.emplace(e.keys[i], r).second) << "key " << e.keys[i] << " exported twice";
  }
  return m;
}

// Sets the value and slots of the rows at `addr` to f(key index, slot, element).
inline void WriteRows(EmbeddingTable* t, const std::vector<int64_t>& addr,
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

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Keys whose unseeded hashes (HashIndex::Hash(key, 0)) all fall in shard 0 and share their
// low 20 bits, as an attacker who knows the hash function would craft them: the mix is
// inverted for hashes chosen to collide.
inline std::vector<int64_t> CraftedCollidingKeys(int64_t n) {
  auto inverse = [](uint64_t c) {  // of an odd constant, modulo 2^64 (Newton's iteration)
    uint64_t x = c;
    for (int i = 0; i < 6; ++i) x *= 2 - c * x;
    return x;
  };
  auto unshift = [](uint64_t y, int s) {  // x with x ^ (x >> s) == y
    uint64_t x = y;
    for (int i = 0; i < 64 / s + 1; ++i) x = y ^ (x >> s);
    return x;
  };
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = (static_cast<uint64_t>(i + 1) << 20) | 0x12345;  // top 6 bits 0
    uint64_t z = unshift(h, 31);
    z = unshift(z * inverse(0x94d049bb133111ebULL), 27);
    z = unshift(z * inverse(0xbf58476d1ce4e5b9ULL), 30);
    keys[i] = static_cast<int64_t>(z - 0x9e3779b97f4a7c15ULL);
  }
  return keys;
}

// The fastest of `runs` timings of f(), in seconds.
inline double FastestSeconds(int runs, const std::function<void()>& f) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace table_test
}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TESTS_TABLE_TEST_UTIL_H_
