// Half-precision rows: the conversions (against the compiler's IEEE float16 and exhaustive
// checks), stochastic rounding's distribution, and a table that stores bfloat16 / float16
// embeddings through lookups, updates, export and checkpoints of any dtype.
#include "tf_ops/core/row_precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "tf_ops/core/checkpoint.h"
#include "tf_ops/core/sparse_optimizers.h"
#include "tf_ops/core/tests/table_test_util.h"

namespace rec_sdk {
namespace {

using precision::BFloat16Nearest;
using precision::BFloat16Stochastic;
using precision::BFloat16ToFloat;
using precision::BitsOf;
using precision::Float16Nearest;
using precision::Float16Stochastic;
using precision::Float16ToFloat;
using precision::FloatOf;
using table_test::ExportAll;
using table_test::MakeTable;
using table_test::ToMap;

TEST(RowPrecisionTest, NamesRoundTripAndUnknownNamesAreRefusedByName) {
  for (RowDtype d : {RowDtype::kFloat32, RowDtype::kBFloat16, RowDtype::kFloat16}) {
    RowDtype back;
    ASSERT_TRUE(RowDtypeFromName(RowDtypeName(d), &back).ok());
    EXPECT_EQ(back, d);
  }
  RowDtype d;
  Status s = RowDtypeFromName("int8", &d);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("emb_dtype 'int8'"), std::string::npos) << s.message();
}

TEST(RowPrecisionTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16Nearest(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16Nearest(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie: to even (down)
  EXPECT_EQ(BFloat16Nearest(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: to even (up)
  EXPECT_EQ(BFloat16Nearest(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(BFloat16Nearest(-2.5f), 0xC020);
  EXPECT_EQ(BFloat16Nearest(3.4028235e38f), 0x7F80);  // past the largest bfloat16: infinity
  EXPECT_EQ(BFloat16Nearest(INFINITY), 0x7F80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(BFloat16Nearest(NAN))));
  // Every bfloat16 (but NaNs) survives a round trip.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(BFloat16Nearest(f), h);
  }
}

TEST(RowPrecisionTest, Float16MatchesTheCompilersIeeeConversion) {
  // Every float16 decodes as the compiler's _Float16 does, and survives a round trip.
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float f = Float16ToFloat(bits);
    if (std::isnan(static_cast<float>(ref))) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(BitsOf(f), BitsOf(static_cast<float>(ref))) << h;
    ASSERT_EQ(Float16Nearest(f), bits) << h;
  }
  // Nearest rounding of floats of every magnitude, ties included (the midpoints of
  // neighbouring float16 values), against the compiler's conversion.
  std::mt19937 rng(7);
  std::vector<float> values;
  for (int i = 0; i < 200000; ++i) {
    const float mantissa = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    values.push_back(std::ldexp(mantissa, std::uniform_int_distribution<int>(-30, 17)(rng)));
  }
  for (uint32_t h = 0; h < 0x7BFF; h += 7) {
    const float a = Float16ToFloat(static_cast<uint16_t>(h));
    const float b = Float16ToFloat(static_cast<uint16_t>(h + 1));
    values.push_back((a + b) / 2);
    values.push_back(-(a + b) / 2);
  }
  values.insert(values.end(), {65504.0f, 65519.0f, 65520.0f, 1e6f, 3e-8f, 2.98e-8f, 0.0f, -0.0f});
  for (float f : values) {
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(Float16Nearest(f), ref_bits) << f;
  }
}

// Over all 65,536 random values, stochastic rounding gives only the two neighbours, and the
// mean of the results is the value itself (to the 2^-16 steps of the probability).
template <typename Round, typename Decode>
void ExpectUnbiased(float x, Round round, Decode decode, double resolution) {
  double sum = 0;
  std::set<float> results;
  for (uint32_t r = 0; r < 65536; ++r) {
    const float y = decode(round(x, r));
    results.insert(y);
    sum += y;
  }
  ASSERT_LE(results.size(), 2u) << x;
  const float lo = *results.begin(), hi = *results.rbegin();
  EXPECT_LE(lo, x);
  EXPECT_GE(hi, x);
  const double gap = static_cast<double>(hi) - lo;
  EXPECT_NEAR(sum / 65536, x, gap * resolution + 1e-30) << x;
  if (lo != hi) {
    // The two results are neighbours: their midpoint rounds to one of them.
    const float mid = decode(round(lo / 2 + hi / 2, 0));
    EXPECT_TRUE(mid == lo || mid == hi) << x;
  }
}

TEST(RowPrecisionTest, StochasticRoundingIsUnbiasedBetweenNeighbours) {
  std::mt19937 rng(11);
  auto bf = [](float x, uint32_t r) { return BFloat16Stochastic(x, r); };
  auto f16 = [](float x, uint32_t r) { return Float16Stochastic(x, r); };
  for (int i = 0; i < 300; ++i) {
    const float m = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    const float x = std::ldexp(m, std::uniform_int_distribution<int>(-20, 14)(rng));
    ExpectUnbiased(x, bf, BFloat16ToFloat, 1.0 / 65536);
    // float16 normals drop 13 bits: the probability moves in steps of 2^-13.
    ExpectUnbiased(x, f16, Float16ToFloat, std::fabs(x) >= 6.1035156e-5f ? 1.0 / 8192 : 1.0 / 1024);
  }
  // A representable value stays put whatever the bits.
  for (uint32_t r : {0u, 1u, 0x8000u, 0xFFFFu}) {
    EXPECT_EQ(BFloat16Stochastic(1.5f, r), BFloat16Nearest(1.5f));
    EXPECT_EQ(Float16Stochastic(-0.75f, r), Float16Nearest(-0.75f));
  }
}

// The bulk float16 conversions (F16C / AVX2 where the CPU has them) equal the scalar ones:
// every float16 decoded, and stochastic rounding of values across the whole range (the
// subnormal edge, the largest finite, infinities, NaN) with any start element and length.
TEST(RowPrecisionTest, BulkFloat16ConversionsEqualTheScalarOnes) {
  std::printf("float16 bulk conversions use SIMD here: %s\n", Float16UsesSimd() ? "yes" : "no");
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(all.size()), scalar(all.size());
  DecodeFloat16(all.data(), static_cast<int>(all.size()), bulk.data());
  DecodeFloat16Scalar(all.data(), static_cast<int>(all.size()), scalar.data());
  for (size_t h = 0; h < all.size(); ++h) {
    if (std::isnan(scalar[h])) {
      EXPECT_TRUE(std::isnan(bulk[h])) << h;
    } else {
      EXPECT_EQ(BitsOf(bulk[h]), BitsOf(scalar[h])) << h;
    }
  }
  std::mt19937_64 rng(11);
  const float edges[] = {0.0f,
                         -0.0f,
                         6.103515625e-05f,
                         6.1035149e-05f,
                         -6.1035156e-05f,
                         65504.0f,
                         65519.0f,
                         65520.0f,
                         -65535.0f,
                         1e-9f,
                         3e38f,
                         INFINITY,
                         -INFINITY,
                         NAN,
                         1.0f,
                         -2.5f};
  std::uniform_real_distribution<float> log2(-30.0f, 17.0f);
  for (int round = 0; round < 3000; ++round) {
    const int n = 1 + static_cast<int>(rng() % 41);
    const int64_t first = static_cast<int64_t>(rng() % 9);
    std::vector<float> in(n);
    for (float& x : in) {
      x = rng() % 5 == 0 ? edges[rng() % (sizeof(edges) / sizeof(float))]
                         : std::exp2(log2(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    }
    const RoundingBits bits(rng(), static_cast<int64_t>(rng()), rng());
    std::vector<uint16_t> a(n), b(n);
    EncodeFloat16Stochastic(in.data(), n, bits, first, a.data());
    EncodeFloat16StochasticScalar(in.data(), n, bits, first, b.data());
    ASSERT_EQ(a, b) << "round " << round;
  }
}

std::string TempDir() {
  char tmpl[] = "/tmp/rec_sdk_precision_XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d;
}

TableConfig Config(RowDtype dtype, int dim = 5, const std::string& name = "p") {
  TableConfig c = table_test::Dynamic(name, dim);
  c.emb_dtype = dtype;
  c.initializer.seed = 42;
  return c;
}

std::vector<float> Rounded(RowDtype dtype, std::vector<float> v) {
  std::vector<uint16_t> stored(v.size());
  if (dtype == RowDtype::kFloat32) return v;
  EncodeRowNearest(dtype, v.data(), static_cast<int>(v.size()), stored.data());
  DecodeRow(dtype, stored.data(), static_cast<int>(v.size()), v.data());
  return v;
}

class HalfTableTest : public ::testing::TestWithParam<RowDtype> {};

TEST_P(HalfTableTest, StoresRoundedValuesAndReadsThemAsFloat32) {
  const RowDtype dtype = GetParam();
  const int dim = 5;
  auto t = MakeTable(Config(dtype, dim));
  EXPECT_EQ(t->emb_dtype(), dtype);
  // New rows start from the initial values rounded to the table's precision, and a lookup
  // of a missing key with init_missing reads exactly what the row would hold.
  const std::vector<int64_t> keys = {3, -7, 1 << 20};
  std::vector<float> missing(keys.size() * dim);
  ASSERT_TRUE(
      t->Lookup(keys.data(), keys.size(), true, missing.data(), nullptr, SerialRunner).ok());
  auto addr = table_test::FindOrInsert(t.get(), keys, true);
  const std::vector<float> rows = table_test::Gather(t.get(), addr);
  EXPECT_EQ(rows, missing);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> initial(dim);
    InitializeRow(t->config().initializer, keys[i], dim, initial.data());
    EXPECT_EQ(table_test::RowOf(rows, i, dim), Rounded(dtype, initial));
    EXPECT_NE(Rounded(dtype, initial), initial);  // the test would not see a missed rounding
  }
  // Upserted values are stored rounded to nearest; lookups, gathers and exports agree.
  std::vector<float> values(keys.size() * dim);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * (i + 1) - 0.77f;
  ASSERT_TRUE(t->Upsert(keys.data(), values.data(), keys.size(), SerialRunner).ok());
  std::vector<float> looked(values.size());
  ASSERT_TRUE(
      t->Lookup(keys.data(), keys.size(), false, looked.data(), nullptr, SerialRunner).ok());
  EXPECT_EQ(looked, Rounded(dtype, values));
  EXPECT_EQ(table_test::Gather(t.get(), addr), Rounded(dtype, values));
  auto exported = ToMap(ExportAll(t.get()), dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(exported[keys[i]][0], Rounded(dtype, table_test::RowOf(values, i, dim)));
  }
}

TEST_P(HalfTableTest, UpdatesRoundStochasticallyWithTheBitsOfKeyAndStep) {
  const RowDtype dtype = GetParam();
  const int dim = 6;
  auto t = MakeTable(Config(dtype, dim));
  const std::vector<int64_t> keys = {10, 11, 12};
  auto addr = table_test::FindOrInsert(t.get(), keys, true);
  std::vector<float> before = table_test::Gather(t.get(), addr);
  // Two updates (steps 1 and 2) adding a fraction of an ulp: each result is the value's
  // stochastic rounding with RoundingBits(seed, key, step).
  for (uint64_t step = 1; step <= 2; ++step) {
    auto add = [&](int64_t, float* value, float* const*) {
      for (int d = 0; d < dim; ++d) value[d] += 1e-3f * (d + 1);
    };
    ASSERT_TRUE(t->UpdateRows(addr.data(), addr.size(), 1, add, SerialRunner).ok());
    const std::vector<float> after = table_test::Gather(t.get(), addr);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float> wanted(dim);
      for (int d = 0; d < dim; ++d) wanted[d] = before[i * dim + d] + 1e-3f * (d + 1);
      std::vector<uint16_t> stored(dim);
      EncodeRowStochastic(dtype, wanted.data(), dim, RoundingBits(42, keys[i], step),
                          stored.data());
      std::vector<float> expected(dim);
      DecodeRow(dtype, stored.data(), dim, expected.data());
      EXPECT_EQ(table_test::RowOf(after, i, dim), expected) << "key " << keys[i];
    }
    before = after;
  }
}

TEST_P(HalfTableTest, SmallStepsAccumulateInExpectation) {
  // 2,000 steps of +2e-4 on values near 1 (a bfloat16 ulp there is 2^-7 = 0.0078): nearest
  // rounding would never move them; stochastic rounding moves them by 0.4 on average.
  const RowDtype dtype = GetParam();
  const int dim = 64;
  TableConfig c = Config(dtype, dim);
  c.initializer.kind = InitializerKind::kConstant;
  c.initializer.value = 1.0f;
  auto t = MakeTable(c);
  auto addr = table_test::FindOrInsert(t.get(), {5}, true);
  for (int step = 0; step < 2000; ++step) {
    ASSERT_TRUE(t->UpdateRows(
                     addr.data(), 1, 1,
                     [&](int64_t, float* value, float* const*) {
                       for (int d = 0; d < dim; ++d) value[d] += 2e-4f;
                     },
                     SerialRunner)
                    .ok());
  }
  const std::vector<float> row = table_test::Gather(t.get(), addr);
  double mean = 0;
  for (float v : row) mean += v / dim;
  EXPECT_NEAR(mean, 1.4, 0.02);
}

TEST_P(HalfTableTest, TrainingIsReproducibleAcrossThreadsAndTables) {
  const RowDtype dtype = GetParam();
  auto a = MakeTable(Config(dtype, 8, "a"));
  auto b = MakeTable(Config(dtype, 8, "b"));
  std::mt19937_64 rng(5);
  for (int step = 1; step <= 30; ++step) {
    std::vector<int64_t> keys;
    for (int i = 0; i < 200; ++i) keys.push_back(static_cast<int64_t>(rng() % 500));
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<float> grads(keys.size() * 8);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + step);
    for (auto* t : {a.get(), b.get()}) {
      const ParallelRunner run = t == a.get() ? SerialRunner : table_test::ThreadedRunner(4);
      auto addr = table_test::FindOrInsert(t, keys, true, nullptr, run);
      ASSERT_TRUE(ApplyLazyAdam(t, addr.data(), grads.data(), addr.size(),
                                {0.01f, 0.9f, 0.999f, 1e-8f, step}, run)
                      .ok());
    }
  }
  EXPECT_TRUE(ToMap(ExportAll(a.get()), 8) == ToMap(ExportAll(b.get()), 8));
}

// Any dtype's checkpoint restores into a table of any dtype: the values convert (exactly to
// a wider dtype, rounded to nearest to a narrower one) and the slots and update step go on.
TEST(HalfCheckpointTest, EveryDtypeRestoresIntoEveryOther) {
  const std::vector<RowDtype> dtypes = {RowDtype::kFloat32, RowDtype::kBFloat16,
                                        RowDtype::kFloat16};
  const int dim = 4;
  const std::vector<int64_t> keys = {1, 2, 3, 40, 500};
  for (RowDtype from : dtypes) {
    auto t = MakeTable(Config(from, dim, "src"));
    auto addr = table_test::FindOrInsert(t.get(), keys, true);
    std::vector<float> grads(keys.size() * dim, 0.25f);
    ASSERT_TRUE(ApplyLazyAdam(t.get(), addr.data(), grads.data(), addr.size(),
                              {0.01f, 0.9f, 0.999f, 1e-8f, 1}, SerialRunner)
                    .ok());
    const std::string dir = TempDir() + "/t";
    ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
    // values.bin holds the table's element type.
    std::ifstream values(dir + "/values.bin", std::ios::binary | std::ios::ate);
    EXPECT_EQ(static_cast<int64_t>(values.tellg()),
              static_cast<int64_t>(keys.size()) * dim * RowDtypeBytes(from));
    const auto saved = ToMap(ExportAll(t.get()), dim);
    for (RowDtype to : dtypes) {
      auto u = MakeTable(Config(to, dim, "dst"));
      std::string note;
      Status s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, &note);
      ASSERT_TRUE(s.ok()) << s.message();
      const auto restored = ToMap(ExportAll(u.get()), dim);
      ASSERT_EQ(restored.size(), saved.size());
      for (const auto& [key, row] : saved) {
        const auto& got = restored.at(key);
        EXPECT_EQ(got[0], Rounded(to, row[0]))
            << RowDtypeName(from) << " -> " << RowDtypeName(to) << ", key " << key;
        EXPECT_EQ(got[1], row[1]);  // slots stay float32
        EXPECT_EQ(got[2], row[2]);
      }
      // Training goes on from the saved update step: the same dtype, restored, trains
      // bit-identically to the table it came from.
      if (to == from) {
        auto addr_u = table_test::FindOrInsert(u.get(), keys, true);
        auto addr_t = table_test::FindOrInsert(t.get(), keys, true);
        ASSERT_TRUE(ApplyLazyAdam(u.get(), addr_u.data(), grads.data(), keys.size(),
                                  {0.01f, 0.9f, 0.999f, 1e-8f, 2}, SerialRunner)
                        .ok());
        ASSERT_TRUE(ApplyLazyAdam(t.get(), addr_t.data(), grads.data(), keys.size(),
                                  {0.01f, 0.9f, 0.999f, 1e-8f, 2}, SerialRunner)
                        .ok());
        EXPECT_TRUE(ToMap(ExportAll(u.get()), dim) == ToMap(ExportAll(t.get()), dim));
      }
    }
    EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  }
}

TEST(HalfCheckpointTest, AHandleAskingForAnotherDtypeIsAnotherTable) {
  TableConfig a = Config(RowDtype::kBFloat16);
  TableConfig b = Config(RowDtype::kFloat32);
  // With the default index layout ("auto") the index differs too: compact for half rows.
  EXPECT_EQ(ConfigDifferences(a, b),
            (std::vector<std::string>{"emb_dtype: bfloat16 vs float32",
                                      "compact index (index_layout): true vs false"}));
  a.index_layout = b.index_layout = TableConfig::IndexLayout::kFull;
  const auto differences = ConfigDifferences(a, b);
  ASSERT_EQ(differences.size(), 1u);
  EXPECT_EQ(differences[0], "emb_dtype: bfloat16 vs float32");
  b = a;
  b.slot_dtype = RowDtype::kBFloat16;
  ASSERT_EQ(ConfigDifferences(a, b).size(), 1u);
  EXPECT_EQ(ConfigDifferences(a, b)[0], "slot_dtype: float32 vs bfloat16");
}

// Memory per row of a table of 65,536 rows made by `config` and trained once by `train`
// (which attaches the optimizer's slots): its rows' (records and chunks) and its index's,
// apart, since the index's varies a little with the table's random hash seed.
struct RowMemory {
  double rows;
  double index;
};

RowMemory BytesPerRow(TableConfig c,
                      const std::function<Status(EmbeddingTable*, const std::vector<int64_t>&,
                                                 const std::vector<float>&)>& train) {
  c.dynamic_expansion = false;
  c.capacity = 1 << 16;
  auto t = MakeTable(c);
  std::vector<int64_t> keys(1 << 16);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i);
  auto addr = table_test::FindOrInsert(t.get(), keys, true);
  std::vector<float> grads(keys.size() * c.dim, 0.1f);
  EXPECT_TRUE(train(t.get(), addr, grads).ok());
  const double index = static_cast<double>(t->IndexMemoryBytes());
  return {(static_cast<double>(t->MemoryBytes()) - index) / keys.size(), index / keys.size()};
}

TEST(HalfMemoryTest, HalfRowsHalveTheEmbeddingBytes) {
  // dim 64, row-wise Adagrad (one slot float): records of 24 + 256 + 4 bytes (288 with
  // padding) in float32 and 24 + 128 + 4 (160) in bfloat16; with a full index for both, the
  // index costs both the same.
  auto bytes_per_row = [](RowDtype dtype, TableConfig::IndexLayout layout) {
    TableConfig c = Config(dtype, 64);
    c.index_layout = layout;
    return BytesPerRow(c, [](EmbeddingTable* t, const auto& addr, const auto& grads) {
      return ApplyRowwiseAdagrad(t, addr.data(), grads.data(), addr.size(), {0.1f, 0.1f, 1e-8f},
                                 SerialRunner);
    });
  };
  using Layout = TableConfig::IndexLayout;
  const RowMemory full32 = bytes_per_row(RowDtype::kFloat32, Layout::kFull);
  const RowMemory full16 = bytes_per_row(RowDtype::kBFloat16, Layout::kFull);
  // (Chunks are mapped in whole pages: a few bytes a row either way.)
  EXPECT_NEAR(full32.rows - full16.rows, 128, 4) << full32.rows << " vs " << full16.rows;
  // "auto" gives half rows a compact index: 8 bytes instead of 16 per index slot, and the
  // index keeps at least two slots per key.
  const RowMemory auto16 = bytes_per_row(RowDtype::kBFloat16, Layout::kAuto);
  EXPECT_NEAR(auto16.rows, full16.rows, 1);
  EXPECT_GE(full16.index - auto16.index, 16 - 1) << full16.index << " vs " << auto16.index;
  const RowMemory auto32 = bytes_per_row(RowDtype::kFloat32, Layout::kAuto);
  EXPECT_NEAR(auto32.rows, full32.rows, 1);
  EXPECT_NEAR(auto32.index, full32.index, 8);  // a full index too: only the seeds differ
}

// bfloat16 slots (slot_dtype): an optimizer update sees its slots in float32 and each slot
// element is rounded back stochastically with the bits of element (s + 1) * dim + d of the
// row's update; the embedding of a float32 table is updated exactly as with float32 slots.
TEST(HalfSlotsTest, AdagradAccumulatorsRoundStochasticallyAfterTheEmbedding) {
  for (RowDtype emb : {RowDtype::kFloat32, RowDtype::kBFloat16}) {
    const int dim = 6;  // not a multiple of 4: the slot's bits start inside a word
    TableConfig c = Config(emb, dim);
    c.slot_dtype = RowDtype::kBFloat16;
    auto t = MakeTable(c);
    const std::vector<int64_t> keys = {10, 11, 12};
    auto addr = table_test::FindOrInsert(t.get(), keys, true);
    std::vector<float> grads(keys.size() * dim);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.05f * std::sin(1.3f * i) + 0.011f;
    auto before = ToMap(ExportAll(t.get()), dim);
    for (uint64_t step = 1; step <= 3; ++step) {
      ASSERT_TRUE(ApplyAdagrad(t.get(), addr.data(), grads.data(), addr.size(),
                               {0.1f, 0.1f, 1e-7f, false}, SerialRunner)
                      .ok());
      auto after = ToMap(ExportAll(t.get()), dim);
      for (size_t i = 0; i < keys.size(); ++i) {
        const RoundingBits bits(42, keys[i], step);
        std::vector<float> acc(dim), w(dim);
        for (int d = 0; d < dim; ++d) {
          const float g = grads[i * dim + d];
          acc[d] =
              (step == 1 ? Rounded(RowDtype::kBFloat16, {0.1f})[0] : before[keys[i]][1][d]) + g * g;
          w[d] = before[keys[i]][0][d] - 0.1f * g / (std::sqrt(acc[d]) + 1e-7f);
        }
        std::vector<uint16_t> stored(dim);
        std::vector<float> acc_expected(dim), w_expected = w;
        EncodeRowStochastic(RowDtype::kBFloat16, acc.data(), dim, bits, stored.data(), dim);
        DecodeRow(RowDtype::kBFloat16, stored.data(), dim, acc_expected.data());
        if (emb != RowDtype::kFloat32) {
          EncodeRowStochastic(emb, w.data(), dim, bits, stored.data());
          DecodeRow(emb, stored.data(), dim, w_expected.data());
        }
        EXPECT_EQ(after[keys[i]][1], acc_expected) << "key " << keys[i] << " step " << step;
        EXPECT_EQ(after[keys[i]][0], w_expected) << "key " << keys[i] << " step " << step;
        EXPECT_NE(acc_expected, acc);  // the test would not see a missed rounding
      }
      before = after;
    }
  }
}

TEST(HalfSlotsTest, CheckpointsHoldFloat32SlotsAndRestoreIntoEitherSlotDtype) {
  const int dim = 5;
  const std::vector<int64_t> keys = {1, 2, 3, 40};
  std::vector<float> grads(keys.size() * dim, 0.3f);
  for (RowDtype from : {RowDtype::kFloat32, RowDtype::kBFloat16}) {
    TableConfig c = Config(RowDtype::kFloat32, dim, "src");
    c.slot_dtype = from;
    auto t = MakeTable(c);
    auto addr = table_test::FindOrInsert(t.get(), keys, true);
    ASSERT_TRUE(ApplyLazyAdam(t.get(), addr.data(), grads.data(), addr.size(),
                              {0.01f, 0.9f, 0.999f, 1e-8f, 1}, SerialRunner)
                    .ok());
    const std::string dir = TempDir() + "/t";
    ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
    std::ifstream slot(dir + "/slot0.bin", std::ios::binary | std::ios::ate);
    EXPECT_EQ(static_cast<int64_t>(slot.tellg()), static_cast<int64_t>(keys.size()) * dim * 4);
    const auto saved = ToMap(ExportAll(t.get()), dim);
    for (RowDtype to : {RowDtype::kFloat32, RowDtype::kBFloat16}) {
      TableConfig d = Config(RowDtype::kFloat32, dim, "dst");
      d.slot_dtype = to;
      auto u = MakeTable(d);
      std::string note;
      ASSERT_TRUE(RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, &note).ok());
      const auto restored = ToMap(ExportAll(u.get()), dim);
      for (const auto& [key, row] : saved) {
        EXPECT_EQ(restored.at(key)[0], row[0]);
        EXPECT_EQ(restored.at(key)[1], Rounded(to, row[1]));
        EXPECT_EQ(restored.at(key)[2], Rounded(to, row[2]));
      }
    }
    EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  }
}

