// Op definitions of the sparse optimizers: each updates the rows at `addresses` in place.
// Duplicate addresses have their gradients summed first (one update per row), unless the
// caller says the addresses are distinct (unique_addresses, as rec_sdk's Python optimizers do
// after their own dedup): duplicates then race and updates are lost.
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

REGISTER_OP(REC_SDK_OP_NAME(ApplyLazyAdam))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("step: int64")
    .Attr("unique_addresses: bool = false")
    .Attr("bias_corrected: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
LazyAdam on the rows at `addresses` [n] with gradients `grads` [n, dim] (duplicates summed unless
unique_addresses); -1
addresses are skipped. `step` (>= 1) is the optimizer's update count for bias correction, or,
with bias_corrected, learning_rate is the corrected rate (as TensorFlow's AdamOptimizer computes
it from its float32 beta powers) and step is not used.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(ApplyGradientDescent))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("weight_decay: float")
    .Attr("unique_addresses: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "w -= learning_rate * (grad + weight_decay * w) on the rows at `addresses` (duplicates "
        "summed unless unique_addresses).");

REGISTER_OP(REC_SDK_OP_NAME(ApplyAdagrad))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Attr("initial_accumulator_value: float")
    .Attr("epsilon: float = 0")
    .Attr("epsilon_inside_sqrt: bool = false")
    .Attr("unique_addresses: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Adagrad on the rows at `addresses` (duplicates summed unless unique_addresses); "
        "accumulators start at initial_accumulator_value. With epsilon, Keras' forms: w -= lr g / "
        "(sqrt(a) + epsilon), or / sqrt(a + epsilon) with epsilon_inside_sqrt.");

REGISTER_OP(REC_SDK_OP_NAME(ApplyRowwiseAdagrad))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Attr("initial_accumulator_value: float")
    .Attr("epsilon: float")
    .Attr("unique_addresses: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Row-wise Adagrad on the rows at `addresses` (duplicates summed unless unique_addresses): "
        "one accumulator per row, a += mean(g^2) over the row, w -= lr g / (sqrt(a) + epsilon); "
        "accumulators start at initial_accumulator_value.");

REGISTER_OP(REC_SDK_OP_NAME(ApplyMomentum))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("momentum: float")
    .Attr("use_nesterov: bool = false")
    .Attr("velocity: bool = false")
    .Attr("unique_addresses: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "Momentum (TensorFlow's MomentumOptimizer) on the rows at `addresses` (duplicates summed "
        "unless unique_addresses); with velocity, Keras' SGD momentum (the slot holds -lr-scaled "
        "velocity).");

REGISTER_OP(REC_SDK_OP_NAME(ApplyFtrl))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("grads: float")
    .Input("learning_rate: float")
    .Input("learning_rate_power: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .Attr("initial_accumulator_value: float")
    .Attr("unique_addresses: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(
        "FTRL-proximal (TensorFlow's ApplyFtrlV2) on the rows at `addresses` (duplicates summed "
        "unless unique_addresses).");

REGISTER_OP(REC_SDK_OP_NAME(TableReadRows))
    .Input("table: resource")
    .Input("addresses: int64")
    .Output("values: float")
    .Output("slots: float")
    .Attr("slot_optimizer: string")
    .Attr("slot_initial_values: list(float) >= 0")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<float> initial;
      TF_RETURN_IF_ERROR(c->GetAttr("slot_initial_values", &initial));
      auto n = c->Dim(c->input(1), 0);
      c->set_output(0, c->Matrix(n, c->UnknownDim()));
      c->set_output(
          1, c->MakeShape({c->MakeDim(static_cast<int64_t>(initial.size())), n, c->UnknownDim()}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The rows at `addresses` [n] (unique; -1 reads zeros) -> values [n, dim] and the slots of
optimizer `slot_optimizer` (one per slot_initial_values, starting at those values) ->
slots [len(slot_initial_values), n, dim], attaching the slots to the table on first use. With
TableWriteRows, it lets an optimizer without a rec_sdk kernel run TensorFlow's own on the rows.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableWriteRows))
    .Input("table: resource")
    .Input("addresses: int64")
    .Input("values: float")
    .Input("slots: float")
    .Attr("slot_optimizer: string")
    .Attr("slot_initial_values: list(float) >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Writes values [n, dim] and the slots [len(slot_initial_values), n, dim] of optimizer
`slot_optimizer` into the rows at `addresses` [n] (unique; -1 skipped). See TableReadRows.
)doc");

}  // namespace rec_sdk
