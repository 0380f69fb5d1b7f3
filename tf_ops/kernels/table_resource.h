// TableResource: the TensorFlow resource that owns one rec_sdk::EmbeddingTable, plus the glue
// shared by all kernels (handle lookup, status translation, thread pool runner).
#ifndef REC_SDK_KERNELS_TABLE_RESOURCE_H_
#define REC_SDK_KERNELS_TABLE_RESOURCE_H_

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tf_ops/core/embedding_table.h"
#include "tf_ops/core/table_registry.h"

namespace rec_sdk {

// The TensorFlow names every kernel file uses.
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// The kernels' error statuses, built with absl (TensorFlow >= 2.16 deprecates
// tensorflow::errors::*; absl's constructors exist in the headers of 2.15 and 2.21 alike).
namespace errors {
#define REC_SDK_ERROR(Name)                          \
  template <typename... Args>                        \
  absl::Status Name(const Args&... args) {           \
    return absl::Name##Error(absl::StrCat(args...)); \
  }
REC_SDK_ERROR(Cancelled)
REC_SDK_ERROR(DataLoss)
REC_SDK_ERROR(FailedPrecondition)
REC_SDK_ERROR(Internal)
REC_SDK_ERROR(InvalidArgument)
REC_SDK_ERROR(NotFound)
REC_SDK_ERROR(OutOfRange)
REC_SDK_ERROR(PermissionDenied)
REC_SDK_ERROR(ResourceExhausted)
#undef REC_SDK_ERROR
}  // namespace errors

// The TensorFlow resource of one table in one session: the table it uses (shared with other
// sessions as TableRegistry allows, see tf_ops/core/table_registry.h), its key dtype and its
// share mode.
class TableResource : public tensorflow::ResourceBase {
 public:
  TableResource(std::shared_ptr<EmbeddingTable> table, tensorflow::DataType key_dtype,
                ShareMode share)
      : table_(std::move(table)), key_dtype_(key_dtype), share_(share) {
    if (share_ != ShareMode::kPrivate) TableRegistry::Process().Attach(table_);
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().push_back(this);
  }
  ~TableResource() override {
    {
      std::lock_guard<std::mutex> lock(LiveMutex());
      std::vector<TableResource*>& live = Live();
      live.erase(std::remove(live.begin(), live.end(), this), live.end());
    }
    if (share_ != ShareMode::kPrivate) TableRegistry::Process().Detach(table_);
  }

  // The table named `name` (the create_table name) that a session of this process created
  // last and still holds, with its size and capacity; false if there is none. What the SDK's
  // table.size() / capacity() read without a session (rec_sdk_table_size below).
  static bool LiveSizeOf(const std::string& name, int64_t* size, int64_t* capacity) {
    std::lock_guard<std::mutex> lock(LiveMutex());
    const std::vector<TableResource*>& live = Live();
    for (auto it = live.rbegin(); it != live.rend(); ++it) {
      const std::shared_ptr<EmbeddingTable> t = (*it)->shared_table();
      if (t->name() != name) continue;
      *size = t->Size();
      *capacity = t->Capacity();
      return true;
    }
    return false;
  }

  EmbeddingTable* table() {
    std::lock_guard<std::mutex> lock(mu_);
    return table_.get();
  }
  std::shared_ptr<EmbeddingTable> shared_table() const {
    std::lock_guard<std::mutex> lock(mu_);
    return table_;
  }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  ShareMode share() const { return share_; }

  // Uses `other` from now on (handing it this session's admission settings). The table used so
  // far stays alive with the resource, so that a kernel still holding its pointer is safe.
  void Adopt(std::shared_ptr<EmbeddingTable> other) {
    std::lock_guard<std::mutex> lock(mu_);
    TableRegistry::HandOver(*table_, other.get(), share_);
    if (share_ != ShareMode::kPrivate) {
      TableRegistry::Process().Attach(other);
      TableRegistry::Process().Detach(table_);
    }
    replaced_.push_back(std::move(table_));
    table_ = std::move(other);
  }

  // Records that the table now holds its checkpoint_id() (shareable tables only).
  void NoteCheckpoint() {
    if (share_ == ShareMode::kPrivate) return;
    const std::shared_ptr<EmbeddingTable> t = shared_table();
    TableRegistry::Process().Note(t->checkpoint_id(), t, key_dtype_);
  }
  // Whether sessions other than this one use its table.
  bool UsedByOthers() {
    return share_ != ShareMode::kPrivate && TableRegistry::Process().Users(*shared_table()) > 1;
  }

