// TableResource: the TensorFlow resource that owns one rec_sdk::EmbeddingTable, plus the glue
// shared by all kernels (handle lookup, status translation, thread pool runner).
#ifndef REC_SDK_KERNELS_TABLE_RESOURCE_H_
#define REC_SDK_KERNELS_TABLE_RESOURCE_H_

#include <memory>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

class TableResource : public tensorflow::ResourceBase {
 public:
  TableResource(std::unique_ptr<EmbeddingTable> table, tensorflow::DataType key_dtype)
      : table_(std::move(table)), key_dtype_(key_dtype) {}

  EmbeddingTable* table() { return table_.get(); }
  tensorflow::DataType key_dtype() const { return key_dtype_; }

  std::string DebugString() const override {
    return "rec_sdk table '" + table_->name() + "' (dim " + std::to_string(table_->dim()) +
           ", " + std::to_string(table_->Size()) + " keys)";
  }
  int64_t MemoryUsed() const override { return table_->MemoryBytes(); }

 private:
  std::unique_ptr<EmbeddingTable> table_;
  const tensorflow::DataType key_dtype_;
};

inline tensorflow::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return absl::OkStatus();
    case StatusCode::kInvalidArgument:
      return tensorflow::errors::InvalidArgument(s.message());
    case StatusCode::kResourceExhausted:
      return tensorflow::errors::ResourceExhausted(s.message());
    case StatusCode::kFailedPrecondition:
      return tensorflow::errors::FailedPrecondition(s.message());
    case StatusCode::kNotFound:
      return tensorflow::errors::NotFound(s.message());
    case StatusCode::kDataLoss:
      return tensorflow::errors::DataLoss(s.message());
    case StatusCode::kInternal:
      return tensorflow::errors::Internal(s.message());
  }
  return tensorflow::errors::Internal(s.message());
}

// Spreads core batch work over the kernel's intra-op thread pool.
inline ParallelRunner MakeRunner(tensorflow::OpKernelContext* ctx) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  return [workers](int64_t total, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& work) {
    tensorflow::Shard(workers->num_threads, workers->workers, total, cost_per_unit,
                      [&work](int64_t begin, int64_t end) { work(begin, end); });
  };
}

// Resolves input 0 (the table handle). The returned reference must be Unref'ed
// (use tensorflow::core::ScopedUnref).
inline tensorflow::Status GetTable(tensorflow::OpKernelContext* ctx, TableResource** table) {
  return tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), table);
}

// Writes a scalar output.
template <typename T>
tensorflow::Status SetScalarOutput(tensorflow::OpKernelContext* ctx, int index, const T& value) {
  tensorflow::Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tensorflow::TensorShape({}), &out));
  out->scalar<T>()() = value;
  return absl::OkStatus();
}

// Reads scalar input `index` (named `name` in the error when it is not a scalar).
template <typename T>
tensorflow::Status GetScalarInput(tensorflow::OpKernelContext* ctx, int index, const char* name,
                                  T* value) {
  const tensorflow::Tensor& t = ctx->input(index);
  if (t.NumElements() != 1) {
    return tensorflow::errors::InvalidArgument(name, " must be a scalar, got shape ",
                                               t.shape().DebugString());
  }
  *value = t.flat<T>()(0);
  return absl::OkStatus();
}

// Copies keys of the table's key dtype into int64 (the core's key type).
inline tensorflow::Status KeysAsInt64(const tensorflow::Tensor& keys, TableResource* table,
                                      std::vector<int64_t>* scratch, const int64_t** out) {
  if (keys.dtype() != table->key_dtype()) {
    return tensorflow::errors::InvalidArgument(
        "keys of table '", table->table()->name(), "' must be ",
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

}  // namespace rec_sdk

#endif  // REC_SDK_KERNELS_TABLE_RESOURCE_H_
