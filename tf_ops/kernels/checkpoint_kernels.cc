// Kernels of the checkpoint ops: save, commit, delta, restore (with the sharing of tables
// that already hold a checkpoint, see tf_ops/core/table_registry.h).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tf_ops/core/checkpoint.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

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
      OP_REQUIRES_OK(
          ctx, ToTfStatus(RestoreTableFiles(table->table(), directories, options, &rows, &note)));
      table->NoteCheckpoint();
    }
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, rows));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 1, tensorflow::tstring(note)));
  }
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableSave)).Device(DEVICE_CPU), TableSaveOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableRestore)).Device(DEVICE_CPU), TableRestoreOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableApplyDelta)).Device(DEVICE_CPU),
                        TableApplyDeltaOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableCommitSave)).Device(DEVICE_CPU),
                        TableCommitSaveOp);

}  // namespace rec_sdk
