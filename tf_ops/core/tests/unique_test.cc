// DeduplicateKeys against a std::unordered_map model: every key appears once in `unique`,
// unique[inverse[i]] == keys[i], and the result does not depend on how work is split.
#include "tf_ops/core/unique.h"
#include "tf_ops/core/tests/table_test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <unordered_set>
#include <vector>

namespace rec_sdk {
namespace {

void TwoThreads(int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& work) {
  const int64_t mid = total / 2;
  std::thread other([&] {
    if (mid < total) work(mid, total);
  });
  if (mid > 0) work(0, mid);
  other.join();
}

void CheckDedup(const std::vector<int64_t>& keys, const ParallelRunner& run) {
  std::vector<int64_t> unique;
  std::vector<int32_t> inverse(keys.size(), -1);
  DeduplicateKeys(keys.data(), keys.size(), &unique, inverse.data(), run);
  const std::unordered_set<int64_t> expected(keys.begin(), keys.end());
  ASSERT_EQ(unique.size(), expected.size());
  const std::unordered_set<int64_t> got(unique.begin(), unique.end());
  EXPECT_EQ(got, expected);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_GE(inverse[i], 0);
    ASSERT_LT(static_cast<size_t>(inverse[i]), unique.size());
    ASSERT_EQ(unique[inverse[i]], keys[i]) << "position " << i;
  }
}

TEST(UniqueTest, EmptyInput) { CheckDedup({}, SerialRunner); }

TEST(UniqueTest, AllEqualAndExtremeKeys) {
  CheckDedup(std::vector<int64_t>(1000, 7), SerialRunner);
  CheckDedup({INT64_MIN, INT64_MAX, -1, 0, INT64_MIN, -1, INT64_MAX}, SerialRunner);
}

TEST(UniqueTest, RandomKeysWithManyDuplicatesSerialAndThreaded) {
  std::mt19937_64 rng(3);
  for (int64_t range : {10, 1000, 1000000}) {
    std::vector<int64_t> keys(50000);
    for (auto& k : keys) k = static_cast<int64_t>(rng() % range) - range / 2;
    CheckDedup(keys, SerialRunner);
    CheckDedup(keys, TwoThreads);
  }
}

// Above the serial limit the batch is split into hash shards deduplicated in parallel.
TEST(UniqueTest, LargeBatchesUseTheParallelPath) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> keys((int64_t{1} << 20) + 1000);
  for (auto& k : keys) k = static_cast<int64_t>(rng() % 300000);
  CheckDedup(keys, TwoThreads);
}

// The kernels' runner with a helper that starts at once or late: the parts of a
// batch are taken by whichever thread comes first, and the output is always the one-map one.
TEST(UniqueTest, SameOutputWhateverThreadTakesWhichPart) {
  std::mt19937_64 rng(11);
  for (int64_t n : {int64_t{8191}, int64_t{8192}, int64_t{65536}, int64_t{100001}}) {
    std::vector<int64_t> keys(n);
    for (auto& k : keys) k = static_cast<int64_t>(rng() % (n / 3 + 1));
    std::vector<int64_t> expected;
    std::vector<int32_t> expected_inverse(n);
    DeduplicateKeys(keys.data(), n, &expected, expected_inverse.data(), SerialRunner);
    // First-occurrence order.
    std::unordered_set<int64_t> seen;
    std::vector<int64_t> in_order;
    for (int64_t k : keys) {
      if (seen.insert(k).second) in_order.push_back(k);
    }
    ASSERT_EQ(expected, in_order);
    for (int delay_us : {0, 100, 300, 1000, 50000}) {
      std::vector<std::thread> helpers;
      auto schedule = [&](std::function<void()> task) {
        helpers.emplace_back([task = std::move(task), delay_us] {
          std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
          task();
        });
      };
      HelperBoard board;  // outlives the helpers (joined below)
      ParallelRunner run = [&](int64_t total, int64_t cost,
                               const std::function<void(int64_t, int64_t)>& work) {
        RunWithLingeringHelpers(board, 2, schedule, total, cost, work);
      };
      std::vector<int64_t> unique;
      std::vector<int32_t> inverse(n);
      DeduplicateKeys(keys.data(), n, &unique, inverse.data(), run);
      for (auto& t : helpers) t.join();
      EXPECT_EQ(unique, expected) << "n " << n << " delay " << delay_us;
      EXPECT_EQ(inverse, expected_inverse) << "n " << n << " delay " << delay_us;
    }
  }
}

TEST(UniqueTest, OutputIsDeterministic) {
  std::mt19937_64 rng(5);
  std::vector<int64_t> keys(20000);
  for (auto& k : keys) k = static_cast<int64_t>(rng() % 5000);
  std::vector<int64_t> a, b;
  std::vector<int32_t> ia(keys.size()), ib(keys.size());
  DeduplicateKeys(keys.data(), keys.size(), &a, ia.data(), SerialRunner);
  DeduplicateKeys(keys.data(), keys.size(), &b, ib.data(), TwoThreads);
  EXPECT_EQ(a, b);
  EXPECT_EQ(ia, ib);
}

// Keys crafted to collide in the unseeded hash made the dedup quadratic; it hashes with a
// random per-process seed, so they cost about what random keys do.
TEST(DeduplicateKeysTest, KeysCraftedToCollideAreNotMuchSlower) {
  const int64_t n = 40000;
  const std::vector<int64_t> crafted = table_test::CraftedCollidingKeys(n);
  std::mt19937_64 rng(3);
  std::vector<int64_t> random(n);
  for (auto& k : random) k = static_cast<int64_t>(rng());
  auto dedup = [](const std::vector<int64_t>& keys) {
    return [&keys] {
      std::vector<int64_t> unique;
      std::vector<int32_t> inverse(keys.size());
      DeduplicateKeys(keys.data(), keys.size(), &unique, inverse.data(), SerialRunner);
      ASSERT_EQ(unique.size(), keys.size());
    };
  };
  const double crafted_s = table_test::FastestSeconds(3, dedup(crafted));
  const double random_s = table_test::FastestSeconds(3, dedup(random));
  EXPECT_LT(crafted_s, 5 * random_s + 0.02) << crafted_s << " s vs " << random_s << " s";
}

}  // namespace
}  // namespace rec_sdk
