// Kernels of the rank ops: thin wrappers of core/step_counter.h and core/size_class.h.
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/size_class.h"
#include "tf_ops/core/step_counter.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::AsyncOpKernel;
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;

namespace {

// The process-wide object (StepCounter, SizeHint) named by the op's `attr`.
template <typename T>
T* Named(OpKernelConstruction* ctx, const char* attr) {
  std::string name;
  auto status = ctx->GetAttr(attr, &name);
  if (!status.ok()) {
    ctx->CtxFailure(status);
    return nullptr;
  }
  return T::Get(name);
}

void SetClass(OpKernelContext* ctx, int index) {
  Tensor* out;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
  out->scalar<int32_t>()() = index;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
  out->scalar<int32_t>()() = static_cast<int32_t>(SizeClassRows(index));
}

}  // namespace

class RankStepDoneOp : public OpKernel {
 public:
  explicit RankStepDoneOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), counter_(Named<StepCounter>(ctx, "counter")) {}
  void Compute(OpKernelContext*) override { counter_->Advance(); }

 private:
  StepCounter* counter_;
};

class RankStepsOp : public OpKernel {
 public:
  explicit RankStepsOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), counter_(Named<StepCounter>(ctx, "counter")) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* count;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &count));
    count->scalar<int64_t>()() = counter_->Count();
  }

 private:
  StepCounter* counter_;
};

class RankWaitForStepsOp : public AsyncOpKernel {
 public:
  explicit RankWaitForStepsOp(OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx), counter_(Named<StepCounter>(ctx, "counter")) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& target = ctx->input(0);
    OP_REQUIRES_ASYNC(
        ctx, target.NumElements() == 1 && target.flat<int64_t>()(0) >= 0,
        errors::InvalidArgument("target must be a scalar >= 0, got ", target.DebugString()), done);
    counter_->WhenReached(target.flat<int64_t>()(0), std::move(done));
  }

 private:
  StepCounter* counter_;
};

class RankSizeClassOp : public OpKernel {
 public:
  explicit RankSizeClassOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), hint_(Named<SizeHint>(ctx, "hint")) {}
  void Compute(OpKernelContext* ctx) override { SetClass(ctx, hint_->Current()); }

 private:
  SizeHint* hint_;
};

class RankObserveSizeOp : public OpKernel {
 public:
  explicit RankObserveSizeOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), hint_(Named<SizeHint>(ctx, "hint")) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& need = ctx->input(0);
    OP_REQUIRES(ctx, need.NumElements() == 1,
                errors::InvalidArgument("need must be a scalar, got ", need.DebugString()));
    int64_t rows = need.flat<int64_t>()(0);
    int index = hint_->Observe(rows);
    OP_REQUIRES(ctx, index >= 0,
                errors::InvalidArgument("need must be in [0, ", SizeClassRows(kSizeClasses - 1),
                                        "] rows per rank, got ", rows));
    SetClass(ctx, index);
  }

 private:
  SizeHint* hint_;
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankStepDone)).Device(DEVICE_CPU), RankStepDoneOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankSteps)).Device(DEVICE_CPU), RankStepsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankWaitForSteps)).Device(DEVICE_CPU),
                        RankWaitForStepsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankSizeClass)).Device(DEVICE_CPU), RankSizeClassOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankObserveSize)).Device(DEVICE_CPU),
                        RankObserveSizeOp);

}  // namespace rec_sdk
