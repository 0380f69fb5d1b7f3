// Op definitions of serving updates (kernels/serving_kernels.cc): a training table's changes
// taken for a push, an update's files written on the task that holds the rows, and an
// update's rows applied to a served table as one change.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP(REC_SDK_OP_NAME(TableTakeChanges))
    .Input("table: resource")
    .Input("full: bool")
    .Output("keys: key_dtype")
    .Output("values: float")
    .Output("removed: key_dtype")
    .Output("replace: bool")
    .Output("since: int64")
    .Output("push_id: int64")
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      c->set_output(2, c->Vector(c->UnknownDim()));
      for (int i = 3; i < 6; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The changes of a table (created with track_changes) since its last push, for a serving
update, taken atomically; the push change set then restarts (checkpoint deltas keep their
own). keys [n] and values [n, dim]: the rows changed (every row when `full`, at the first
push, or after the table was cleared or restored); removed: keys removed or evicted since
(none when replace). replace: the rows are the whole table (keys not among them are gone).
since: the push id these changes follow (0 when replace); push_id: this push's id.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(WriteUpdateFile))
    .Input("path: string")
    .Input("data: T")
    .Output("bytes: int64")
    .Attr("T: {int32, int64, float}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Writes the raw bytes of `data` (little-endian, row-major) to `path`, created or truncated,
and fsyncs the file and its directory: the file of a serving update a rank writes on its own
task. bytes: how many were written.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableApplyRows))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: float")
    .Input("removed: key_dtype")
    .Input("replace: bool")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Applies a serving update as one change (lookups see the table all before or all after it):
removes the keys `removed` (or, with replace, every key not among `keys`), then writes the
rows values [n, dim] of keys [n].
)doc");

}  // namespace rec_sdk
