// ParallelRunner: how the core spreads a batch over threads without knowing TensorFlow.
// Kernels pass a runner backed by TF's intra-op thread pool (RunInBlocks); tests and tools use
// SerialRunner.
#ifndef REC_SDK_CORE_PARALLEL_H_
#define REC_SDK_CORE_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace rec_sdk {

// Calls work(begin, end) over disjoint ranges covering [0, total). cost_per_unit is a rough
// cost of one unit in CPU cycles, used to decide how finely to split.
using ParallelRunner = std::function<void(int64_t total, int64_t cost_per_unit,
                                          const std::function<void(int64_t, int64_t)>& work)>;

inline void SerialRunner(int64_t total, int64_t /*cost_per_unit*/,
                         const std::function<void(int64_t, int64_t)>& work) {
  if (total > 0) work(0, total);
}

// Work below this many cycles runs on the calling thread; a block is at least this much.
inline constexpr int64_t kMinParallelCycles = 20000;

// The runner of the kernels: [0, total) in blocks that the calling thread and threads - 1
// helper tasks (given to `schedule`) claim one at a time. The caller starts at once and never
// waits for a helper that has not started: a pool thread that had gone to sleep takes
// 40-100 us to wake on a virtual machine's idle core (measured on the 2-core VM), longer than
// many regions last; a helper that arrives late takes the blocks that are left, or none. The
// caller returns when every block is done; a helper arriving after that touches nothing but
// the shared counter. Which thread runs a block never changes what the block computes.
inline void RunInBlocks(int threads, const std::function<void(std::function<void()>)>& schedule,
                        int64_t total, int64_t cost_per_unit,
                        const std::function<void(int64_t, int64_t)>& work) {
  if (total <= 0) return;
  const int64_t cost = std::max<int64_t>(1, cost_per_unit);
  const int64_t cycles = total > INT64_MAX / cost ? INT64_MAX : total * cost;
  if (threads <= 1 || total == 1 || cycles < 2 * kMinParallelCycles) {
    work(0, total);
    return;
  }
  struct Claims {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int64_t blocks = 0;
    int64_t total = 0;
    const std::function<void(int64_t, int64_t)>* work = nullptr;
    std::mutex mu;  // with all_done: the caller sleeps on it when a helper's block is long
    std::condition_variable all_done;
    // Runs blocks until none is left.
    void Drain() {
      for (;;) {
        const int64_t b = next.fetch_add(1, std::memory_order_relaxed);
        if (b >= blocks) return;
        const int64_t begin = total * b / blocks;
        (*work)(begin, total*(b + 1) / blocks);
        if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == blocks) {
          std::lock_guard<std::mutex> lock(mu);
          all_done.notify_all();
        }
      }
    }
    bool Finished() const { return done.load(std::memory_order_acquire) >= blocks; }
  };
  auto claims = std::make_shared<Claims>();
  // Enough blocks for a late helper to find some left, each worth scheduling.
  claims->blocks = std::min<int64_t>(
      {total, int64_t{8} * threads, std::max<int64_t>(2, cycles / kMinParallelCycles)});
  claims->total = total;
  claims->work = &work;
  for (int t = 1; t < threads; ++t) schedule([claims] { claims->Drain(); });
  claims->Drain();
  // Blocks still running are on helpers that started: the wait is for their last block. A
  // spin first (a block is 10 us to a few 100 us; a sleeping caller would take as long to
  // wake as a helper does); then sleep, so that on a loaded machine (several processes per
  // core) a caller whose helper lost its core does not keep the other one.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(400);
  while (!claims->Finished() && std::chrono::steady_clock::now() < spin_until) {
    std::this_thread::yield();
  }
  if (claims->Finished()) return;
  std::unique_lock<std::mutex> lock(claims->mu);
  claims->all_done.wait(lock, [&] { return claims->Finished(); });
}

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_PARALLEL_H_
