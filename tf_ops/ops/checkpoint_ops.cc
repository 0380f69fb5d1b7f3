// Op definitions of table checkpoints (kernels/checkpoint_kernels.cc): save, commit, restore
// and delta application.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP(REC_SDK_OP_NAME(TableSave))
    .Input("table: resource")
    .Input("directory: string")
    .Input("delta: bool")
    .Output("rows: int64")
    .Output("save_id: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Streams the table (rows, slots, admission counts, clocks, pending keys) into `directory`, which
must not exist, with a checksummed meta.txt written last (see tf_ops/core/checkpoint.h).
With delta (tables created with track_changes), only what changed since the last committed
save. Run TableCommitSave with save_id once the files are durable.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableCommitSave))
    .Input("table: resource")
    .Input("save_id: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Marks the save `save_id` (from TableSave) complete: later deltas are relative to it.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableApplyDelta))
    .Input("table: resource")
    .Input("directory: string")
    .Output("rows: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Applies a delta checkpoint directory onto the table, which must hold the checkpoint the delta
follows.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableRestore))
    .Input("table: resource")
    .Input("directories: string")
    .Input("rank_id: int64")
    .Input("rank_size: int64")
    .Output("rows: int64")
    .Output("note: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Replaces the table's contents with the rows saved in `directories` (one per rank that saved)
whose key satisfies abs(key % rank_size) == rank_id. Checks metadata, sizes and checksums;
on an error the table is left empty. note says what happened to optimizer slots.
)doc");

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

}  // namespace rec_sdk

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
