// Kernels of the checkpoint ops: save, commit, delta, restore (with the sharing of tables
// that already hold a checkpoint, see tf_ops/core/table_registry.h).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tf_ops/core/checkpoint.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

namespace {

// A checkpoint path from a string tensor: a NUL byte would silently cut it short where the
// operating system reads it, so it is an error.
absl::Status CheckPath(const char* name, const std::string& path) {
  const size_t nul = path.find('\0');
  if (nul != std::string::npos) {
    return errors::InvalidArgument(name, " must not contain a NUL byte, got '",
                                   path.substr(0, nul), "\\0...' (", path.size(), " bytes)");
  }
  if (path.empty()) return errors::InvalidArgument(name, " must not be empty");
  return absl::OkStatus();
}

// Reads scalar string input `index` as a checked checkpoint path.
absl::Status GetPathInput(OpKernelContext* ctx, int index, const char* name,
                                std::string* path) {
  tensorflow::tstring value;
  TF_RETURN_IF_ERROR(GetScalarInput(ctx, index, name, &value));
  *path = std::string(value);
  return CheckPath(name, *path);
}

}  // namespace

class TableSaveOp : public TableOpKernel {
 public:
  explicit TableSaveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    std::string dir;
    bool delta = false;
    OP_REQUIRES_OK(ctx, GetPathInput(ctx, 1, "directory", &dir));
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 2, "delta", &delta));
    int64_t rows = 0, save_id = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(SaveTableFiles(table->table(), dir, &rows, delta, &save_id)));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, rows));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 1, save_id));
  }
};

class TableCommitSaveOp : public TableOpKernel {
 public:
  explicit TableCommitSaveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    int64_t save_id;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 1, "save_id", &save_id));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->CommitSave(save_id)));
    table->NoteCheckpoint();
  }
};

class TableApplyDeltaOp : public TableOpKernel {
 public:
  explicit TableApplyDeltaOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    std::string dir;
    OP_REQUIRES_OK(ctx, GetPathInput(ctx, 1, "directory", &dir));
    int64_t rows = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(ApplyDeltaFiles(table->table(), dir, &rows)));
    table->NoteCheckpoint();
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, rows));
  }
};

class TableRestoreOp : public TableOpKernel {
 public:
  explicit TableRestoreOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  // A shareable table restoring one whole checkpoint that it, or another table of the
  // process, already holds in memory: uses that table instead of reading the files.
  static bool UseTableInMemory(TableResource* table, const std::vector<std::string>& dirs,
                               const RestoreOptions& options, int64_t* rows, std::string* note) {
    if (table->share() == ShareMode::kPrivate || dirs.size() != 1 || options.rank_size != 1) {
      return false;
    }
    int64_t save_id = 0;
    bool delta = false;
    if (!ReadCheckpointId(dirs[0], &save_id, &delta).ok() || delta) return false;
    if (!table->table()->HoldsCheckpoint(save_id)) {
      std::shared_ptr<EmbeddingTable> held = TableRegistry::Process().Find(
          save_id, *table->table(), table->key_dtype(), table->share());
      if (held == nullptr) return false;
      table->Adopt(std::move(held));
    }
    *rows = table->table()->Size();
    *note = "the table already held checkpoint " + std::to_string(save_id) +
            " in memory: no files were read";
    return true;
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& dirs = ctx->input(1);
    std::vector<std::string> directories;
    for (int64_t i = 0; i < dirs.NumElements(); ++i) {
      directories.emplace_back(dirs.flat<tensorflow::tstring>()(i));
      OP_REQUIRES_OK(ctx, CheckPath("directories", directories.back()));
    }
    RestoreOptions options;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 2, "rank_id", &options.rank_id));
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 3, "rank_size", &options.rank_size));
    options.int32_keys = table->key_dtype() == tensorflow::DT_INT32;
    int64_t rows = 0;
    std::string note;
    if (!UseTableInMemory(table, directories, options, &rows, &note)) {
      if (table->UsedByOthers()) {
        // Sessions share this table: restore into a table of this session's own instead of
        // overwriting theirs.
        std::unique_ptr<EmbeddingTable> own;
        OP_REQUIRES_OK(ctx, ToTfStatus(EmbeddingTable::Create(table->table()->config(), &own)));
        table->Adopt(std::shared_ptr<EmbeddingTable>(std::move(own)));
      }
      OP_REQUIRES_OK(ctx, ToTfStatus(RestoreTableFiles(table->table(), directories, options,
                                                       &rows, &note)));
      table->NoteCheckpoint();
    }
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, rows));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 1, tensorflow::tstring(note)));
  }
};

class TableTakeChangesOp : public TableOpKernel {
 public:
  explicit TableTakeChangesOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    OP_REQUIRES(ctx, dim_ == t->dim(),
                errors::InvalidArgument("taking the changes of table '", t->name(),
                                        "' asks for dim ", dim_, "; the table has dim ",
                                        t->dim()));
    bool full;
    OP_REQUIRES_OK(ctx, GetScalarInput(ctx, 1, "full", &full));
    std::vector<int64_t> keys, removed;
    std::vector<float> values;
    bool replace = false;
    int64_t since = 0, id = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(t->TakeChanges(
                            full,
                            [&](const EmbeddingTable::SnapshotView& view,
                                bool whole) -> Status {
                              replace = whole;
                              keys.clear();
                              values.clear();
                              const Status s = view.ForEachRow(
                                  [&](int64_t key, const char* record, uint32_t, int64_t) {
                                    keys.push_back(key);
                                    values.resize(values.size() + dim_);
                                    view.ReadEmbedding(record, values.data() + values.size() -
                                                                   dim_);
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
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            2, TensorShape({static_cast<int64_t>(removed.size())}), &out));
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

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableSave)).Device(DEVICE_CPU), TableSaveOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableRestore)).Device(DEVICE_CPU), TableRestoreOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableApplyDelta)).Device(DEVICE_CPU),
                        TableApplyDeltaOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableCommitSave)).Device(DEVICE_CPU),
                        TableCommitSaveOp);

REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(TableTakeChanges)).Device(DEVICE_CPU).TypeConstraint<int32_t>("key_dtype"),
    TableTakeChangesOp);
REGISTER_KERNEL_BUILDER(
    Name(REC_SDK_OP_NAME(TableTakeChanges)).Device(DEVICE_CPU).TypeConstraint<int64_t>("key_dtype"),
    TableTakeChangesOp);

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(WriteUpdateFile)).Device(DEVICE_CPU),
                        WriteUpdateFileOp);

}  // namespace rec_sdk
