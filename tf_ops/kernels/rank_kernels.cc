// Kernels of the rank ops: thin wrappers of core/step_counter.h, core/size_class.h and
// core/step_header.h.
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/rank_parts.h"
#include "tf_ops/core/size_class.h"
#include "tf_ops/core/step_counter.h"
#include "tf_ops/core/step_header.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::AsyncOpKernel;
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;

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

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The position of `batch` in a step's plan, or -1 when the plan lacks it.
int PositionIn(const Tensor& plan, int64_t batch) {
  auto ids = plan.flat<int64_t>();
  for (int64_t i = 0; i < ids.size(); ++i) {
    if (ids(i) == batch) return static_cast<int>(i);
  }
  return -1;
}

void SetVector(OpKernelContext* ctx, int index, const std::vector<int64_t>& values) {
  Tensor* out;
  OP_REQUIRES_OK(
      ctx, ctx->allocate_output(index, TensorShape({static_cast<int64_t>(values.size())}), &out));
  for (size_t i = 0; i < values.size(); ++i) out->flat<int64_t>()(i) = values[i];
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

class RankStepHeaderOp : public AsyncOpKernel {
 public:
  explicit RankStepHeaderOp(OpKernelConstruction* ctx)
      : AsyncOpKernel(ctx), headers_(Named<StepHeaders>(ctx, "headers")) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("batch", &batch_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("phase", &phase_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("restart", &restart_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& plan = ctx->input(0);
    const Tensor& need = ctx->input(1);
    const Tensor& has_data = ctx->input(2);
    OP_REQUIRES_ASYNC(
        ctx, plan.dims() == 1 && plan.NumElements() <= kMaxPlanPositions,
        errors::InvalidArgument("plan must be a vector of at most ", kMaxPlanPositions,
                                " batch ids, got shape ", plan.shape().DebugString()),
        done);
    OP_REQUIRES_ASYNC(
        ctx, need.NumElements() == 1 && need.flat<int64_t>()(0) >= 0,
        errors::InvalidArgument("need must be a scalar >= 0, got ", need.DebugString()), done);
    OP_REQUIRES_ASYNC(
        ctx, has_data.NumElements() == 1,
        errors::InvalidArgument("has_data must be a scalar, got ", has_data.DebugString()), done);
    const int64_t step_id = ctx->step_id();
    int position = PositionIn(plan, batch_);
    if (plan.NumElements() == 0) {
      position = headers_->UnplannedPosition(step_id);
      OP_REQUIRES_ASYNC(ctx, position < kMaxPlanPositions,
                        errors::InvalidArgument("a run without a plan began more than ",
                                                kMaxPlanPositions, " headers"),
                        done);
    }
    OP_REQUIRES_ASYNC(
        ctx, position >= 0,
        errors::InvalidArgument("batch ", batch_,
                                " of lookups over ranks runs in a step whose "
                                "plan does not list it (the plan lists the batches the "
                                "session run's fetches reach): a batch inside a function or "
                                "a control-flow construct the plan cannot follow"),
        done);
    std::vector<int64_t> header(kHeaderWidth, 0);
    header[kHeaderVersion] = kHeaderFormat;
    header[kHeaderStep] = headers_->Begin(step_id, phase_, NowMs());
    header[kHeaderPhase] = phase_;
    header[kHeaderRestart] = restart_;
    header[kHeaderHasData] = has_data.flat<bool>()(0) ? 1 : 0;
    header[kHeaderPlan] =
        PlanDigest(plan.flat<int64_t>().data(), static_cast<int>(plan.NumElements()));
    header[kHeaderBatch] = batch_;
    header[kHeaderNeed] = need.flat<int64_t>()(0);
    auto* cancellation = ctx->cancellation_manager();
    auto token = cancellation->get_cancellation_token();
    StepHeaders* headers = headers_;
    bool registered =
        cancellation->RegisterCallback(token, [headers, step_id] { headers->CancelRun(step_id); });
    if (!registered) headers->CancelRun(step_id);  // cancelled already
    headers_->WhenTurn(step_id, position, [=](bool ok) {
      if (registered) cancellation->TryDeregisterCallback(token);
      if (!ok) {
        ctx->SetStatus(errors::Cancelled("the step was cancelled before batch ", batch_,
                                         " could send its header"));
        done();
        return;
      }
      Tensor* key;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &key), done);
      key->scalar<int32_t>()() = kFirstHeaderKey + position;
      SetVector(ctx, 1, header);
      Tensor* at;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(2, TensorShape({}), &at), done);
      at->scalar<int32_t>()() = position;
      done();
    });
  }

 private:
  StepHeaders* headers_;
  int64_t batch_;
  int64_t phase_;
  int64_t restart_;
};

