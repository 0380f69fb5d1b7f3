// Tests of InitializerSpec / InitializeRow: determinism, value ranges and distribution
// moments, and validation errors.
#include "tf_ops/core/initializer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace rec_sdk {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::vector<float> Row(const InitializerSpec& spec, int64_t key, int dim) {
  std::vector<float> out(dim, std::nanf(""));
  InitializeRow(spec, key, dim, out.data());
  return out;
}

// Mean and (population) variance of every value of rows with keys [0, rows).
struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
  std::vector<float> all;
};
Moments Sample(const InitializerSpec& spec, int64_t rows, int dim) {
  Moments m;
  for (int64_t k = 0; k < rows; ++k) {
    // Spread the keys (negative ones too) rather than using only 0..rows-1.
    const int64_t key = (k % 2 == 0 ? 1 : -1) * k * 1000003;
    std::vector<float> r = Row(spec, key, dim);
    m.all.insert(m.all.end(), r.begin(), r.end());
  }
  for (float v : m.all) {
    m.mean += v;
    m.min = std::min<double>(m.min, v);
    m.max = std::max<double>(m.max, v);
  }
  m.mean /= m.all.size();
  for (float v : m.all) m.var += (v - m.mean) * (v - m.mean);
  m.var /= m.all.size();
  return m;
}

InitializerSpec Spec(InitializerKind kind) {
  InitializerSpec s;
  s.kind = kind;
  return s;
}

// --- Determinism ------------------------------------------------------------------------------

TEST(InitializerTest, SameSeedAndKeyGiveSameValues) {
  for (InitializerKind kind : {InitializerKind::kRandomUniform, InitializerKind::kRandomNormal,
                               InitializerKind::kTruncatedNormal}) {
    InitializerSpec s = Spec(kind);
    s.seed = 1234;
    for (int64_t key : {int64_t{0}, int64_t{1}, int64_t{-1}, kMin, kMax}) {
      EXPECT_EQ(Row(s, key, 33), Row(s, key, 33)) << "key " << key;
      // A copy of the spec (as another table or process would have) gives the same values.
      InitializerSpec copy = s;
      EXPECT_EQ(Row(copy, key, 33), Row(s, key, 33));
    }
  }
}

TEST(InitializerTest, DifferentKeyOrSeedGivesDifferentValues) {
  for (InitializerKind kind : {InitializerKind::kRandomUniform, InitializerKind::kRandomNormal,
                               InitializerKind::kTruncatedNormal}) {
    InitializerSpec s = Spec(kind);
    s.seed = 5;
    const std::vector<int64_t> keys = {0, 1, 2, -1, -2, kMin, kMax, 1LL << 40, 12345678901LL};
    std::vector<std::vector<float>> rows;
    for (int64_t key : keys) rows.push_back(Row(s, key, 8));
    for (size_t i = 0; i < rows.size(); ++i) {
      for (size_t j = i + 1; j < rows.size(); ++j) {
        EXPECT_NE(rows[i], rows[j]) << "keys " << keys[i] << " and " << keys[j];
      }
    }
    // Seeds 0, 1, 6 versus seed 5, same key.
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{6}, ~uint64_t{0}}) {
      InitializerSpec other = s;
      other.seed = seed;
      EXPECT_NE(Row(other, 7, 8), Row(s, 7, 8)) << "seed " << seed;
    }
  }
}

TEST(InitializerTest, ElementsOfARowAreNotAllEqual) {
  InitializerSpec s = Spec(InitializerKind::kRandomNormal);
  std::vector<float> r = Row(s, 3, 16);
  int distinct = 0;
  for (int i = 1; i < 16; ++i) distinct += r[i] != r[0];
  EXPECT_EQ(distinct, 15);
}

// --- Constant and scale ------------------------------------------------------------------------

TEST(InitializerTest, ConstantTimesScale) {
  InitializerSpec s = Spec(InitializerKind::kConstant);
  s.value = 0.25f;
  s.scale = 4.0f;
  for (float v : Row(s, 99, 10)) EXPECT_EQ(v, 1.0f);
  s.value = -3.0f;
  s.scale = 0.5f;
  for (float v : Row(s, -99, 3)) EXPECT_EQ(v, -1.5f);
  // Default spec: constant zero.
  for (float v : Row(InitializerSpec(), 1, 4)) EXPECT_EQ(v, 0.0f);
}

