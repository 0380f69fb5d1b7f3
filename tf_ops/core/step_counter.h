// A process's count of finished update steps of its tables sharded over ranks, by name, with
// callbacks for waiters. Rank 0 saves and evicts every rank's shard between steps; it first
// waits (on the shard's process) until that process has finished as many update steps as
// rank 0 has, so that no rank has to wait for every shard's update at the end of each step.
#ifndef REC_SDK_TF_OPS_CORE_STEP_COUNTER_H_
#define REC_SDK_TF_OPS_CORE_STEP_COUNTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace rec_sdk {

class StepCounter {
 public:
  // The process-wide counter named `name` (made on first use, never freed).
  static StepCounter* Get(const std::string& name);

  int64_t Count();
  // Adds one and calls the waiters whose target is reached (outside the lock).
  void Advance();
  // Calls done() once Count() >= target: at once when it already is, else from the Advance()
  // that reaches it.
  void WhenReached(int64_t target, std::function<void()> done);

 private:
  std::mutex mu_;
  int64_t count_ = 0;
  std::multimap<int64_t, std::function<void()>> waiters_;
};

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_STEP_COUNTER_H_