TEST(HalfSlotsTest, OneFloatPerRowStaysFloat32AndFloat16IsRefused) {
  TableConfig c = Config(RowDtype::kBFloat16, 8);
  c.slot_dtype = RowDtype::kBFloat16;
  auto t = MakeTable(c);
  auto addr = table_test::FindOrInsert(t.get(), {7}, true);
  std::vector<float> grads(8, 0.001f);
  ASSERT_TRUE(
      ApplyRowwiseAdagrad(t.get(), addr.data(), grads.data(), 1, {0.1f, 0.1f, 1e-8f}, SerialRunner)
          .ok());
  const auto rows = ToMap(ExportAll(t.get()), 8);
  // 0.1 + 1e-6 is not a bfloat16 value (nor 0.1): the float32 accumulator keeps it.
  EXPECT_EQ(rows.at(7)[1][0], 0.1f + 1e-6f);
  TableConfig f = Config(RowDtype::kFloat32, 8, "f16");
  f.slot_dtype = RowDtype::kFloat16;
  std::unique_ptr<EmbeddingTable> u;
  Status s = EmbeddingTable::Create(f, &u);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot_dtype must be float32 or bfloat16, got float16"),
            std::string::npos)
      << s.message();
}

TEST(HalfSlotsTest, Bfloat16SlotsHalveTheSlotBytes) {
  // dim 16, LazyAdam (two slots of 16 values): records of 24 + 64 + 128 bytes with float32
  // slots and 24 + 64 + 64 with bfloat16 slots.
  std::vector<double> per_row;
  for (RowDtype slots : {RowDtype::kFloat32, RowDtype::kBFloat16}) {
    TableConfig c = Config(RowDtype::kFloat32, 16);
    c.slot_dtype = slots;
    per_row.push_back(BytesPerRow(c, [](EmbeddingTable* t, const auto& addr, const auto& grads) {
                        return ApplyLazyAdam(t, addr.data(), grads.data(), addr.size(),
                                             {0.01f, 0.9f, 0.999f, 1e-8f, 1}, SerialRunner);
                      }).rows);
  }
  EXPECT_NEAR(per_row[0] - per_row[1], 64, 4) << per_row[0] << " vs " << per_row[1];
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfTableTest,
                         ::testing::Values(RowDtype::kBFloat16, RowDtype::kFloat16),
                         [](const auto& info) { return std::string(RowDtypeName(info.param)); });

}  // namespace
}  // namespace rec_sdk
