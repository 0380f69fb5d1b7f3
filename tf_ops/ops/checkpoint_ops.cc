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

}  // namespace rec_sdk