  std::string DebugString() const override {
    const std::shared_ptr<EmbeddingTable> t = shared_table();
    return "rec_sdk table '" + t->name() + "' (dim " + std::to_string(t->dim()) + ", " +
           std::to_string(t->Size()) + " keys)";
  }
  int64_t MemoryUsed() const override { return shared_table()->MemoryBytes(); }

 private:
  // Every TableResource alive in the process, in creation order (guarded by LiveMutex()).
  static std::vector<TableResource*>& Live() {
    static auto* live = new std::vector<TableResource*>();
    return *live;
  }
  static std::mutex& LiveMutex() {
    static auto* mu = new std::mutex();
    return *mu;
  }

  mutable std::mutex mu_;
  std::shared_ptr<EmbeddingTable> table_;
  std::vector<std::shared_ptr<EmbeddingTable>> replaced_;
  const tensorflow::DataType key_dtype_;
  const ShareMode share_;
};

inline absl::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return absl::OkStatus();
    case StatusCode::kInvalidArgument:
      return errors::InvalidArgument(s.message());
    case StatusCode::kResourceExhausted:
      return errors::ResourceExhausted(s.message());
    case StatusCode::kFailedPrecondition:
      return errors::FailedPrecondition(s.message());
    case StatusCode::kNotFound:
      return errors::NotFound(s.message());
    case StatusCode::kDataLoss:
      return errors::DataLoss(s.message());
    case StatusCode::kPermissionDenied:
      return errors::PermissionDenied(s.message());
    case StatusCode::kInternal:
      return errors::Internal(s.message());
    case StatusCode::kOutOfRange:
      return errors::OutOfRange(s.message());
  }
  return errors::Internal(s.message());
}

// Spreads core batch work over the kernel's intra-op thread pool: the calling thread and
// helper tasks on the pool claim blocks, so that a pool thread slow to wake delays nothing,
// and the helpers linger for the next region (RunWithLingeringHelpers, parallel.h). Make one
// per kernel call: the call counts as running until its last copy is gone.
inline ParallelRunner MakeRunner(tensorflow::OpKernelContext* ctx) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  HelperBoard* board = &BoardOf(workers->workers);
  auto call = std::make_shared<ActiveCall>(*board);  // until the kernel's runner is gone
  return [workers, board, call](int64_t total, int64_t cost_per_unit,
                                const std::function<void(int64_t, int64_t)>& work) {
    RunWithLingeringHelpers(
        *board, workers->num_threads,
        [workers](std::function<void()> task) { workers->workers->Schedule(std::move(task)); },
        total, cost_per_unit, work);
  };
}

// Resolves input 0 (the table handle). The returned reference must be Unref'ed
// (use tensorflow::core::ScopedUnref).
inline absl::Status GetTable(tensorflow::OpKernelContext* ctx, TableResource** table) {
  return tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), table);
}

// Resolves input 0 for a kernel that changes the table. A reader (an evaluation or prediction
// graph sharing a table, see ShareMode) may not change a table other sessions use.
inline absl::Status GetWritableTable(tensorflow::OpKernelContext* ctx, TableResource** table) {
  TF_RETURN_IF_ERROR(GetTable(ctx, table));
  if ((*table)->share() == ShareMode::kReader && (*table)->UsedByOthers()) {
    const std::string name = (*table)->table()->name();
    (*table)->Unref();
    return errors::FailedPrecondition(
        "table '", name,
        "' of this graph reads the in-memory table of another session (it "
        "restored the checkpoint that table holds; the graph has no training lookups of it, "
        "see share_tables): it cannot be changed here");
  }
  return absl::OkStatus();
}

// Whether a table kernel changes its table (see GetWritableTable).
constexpr bool kWritesTable = true;
constexpr bool kReadsTable = false;

// Base of the kernels whose input 0 is a table: Compute resolves the table (writable when the
// kernel changes it), holds a reference for the call and runs ComputeWithTable.
class TableOpKernel : public tensorflow::OpKernel {
 public:
  TableOpKernel(tensorflow::OpKernelConstruction* ctx, bool writes_table)
      : tensorflow::OpKernel(ctx), writes_table_(writes_table) {}

