// CopyFloats: the row copy of every lookup (rows out of the table, rows spread over a batch's
// positions). A memcpy of a run-time size is a library call per row, ~5 ns for a 64-byte row
// (a third of a lookup's time in the spread of 65,536 rows); the common widths are copied
// with fixed-size moves the compiler inlines as a few vector loads and stores.
#ifndef REC_SDK_CORE_ROW_COPY_H_
#define REC_SDK_CORE_ROW_COPY_H_

#include <cstring>

namespace rec_sdk {

inline void CopyFloats(float* dst, const float* src, int n) {
  switch (n) {
    case 4:
      std::memcpy(dst, src, 4 * sizeof(float));
      return;
    case 8:
      std::memcpy(dst, src, 8 * sizeof(float));
      return;
    case 16:
      std::memcpy(dst, src, 16 * sizeof(float));
      return;
    case 32:
      std::memcpy(dst, src, 32 * sizeof(float));
      return;
    case 64:
      std::memcpy(dst, src, 64 * sizeof(float));
      return;
    default:
      std::memcpy(dst, src, n * sizeof(float));
  }
}

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_ROW_COPY_H_
