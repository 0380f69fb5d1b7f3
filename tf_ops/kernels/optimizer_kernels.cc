// Kernels of the sparse optimizers: check shapes, read scalar hyperparameters, call the core.
#include <cmath>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/logging.h"
#include "tf_ops/core/row_sum.h"
#include "tf_ops/core/sparse_optimizers.h"
#include "tf_ops/core/unique.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

// Shared part of every apply kernel: resolves the table and checks addresses [n] and
// grads [n, dim]; Update() then runs the optimizer itself.
class ApplyOpBase : public TableOpKernel {
 public:
  explicit ApplyOpBase(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("unique_addresses", &unique_addresses_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    const Tensor& addresses = ctx->input(1);
    const Tensor& grads = ctx->input(2);
    OP_REQUIRES(ctx, addresses.dims() == 1,
                errors::InvalidArgument(type_string(), " on table '", t->name(),
                                        "': addresses must be a vector, got shape ",
                                        addresses.shape().DebugString()));
    OP_REQUIRES(ctx,
                grads.dims() == 2 && grads.dim_size(0) == addresses.dim_size(0) &&
                    grads.dim_size(1) == t->dim(),
                errors::InvalidArgument(type_string(), " on table '", t->name(),
                                        "': grads must have shape [", addresses.dim_size(0), ", ",
                                        t->dim(), "], got ", grads.shape().DebugString()));
    const int64_t* address_data =
        reinterpret_cast<const int64_t*>(addresses.flat<int64_t>().data());
    const float* grad_data = grads.flat<float>().data();
    int64_t n = addresses.NumElements();
    std::vector<int64_t> unique;
    std::vector<float> summed;
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument(type_string(), " on table '", t->name(), "': at most ",
                                        std::numeric_limits<int32_t>::max(),
                                        " addresses per update, got ", n));
    if (!unique_addresses_ && n > 1) {
      // One update per row: concurrent updates of one row in a batch would race and lose
      // some of them.
      std::vector<int32_t> inverse(n);
      DeduplicateKeys(address_data, n, &unique, inverse.data(), MakeRunner(ctx));
      if (static_cast<int64_t>(unique.size()) < n) {
        summed.resize(unique.size() * t->dim());
        OP_REQUIRES_OK(
            ctx, ToTfStatus(SumRowsByIndex(grad_data, inverse.data(), n, t->dim(), unique.size(),
                                           summed.data(), MakeRunner(ctx))));
        address_data = unique.data();
        grad_data = summed.data();
        n = static_cast<int64_t>(unique.size());
      }
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(Update(ctx, t, address_data, grad_data, n)));
    // E.g. restored slots of another optimizer that this one re-initialised.
    const std::string notice = t->TakeNotice();
    if (!notice.empty()) LOG(WARNING) << "rec_sdk: " << notice;
  }

 protected:
  virtual Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                        const float* grads, int64_t n) = 0;

  // The caller says the addresses are distinct: no dedup (see the op definitions).
  bool unique_addresses_ = false;

  // Reads scalar input `index`; non-scalars are reported as a Status by the caller's checks.
  template <typename T>
  static Status Scalar(OpKernelContext* ctx, int index, const char* name, T* value) {
    const Tensor& t = ctx->input(index);
    if (t.NumElements() != 1) {
      return Status::InvalidArgument(std::string(name) + " must be a scalar, got shape " +
                                     t.shape().DebugString());
    }
    *value = t.flat<T>()(0);
    return Status::Ok();
  }
};

class ApplyLazyAdamOp : public ApplyOpBase {
 public:
  explicit ApplyLazyAdamOp(OpKernelConstruction* ctx) : ApplyOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bias_corrected", &bias_corrected_));
  }

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    LazyAdamParams p;
    p.bias_corrected = bias_corrected_;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 4, "beta1", &p.beta1));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 5, "beta2", &p.beta2));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 6, "epsilon", &p.epsilon));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 7, "step", &p.step));
    return ApplyLazyAdam(table, addresses, grads, n, p, MakeRunner(ctx));
  }

 private:
  bool bias_corrected_ = false;
};

class ApplyGradientDescentOp : public ApplyOpBase {
 public:
  using ApplyOpBase::ApplyOpBase;

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    GradientDescentParams p;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 4, "weight_decay", &p.weight_decay));
    return ApplyGradientDescent(table, addresses, grads, n, p, MakeRunner(ctx));
  }
};

class ApplyAdagradOp : public ApplyOpBase {
 public:
  explicit ApplyAdagradOp(OpKernelConstruction* ctx) : ApplyOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &initial_accumulator_value_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon_inside_sqrt", &epsilon_inside_sqrt_));
  }

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    AdagradParams p;
    p.initial_accumulator_value = initial_accumulator_value_;
    p.epsilon = epsilon_;
    p.epsilon_inside_sqrt = epsilon_inside_sqrt_;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    return ApplyAdagrad(table, addresses, grads, n, p, MakeRunner(ctx));
  }

 private:
  float initial_accumulator_value_;
  float epsilon_;
  bool epsilon_inside_sqrt_;
};

class ApplyRowwiseAdagradOp : public ApplyOpBase {
 public:
  explicit ApplyRowwiseAdagradOp(OpKernelConstruction* ctx) : ApplyOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &initial_accumulator_value_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    RowwiseAdagradParams p;
    p.initial_accumulator_value = initial_accumulator_value_;
    p.epsilon = epsilon_;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    return ApplyRowwiseAdagrad(table, addresses, grads, n, p, MakeRunner(ctx));
  }

 private:
  float initial_accumulator_value_;
  float epsilon_;
};

