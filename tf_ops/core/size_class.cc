#include "tf_ops/core/size_class.h"

#include <algorithm>

#include "tf_ops/core/process_wide.h"

namespace rec_sdk {

int64_t SizeClassRows(int index) { return static_cast<int64_t>(4 + index % 4) << (index / 4); }

int SizeClassOf(int64_t rows) {
  if (rows < 0 || rows > SizeClassRows(kSizeClasses - 1)) return -1;
  if (rows <= 4) return 0;
  int shift = 0;  // rows in (4 << shift, 8 << shift]
  while ((int64_t{8} << shift) < rows) ++shift;
  // The least m in 5..8 with m << shift >= rows; m == 8 is class 4 (shift + 1).
  int64_t m = (rows + (int64_t{1} << shift) - 1) >> shift;
  return m == 8 ? 4 * (shift + 1) : 4 * shift + static_cast<int>(m) - 4;
}

SizeHint* SizeHint::Get(const std::string& name) { return ProcessWide<SizeHint>(name); }

int SizeHint::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

int SizeHint::Observe(int64_t need) {
  int index = SizeClassOf(need);
  if (index < 0) return -1;
  int roomy = std::min(index + 1, kSizeClasses - 1);
  std::lock_guard<std::mutex> lock(mu_);
  if (index > current_) {
    current_ = roomy;
    low_steps_ = 0;
  } else if (SizeClassRows(current_) >= 2 * std::max<int64_t>(need, 1) && roomy < current_) {
    if (++low_steps_ >= kShrinkAfter) {
      current_ = roomy;
      low_steps_ = 0;
    }
  } else {
    low_steps_ = 0;
  }
  return index;
}

}  // namespace rec_sdk
