// Kernels of the admission and eviction ops: configuring the thresholds, changing the
// admission threshold, eviction by age, Restrict.
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

class TableConfigureAdmissionOp : public TableOpKernel {
 public:
  explicit TableConfigureAdmissionOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("access_threshold", &admission_.access_threshold));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("eviction_threshold", &admission_.eviction_threshold));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->ConfigureAdmission(admission_)));
    ctx->set_output(0, ctx->input(0));
  }

 private:
  AdmissionConfig admission_;
};

class TableSetAccessThresholdOp : public TableOpKernel {
 public:
  explicit TableSetAccessThresholdOp(OpKernelConstruction* ctx)
      : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    int64_t threshold;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 1, "threshold", &threshold));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->SetAccessThreshold(threshold)));
  }
};

class TableTrackAccessOp : public TableOpKernel {
 public:
  explicit TableTrackAccessOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    table->table()->TrackAccess();
  }
};

class TableEvictOp : public TableOpKernel {
 public:
  explicit TableEvictOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    int64_t rows = 0, pending = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->Evict(&rows, &pending, MakeRunner(ctx))));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, rows));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 1, pending));
  }
};

class TableRestrictOp : public TableOpKernel {
 public:
  explicit TableRestrictOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {
    std::string by;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("by", &by));
    by_ = by == "count" ? RestrictBy::kCount : RestrictBy::kLastSeen;
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    int64_t keep = 0, removed = 0;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 1, "num_reserved", &keep));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->Restrict(keep, by_, &removed)));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, removed));
  }

 private:
  RestrictBy by_;
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableConfigureAdmission)).Device(DEVICE_CPU),
                        TableConfigureAdmissionOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableSetAccessThreshold)).Device(DEVICE_CPU),
                        TableSetAccessThresholdOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableTrackAccess)).Device(DEVICE_CPU),
                        TableTrackAccessOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableEvict)).Device(DEVICE_CPU), TableEvictOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableRestrict)).Device(DEVICE_CPU), TableRestrictOp);

}  // namespace rec_sdk
