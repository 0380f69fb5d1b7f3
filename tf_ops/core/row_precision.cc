#include "tf_ops/core/row_precision.h"

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

}  // namespace rec_sdk
