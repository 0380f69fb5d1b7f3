// RunWithLingeringHelpers (the kernels' runner): every unit runs exactly once whatever the
// helpers do, the caller never waits for a helper that has not started, a helper arriving
// after the caller returned touches nothing of the finished call, and helpers stay for the
// next regions.
#include "tf_ops/core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rec_sdk {
namespace {

// Helper tasks run on threads started after `delay` (a pool thread slow to wake), or never.
class DelayedPool {
 public:
  explicit DelayedPool(std::chrono::milliseconds delay, bool run = true)
      : delay_(delay), run_(run) {}
  ~DelayedPool() {
    for (auto& t : threads_) t.join();
  }
  std::function<void(std::function<void()>)> schedule() {
    return [this](std::function<void()> task) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!run_) {
        dropped_.push_back(std::move(task));
        return;
      }
      threads_.emplace_back([this, task = std::move(task)] {
        std::this_thread::sleep_for(delay_);
        task();
      });
    };
  }
  // Runs the tasks never run so far (after their calls returned).
  void RunDropped() {
    for (auto& task : dropped_) task();
    dropped_.clear();
  }

 private:
  std::chrono::milliseconds delay_;
  bool run_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::vector<std::function<void()>> dropped_;
};

// A board that outlives every helper (late ones run after their test).
HelperBoard& TestBoard() {
  static auto* board = new HelperBoard();
  return *board;
}

void ExpectEachUnitOnce(int threads, const std::function<void(std::function<void()>)>& schedule,
                        int64_t total, int64_t cost) {
  std::vector<std::atomic<int>> hits(total);
  RunWithLingeringHelpers(TestBoard(), threads, schedule, total, cost,
                          [&](int64_t begin, int64_t end) {
                            ASSERT_LE(0, begin);
                            ASSERT_LT(begin, end);
                            ASSERT_LE(end, total);
                            for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
                          });
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(hits[i].load(), 1) << "unit " << i;
}

TEST(RunnerTest, EveryUnitOnceWithPromptLateOrAbsentHelpers) {
  for (int threads : {1, 2, 8}) {
    for (int64_t total : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65536}}) {
      DelayedPool prompt(std::chrono::milliseconds(0));
      ExpectEachUnitOnce(threads, prompt.schedule(), total, 1000);
      DelayedPool late(std::chrono::milliseconds(20));
      ExpectEachUnitOnce(threads, late.schedule(), total, 1000);
      DelayedPool absent(std::chrono::milliseconds(0), /*run=*/false);
      ExpectEachUnitOnce(threads, absent.schedule(), total, 1000);
      absent.RunDropped();  // after the call: must find no block left
    }
  }
}

TEST(RunnerTest, CallerDoesNotWaitForAHelperThatHasNotStarted) {
  DelayedPool late(std::chrono::milliseconds(2000));
  const auto start = std::chrono::steady_clock::now();
  ExpectEachUnitOnce(2, late.schedule(), 4096, 100000);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
}

TEST(RunnerTest, SmallWorkStaysOnTheCallingThread) {
  int scheduled = 0;
  auto count = [&](std::function<void()> task) {
    ++scheduled;
    task();
  };
  ExpectEachUnitOnce(4, count, 10, 10);  // 100 cycles: not worth a helper
  EXPECT_EQ(scheduled, 0);
  ExpectEachUnitOnce(4, count, 100000, 100);
  EXPECT_EQ(scheduled, 3);
}

// The lingering helpers: every unit of every region once, with prompt, late and absent
// helpers, and with helpers of another pool on the board (a board per pool in the kernels).
TEST(LingeringHelpersTest, EveryUnitOfEveryRegionOnce) {
  HelperBoard board;
  DelayedPool other(std::chrono::milliseconds(0));
  for (int threads : {1, 2, 8}) {
    for (auto delay : {std::chrono::milliseconds(0), std::chrono::milliseconds(5)}) {
      for (bool run : {true, false}) {
        DelayedPool pool(delay, run);
        for (int64_t total : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65536}}) {
          for (int region = 0; region < 5; ++region) {
            std::vector<std::atomic<int>> hits(total);
            RunWithLingeringHelpers(board, threads, region % 2 ? other.schedule() : pool.schedule(),
                                    total, 1000, [&](int64_t begin, int64_t end) {
                                      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
                                    });
            for (int64_t i = 0; i < total; ++i) ASSERT_EQ(hits[i].load(), 1) << "unit " << i;
          }
        }
        pool.RunDropped();  // after their calls: they find no block left, and leave
      }
    }
  }
}

// Regions that follow each other closely are taken by the helpers already there: the pool
// is asked for far fewer helpers than regions. (The caller's first block of each region
// waits, up to a second, for a helper to take a block of it.)
TEST(LingeringHelpersTest, HelpersStayForTheNextRegions) {
  HelperBoard board;
  DelayedPool pool(std::chrono::milliseconds(0));
  int helped = 0;
  const auto caller = std::this_thread::get_id();
  for (int region = 0; region < 200; ++region) {
    std::atomic<int> on_helper{0};
    RunWithLingeringHelpers(board, 2, pool.schedule(), 64, 1000000, [&](int64_t begin, int64_t) {
      if (std::this_thread::get_id() != caller) {
        on_helper.fetch_add(1);
        return;
      }
      if (begin != 0) return;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (on_helper.load() == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    });
    helped += on_helper.load() > 0;
  }
  EXPECT_EQ(helped, 200);
  EXPECT_LE(board.started.load(), 100);
  EXPECT_EQ(&BoardOf(&pool), &BoardOf(&pool));
  EXPECT_NE(&BoardOf(&pool), &BoardOf(&board));
}

}  // namespace
}  // namespace rec_sdk
