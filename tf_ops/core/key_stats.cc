#include "tf_ops/core/key_stats.h"

#include <algorithm>
#include <limits>
#include <string>

namespace rec_sdk {

Status AggregateKeyAccess(const int32_t* inverse, int64_t n, int64_t num_unique,
                          const int64_t* weights, int64_t weight, const int64_t* sample_times,
                          int64_t num_samples, int64_t* counts, int64_t* newest) {
  if (num_unique < 0) {
    return Status::InvalidArgument("num_unique must be >= 0, got " + std::to_string(num_unique));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (inverse[i] < 0 || inverse[i] >= num_unique) {
      return Status::InvalidArgument("inverse index " + std::to_string(inverse[i]) +
                                     " at position " + std::to_string(i) + " is outside [0, " +
                                     std::to_string(num_unique) + ")");
    }
  }
  int64_t per_sample = 1;
  if (sample_times != nullptr) {
    if (n > 0 && (num_samples <= 0 || n % num_samples != 0)) {
      return Status::InvalidArgument(
          std::to_string(num_samples) + " sample timestamps do not divide the " +
          std::to_string(n) + " ids into samples (the ids' first dimension must be the batch)");
    }
    if (n > 0) per_sample = n / num_samples;
  }
  std::fill_n(counts, num_unique, 0);
  // Counts saturate instead of wrapping.
  for (int64_t i = 0; i < n; ++i) {
    int64_t& count = counts[inverse[i]];
    if (__builtin_add_overflow(count, weights != nullptr ? weights[i] : weight, &count)) {
      count = std::numeric_limits<int64_t>::max();
    }
  }
  if (sample_times != nullptr) {
    std::fill_n(newest, num_unique, std::numeric_limits<int64_t>::min());
    for (int64_t s = 0, i = 0; i < n; ++s) {
      const int64_t t = sample_times[s];
      for (const int64_t end = i + per_sample; i < end; ++i) {
        int64_t& slot = newest[inverse[i]];
        slot = std::max(slot, t);
      }
    }
  }
  return Status::Ok();
}

}  // namespace rec_sdk
