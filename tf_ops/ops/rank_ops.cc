// Op definitions of the rank step ops (kernels/rank_kernels.cc): a process's count of
// finished update steps of tables sharded over ranks, and a wait for it.
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

}  // namespace rec_sdk
