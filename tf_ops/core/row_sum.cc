#include "tf_ops/core/row_sum.h"

#include <algorithm>
#include <string>

namespace rec_sdk {

namespace {

Status CheckIndex(const int32_t* index, int64_t n, int dim, int64_t num_rows) {
  if (dim < 1) return Status::InvalidArgument("dim must be >= 1, got " + std::to_string(dim));
  for (int64_t i = 0; i < n; ++i) {
    if (index[i] < 0 || index[i] >= num_rows) {
      return Status::InvalidArgument("index[" + std::to_string(i) + "] = " +
                                     std::to_string(index[i]) + " is not in [0, " +
                                     std::to_string(num_rows) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status GatherRowsByIndex(const float* values, int64_t num_rows, int dim, const int32_t* index,
                         int64_t n, float* out, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(CheckIndex(index, n, dim, num_rows));
  run(n, 4 + dim, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      std::copy_n(values + static_cast<int64_t>(index[i]) * dim, dim, out + i * dim);
    }
  });
  return Status::Ok();
}

Status SumRowsByIndex(const float* values, const int32_t* index, int64_t n, int dim,
                      int64_t num_rows, float* out, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(CheckIndex(index, n, dim, num_rows));
  std::fill_n(out, num_rows * dim, 0.0f);
  // Each part owns a range of output rows and scans all of `index`: a few parts only (the
  // runner may run each part as its own task, and every task pays a full scan).
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(4, num_rows * dim / 4096));
  const int64_t rows_per_part = (num_rows + parts - 1) / parts;
  run(parts, 2 * n + n * dim / parts, [&](int64_t first, int64_t last) {
    const int64_t lo = first * rows_per_part;
    const int64_t hi = std::min(num_rows, last * rows_per_part);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = index[i];
      if (r < lo || r >= hi) continue;
      float* __restrict dst = out + r * dim;
      const float* __restrict src = values + i * dim;
      for (int d = 0; d < dim; ++d) dst[d] += src[d];
    }
  });
  return Status::Ok();
}

}  // namespace rec_sdk
