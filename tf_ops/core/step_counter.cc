#include "tf_ops/core/step_counter.h"

#include <utility>
#include <vector>

#include "tf_ops/core/process_wide.h"

namespace rec_sdk {

StepCounter* StepCounter::Get(const std::string& name) { return ProcessWide<StepCounter>(name); }

int64_t StepCounter::Count() {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void StepCounter::Advance() {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    auto end = waiters_.upper_bound(count_);
    for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
    waiters_.erase(waiters_.begin(), end);
  }
  for (auto& done : ready) done();
}

void StepCounter::WhenReached(int64_t target, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ < target) {
      waiters_.emplace(target, std::move(done));
      return;
    }
  }
  done();
}

}  // namespace rec_sdk