TEST(InitializerTest, ScaleMultipliesRandomValues) {
  for (InitializerKind kind : {InitializerKind::kRandomUniform, InitializerKind::kRandomNormal,
                               InitializerKind::kTruncatedNormal}) {
    InitializerSpec s = Spec(kind);
    s.minval = -1.0f;
    s.maxval = 3.0f;
    s.mean = 0.5f;
    s.stddev = 2.0f;
    InitializerSpec scaled = s;
    scaled.scale = 0.125f;
    std::vector<float> a = Row(s, 42, 64), b = Row(scaled, 42, 64);
    for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(b[i], a[i] * 0.125f) << "element " << i;
  }
}

TEST(InitializerTest, ZeroDimWritesNothing) {
  float sentinel = 7.0f;
  InitializeRow(Spec(InitializerKind::kRandomNormal), 1, 0, &sentinel);
  EXPECT_EQ(sentinel, 7.0f);
}

// --- Distributions -----------------------------------------------------------------------------

TEST(InitializerTest, UniformWithinRangeWithRightMoments) {
  InitializerSpec s = Spec(InitializerKind::kRandomUniform);
  s.minval = -0.5f;
  s.maxval = 1.5f;
  s.seed = 77;
  Moments m = Sample(s, 4000, 32);  // 128,000 values
  for (float v : m.all) {
    ASSERT_GE(v, s.minval);
    ASSERT_LT(v, s.maxval);
  }
  const double width = s.maxval - s.minval;
  EXPECT_NEAR(m.mean, 0.5, 0.01);                // standard error ~0.0016
  EXPECT_NEAR(m.var, width * width / 12, 0.01);  // 1/3, standard error ~0.0012
  EXPECT_LT(m.min, s.minval + 0.001);            // the whole range is used
  EXPECT_GT(m.max, s.maxval - 0.001);
  // Roughly flat: each quarter of the range holds ~25% of the values.
  std::vector<int> quarter(4, 0);
  for (float v : m.all) ++quarter[std::min(3, static_cast<int>((v - s.minval) / width * 4))];
  for (int q = 0; q < 4; ++q) EXPECT_NEAR(quarter[q] / double(m.all.size()), 0.25, 0.01);
}

TEST(InitializerTest, UniformDegenerateRange) {
  InitializerSpec s = Spec(InitializerKind::kRandomUniform);
  s.minval = s.maxval = 2.5f;
  ASSERT_TRUE(s.Validate().ok());
  for (float v : Row(s, 3, 16)) EXPECT_EQ(v, 2.5f);
}

TEST(InitializerTest, NormalMeanAndStddev) {
  InitializerSpec s = Spec(InitializerKind::kRandomNormal);
  s.mean = 1.0f;
  s.stddev = 2.0f;
  s.seed = 3;
  Moments m = Sample(s, 4000, 32);
  EXPECT_NEAR(m.mean, 1.0, 0.03);            // standard error ~0.0056
  EXPECT_NEAR(std::sqrt(m.var), 2.0, 0.03);  // standard error ~0.004
  // Not truncated: about 4.55% of the values lie beyond 2 stddev.
  int64_t beyond = 0;
  for (float v : m.all) beyond += std::fabs(v - 1.0f) > 4.0f;
  EXPECT_NEAR(beyond / double(m.all.size()), 0.0455, 0.004);
}

TEST(InitializerTest, TruncatedNormalStaysWithinTwoStddev) {
  InitializerSpec s = Spec(InitializerKind::kTruncatedNormal);
  s.mean = -0.5f;
  s.stddev = 0.1f;
  s.seed = 11;
  Moments m = Sample(s, 4000, 32);
  const double bound = 2 * 0.1;
  for (float v : m.all) ASSERT_LE(std::fabs(v - (-0.5)), bound * (1 + 1e-6)) << v;
  EXPECT_NEAR(m.mean, -0.5, 0.002);
  // A standard normal truncated to [-2, 2] has stddev sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)).
  const double phi2 = std::exp(-2.0) / std::sqrt(2 * M_PI);
  const double mass = std::erf(2.0 / std::sqrt(2.0));
  const double truncated_sd = std::sqrt(1 - 4 * phi2 / mass);  // ~0.880
  EXPECT_NEAR(std::sqrt(m.var), 0.1 * truncated_sd, 0.1 * 0.02);
  // Values beyond the bound are redrawn, not clamped: no pile-up at the edges.
  int64_t at_edge = 0;
  for (float v : m.all) at_edge += std::fabs(std::fabs(v + 0.5) - bound) < 1e-5;
  EXPECT_LT(at_edge, 20);
}

