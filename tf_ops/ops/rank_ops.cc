// Op definitions of the rank ops (kernels/rank_kernels.cc): a process's count of finished
// update steps of tables sharded over ranks, a wait for it, and the size class a batch of
// lookups exchanges its keys in (core/size_class.h).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

REGISTER_OP(REC_SDK_OP_NAME(RankStepDone))
    .Attr("counter: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Adds one to this process's count of finished update steps named `counter` (run after a
training step's updates of this rank's shards), waking the RankWaitForSteps waiting for it.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankSteps))
    .Output("count: int64")
    .Attr("counter: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
This process's count of finished update steps named `counter`.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankWaitForSteps))
    .Input("target: int64")
    .Attr("counter: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Finishes once this process's count of finished update steps named `counter` reaches
`target` (a scalar >= 0), without holding a thread while it waits. Rank 0 runs it on each
rank's task before saving or evicting that rank's shard, with its own count as the target.
)doc");

// A size class's outputs: its index and its rows, both scalars.
absl::Status SizeClassShape(tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->Scalar());
  c->set_output(1, c->Scalar());
  return absl::OkStatus();
}

REGISTER_OP(REC_SDK_OP_NAME(RankSizeClass))
    .Output("index: int32")
    .Output("rows: int32")
    .Attr("hint: string")
    .SetIsStateful()
    .SetShapeFn(SizeClassShape)
    .Doc(R"doc(
The size class this process's hint named `hint` holds (its index, and the rows per rank it
holds): the class a batch of lookups sends its keys in.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankObserveSize))
    .Input("need: int64")
    .Output("index: int32")
    .Output("rows: int32")
    .Attr("hint: string")
    .SetIsStateful()
    .SetShapeFn(SizeClassShape)
    .Doc(R"doc(
Records a step's largest need (`need`, a scalar: rows per rank, the same on every rank) in
the hint named `hint`, and returns the smallest size class holding it (index, rows).
)doc");

}  // namespace rec_sdk