class ApplyMomentumOp : public ApplyOpBase {
 public:
  explicit ApplyMomentumOp(OpKernelConstruction* ctx) : ApplyOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &use_nesterov_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("velocity", &velocity_));
  }

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    MomentumParams p;
    p.use_nesterov = use_nesterov_;
    p.velocity = velocity_;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 4, "momentum", &p.momentum));
    return ApplyMomentum(table, addresses, grads, n, p, MakeRunner(ctx));
  }

 private:
  bool use_nesterov_;
  bool velocity_;
};

class ApplyFtrlOp : public ApplyOpBase {
 public:
  explicit ApplyFtrlOp(OpKernelConstruction* ctx) : ApplyOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_accumulator_value", &initial_accumulator_value_));
  }

 protected:
  Status Update(OpKernelContext* ctx, EmbeddingTable* table, const int64_t* addresses,
                const float* grads, int64_t n) override {
    FtrlParams p;
    p.initial_accumulator_value = initial_accumulator_value_;
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 3, "learning_rate", &p.learning_rate));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 4, "learning_rate_power", &p.learning_rate_power));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 5, "l1", &p.l1));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 6, "l2", &p.l2));
    REC_SDK_RETURN_IF_ERROR(Scalar(ctx, 7, "l2_shrinkage", &p.l2_shrinkage));
    return ApplyFtrl(table, addresses, grads, n, p, MakeRunner(ctx));
  }

 private:
  float initial_accumulator_value_;
};

// TableReadRows / TableWriteRows: rows and an optimizer's slots by address, for optimizers
// that run TensorFlow's own kernels on gathered rows. The base checks the layout and the
// addresses [n]; Run reads or writes the n rows and their k slots.
class RowsWithSlotsOpBase : public TableOpKernel {
 public:
  explicit RowsWithSlotsOpBase(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_optimizer", &layout_.optimizer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_initial_values", &layout_.initial_values));
    for (const float v : layout_.initial_values) {
      OP_REQUIRES(ctx, std::isfinite(v),
                  errors::InvalidArgument(type_string(),
                                          ": slot_initial_values must be "
                                          "finite, got ",
                                          v));
    }
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    const Tensor& addresses = ctx->input(1);
    OP_REQUIRES(ctx, addresses.dims() == 1,
                errors::InvalidArgument(type_string(), " on table '", t->name(),
                                        "': addresses must be a vector, got shape ",
                                        addresses.shape().DebugString()));
    Run(ctx, t, reinterpret_cast<const int64_t*>(addresses.flat<int64_t>().data()),
        addresses.dim_size(0), static_cast<int64_t>(layout_.initial_values.size()));
  }

 protected:
  virtual void Run(OpKernelContext* ctx, EmbeddingTable* t, const int64_t* addresses, int64_t n,
                   int64_t k) = 0;

  EmbeddingTable::SlotLayout layout_;
};

class TableReadRowsOp : public RowsWithSlotsOpBase {
 public:
  using RowsWithSlotsOpBase::RowsWithSlotsOpBase;

 protected:
  void Run(OpKernelContext* ctx, EmbeddingTable* t, const int64_t* addresses, int64_t n,
           int64_t k) override {
    Tensor* values;
    Tensor* slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, t->dim()}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({k, n, t->dim()}), &slots));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(ReadRowsWithSlots(t, layout_, addresses, n, values->flat<float>().data(),
                                          slots->flat<float>().data(), MakeRunner(ctx))));
  }
};

class TableWriteRowsOp : public RowsWithSlotsOpBase {
 public:
  using RowsWithSlotsOpBase::RowsWithSlotsOpBase;

 protected:
  void Run(OpKernelContext* ctx, EmbeddingTable* t, const int64_t* addresses, int64_t n,
           int64_t k) override {
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    OP_REQUIRES(ctx, values.shape() == TensorShape({n, t->dim()}),
                errors::InvalidArgument(type_string(), " on table '", t->name(),
                                        "': values must have shape [", n, ", ", t->dim(), "], got ",
                                        values.shape().DebugString()));
    OP_REQUIRES(ctx, slots.shape() == TensorShape({k, n, t->dim()}),
                errors::InvalidArgument(type_string(), " on table '", t->name(),
                                        "': slots must have shape [", k, ", ", n, ", ", t->dim(),
                                        "], got ", slots.shape().DebugString()));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(WriteRowsWithSlots(t, layout_, addresses, n, values.flat<float>().data(),
                                           slots.flat<float>().data(), MakeRunner(ctx))));
  }
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyLazyAdam)).Device(DEVICE_CPU), ApplyLazyAdamOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyGradientDescent)).Device(DEVICE_CPU),
                        ApplyGradientDescentOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyAdagrad)).Device(DEVICE_CPU), ApplyAdagradOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyRowwiseAdagrad)).Device(DEVICE_CPU),
                        ApplyRowwiseAdagradOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyFtrl)).Device(DEVICE_CPU), ApplyFtrlOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(ApplyMomentum)).Device(DEVICE_CPU), ApplyMomentumOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableReadRows)).Device(DEVICE_CPU), TableReadRowsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableWriteRows)).Device(DEVICE_CPU), TableWriteRowsOp);

}  // namespace rec_sdk
