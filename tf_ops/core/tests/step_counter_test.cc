#include "tf_ops/core/step_counter.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rec_sdk {
namespace {

TEST(StepCounterTest, NamedCountersAreSeparateAndShared) {
  StepCounter* a = StepCounter::Get("step_counter_test_a");
  EXPECT_EQ(a, StepCounter::Get("step_counter_test_a"));
  EXPECT_NE(a, StepCounter::Get("step_counter_test_b"));
  int64_t before = a->Count();
  a->Advance();
  EXPECT_EQ(a->Count(), before + 1);
  EXPECT_EQ(StepCounter::Get("step_counter_test_b")->Count(), 0);
}

TEST(StepCounterTest, WaitersRunWhenTheirTargetIsReachedAndOnlyThen) {
  StepCounter* c = StepCounter::Get("step_counter_test_wait");
  int calls_now = 0, calls_two = 0, calls_three = 0;
  c->WhenReached(0, [&] { ++calls_now; });
  EXPECT_EQ(calls_now, 1);  // already reached: at once
  c->WhenReached(2, [&] { ++calls_two; });
  c->WhenReached(3, [&] { ++calls_three; });
  c->WhenReached(2, [&] { ++calls_two; });
  c->Advance();
  EXPECT_EQ(calls_two, 0);
  c->Advance();
  EXPECT_EQ(calls_two, 2);
  EXPECT_EQ(calls_three, 0);
  c->Advance();
  c->Advance();
  EXPECT_EQ(calls_two, 2);
  EXPECT_EQ(calls_three, 1);
}

TEST(StepCounterTest, ConcurrentAdvancesAndWaitersLoseNothing) {
  StepCounter* c = StepCounter::Get("step_counter_test_threads");
  std::atomic<int> fired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        c->WhenReached(1 + (i * 4 + t) % 1000, [&] { fired.fetch_add(1); });
        c->Advance();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(c->Count(), 1000);
  EXPECT_EQ(fired.load(), 1000);
}

}  // namespace
}  // namespace rec_sdk
