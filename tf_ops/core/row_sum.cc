#include "tf_ops/core/row_sum.h"

#include <algorithm>
#include <string>
#include <vector>

#include "tf_ops/core/row_copy.h"

namespace rec_sdk {

namespace {

// Floats of per-part sums SumRowsByIndex may keep per thread (4 MiB).
constexpr int64_t kMaxScratchFloats = int64_t{1} << 20;

Status CheckIndex(const int32_t* index, int64_t n, int dim, int64_t num_rows) {
  if (dim < 1) return Status::InvalidArgument("dim must be >= 1, got " + std::to_string(dim));
  for (int64_t i = 0; i < n; ++i) {
    if (index[i] < 0 || index[i] >= num_rows) {
      return Status::InvalidArgument("index[" + std::to_string(i) +
                                     "] = " + std::to_string(index[i]) + " is not in [0, " +
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
      CopyFloats(out + i * dim, values + static_cast<int64_t>(index[i]) * dim, dim);
    }
  });
  return Status::Ok();
}

Status SumRowsByIndex(const float* values, const int32_t* index, int64_t n, int dim,
                      int64_t num_rows, float* out, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(CheckIndex(index, n, dim, num_rows));
  const int64_t out_floats = num_rows * dim;
  // Few output floats (a deduplicated batch's rows): each part sums a contiguous range of
  // positions into its own buffer (part 0 into out), and the buffers are added up after. Every
  // position is read once, with no data-dependent branch.
  const int64_t position_parts = std::min<int64_t>(2, n * dim / 65536);
  if (position_parts > 1 && out_floats * (position_parts - 1) <= kMaxScratchFloats) {
    // The calling thread's buffer, reused (no page faults after the first call); the parts
    // reach it through `copies` (a thread_local named in a part would be the part's thread's).
    thread_local std::vector<float> scratch;
    scratch.assign(out_floats * (position_parts - 1), 0.0f);
    float* const copies = scratch.data();
    std::fill_n(out, out_floats, 0.0f);
    run(position_parts, n * dim / position_parts * 2, [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p) {
        float* __restrict sums = p == 0 ? out : copies + (p - 1) * out_floats;
        for (int64_t i = n * p / position_parts; i < n * (p + 1) / position_parts; ++i) {
          float* __restrict dst = sums + static_cast<int64_t>(index[i]) * dim;
          const float* __restrict src = values + i * dim;
          for (int d = 0; d < dim; ++d) dst[d] += src[d];
        }
      }
    });
    run(out_floats, position_parts, [&](int64_t first, int64_t last) {
      for (int64_t p = 1; p < position_parts; ++p) {
        const float* __restrict part = copies + (p - 1) * out_floats;
        for (int64_t j = first; j < last; ++j) out[j] += part[j];
      }
    });
    return Status::Ok();
  }
  std::fill_n(out, out_floats, 0.0f);
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