TEST(InitializerTest, ZeroStddevGivesMean) {
  for (InitializerKind kind : {InitializerKind::kRandomNormal, InitializerKind::kTruncatedNormal}) {
    InitializerSpec s = Spec(kind);
    s.mean = 0.75f;
    s.stddev = 0.0f;
    ASSERT_TRUE(s.Validate().ok());
    for (float v : Row(s, 8, 16)) EXPECT_EQ(v, 0.75f);
  }
}

// --- Validation --------------------------------------------------------------------------------

TEST(InitializerTest, ValidateAcceptsDefaultsOfEveryKind) {
  for (InitializerKind kind : {InitializerKind::kConstant, InitializerKind::kRandomUniform,
                               InitializerKind::kRandomNormal, InitializerKind::kTruncatedNormal}) {
    EXPECT_TRUE(Spec(kind).Validate().ok());
  }
}

TEST(InitializerTest, ValidateRejectsMinvalAboveMaxval) {
  InitializerSpec s = Spec(InitializerKind::kRandomUniform);
  s.minval = 2.0f;
  s.maxval = 1.0f;
  Status st = s.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("minval"), std::string::npos) << st.message();
}

TEST(InitializerTest, ValidateRejectsNegativeStddev) {
  for (InitializerKind kind : {InitializerKind::kRandomNormal, InitializerKind::kTruncatedNormal}) {
    InitializerSpec s = Spec(kind);
    s.stddev = -0.1f;
    Status st = s.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("stddev"), std::string::npos) << st.message();
  }
}

TEST(InitializerTest, ValidateRejectsNonFiniteParameters) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    InitializerKind kind;
    float InitializerSpec::*field;
    float bad;
  };
  const Case cases[] = {
      {InitializerKind::kConstant, &InitializerSpec::value, nan},
      {InitializerKind::kConstant, &InitializerSpec::value, inf},
      {InitializerKind::kConstant, &InitializerSpec::scale, inf},
      {InitializerKind::kRandomUniform, &InitializerSpec::minval, -inf},
      {InitializerKind::kRandomUniform, &InitializerSpec::maxval, inf},
      {InitializerKind::kRandomUniform, &InitializerSpec::maxval, nan},
      {InitializerKind::kRandomNormal, &InitializerSpec::mean, nan},
      {InitializerKind::kRandomNormal, &InitializerSpec::stddev, inf},
      {InitializerKind::kTruncatedNormal, &InitializerSpec::stddev, nan},
      {InitializerKind::kTruncatedNormal, &InitializerSpec::scale, nan},
  };
  for (const Case& c : cases) {
    InitializerSpec s = Spec(c.kind);
    s.*c.field = c.bad;
    EXPECT_EQ(s.Validate().code(), StatusCode::kInvalidArgument)
        << "kind " << static_cast<int>(c.kind) << " bad value " << c.bad;
  }
}

TEST(InitializerTest, KindFromName) {
  const std::pair<const char*, InitializerKind> names[] = {
      {"constant", InitializerKind::kConstant},
      {"random_uniform", InitializerKind::kRandomUniform},
      {"random_normal", InitializerKind::kRandomNormal},
      {"truncated_normal", InitializerKind::kTruncatedNormal},
  };
  for (const auto& [name, kind] : names) {
    InitializerKind got = kind == InitializerKind::kConstant ? InitializerKind::kRandomNormal
                                                             : InitializerKind::kConstant;
    ASSERT_TRUE(InitializerSpec::KindFromName(name, &got).ok()) << name;
    EXPECT_EQ(got, kind) << name;
  }
  for (const char* bad : {"", "Constant", "uniform", "normal", "glorot_uniform", "constant "}) {
    InitializerKind got;
    Status st = InitializerSpec::KindFromName(bad, &got);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_NE(st.message().find("'" + std::string(bad) + "'"), std::string::npos) << st.message();
  }
}

TEST(InitializerTest, ConstantPerElementValues) {
  InitializerSpec spec;
  spec.kind = InitializerKind::kConstant;
  spec.values = {0.5f, -1.0f, 2.0f};
  spec.scale = 2.0f;
  ASSERT_TRUE(spec.Validate().ok());
  float out[3];
  InitializeRow(spec, 7, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 4.0f);
  spec.values[1] = std::nanf("");
  EXPECT_EQ(spec.Validate().code(), StatusCode::kInvalidArgument);
  spec.values = {1.0f};
  spec.kind = InitializerKind::kRandomNormal;
  EXPECT_EQ(spec.Validate().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rec_sdk
