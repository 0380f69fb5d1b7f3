#include "tf_ops/core/rank_parts.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace rec_sdk {

Status RouteKeys(const int64_t* keys, int64_t n, const int32_t* dest_of_owner, int64_t ranks,
                 int32_t parts, int32_t* dest, int32_t* within, int32_t* per_dest) {
  if (ranks < 1 || parts < 1) {
    return Status::InvalidArgument("ranks and parts must be >= 1, got " + std::to_string(ranks) +
                                   " and " + std::to_string(parts));
  }
  for (int64_t r = 0; r < ranks; ++r) {
    if (dest_of_owner[r] < 0 || dest_of_owner[r] >= parts) {
      return Status::InvalidArgument("dest_of_owner[" + std::to_string(r) + "] is " +
                                     std::to_string(dest_of_owner[r]) + ", outside [0, " +
                                     std::to_string(parts) + ")");
    }
  }
  std::fill(per_dest, per_dest + parts, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t d = dest_of_owner[OwnerOf(keys[i], ranks)];
    dest[i] = d;
    within[i] = per_dest[d]++;
  }
  return Status::Ok();
}

template <typename T>
Status FillParts(const T* values, int64_t num_values, int64_t width, const int32_t* take,
                 const int32_t* dest, const int32_t* within, int64_t n, const T* head,
                 int64_t head_rows, int32_t parts, int64_t cap, T* out) {
  if (parts < 1 || cap < 0 || head_rows < 0 || width < 0) {
    return Status::InvalidArgument("parts must be >= 1 and cap, head rows, width >= 0");
  }
  if (take == nullptr && n > num_values) {
    return Status::InvalidArgument("values has " + std::to_string(num_values) + " rows for " +
                                   std::to_string(n) + " entries");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (dest[i] < 0 || dest[i] >= parts || within[i] < 0) {
      return Status::InvalidArgument(
          "entry " + std::to_string(i) + " goes to part " + std::to_string(dest[i]) + " slot " +
          std::to_string(within[i]) + ": parts are [0, " + std::to_string(parts) + "), slots >= 0");
    }
    if (take != nullptr && (take[i] < 0 || take[i] >= num_values)) {
      return Status::InvalidArgument("take[" + std::to_string(i) + "] is " +
                                     std::to_string(take[i]) + ", outside [0, " +
                                     std::to_string(num_values) + ")");
    }
  }
  const int64_t part_rows = head_rows + cap;
  if (part_rows == 0 || width == 0) return Status::Ok();  // an empty output: nothing to write
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(T);
  for (int32_t d = 0; d < parts; ++d) {
    T* part = out + d * part_rows * width;
    if (head_rows > 0) std::memcpy(part, head + d * head_rows * width, head_rows * row_bytes);
    std::memset(part + head_rows * width, 0, cap * row_bytes);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (within[i] >= cap) continue;
    const int64_t row = take == nullptr ? i : take[i];
    std::memcpy(out + (dest[i] * part_rows + head_rows + within[i]) * width, values + row * width,
                row_bytes);
  }
  return Status::Ok();
}

template Status FillParts<float>(const float*, int64_t, int64_t, const int32_t*, const int32_t*,
                                 const int32_t*, int64_t, const float*, int64_t, int32_t, int64_t,
                                 float*);
template Status FillParts<int64_t>(const int64_t*, int64_t, int64_t, const int32_t*, const int32_t*,
                                   const int32_t*, int64_t, const int64_t*, int64_t, int32_t,
                                   int64_t, int64_t*);

}  // namespace rec_sdk
