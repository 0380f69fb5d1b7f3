// GatherRowsByIndex and SumRowsByIndex: the forward and backward pass of spreading the rows of
// a deduplicated lookup back over the id positions, in parallel.
//
// SumRowsByIndex: out[index[i]] += values[i]: gradients of every id position summed onto the
// unique row they came from, in parallel without atomics (TensorFlow's UnsortedSegmentSum runs
// on one thread): when the output is small (up to 1M floats, a deduplicated batch's rows), two
// threads each sum half of the positions into their own copy, added up after; otherwise each
// thread owns a range of output rows and scans all indices.
#ifndef REC_SDK_CORE_ROW_SUM_H_
#define REC_SDK_CORE_ROW_SUM_H_

#include <cstdint>

#include "tf_ops/core/parallel.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

// out[i] = values[index[i]] for i in [0, n); values has num_rows rows of dim floats. Fails
// (before writing) when an index is outside [0, num_rows).
Status GatherRowsByIndex(const float* values, int64_t num_rows, int dim, const int32_t* index,
                         int64_t n, float* out, const ParallelRunner& run);

// out has num_rows * dim floats and is overwritten. Fails (before writing) when an index is
// outside [0, num_rows).
Status SumRowsByIndex(const float* values, const int32_t* index, int64_t n, int dim,
                      int64_t num_rows, float* out, const ParallelRunner& run);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_ROW_SUM_H_