class RankCheckHeadersOp : public OpKernel {
 public:
  explicit RankCheckHeadersOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), headers_(Named<StepHeaders>(ctx, "headers")) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& gathered = ctx->input(0);
    const Tensor& position = ctx->input(1);
    OP_REQUIRES(
        ctx,
        gathered.dims() == 1 && gathered.NumElements() > 0 &&
            gathered.NumElements() % kHeaderWidth == 0,
        errors::InvalidArgument("gathered must be a vector of ", kHeaderWidth,
                                " values per rank, got shape ", gathered.shape().DebugString()));
    OP_REQUIRES(ctx, position.NumElements() == 1,
                errors::InvalidArgument("position must be a scalar, got ", position.DebugString()));
    int64_t need = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(CheckHeaders(
                            gathered.flat<int64_t>().data(),
                            static_cast<int>(gathered.NumElements() / kHeaderWidth), &need)));
    headers_->Checked(ctx->step_id(), position.flat<int32_t>()(0), NowMs());
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = need;
  }

 private:
  StepHeaders* headers_;
};

class RankLeaveHeaderOp : public OpKernel {
 public:
  explicit RankLeaveHeaderOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), headers_(Named<StepHeaders>(ctx, "headers")) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("restart", &restart_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& phase = ctx->input(0);
    OP_REQUIRES(ctx,
                phase.NumElements() == 1 && (phase.flat<int64_t>()(0) == kPhaseLeft ||
                                             phase.flat<int64_t>()(0) == kPhaseEnded),
                errors::InvalidArgument("phase must be ", kPhaseLeft, " (left) or ", kPhaseEnded,
                                        " (input ended), got ", phase.DebugString()));
    const int64_t leave = phase.flat<int64_t>()(0);
    std::vector<int64_t> header(kHeaderWidth, 0);
    header[kHeaderVersion] = kHeaderFormat;
    header[kHeaderStep] = headers_->Leave(leave, NowMs());
    header[kHeaderPhase] = leave;
    header[kHeaderRestart] = restart_;
    header[kHeaderBatch] = -1;
    SetVector(ctx, 0, header);
  }

 private:
  StepHeaders* headers_;
  int64_t restart_;
};

class RankHeaderActivityOp : public OpKernel {
 public:
  explicit RankHeaderActivityOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), headers_(Named<StepHeaders>(ctx, "headers")) {}
  void Compute(OpKernelContext* ctx) override {
    StepHeaders::Activity a = headers_->Current();
    SetVector(ctx, 0, {a.step, a.phase, a.began_ms, a.checked_ms, a.left, NowMs()});
  }

 private:
  StepHeaders* headers_;
};

// Routes keys to the parts of an exchange; see the op's doc.
class RankRouteKeysOp : public OpKernel {
 public:
  explicit RankRouteKeysOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("parts", &parts_));
    OP_REQUIRES(ctx, parts_ <= std::numeric_limits<int32_t>::max(),
                tensorflow::errors::InvalidArgument("parts must be at most 2^31-1, got ", parts_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& owners = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1 && owners.dims() == 1 && owners.NumElements() > 0,
                tensorflow::errors::InvalidArgument(
                    "keys and dest_of_owner must be vectors, dest_of_owner not empty; got "
                    "shapes ",
                    keys.shape().DebugString(), " and ", owners.shape().DebugString()));
    OP_REQUIRES(
        ctx, keys.NumElements() <= std::numeric_limits<int32_t>::max(),
        tensorflow::errors::InvalidArgument("at most 2^31-1 keys, got ", keys.NumElements()));
    Tensor *dest, *within, *per_dest;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &dest));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &within));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({parts_}), &per_dest));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(RouteKeys(
                 keys.flat<int64_t>().data(), keys.NumElements(), owners.flat<int32_t>().data(),
                 owners.NumElements(), static_cast<int32_t>(parts_), dest->flat<int32_t>().data(),
                 within->flat<int32_t>().data(), per_dest->flat<int32_t>().data())));
  }

 private:
  int64_t parts_;
};

