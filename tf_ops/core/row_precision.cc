#include "tf_ops/core/row_precision.h"

#include <vector>

namespace rec_sdk {

const char* RowDtypeName(RowDtype dtype) {
  switch (dtype) {
    case RowDtype::kFloat32:
      return "float32";
    case RowDtype::kBFloat16:
      return "bfloat16";
    case RowDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

Status RowDtypeFromName(const std::string& name, RowDtype* dtype) {
  for (RowDtype d : {RowDtype::kFloat32, RowDtype::kBFloat16, RowDtype::kFloat16}) {
    if (name == RowDtypeName(d)) {
      *dtype = d;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("emb_dtype '" + name +
                                 "' is not a row dtype: use float32, bfloat16 or float16");
}

void ConvertRow(RowDtype from, const void* src, int n, RowDtype to, void* dst) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * RowDtypeBytes(from));
    return;
  }
  if (to == RowDtype::kFloat32) {
    DecodeRow(from, src, n, static_cast<float*>(dst));
    return;
  }
  thread_local std::vector<float> scratch;
  scratch.resize(n);
  DecodeRow(from, src, n, scratch.data());
  EncodeRowNearest(to, scratch.data(), n, dst);
}

}  // namespace rec_sdk
