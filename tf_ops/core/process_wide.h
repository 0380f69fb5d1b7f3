// ProcessWide<T>(name): the process's one object of type T named `name` (made on first use,
// never freed): the state rank ops share across sessions and graphs of a process.
#ifndef REC_SDK_TF_OPS_CORE_PROCESS_WIDE_H_
#define REC_SDK_TF_OPS_CORE_PROCESS_WIDE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace rec_sdk {

template <typename T>
T* ProcessWide(const std::string& name) {
  static std::mutex registry_mu;
  static auto* registry = new std::map<std::string, std::unique_ptr<T>>();
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& slot = (*registry)[name];
  if (!slot) slot.reset(new T());
  return slot.get();
}

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_PROCESS_WIDE_H_
