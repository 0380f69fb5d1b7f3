#include "tf_ops/core/size_class.h"

#include <gtest/gtest.h>

namespace rec_sdk {
namespace {

TEST(SizeClassTest, ClassesGrowByAQuarterAtMost) {
  EXPECT_EQ(SizeClassRows(0), 4);
  EXPECT_EQ(SizeClassRows(1), 5);
  EXPECT_EQ(SizeClassRows(3), 7);
  EXPECT_EQ(SizeClassRows(4), 8);
  EXPECT_EQ(SizeClassRows(5), 10);
  EXPECT_EQ(SizeClassRows(8), 16);
  EXPECT_EQ(SizeClassRows(kSizeClasses - 1), int64_t{7} << 28);
  for (int i = 1; i < kSizeClasses; ++i) {
    ASSERT_GT(SizeClassRows(i), SizeClassRows(i - 1)) << i;
    ASSERT_LE(SizeClassRows(i) * 4, SizeClassRows(i - 1) * 5) << i;
  }
}

TEST(SizeClassTest, ClassOfIsTheSmallestThatHolds) {
  EXPECT_EQ(SizeClassOf(0), 0);
  EXPECT_EQ(SizeClassOf(4), 0);
  EXPECT_EQ(SizeClassOf(5), 1);
  EXPECT_EQ(SizeClassOf(8), 4);
  EXPECT_EQ(SizeClassOf(9), 5);
  EXPECT_EQ(SizeClassOf(-1), -1);
  EXPECT_EQ(SizeClassOf(SizeClassRows(kSizeClasses - 1)), kSizeClasses - 1);
  EXPECT_EQ(SizeClassOf(SizeClassRows(kSizeClasses - 1) + 1), -1);
  // Against a scan, over every row count up to 5,000 and around each class's edges.
  auto scan = [](int64_t rows) {
    int i = 0;
    while (SizeClassRows(i) < rows) ++i;
    return i;
  };
  for (int64_t rows = 0; rows <= 5000; ++rows) ASSERT_EQ(SizeClassOf(rows), scan(rows)) << rows;
  for (int i = 1; i < kSizeClasses; ++i) {
    int64_t edge = SizeClassRows(i);
    ASSERT_EQ(SizeClassOf(edge), i);
    ASSERT_EQ(SizeClassOf(edge - 1), SizeClassRows(i - 1) >= edge - 1 ? i - 1 : i);
    if (i + 1 < kSizeClasses) ASSERT_EQ(SizeClassOf(edge + 1), i + 1);
  }
}

TEST(SizeClassTest, HintGrowsAtOnceWithHeadroomAndShrinksSlowly) {
  SizeHint* hint = SizeHint::Get("size_class_test_hint");
  EXPECT_EQ(hint, SizeHint::Get("size_class_test_hint"));
  EXPECT_NE(hint, SizeHint::Get("size_class_test_other"));
  EXPECT_EQ(hint->Current(), 0);
  EXPECT_EQ(hint->Observe(3), 0);  // fits: unchanged
  EXPECT_EQ(hint->Current(), 0);
  EXPECT_EQ(hint->Observe(100), SizeClassOf(100));
  EXPECT_EQ(hint->Current(), SizeClassOf(100) + 1);
  EXPECT_EQ(hint->Observe(90), SizeClassOf(90));  // fits: unchanged
  EXPECT_EQ(hint->Current(), SizeClassOf(100) + 1);
  // Needs of at most half: the hint holds for kShrinkAfter - 1 steps, then shrinks.
  for (int i = 0; i < SizeHint::kShrinkAfter - 1; ++i) {
    hint->Observe(40);
    ASSERT_EQ(hint->Current(), SizeClassOf(100) + 1) << i;
  }
  hint->Observe(70);  // more than half of 128: the run starts again
  for (int i = 0; i < SizeHint::kShrinkAfter - 1; ++i) hint->Observe(40);
  EXPECT_EQ(hint->Current(), SizeClassOf(100) + 1);
  hint->Observe(40);
  EXPECT_EQ(hint->Current(), SizeClassOf(40) + 1);
  EXPECT_EQ(hint->Observe(-5), -1);
  EXPECT_EQ(hint->Current(), SizeClassOf(40) + 1);
  EXPECT_EQ(SizeHint::Get("size_class_test_other")->Current(), 0);
}

TEST(SizeClassTest, EqualObservationsGiveEqualHints) {
  // Every rank observes the same needs: their hints (here two names) stay equal.
  SizeHint* a = SizeHint::Get("size_class_test_rank_a");
  SizeHint* b = SizeHint::Get("size_class_test_rank_b");
  int64_t need = 7;
  for (int step = 0; step < 500; ++step) {
    need = (need * 1103515245 + 12345) % 2000 + (step % 97 == 0 ? 30000 : 0);
    ASSERT_EQ(a->Observe(need), b->Observe(need));
    ASSERT_EQ(a->Current(), b->Current());
    ASSERT_GE(SizeClassRows(a->Current()), need);
  }
}

}  // namespace
}  // namespace rec_sdk
