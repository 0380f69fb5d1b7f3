// Kernels of serving updates (ops/serving_ops.cc): TakeChanges, WriteUpdateFile, ApplyRows.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/checkpoint.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

class TableTakeChangesOp : public TableOpKernel {
 public:
  explicit TableTakeChangesOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    OP_REQUIRES(ctx, dim_ == t->dim(),
                errors::InvalidArgument("taking the changes of table '", t->name(),
                                        "' asks for dim ", dim_, "; the table has dim ", t->dim()));
    bool full;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 1, "full", &full));
    std::vector<int64_t> keys, removed;
    std::vector<float> values;
    bool replace = false;
    int64_t since = 0, id = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(t->TakeChanges(
                            full,
                            [&](const EmbeddingTable::SnapshotView& view, bool whole) -> Status {
                              replace = whole;
                              keys.clear();
                              values.clear();
                              const Status s = view.ForEachRow(
                                  [&](int64_t key, const char* record, uint32_t, int64_t) {
                                    keys.push_back(key);
                                    values.resize(values.size() + dim_);
                                    view.ReadEmbedding(record,
                                                       values.data() + values.size() - dim_);
                                    return Status::Ok();
                                  },
                                  /*changed_only=*/!replace);
                              if (!replace) removed = view.removed_keys();
                              return s;
                            },
                            &since, &id)));
    const int64_t n = static_cast<int64_t>(keys.size());
    const bool int32_keys = table->key_dtype() == tensorflow::DT_INT32;
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &out));
    CopyKeys(keys, int32_keys, out);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, dim_}), &out));
    if (n > 0) std::memcpy(out->flat<float>().data(), values.data(), values.size() * 4);
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(2, TensorShape({static_cast<int64_t>(removed.size())}), &out));
    CopyKeys(removed, int32_keys, out);
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 3, replace));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 4, since));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 5, id));
  }

 private:
  static void CopyKeys(const std::vector<int64_t>& keys, bool int32_keys, Tensor* out) {
    if (int32_keys) {
      auto flat = out->flat<int32_t>();
      for (size_t i = 0; i < keys.size(); ++i) flat(i) = static_cast<int32_t>(keys[i]);
    } else if (!keys.empty()) {
      std::memcpy(out->flat<int64_t>().data(), keys.data(), keys.size() * 8);
    }
  }
  int64_t dim_;
};

// Writes a tensor's bytes to a file, durably (a serving update's file).
class WriteUpdateFileOp : public OpKernel {
 public:
  explicit WriteUpdateFileOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    std::string path;
    OP_REQUIRES_OK(ctx, GetPathInput(ctx, 0, "path", &path));
    const tensorflow::StringPiece data = ctx->input(1).tensor_data();
    OP_REQUIRES_OK(ctx, ToTfStatus(WriteUpdateFile(path, data.data(), data.size())));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, static_cast<int64_t>(data.size())));
  }
};

class TableApplyRowsOp : public TableOpKernel {
 public:
  explicit TableApplyRowsOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("keys of an update must be a vector, got shape ",
                                        keys.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckRowsShape("update values", values, keys.shape(), table->table()));
    bool replace;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 4, "replace", &replace));
    std::vector<int64_t> key_scratch, removed_scratch;
    const int64_t* key_data;
    const int64_t* removed_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &key_scratch, &key_data));
    OP_REQUIRES_OK(ctx, KeysAsInt64(ctx->input(3), table, &removed_scratch, &removed_data));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->ApplyRows(
                            key_data, values.flat<float>().data(), keys.NumElements(), removed_data,
                            ctx->input(3).NumElements(), replace, MakeRunner(ctx))));
  }
};

REC_SDK_REGISTER_KEYED(TableTakeChanges, TableTakeChangesOp);
REC_SDK_REGISTER_KEYED(TableApplyRows, TableApplyRowsOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(WriteUpdateFile)).Device(DEVICE_CPU),
                        WriteUpdateFileOp);

}  // namespace rec_sdk
