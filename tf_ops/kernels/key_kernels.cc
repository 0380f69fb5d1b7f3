// Kernels of the batch ops that work on keys and rows without a table: dedup, admission
// statistics, the gather of unique rows over ids and its gradient, trainable rows.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/key_stats.h"
#include "tf_ops/core/row_sum.h"
#include "tf_ops/core/unique.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

template <typename T>
class UniqueKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(
        ctx, keys.dims() == 1,
        errors::InvalidArgument("keys must be a vector, got shape ", keys.shape().DebugString()));
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("at most 2^31-1 keys per call, got ", n));
    const auto flat = keys.flat<T>();
    std::vector<int64_t> wide;
    const int64_t* key_data;
    if (std::is_same<T, int64_t>::value) {
      key_data = reinterpret_cast<const int64_t*>(flat.data());
    } else {
      wide.assign(flat.data(), flat.data() + n);
      key_data = wide.data();
    }
    Tensor* inverse;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &inverse));
    thread_local std::vector<int64_t> unique;  // reused: no page faults per batch
    DeduplicateKeys(key_data, n, &unique, inverse->flat<int32_t>().data(), MakeRunner(ctx));
    Tensor* unique_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(unique.size())}),
                                             &unique_out));
    std::copy(unique.begin(), unique.end(), unique_out->flat<T>().data());
  }
};

class KeyAccessStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& inverse = ctx->input(0);
    const Tensor& num_unique = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    const Tensor& times = ctx->input(3);
    OP_REQUIRES(ctx, inverse.dims() >= 1,
                errors::InvalidArgument("inverse must have the ids' shape (rank >= 1), got "
                                        "shape ",
                                        inverse.shape().DebugString()));
    // A sample is a slice of the ids' leading dimension: one timestamp per sample, or one for
    // every id. Any other count would give keys the clocks of other samples.
    const int64_t samples = inverse.dim_size(0);
    OP_REQUIRES(ctx, times.NumElements() <= 1 || times.NumElements() == samples,
                errors::InvalidArgument(
                    "sample_times has ", times.NumElements(), " timestamps for ", samples,
                    " samples (the ids' "
                    "leading dimension, shape ",
                    inverse.shape().DebugString(), "): give one per sample, or one for all"));
    OP_REQUIRES(ctx, num_unique.NumElements() == 1,
                errors::InvalidArgument("num_unique must be a scalar"));
    const int64_t n = inverse.NumElements();
    const int64_t u = num_unique.flat<int32_t>()(0);
    OP_REQUIRES(ctx, u >= 0, errors::InvalidArgument("num_unique must be >= 0, got ", u));
    OP_REQUIRES(ctx, weights.NumElements() == 1 || weights.NumElements() == n,
                errors::InvalidArgument("weights must be one value or one per id (", n, "), got ",
                                        weights.NumElements()));
    const auto weight_values = weights.flat<int64_t>();
    for (int64_t i = 0; i < weights.NumElements(); ++i) {
      OP_REQUIRES(ctx, weight_values(i) >= 0,
                  errors::InvalidArgument("weights must be >= 0, got ", weight_values(i),
                                          " at position ", i));
    }
    Tensor* counts;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &counts));
    Tensor* newest;
    const bool with_times = times.NumElements() > 0;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({with_times ? u : 0}), &newest));
    const int64_t* weight_data = reinterpret_cast<const int64_t*>(weights.flat<int64_t>().data());
    const bool per_id = weights.NumElements() == n && n != 1;
    OP_REQUIRES_OK(
        ctx,
        ToTfStatus(AggregateKeyAccess(
            inverse.flat<int32_t>().data(), n, u, per_id ? weight_data : nullptr,
            weights.NumElements() > 0 ? weight_data[0] : 0,
            with_times ? reinterpret_cast<const int64_t*>(times.flat<int64_t>().data()) : nullptr,
            times.NumElements(), reinterpret_cast<int64_t*>(counts->flat<int64_t>().data()),
            with_times ? reinterpret_cast<int64_t*>(newest->flat<int64_t>().data()) : nullptr)));
  }
};

class GatherRowsByIndexOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& index = ctx->input(1);
    OP_REQUIRES(
        ctx,
        values.dims() == 2 && values.dim_size(1) >= 1 &&
            values.dim_size(1) <= EmbeddingTable::kMaxDim,
        errors::InvalidArgument("values must be a matrix with 1 to ", EmbeddingTable::kMaxDim,
                                " columns, got shape ", values.shape().DebugString()));
    OP_REQUIRES(
        ctx, index.dims() == 1,
        errors::InvalidArgument("index must be a vector, got shape ", index.shape().DebugString()));
    Tensor* rows;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({index.dim_size(0), values.dim_size(1)}), &rows));
    OP_REQUIRES_OK(ctx, ToTfStatus(GatherRowsByIndex(
                            values.flat<float>().data(), values.dim_size(0),
                            static_cast<int>(values.dim_size(1)), index.flat<int32_t>().data(),
                            index.dim_size(0), rows->flat<float>().data(), MakeRunner(ctx))));
  }
};

class SumRowsByIndexOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& index = ctx->input(1);
    const Tensor& num_rows = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() == 2,
                errors::InvalidArgument("values must be a matrix, got shape ",
                                        values.shape().DebugString()));
    OP_REQUIRES(ctx, index.dims() == 1 && index.dim_size(0) == values.dim_size(0),
                errors::InvalidArgument("index must be a vector of ", values.dim_size(0),
                                        " row indices, got shape ", index.shape().DebugString()));
    OP_REQUIRES(ctx, num_rows.NumElements() == 1 && num_rows.flat<int32_t>()(0) >= 0,
                errors::InvalidArgument("num_rows must be a scalar >= 0"));
    OP_REQUIRES(ctx, values.dim_size(1) >= 1 && values.dim_size(1) <= EmbeddingTable::kMaxDim,
                errors::InvalidArgument("values must have 1 to ", EmbeddingTable::kMaxDim,
                                        " columns, got shape ", values.shape().DebugString()));
    const int64_t rows = num_rows.flat<int32_t>()(0);
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({rows, values.dim_size(1)}, &shape));
    Tensor* sums;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &sums));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(SumRowsByIndex(values.flat<float>().data(), index.flat<int32_t>().data(),
                                       values.dim_size(0), static_cast<int>(values.dim_size(1)),
                                       rows, sums->flat<float>().data(), MakeRunner(ctx))));
  }
};

// Stacks blocks of rows of different widths, zero-padded to one width; see the op's doc.
template <typename T>
class PackRowsOp : public OpKernel {
 public:
  explicit PackRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::OpInputList values;
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    int64_t total = 0;
    for (int i = 0; i < values.size(); ++i) {
      const Tensor& value = values[i];
      OP_REQUIRES(ctx, value.dims() == 1 || value.dims() == 2,
                  errors::InvalidArgument("values[", i,
                                          "] must be a vector or a matrix, got "
                                          "shape ",
                                          value.shape().DebugString()));
      const int64_t cols = value.dims() == 1 ? 1 : value.dim_size(1);
      OP_REQUIRES(ctx, cols <= width_,
                  errors::InvalidArgument("values[", i, "] has ", cols,
                                          " columns, more than width=", width_));
      total += value.dim_size(0);
    }
    OP_REQUIRES(ctx, total <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("at most 2^31-1 rows, got ", total));
    Tensor* packed;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total, width_}), &packed));
    Tensor* sizes;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(1, TensorShape({static_cast<int64_t>(values.size())}), &sizes));
    T* out = packed->flat<T>().data();
    std::fill(out, out + total * width_, T(0));
    for (int i = 0; i < values.size(); ++i) {
      const Tensor& value = values[i];
      const int64_t rows = value.dim_size(0);
      const int64_t cols = value.dims() == 1 ? 1 : value.dim_size(1);
      const T* in = value.flat<T>().data();
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(in + r * cols, in + (r + 1) * cols, out + r * width_);
      }
      out += rows * width_;
      sizes->flat<int32_t>()(i) = static_cast<int32_t>(rows);
    }
  }

 private:
  int64_t width_;
};

// Splits a PackRows matrix back into its blocks; see the op's doc.
template <typename T>
class SplitRowsOp : public OpKernel {
 public:
  explicit SplitRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    const Tensor& sizes = ctx->input(1);
    const int n = static_cast<int>(dims_.size());
    OP_REQUIRES(ctx, packed.dims() == 2,
                errors::InvalidArgument("packed must be a matrix, got shape ",
                                        packed.shape().DebugString()));
    OP_REQUIRES(ctx, sizes.dims() == 1 && sizes.dim_size(0) == n,
                errors::InvalidArgument("sizes must be a vector of ", n,
                                        " row counts, got "
                                        "shape ",
                                        sizes.shape().DebugString()));
    const int64_t width = packed.dim_size(1);
    const auto count = sizes.flat<int32_t>();
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, count(i) >= 0,
                  errors::InvalidArgument("sizes[", i, "] must be >= 0, got ", count(i)));
      OP_REQUIRES(
          ctx, dims_[i] >= 0 && dims_[i] <= width,
          errors::InvalidArgument("dims[", i, "] must be in [0, ", width, "], got ", dims_[i]));
      total += count(i);
    }
    OP_REQUIRES(ctx, total == packed.dim_size(0),
                errors::InvalidArgument("sizes add up to ", total, " rows; packed has ",
                                        packed.dim_size(0)));
    const T* in = packed.flat<T>().data();
    for (int i = 0; i < n; ++i) {
      const int64_t rows = count(i);
      const int64_t cols = dims_[i] == 0 ? 1 : dims_[i];
      Tensor* value;
      OP_REQUIRES_OK(
          ctx, ctx->allocate_output(
                   i, dims_[i] == 0 ? TensorShape({rows}) : TensorShape({rows, cols}), &value));
      T* out = value->flat<T>().data();
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(in + r * width, in + r * width + cols, out + r * cols);
      }
      in += rows * width;
    }
  }

 private:
  std::vector<int64_t> dims_;
};

// Forwards its rows input; see the op's doc.
class TrainableRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(1)); }
};

REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(UniqueKeys)).Device(DEVICE_CPU).TypeConstraint<int32_t>("T"),
    UniqueKeysOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(UniqueKeys)).Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
    UniqueKeysOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(GatherRowsByIndex)).Device(DEVICE_CPU),
                        GatherRowsByIndexOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(SumRowsByIndex)).Device(DEVICE_CPU), SumRowsByIndexOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(KeyAccessStats)).Device(DEVICE_CPU), KeyAccessStatsOp);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(PackRows)).Device(DEVICE_CPU).TypeConstraint<float>("T"),
    PackRowsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(PackRows)).Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
    PackRowsOp<int64_t>);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(SplitRows)).Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SplitRowsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(SplitRows)).Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
    SplitRowsOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TrainableRows)).Device(DEVICE_CPU), TrainableRowsOp);

}  // namespace rec_sdk
