// Op definitions of the rank ops (kernels/rank_kernels.cc): a process's count of finished
// update steps of tables sharded over ranks, a wait for it, the size class a batch of
// lookups exchanges its keys in (core/size_class.h), the steps' headers
// (core/step_header.h), and the routing and packing of the exchanged parts
// (core/rank_parts.h).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/core/step_header.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

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

REGISTER_OP(REC_SDK_OP_NAME(RankRouteKeys))
    .Input("keys: int64")
    .Input("dest_of_owner: int32")
    .Output("dest: int32")
    .Output("within: int32")
    .Output("per_dest: int32")
    .Attr("parts: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, owners;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &owners));
      int64_t parts;
      TF_RETURN_IF_ERROR(c->GetAttr("parts", &parts));
      c->set_output(0, keys);
      c->set_output(1, keys);
      c->set_output(2, c->Vector(parts));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Routes keys to the parts of an exchange between ranks, in one pass: the owner of a key is
abs(key % R) (C's remainder; R = the length of dest_of_owner), its part
dest[i] = dest_of_owner[owner], within[i] its slot in that part (the keys before it with the
same part: a stable sort by part), per_dest the keys of each part.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(RankFillParts))
    .Input("values: T")
    .Input("take: int32")
    .Input("dest: int32")
    .Input("within: int32")
    .Input("head: T")
    .Input("cap: int32")
    .Output("parts_out: T")
    .Attr("T: {float, int64}")
    .Attr("parts: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, head;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 3, &head));
      int64_t parts;
      TF_RETURN_IF_ERROR(c->GetAttr("parts", &parts));
      c->set_output(0, c->MakeShape({c->MakeDim(parts), c->UnknownDim(), c->Dim(values, 1)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The parts an exchange between ranks sends, in one pass: parts_out [parts, H + cap, width]
holds head [parts, H, width] in each part's first H rows, then values[take[i]] (values[i]
when take is empty) at row H + within[i] of part dest[i] for every entry i whose slot
within[i] < cap; zeros elsewhere. Entries that do not fit are left out (the exchange sends
them again in larger parts).
)doc");

}  // namespace rec_sdk
