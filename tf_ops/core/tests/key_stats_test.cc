// Tests of AggregateKeyAccess against a direct computation.
#include "tf_ops/core/key_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace rec_sdk {
namespace {

TEST(KeyStatsTest, CountsAndNewestTimesMatchReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t samples = 1 + rng() % 30, per = 1 + rng() % 5, n = samples * per;
    const int64_t unique = 1 + rng() % 12;
    std::vector<int32_t> inverse(n);
    std::vector<int64_t> weights(n), times(samples);
    for (auto& x : inverse) x = rng() % unique;
    for (auto& w : weights) w = 1 + rng() % 3;
    for (auto& t : times) t = static_cast<int64_t>(rng() % 1000) - 500;
    std::vector<int64_t> counts(unique), newest(unique);
    ASSERT_TRUE(AggregateKeyAccess(inverse.data(), n, unique, weights.data(), 0, times.data(),
                                   samples, counts.data(), newest.data())
                    .ok());
    std::vector<int64_t> want_counts(unique, 0),
        want_newest(unique, std::numeric_limits<int64_t>::min());
    for (int64_t i = 0; i < n; ++i) {
      want_counts[inverse[i]] += weights[i];
      want_newest[inverse[i]] = std::max(want_newest[inverse[i]], times[i / per]);
    }
    EXPECT_EQ(counts, want_counts);
    EXPECT_EQ(newest, want_newest);
    // One weight for all, no times.
    ASSERT_TRUE(AggregateKeyAccess(inverse.data(), n, unique, nullptr, 2, nullptr, 0, counts.data(),
                                   nullptr)
                    .ok());
    for (int64_t u = 0; u < unique; ++u) {
      EXPECT_EQ(counts[u], 2 * std::count(inverse.begin(), inverse.end(), u));
    }
  }
}

TEST(KeyStatsTest, RejectsBadInput) {
  std::vector<int32_t> inverse = {0, 3};
  std::vector<int64_t> counts(2), newest(2), times = {1, 2, 3};
  EXPECT_FALSE(
      AggregateKeyAccess(inverse.data(), 2, 2, nullptr, 1, nullptr, 0, counts.data(), nullptr)
          .ok());
  inverse = {0, 1};
  EXPECT_FALSE(AggregateKeyAccess(inverse.data(), 2, 2, nullptr, 1, times.data(), 3, counts.data(),
                                  newest.data())
                   .ok());
  EXPECT_FALSE(AggregateKeyAccess(inverse.data(), 2, 2, nullptr, 1, times.data(), 0, counts.data(),
                                  newest.data())
                   .ok());
  EXPECT_TRUE(AggregateKeyAccess(inverse.data(), 0, 0, nullptr, 1, times.data(), 0, counts.data(),
                                 newest.data())
                  .ok());
}

}  // namespace
}  // namespace rec_sdk