// Fills the parts an exchange sends; see the op's doc.
template <typename T>
class RankFillPartsOp : public OpKernel {
 public:
  explicit RankFillPartsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("parts", &parts_));
    OP_REQUIRES(ctx, parts_ <= std::numeric_limits<int32_t>::max(),
                tensorflow::errors::InvalidArgument("parts must be at most 2^31-1, got ", parts_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& take = ctx->input(1);
    const Tensor& dest = ctx->input(2);
    const Tensor& within = ctx->input(3);
    const Tensor& head = ctx->input(4);
    const Tensor& cap = ctx->input(5);
    OP_REQUIRES(ctx,
                values.dims() == 2 && head.dims() == 3 && TensorShapeUtils::IsScalar(cap.shape()),
                tensorflow::errors::InvalidArgument(
                    "values must be a matrix, head [parts, rows, width], cap a scalar; got "
                    "shapes ",
                    values.shape().DebugString(), ", ", head.shape().DebugString(), ", ",
                    cap.shape().DebugString()));
    const int64_t width = values.dim_size(1);
    OP_REQUIRES(ctx, head.dim_size(0) == parts_ && head.dim_size(2) == width,
                tensorflow::errors::InvalidArgument("head must be [", parts_, ", rows, ", width,
                                                    "], got ", head.shape().DebugString()));
    const int64_t n = dest.NumElements();
    OP_REQUIRES(ctx,
                dest.dims() == 1 && within.dims() == 1 && within.NumElements() == n &&
                    take.dims() == 1 && (take.NumElements() == 0 || take.NumElements() == n),
                tensorflow::errors::InvalidArgument(
                    "dest, within (and take, unless empty) must be vectors of one length; got "
                    "shapes ",
                    dest.shape().DebugString(), ", ", within.shape().DebugString(), ", ",
                    take.shape().DebugString()));
    const int64_t rows = cap.scalar<int32_t>()();
    OP_REQUIRES(ctx, rows >= 0,
                tensorflow::errors::InvalidArgument("cap must be >= 0, got ", rows));
    const int64_t head_rows = head.dim_size(1);
    // BuildTensorShape fails on a shape whose size overflows (TensorShape's constructor
    // would abort the process).
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({parts_, head_rows + rows, width}, &shape));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    const bool taken = take.NumElements() > 0;
    OP_REQUIRES_OK(
        ctx, ToTfStatus(FillParts<T>(values.flat<T>().data(), values.dim_size(0), width,
                                     taken ? take.flat<int32_t>().data() : nullptr,
                                     dest.flat<int32_t>().data(), within.flat<int32_t>().data(), n,
                                     head.flat<T>().data(), head_rows, static_cast<int32_t>(parts_),
                                     rows, out->flat<T>().data())));
  }

 private:
  int64_t parts_;
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankStepDone)).Device(DEVICE_CPU), RankStepDoneOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankSteps)).Device(DEVICE_CPU), RankStepsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankWaitForSteps)).Device(DEVICE_CPU),
                        RankWaitForStepsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankSizeClass)).Device(DEVICE_CPU), RankSizeClassOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankObserveSize)).Device(DEVICE_CPU),
                        RankObserveSizeOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankStepHeader)).Device(DEVICE_CPU), RankStepHeaderOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankCheckHeaders)).Device(DEVICE_CPU),
                        RankCheckHeadersOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankLeaveHeader)).Device(DEVICE_CPU),
                        RankLeaveHeaderOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankHeaderActivity)).Device(DEVICE_CPU),
                        RankHeaderActivityOp);

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(RankRouteKeys)).Device(DEVICE_CPU), RankRouteKeysOp);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(RankFillParts)).Device(DEVICE_CPU).TypeConstraint<float>("T"),
    RankFillPartsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(RankFillParts)).Device(DEVICE_CPU).TypeConstraint<int64_t>("T"),
    RankFillPartsOp<int64_t>);

}  // namespace rec_sdk