  void Compute(tensorflow::OpKernelContext* ctx) final {
    TableResource* table;
    OP_REQUIRES_OK(ctx, writes_table_ ? GetWritableTable(ctx, &table) : GetTable(ctx, &table));
    tensorflow::core::ScopedUnref unref(table);
    ComputeWithTable(ctx, table);
  }

 protected:
  virtual void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* table) = 0;
  void set_writes_table(bool writes_table) { writes_table_ = writes_table; }

 private:
  bool writes_table_;
};

// Writes a scalar output.
template <typename T>
absl::Status SetScalarOutput(tensorflow::OpKernelContext* ctx, int index, const T& value) {
  tensorflow::Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tensorflow::TensorShape({}), &out));
  out->scalar<T>()() = value;
  return absl::OkStatus();
}

// Reads scalar input `index` (named `name` in the error when it is not a scalar).
template <typename T>
absl::Status GetScalarInput(tensorflow::OpKernelContext* ctx, int index, const char* name,
                            T* value) {
  const tensorflow::Tensor& t = ctx->input(index);
  if (t.NumElements() != 1) {
    return errors::InvalidArgument(name, " must be a scalar, got shape ", t.shape().DebugString());
  }
  *value = t.flat<T>()(0);
  return absl::OkStatus();
}

// A checkpoint path from a string tensor: a NUL byte would silently cut it short where the
// operating system reads it, so it is an error.
inline absl::Status CheckPath(const char* name, const std::string& path) {
  const size_t nul = path.find('\0');
  if (nul != std::string::npos) {
    return errors::InvalidArgument(name, " must not contain a NUL byte, got '", path.substr(0, nul),
                                   "\\0...' (", path.size(), " bytes)");
  }
  if (path.empty()) return errors::InvalidArgument(name, " must not be empty");
  return absl::OkStatus();
}

// Reads scalar string input `index` as a checked checkpoint path.
inline absl::Status GetPathInput(tensorflow::OpKernelContext* ctx, int index, const char* name,
                                 std::string* path) {
  tensorflow::tstring value;
  TF_RETURN_IF_ERROR(GetScalarInput(ctx, index, name, &value));
  *path = std::string(value);
  return CheckPath(name, *path);
}

// Checks that `values` has shape keys.shape + [dim].
inline absl::Status CheckRowsShape(const char* what, const tensorflow::Tensor& values,
                                   const tensorflow::TensorShape& keys_shape,
                                   EmbeddingTable* table) {
  tensorflow::TensorShape expected = keys_shape;
  expected.AddDim(table->dim());
  if (values.shape() != expected) {
    return errors::InvalidArgument(what, " of table '", table->name(), "' must have shape ",
                                   expected.DebugString(), " (keys shape + [dim]), got ",
                                   values.shape().DebugString());
  }
  return absl::OkStatus();
}

// Copies keys of the table's key dtype into int64 (the core's key type).
inline absl::Status KeysAsInt64(const tensorflow::Tensor& keys, TableResource* table,
                                std::vector<int64_t>* scratch, const int64_t** out) {
  if (keys.dtype() != table->key_dtype()) {
    return errors::InvalidArgument("keys of table '", table->table()->name(), "' must be ",
                                   tensorflow::DataTypeString(table->key_dtype()), ", got ",
                                   tensorflow::DataTypeString(keys.dtype()));
  }
  if (keys.dtype() == tensorflow::DT_INT64) {
    *out = reinterpret_cast<const int64_t*>(keys.flat<int64_t>().data());
    return absl::OkStatus();
  }
  const auto flat = keys.flat<int32_t>();
  scratch->assign(flat.data(), flat.data() + flat.size());
  *out = scratch->data();
  return absl::OkStatus();
}

// Registers `kernel` for op `op` with int32 and with int64 keys (attribute key_dtype).
#define REC_SDK_REGISTER_KEYED(op, kernel)                                                        \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name(REC_SDK_OP_NAME(op)).Device(DEVICE_CPU).TypeConstraint<int32_t>("key_dtype"), kernel); \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name(REC_SDK_OP_NAME(op)).Device(DEVICE_CPU).TypeConstraint<int64_t>("key_dtype"), kernel)

}  // namespace rec_sdk

#endif  // REC_SDK_KERNELS_TABLE_RESOURCE_H_
