#include "tf_ops/core/rank_parts.h"

#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace rec_sdk {
namespace {

TEST(RankPartsTest, OwnerIsTheAbsoluteCRemainder) {
  EXPECT_EQ(OwnerOf(7, 3), 1);
  EXPECT_EQ(OwnerOf(-7, 3), 1);  // C: -7 % 3 == -1
  EXPECT_EQ(OwnerOf(-6, 3), 0);
  EXPECT_EQ(OwnerOf(INT64_MIN, 2), 0);
  EXPECT_EQ(OwnerOf(INT64_MIN + 1, 3), std::llabs((INT64_MIN + 1) % 3));
}

TEST(RankPartsTest, RouteKeysMatchesAStableSortByDestination) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t ranks = 1 + rng() % 6;
    const int32_t parts = 1 + static_cast<int32_t>(rng() % ranks);
    std::vector<int32_t> dest_of_owner(ranks);
    for (auto& d : dest_of_owner) d = static_cast<int32_t>(rng() % parts);
    const int64_t n = rng() % 300;
    std::vector<int64_t> keys(n);
    for (auto& k : keys) k = static_cast<int64_t>(rng() % 2001) - 1000;
    std::vector<int32_t> dest(n), within(n), per_dest(parts, -1);
    ASSERT_TRUE(RouteKeys(keys.data(), n, dest_of_owner.data(), ranks, parts, dest.data(),
                          within.data(), per_dest.data())
                    .ok());
    std::map<int32_t, int32_t> seen;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t want = dest_of_owner[std::llabs(keys[i] % ranks)];
      EXPECT_EQ(dest[i], want);
      EXPECT_EQ(within[i], seen[want]++);
    }
    for (int32_t d = 0; d < parts; ++d) EXPECT_EQ(per_dest[d], seen[d]);
  }
}

TEST(RankPartsTest, RouteKeysRefusesDestinationsOutsideTheParts) {
  const int64_t keys[] = {1, 2};
  const int32_t bad[] = {0, 2};
  int32_t dest[2], within[2], per_dest[2] = {7, 7};
  auto status = RouteKeys(keys, 2, bad, 2, 2, dest, within, per_dest);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("dest_of_owner[1] is 2"), std::string::npos);
  EXPECT_EQ(per_dest[0], 7);  // nothing written
  EXPECT_FALSE(RouteKeys(keys, 2, bad, 0, 2, dest, within, per_dest).ok());
}

// The reference: a zeroed buffer, the head copied, each entry that fits placed.
template <typename T>
std::vector<T> Reference(const std::vector<T>& values, int64_t width, const int32_t* take,
                         const std::vector<int32_t>& dest, const std::vector<int32_t>& within,
                         const std::vector<T>& head, int64_t head_rows, int32_t parts,
                         int64_t cap) {
  const int64_t rows = head_rows + cap;
  std::vector<T> out(parts * rows * width, T(0));
  for (int32_t d = 0; d < parts; ++d) {
    for (int64_t r = 0; r < head_rows; ++r) {
      for (int64_t c = 0; c < width; ++c) {
        out[(d * rows + r) * width + c] = head[(d * head_rows + r) * width + c];
      }
    }
  }
  for (size_t i = 0; i < dest.size(); ++i) {
    if (within[i] >= cap) continue;
    const int64_t src = take ? take[i] : static_cast<int64_t>(i);
    for (int64_t c = 0; c < width; ++c) {
      out[(dest[i] * rows + head_rows + within[i]) * width + c] = values[src * width + c];
    }
  }
  return out;
}

TEST(RankPartsTest, FillPartsMatchesTheReference) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t parts = 1 + static_cast<int32_t>(rng() % 4);
    const int64_t width = 1 + rng() % 5, head_rows = rng() % 3, n = rng() % 100;
    const bool with_take = trial % 2;
    const int64_t num_values = with_take ? 1 + rng() % 40 : n;
    std::vector<float> values(num_values * width);
    for (auto& v : values) v = static_cast<float>(rng() % 1000) / 7.0f;
    std::vector<float> head(parts * head_rows * width);
    for (auto& v : head) v = static_cast<float>(rng() % 100);
    // Slots as RouteKeys gives them, so no two entries share one.
    std::vector<int32_t> dest(n), within(n), take(n), count(parts, 0);
    for (int64_t i = 0; i < n; ++i) {
      dest[i] = static_cast<int32_t>(rng() % parts);
      within[i] = count[dest[i]]++;
      take[i] = static_cast<int32_t>(rng() % num_values);
    }
    int64_t most = 0;
    for (int32_t c : count) most = std::max<int64_t>(most, c);
    const int64_t cap = trial % 3 == 0 ? most / 2 : most + rng() % 3;  // some cut off
    const int32_t* t = with_take ? take.data() : nullptr;
    std::vector<float> out(parts * (head_rows + cap) * width, -1.0f);
    ASSERT_TRUE(FillParts<float>(values.data(), num_values, width, t, dest.data(), within.data(), n,
                                 head.data(), head_rows, parts, cap, out.data())
                    .ok());
    EXPECT_EQ(out, Reference(values, width, t, dest, within, head, head_rows, parts, cap));
  }
}

TEST(RankPartsTest, FillPartsRefusesBadEntriesBeforeWriting) {
  const int64_t values[] = {1, 2, 3};
  const int32_t dest[] = {0, 1, 2};
  const int32_t within[] = {0, 0, 0};
  const int32_t take[] = {0, 5, 1};
  std::vector<int64_t> out(6, -1);
  auto status =
      FillParts<int64_t>(values, 3, 1, nullptr, dest, within, 3, nullptr, 0, 2, 3, out.data());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("entry 2 goes to part 2"), std::string::npos);
  status = FillParts<int64_t>(values, 3, 1, take, dest, within, 2, nullptr, 0, 2, 3, out.data());
  EXPECT_NE(status.message().find("take[1] is 5"), std::string::npos);
  const int32_t negative[] = {0, -1};
  EXPECT_FALSE(
      FillParts<int64_t>(values, 3, 1, nullptr, dest, negative, 2, nullptr, 0, 2, 3, out.data())
          .ok());
  EXPECT_FALSE(
      FillParts<int64_t>(values, 1, 1, nullptr, dest, within, 2, nullptr, 0, 2, 3, out.data())
          .ok());
  EXPECT_EQ(out, std::vector<int64_t>(6, -1));
}

}  // namespace
}  // namespace rec_sdk
