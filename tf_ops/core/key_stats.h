// AggregateKeyAccess: what a deduplicated training lookup tells the table about each unique
// key: its admission count increment (summed weights of its ids) and the newest timestamp of
// the samples it appears in. One pass over the ids (the unique keys' arrays stay in cache);
// it replaces a segment sum and a segment max over broadcast timestamps.
#ifndef REC_SDK_CORE_KEY_STATS_H_
#define REC_SDK_CORE_KEY_STATS_H_

#include <cstdint>

#include "tf_ops/core/status.h"

namespace rec_sdk {

// For ids i in [0, n) with unique key u = inverse[i] (in [0, num_unique)):
//   counts[u] = sum of (weights ? weights[i] : weight)
//   newest[u] = max of sample_times[i / (n / num_samples)]   (only when sample_times != null)
// Samples are the ids' leading dimension: n must be a multiple of num_samples, and sample s
// owns ids [s * n / num_samples, (s + 1) * n / num_samples). Fails (before writing) on an
// inverse index outside [0, num_unique) or a bad num_samples.
Status AggregateKeyAccess(const int32_t* inverse, int64_t n, int64_t num_unique,
                          const int64_t* weights, int64_t weight, const int64_t* sample_times,
                          int64_t num_samples, int64_t* counts, int64_t* newest);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_KEY_STATS_H_
