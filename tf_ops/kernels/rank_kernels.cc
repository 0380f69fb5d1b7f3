// Kernels of the rank step ops: thin wrappers of core/step_counter.h.
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/step_counter.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::DEVICE_CPU;
namespace errors = tensorflow::errors;

class RankStepDoneOp : public OpKernel {
 public:
  explicit RankStepDoneOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("counter", &name));
    counter_ = StepCounter::Get(name);
  }
  void Compute(OpKernelContext*) override { counter_->Advance(); }

 private:
  StepCounter* counter_;
};

class RankStepsOp : public OpKernel {
 public:
  explicit RankStepsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("counter", &name));
    counter_ = StepCounter::Get(name);
  }
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
  explicit RankWaitForStepsOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("counter", &name));
    counter_ = StepCounter::Get(name);
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& target = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, target.NumElements() == 1 && target.flat<int64_t>()(0) >= 0,
                      errors::InvalidArgument("target must be a scalar >= 0, got ",
                                              target.DebugString()),
                      done);
    counter_->WhenReached(target.flat<int64_t>()(0), std::move(done));
  }

 private:
  StepCounter* counter_;
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankStepDone)).Device(DEVICE_CPU), RankStepDoneOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankSteps)).Device(DEVICE_CPU), RankStepsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankWaitForSteps)).Device(DEVICE_CPU),
                        RankWaitForStepsOp);

}  // namespace rec_sdk
