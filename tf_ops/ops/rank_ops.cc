// Op definitions of the rank ops (kernels/rank_kernels.cc): a process's count of finished
// update steps of tables sharded over ranks, a wait for it, the size class a batch of
// lookups exchanges its keys in (core/size_class.h), and the steps' headers
// (core/step_header.h).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/core/step_header.h"
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

// An op whose output `index` is a vector of `size` values.
absl::Status VectorOutput(tensorflow::shape_inference::InferenceContext* c, int index,
                          int64_t size) {
  c->set_output(index, c->Vector(size));
  return absl::OkStatus();
}

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

REGISTER_OP(REC_SDK_OP_NAME(RankStepHeader))
    .Input("plan: int64")
    .Input("need: int64")
    .Input("has_data: bool")
    .Output("instance_key: int32")
    .Output("header: int64")
    .Output("position: int32")
    .Attr("headers: string")
    .Attr("batch: int")
    .Attr("phase: int")
    .Attr("restart: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(kHeaderWidth));
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
This rank's header of batch `batch` in this step: [format, step number, phase, restart, has
data, plan digest, batch, need] (core/step_header.h), the collective instance key of its
position in the step's plan (`plan`: the batch ids the step exchanges, in order; empty: the
batch alone, position 0), and that position. `has_data` false: this rank's input ended (the
check stops every rank). A position after the first starts once the one before it was
checked, so a step's collectives wait for its first header's check.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankCheckHeaders))
    .Input("gathered: int64")
    .Input("position: int32")
    .Output("need: int64")
    .Attr("headers: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Checks every rank's header (`gathered`: the ranks' headers, concatenated in rank order) and
returns the largest need. OutOfRange when a rank's input ended (every rank stops), else
FailedPrecondition naming the ranks and what differs when they do not run the same step.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankLeaveHeader))
    .Input("phase: int64")
    .Output("header: int64")
    .Attr("headers: string")
    .Attr("restart: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return VectorOutput(c, 0, kHeaderWidth);
    })
    .Doc(R"doc(
The header a rank sends when it leaves (`phase`: 3, its session closed; 4, its input
ended), carrying the number of the step it would have run.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankHeaderActivity))
    .Output("activity: int64")
    .Attr("headers: string")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return VectorOutput(c, 0, 6);  // StepHeaders::Activity's five fields, and the time
    })
    .Doc(R"doc(
What this process's steps are doing: [last step begun, its phase, when its header began,
when it was checked (0: not yet), the phase of the leave header sent (0: none), now], times
in ms since the epoch (peers' watchdogs read it).
)doc");

}  // namespace rec_sdk
