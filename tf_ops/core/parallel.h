// ParallelRunner: how the core spreads a batch over threads without knowing TensorFlow.
// Kernels pass a runner backed by TF's intra-op thread pool (RunWithLingeringHelpers); tests
// and tools use SerialRunner.
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
#include <unordered_map>

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

namespace parallel_detail {

// One parallel region: [0, total) in blocks that threads claim one at a time.
struct Region {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t blocks = 0;
  int64_t total = 0;
  const std::function<void(int64_t, int64_t)>* work = nullptr;
  std::mutex mu;  // with all_done: the caller sleeps on it when a helper's block is long
  std::condition_variable all_done;
  // Runs blocks until none is left. A thread arriving after the last block was claimed
  // touches nothing but the counter (the region's caller may have returned).
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
  // The caller, after its Drain: blocks still running are on helpers that started, so the
  // wait is for their last block. A spin first (a block is 10 us to a few 100 us; a sleeping
  // caller would take as long to wake as a helper does); then sleep, so that on a loaded
  // machine (several processes per core) a caller whose helper lost its core does not keep
  // the other one.
  void Wait() {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(400);
    while (!Finished() && std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    if (Finished()) return;
    std::unique_lock<std::mutex> lock(mu);
    all_done.wait(lock, [&] { return Finished(); });
  }
};

// A region of `total` units for `threads` threads, or null when it is too small to split
// (the caller runs it alone).
inline std::shared_ptr<Region> MakeRegion(int threads, int64_t total, int64_t cost_per_unit,
                                          const std::function<void(int64_t, int64_t)>& work) {
  const int64_t cost = std::max<int64_t>(1, cost_per_unit);
  const int64_t cycles = total > INT64_MAX / cost ? INT64_MAX : total * cost;
  if (threads <= 1 || total <= 1 || cycles < 2 * kMinParallelCycles) return nullptr;
  auto region = std::make_shared<Region>();
  // Enough blocks for a late helper to find some left, each worth scheduling.
  region->blocks = std::min<int64_t>(
      {total, int64_t{8} * threads, std::max<int64_t>(2, cycles / kMinParallelCycles)});
  region->total = total;
  region->work = &work;
  return region;
}

// The regions published to the helpers that linger after their blocks: one board per
// thread pool, so that a helper of one kernel call takes the next call's region, whichever
// kernel it is, and a pool's helpers work only for kernels that run on that pool (a pool
// being destroyed waits for its tasks; its helpers then see no new region and leave).
struct Board {
  std::mutex mu;  // guards region
  std::shared_ptr<Region> region;
  std::atomic<uint64_t> generation{0};  // regions published so far
  std::atomic<int> helpers{0};          // helpers scheduled that have not left
  std::atomic<int> calls{0};            // kernel calls running with this board (ActiveCall)
  std::atomic<int64_t> started{0};      // helpers started so far (for tests)
};

// How long a helper waits for another region: while a kernel call of its board runs, and
// after the last one ended (the next kernel of a lookup starts within a few microseconds;
// other work of the pool, such as a dense layer's matrix products, must not wait long for
// the helper's thread).
inline constexpr int64_t kLingerMicros = 300;
inline constexpr int64_t kGraceMicros = 50;

// A helper: drains every region published while it is here, and leaves when none came for
// kLingerMicros, or for kGraceMicros once no kernel call of the board runs.
inline void Linger(Board& board) {
  board.started.fetch_add(1, std::memory_order_relaxed);
  uint64_t seen = 0;
  auto idle_since = std::chrono::steady_clock::now();
  for (;;) {
    if (board.generation.load(std::memory_order_acquire) != seen) {
      std::shared_ptr<Region> region;
      {
        std::lock_guard<std::mutex> lock(board.mu);
        region = board.region;
        seen = board.generation.load(std::memory_order_relaxed);
      }
      region->Drain();
      idle_since = std::chrono::steady_clock::now();
      continue;
    }
    const auto idle = std::chrono::steady_clock::now() - idle_since;
    if (idle > std::chrono::microseconds(kLingerMicros) ||
        (board.calls.load(std::memory_order_acquire) == 0 &&
         idle > std::chrono::microseconds(kGraceMicros))) {
      board.helpers.fetch_sub(1, std::memory_order_acq_rel);
      // A region published while this helper was leaving may have counted on it: it stays
      // for that one.
      if (board.generation.load(std::memory_order_acquire) == seen) return;
      board.helpers.fetch_add(1, std::memory_order_acq_rel);
      continue;
    }
    std::this_thread::yield();
  }
}

}  // namespace parallel_detail

using HelperBoard = parallel_detail::Board;

// Counts a kernel call as running with `board` for as long as it lives.
class ActiveCall {
 public:
  explicit ActiveCall(HelperBoard& board) : board_(board) {
    board_.calls.fetch_add(1, std::memory_order_acq_rel);
  }
  ~ActiveCall() { board_.calls.fetch_sub(1, std::memory_order_acq_rel); }
  ActiveCall(const ActiveCall&) = delete;
  ActiveCall& operator=(const ActiveCall&) = delete;

 private:
  HelperBoard& board_;
};

// The board of the pool `pool` identifies (made on first use; never freed: helpers may run
// during static destruction, and a board outlives any pool).
inline HelperBoard& BoardOf(const void* pool) {
  static std::mutex mu;
  static auto* boards = new std::unordered_map<const void*, HelperBoard*>();
  std::lock_guard<std::mutex> lock(mu);
  HelperBoard*& board = (*boards)[pool];
  if (board == nullptr) board = new HelperBoard();
  return *board;
}

// The kernels' runner: [0, total) in blocks that the calling thread and threads - 1 helper
// tasks (given to `schedule`) claim one at a time. The caller starts at once and never waits
// for a helper that has not started: a pool thread that had gone to sleep takes 40-100 us
// to wake on a virtual machine's idle core (measured on the 2-core VM), longer than many
// regions last; a helper that arrives late takes the blocks that are left, or none. The
// caller returns when every block is done. Which thread runs a block never changes what the
// block computes. A helper that finished its blocks spins (yielding its core to anything runnable)
// for the next region of any kernel call on its board (its pool) while such calls run, and briefly
// after (parallel_detail::Linger), so a lookup's kernels (dedup, then bucket, probe, place and
// copy, then spread) wake a sleeping pool thread once instead of once per region.
inline void RunWithLingeringHelpers(HelperBoard& board, int threads,
                                    const std::function<void(std::function<void()>)>& schedule,
                                    int64_t total, int64_t cost_per_unit,
                                    const std::function<void(int64_t, int64_t)>& work) {
  if (total <= 0) return;
  auto region = parallel_detail::MakeRegion(threads, total, cost_per_unit, work);
  if (region == nullptr) {
    work(0, total);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(board.mu);
    board.region = region;
    board.generation.fetch_add(1, std::memory_order_release);
  }
  // Helpers lingering take this region; the missing ones are scheduled.
  for (int t = board.helpers.load(std::memory_order_acquire) + 1; t < threads; ++t) {
    board.helpers.fetch_add(1, std::memory_order_acq_rel);
    schedule([&board] { parallel_detail::Linger(board); });
  }
  region->Drain();
  region->Wait();
}

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_PARALLEL_H_
