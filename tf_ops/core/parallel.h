// ParallelRunner: how the core spreads a batch over threads without knowing TensorFlow.
// Kernels pass a runner backed by TF's intra-op thread pool; tests and tools use SerialRunner.
#ifndef REC_SDK_CORE_PARALLEL_H_
#define REC_SDK_CORE_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace rec_sdk {

// Calls work(begin, end) over disjoint ranges covering [0, total). cost_per_unit is a rough
// cost of one unit in CPU cycles, used to decide how finely to split.
using ParallelRunner = std::function<void(int64_t total, int64_t cost_per_unit,
                                          const std::function<void(int64_t, int64_t)>& work)>;

inline void SerialRunner(int64_t total, int64_t /*cost_per_unit*/,
                         const std::function<void(int64_t, int64_t)>& work) {
  if (total > 0) work(0, total);
}

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_PARALLEL_H_
