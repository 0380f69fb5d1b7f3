// Op definitions of the key ops (kernels/key_kernels.cc): deduplication, per-key access
// statistics, and rows gathered or summed by index.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP(REC_SDK_OP_NAME(UniqueKeys))
    .Input("keys: T")
    .Output("unique: T")
    .Output("inverse: int32")
    .Attr("T: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, keys);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Deduplicates a vector of keys in parallel: unique[inverse[i]] == keys[i]. Unique keys are
grouped by hash shard (deterministic for a given input), not sorted.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(KeyAccessStats))
    .Input("inverse: int32")
    .Input("num_unique: int32")
    .Input("weights: int64")
    .Input("sample_times: int64")
    .Output("counts: int64")
    .Output("newest: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle inverse;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inverse));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per unique key of a deduplicated lookup (inverse from UniqueKeys, in the ids' shape): counts[u]
= sum of the weights of its ids (weights: one scalar for all ids, or one per id in row-major
order), and, when sample_times is not empty, newest[u] = the newest timestamp of the samples
it appears in. A sample is a slice of the ids' leading dimension: sample_times has one value
per sample, or one for all (InvalidArgument naming both counts otherwise). newest is empty
without sample_times.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(GatherRowsByIndex))
    .Input("values: float")
    .Input("index: int32")
    .Output("rows: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, index;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
      c->set_output(0, c->Matrix(c->Dim(index, 0), c->Dim(values, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
rows[i] = values[index[i]]: spreads the rows of a deduplicated lookup over the id positions,
in parallel. Its gradient is SumRowsByIndex.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(SumRowsByIndex))
    .Input("values: float")
    .Input("index: int32")
    .Input("num_rows: int32")
    .Output("sums: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(values, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
sums[r] = sum of values[i] over i with index[i] == r, for r in [0, num_rows): the gradient of
gathering rows by `index`, summed in parallel.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(PackRows))
    .Input("values: N * T")
    .Output("packed: T")
    .Output("sizes: int32")
    .Attr("N: int >= 1")
    .Attr("T: {float, int64}")
    .Attr("width: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      for (int i = 0; i < c->num_inputs(); ++i) {
        ShapeHandle value;
        TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &value));
        TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(i), 2, &value));
      }
      c->set_output(0, c->Matrix(c->UnknownDim(), width));
      c->set_output(1, c->Vector(c->num_inputs()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Stacks N blocks of rows of different widths into one matrix: packed holds values[0]'s rows,
then values[1]'s, ..., each zero-padded to `width` columns (a vector is a block of one
column); sizes[i] is the number of rows of values[i]. One op whatever N: the exchange of
many tables' keys, rows and gradients between ranks packs them (SplitRows undoes it).
)doc");

REGISTER_OP(REC_SDK_OP_NAME(SplitRows))
    .Input("packed: T")
    .Input("sizes: int32")
    .Output("values: N * T")
    .Attr("N: int >= 1")
    .Attr("T: {float, int64}")
    .Attr("dims: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      if (static_cast<int>(dims.size()) != c->num_outputs()) {
        return tensorflow::errors::InvalidArgument("dims must have N entries");
      }
      ShapeHandle packed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &packed));
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(
            i, dims[i] == 0 ? c->Vector(c->UnknownDim()) : c->Matrix(c->UnknownDim(), dims[i]));
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Undoes PackRows: values[i] is the next sizes[i] rows of packed, their first dims[i] columns
(dims[i] == 0: the first column, as a vector). sum(sizes) must be packed's row count.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TrainableRows))
    .Input("trainable: resource")
    .Input("rows: float")
    .Output("values: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Returns rows unchanged. Its registered gradient sends the rows' gradient to `trainable` (the
handle of a dynamic_embedding lookup's trainable) as IndexedSlices, so that stock
optimizers' compute_gradients find it; the resource is never read.
)doc");

}  // namespace rec_sdk
