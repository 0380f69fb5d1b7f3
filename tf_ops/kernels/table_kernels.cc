// Kernels of the table ops: the handle, lookups (find_or_insert, gather, lookup), upsert,
// remove, size, clear, stats, export and import. They parse and check inputs, call the core
// and translate its status. The admission, checkpoint and key-batch kernels are in
// admission_kernels.cc, checkpoint_kernels.cc and key_kernels.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tf_ops/core/table_config.h"
#include "tf_ops/kernels/table_resource.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::core::ScopedUnref;

class EmbeddingTableOp : public OpKernel {
 public:
  explicit EmbeddingTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string initializer;
    int64_t dim, seed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &config_.name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_dtype", &key_dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
    std::string emb_dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("emb_dtype", &emb_dtype));
    OP_REQUIRES_OK(ctx, ToTfStatus(RowDtypeFromName(emb_dtype, &config_.emb_dtype)));
    std::string slot_dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_dtype", &slot_dtype));
    OP_REQUIRES_OK(ctx, ToTfStatus(RowDtypeFromName(slot_dtype, &config_.slot_dtype)));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic_expansion", &config_.dynamic_expansion));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &config_.capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_capacity", &config_.initial_capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initializer", &initializer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_value", &config_.initializer.value));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_values", &config_.initializer.values));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_minval", &config_.initializer.minval));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_maxval", &config_.initializer.maxval));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_mean", &config_.initializer.mean));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_stddev", &config_.initializer.stddev));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_scale", &config_.initializer.scale));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("evict_when_full", &config_.evict_when_full));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("track_changes", &config_.track_changes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("track_access", &config_.track_access));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_paths", &config_.ssd_paths));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_rows", &config_.ssd_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ssd_direct_io", &config_.ssd_direct_io));
    std::string index_layout;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("index_layout", &index_layout));
    OP_REQUIRES_OK(ctx, ToTfStatus(IndexLayoutFromName(index_layout, &config_.index_layout)));
    std::string share;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("share", &share));
    OP_REQUIRES(ctx, ParseShareMode(share, &share_),
                errors::InvalidArgument("share must be \"\", \"reader\" or \"trainer\", got \"",
                                        share, "\""));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES(ctx, dim <= EmbeddingTable::kMaxDim,
                errors::InvalidArgument("dim of table '", config_.name, "' must be in [1, ",
                                        EmbeddingTable::kMaxDim, "], got ", dim));
    config_.dim = static_cast<int>(dim);
    config_.initializer.seed = static_cast<uint64_t>(seed);
    OP_REQUIRES_OK(
        ctx, ToTfStatus(InitializerSpec::KindFromName(initializer, &config_.initializer.kind)));
    if (shared_name_.empty()) shared_name_ = name();
  }

  void Compute(OpKernelContext* ctx) override {
    auto* rm = ctx->resource_manager();
    const std::string container = container_.empty() ? rm->default_container() : container_;
    TableResource* resource = nullptr;
    OP_REQUIRES_OK(
        ctx, rm->LookupOrCreate<TableResource>(
                 container, shared_name_, &resource,
                 [this, ctx](TableResource** created) -> absl::Status {
                   std::unique_ptr<EmbeddingTable> table;
                   TF_RETURN_IF_ERROR(ToTfStatus(EmbeddingTable::Create(config_, &table)));
                   // One line per table, as TFRA's tables log theirs.
                   LOG(INFO) << "rec_sdk: table '" << shared_name_ << "' created on "
                             << ctx->device()->attributes().device_type() << ": dim=" << config_.dim
                             << ", init_size=" << config_.initial_capacity;
                   *created = new TableResource(std::shared_ptr<EmbeddingTable>(std::move(table)),
                                                key_dtype_, share_);
                   return absl::OkStatus();
                 }));
    ScopedUnref unref(resource);
    // A second handle (same shared name) must ask for the table that exists.
    std::vector<std::string> differences = ConfigDifferences(resource->table()->config(), config_);
    if (resource->key_dtype() != key_dtype_) {
      differences.insert(differences.begin(),
                         "key_dtype: " + tensorflow::DataTypeString(resource->key_dtype()) +
                             " vs " + tensorflow::DataTypeString(key_dtype_));
    }
    OP_REQUIRES(ctx, differences.empty(),
                errors::InvalidArgument("table '", shared_name_,
                                        "' already exists with "
                                        "another configuration (existing vs asked for): ",
                                        absl::StrJoin(differences, "; ")));
    Tensor* handle;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::MakeResourceHandle<TableResource>(ctx, container, shared_name_);
  }

 private:
  TableConfig config_;
  tensorflow::DataType key_dtype_;
  ShareMode share_ = ShareMode::kPrivate;
  std::string container_;
  std::string shared_name_;
};

// TableFindOrInsert, and with kWithRows TableFindOrInsertRows (the rows too).
template <bool kWithRows>
class TableFindOrInsertOp : public TableOpKernel {
 public:
  explicit TableFindOrInsertOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("is_train", &is_train_));
    if (kWithRows) OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    set_writes_table(is_train_);  // training lookups insert keys and count them
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    const Tensor& counts = ctx->input(2);
    const Tensor& times = ctx->input(3);
    const int64_t n = keys.NumElements();
    KeyAccess access;
    if (counts.NumElements() > 0) {
      OP_REQUIRES(ctx, counts.NumElements() == n,
                  errors::InvalidArgument(
                      "counts of a lookup of table '", table->table()->name(), "' must have ", n,
                      " elements (one per key) or none, got ", counts.NumElements()));
      access.counts = reinterpret_cast<const int64_t*>(counts.flat<int64_t>().data());
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(
            ctx, access.counts[i] >= 0,
            errors::InvalidArgument("counts of a lookup of table '", table->table()->name(),
                                    "' must be >= 0, got ", access.counts[i], " at position ", i));
      }
    }
    if (times.NumElements() > 0) {
      OP_REQUIRES(ctx, times.NumElements() == n || times.NumElements() == 1,
                  errors::InvalidArgument(
                      "times of a lookup of table '", table->table()->name(), "' must have ", n,
                      " elements (one per key), one or none, got ", times.NumElements()));
      access.times = reinterpret_cast<const int64_t*>(times.flat<int64_t>().data());
      access.times_per_key = times.NumElements() == n && n != 1;
    }
    Tensor* addresses;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &addresses));
    float* rows = nullptr;
    if (kWithRows) {
      OP_REQUIRES(
          ctx, dim_ == table->table()->dim(),
          errors::InvalidArgument("a lookup of table '", table->table()->name(), "' asks for dim ",
                                  dim_, "; the table has dim ", table->table()->dim()));
      TensorShape shape = keys.shape();
      shape.AddDim(dim_);
      Tensor* values;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, shape, &values));
      rows = values->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->FindOrInsert(
                            key_data, n, is_train_,
                            reinterpret_cast<int64_t*>(addresses->flat<int64_t>().data()),
                            MakeRunner(ctx), access, rows)));
  }

 private:
  bool is_train_;
  int dim_ = 0;
};

class TableStatsOp : public TableOpKernel {
 public:
  explicit TableStatsOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const auto values = table->table()->Stats().Values();
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({TableStats::kCount}), &out));
    auto v = out->flat<int64_t>();
    for (int i = 0; i < TableStats::kCount; ++i) v(i) = values[i];
  }
};

class TableGatherOp : public TableOpKernel {
 public:
  explicit TableGatherOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    OP_REQUIRES(
        ctx, dim_ == table->table()->dim(),
        errors::InvalidArgument("gather of table '", table->table()->name(), "' asks for dim ",
                                dim_, " but the table has dim ", table->table()->dim()));
    const Tensor& addresses = ctx->input(1);
    TensorShape shape = addresses.shape();
    shape.AddDim(dim_);
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &values));
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(table->table()->Gather(
                       reinterpret_cast<const int64_t*>(addresses.flat<int64_t>().data()),
                       addresses.NumElements(), values->flat<float>().data(), MakeRunner(ctx))));
  }

 private:
  int64_t dim_;
};

class TableLookupOp : public TableOpKernel {
 public:
  explicit TableLookupOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("init_missing", &init_missing_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_default", &slot_default_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_optimizer", &slot_optimizer_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    OP_REQUIRES(
        ctx, dim_ == table->table()->dim(),
        errors::InvalidArgument("lookup of table '", table->table()->name(), "' asks for dim ",
                                dim_, " but the table has dim ", table->table()->dim()));
    const std::string& owner = table->table()->slot_optimizer();
    OP_REQUIRES(
        ctx, slot_ < 0 || slot_optimizer_.empty() || owner.empty() || owner == slot_optimizer_,
        errors::InvalidArgument("the slots of table '", table->table()->name(),
                                "' belong to optimizer ", owner, ", not ", slot_optimizer_));
    const Tensor& keys = ctx->input(1);
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    Tensor* values;
    Tensor* exists;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &exists));
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(table->table()->Lookup(
                       key_data, keys.NumElements(), init_missing_, values->flat<float>().data(),
                       exists->flat<bool>().data(), MakeRunner(ctx), slot_, slot_default_)));
  }

 private:
  int64_t dim_;
  bool init_missing_;
  int slot_;
  float slot_default_;
  std::string slot_optimizer_;
};

class TableUpsertOp : public TableOpKernel {
 public:
  explicit TableUpsertOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckRowsShape("upsert values", values, keys.shape(), table->table()));
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->Upsert(key_data, values.flat<float>().data(),
                                                          keys.NumElements(), MakeRunner(ctx))));
  }
};

class TableRemoveOp : public TableOpKernel {
 public:
  explicit TableRemoveOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    Tensor* removed;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &removed));
    int64_t count = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->Remove(key_data, keys.NumElements(), &count,
                                                          MakeRunner(ctx))));
    removed->scalar<int64_t>()() = count;
  }
};

class TablePrefetchColdOp : public TableOpKernel {
 public:
  explicit TablePrefetchColdOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    Tensor* read;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &read));
    int64_t count = 0;
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->PrefetchCold(key_data, keys.NumElements(),
                                                                &count, MakeRunner(ctx))));
    read->scalar<int64_t>()() = count;
  }
};

// The prefetch of the FeatureSpec pipeline, inside tf.data: the table is found by name (a
// dataset function cannot capture the table op), and one not created yet reads nothing.
class TablePrefetchColdByNameOp : public OpKernel {
 public:
  explicit TablePrefetchColdByNameOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto* rm = ctx->resource_manager();
    const std::string container = container_.empty() ? rm->default_container() : container_;
    TableResource* table = nullptr;
    int64_t count = 0;
    if (rm->Lookup<TableResource>(container, shared_name_, &table).ok()) {
      ScopedUnref unref(table);
      const Tensor& keys = ctx->input(0);
      std::vector<int64_t> scratch;
      const int64_t* key_data;
      OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
      OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->PrefetchCold(key_data, keys.NumElements(),
                                                                  &count, MakeRunner(ctx))));
    }
    OP_REQUIRES_OK(ctx, SetScalarOutput<int64_t>(ctx, 0, count));
  }

 private:
  std::string container_;
  std::string shared_name_;
};

class TableSizeOp : public TableOpKernel {
 public:
  explicit TableSizeOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    capacity_ = type_string() == REC_SDK_OP_NAME(TableCapacity);
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = capacity_ ? table->table()->Capacity() : table->table()->Size();
  }

 private:
  bool capacity_;
};

class TableClearOp : public TableOpKernel {
 public:
  explicit TableClearOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    table->table()->Clear();
  }
};

class TableExportOp : public TableOpKernel {
 public:
  explicit TableExportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_dtype", &key_dtype_));
  }

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    OP_REQUIRES(ctx, dim_ == t->dim() && key_dtype_ == table->key_dtype(),
                errors::InvalidArgument("export of table '", t->name(), "' asks for dim ", dim_,
                                        " and ", tensorflow::DataTypeString(key_dtype_),
                                        " keys; the table has dim ", t->dim(), " and ",
                                        tensorflow::DataTypeString(table->key_dtype()), " keys"));
    const int dim = t->dim();
    const bool int32_keys = table->key_dtype() == tensorflow::DT_INT32;
    std::vector<int64_t> wide_keys;
    Tensor* keys_out = nullptr;
    OP_REQUIRES_OK(ctx, ToTfStatus(t->Export([&](int64_t n, int64_t** keys, float** values,
                                                 float** slots) -> Status {
                     Tensor* values_out;
                     Tensor* slots_out;
                     auto s = ctx->allocate_output(0, TensorShape({n}), &keys_out);
                     if (s.ok()) s = ctx->allocate_output(1, TensorShape({n, dim}), &values_out);
                     // [num_slots, n, slot_width]: a row-wise optimizer's slots are 1 float per
                     // row.
                     if (s.ok()) {
                       s = ctx->allocate_output(
                           2, TensorShape({t->num_slots(), n, t->slot_width()}), &slots_out);
                     }
                     if (!s.ok()) return Status::ResourceExhausted(std::string(s.message()));
                     if (int32_keys) {
                       wide_keys.resize(n);
                       *keys = wide_keys.data();
                     } else {
                       *keys = reinterpret_cast<int64_t*>(keys_out->flat<int64_t>().data());
                     }
                     *values = values_out->flat<float>().data();
                     *slots = slots_out->flat<float>().data();
                     return Status::Ok();
                   })));
    if (int32_keys) {
      auto flat = keys_out->flat<int32_t>();
      for (size_t i = 0; i < wide_keys.size(); ++i) flat(i) = static_cast<int32_t>(wide_keys[i]);
    }
  }

 private:
  int64_t dim_;
  tensorflow::DataType key_dtype_;
};

class TableExportAccessOp : public TableOpKernel {
 public:
  explicit TableExportAccessOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kReadsTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    std::vector<int64_t> columns[3];
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(table->table()->ExportAccess(&columns[0], &columns[1], &columns[2])));
    for (int i = 0; i < 3; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              i, TensorShape({static_cast<int64_t>(columns[i].size())}), &out));
      std::copy(columns[i].begin(), columns[i].end(), out->flat<int64_t>().data());
    }
  }
};

class TableImportAccessOp : public TableOpKernel {
 public:
  explicit TableImportAccessOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& last_seen = ctx->input(2);
    const Tensor& counts = ctx->input(3);
    OP_REQUIRES(
        ctx,
        keys.dims() == 1 && last_seen.shape() == keys.shape() && counts.shape() == keys.shape(),
        errors::InvalidArgument("access statistics of table '", table->table()->name(),
                                "': keys, last_seen and counts must be vectors of one "
                                "length, got shapes ",
                                keys.shape().DebugString(), ", ", last_seen.shape().DebugString(),
                                " and ", counts.shape().DebugString()));
    OP_REQUIRES_OK(ctx, ToTfStatus(table->table()->ImportAccess(
                            keys.flat<int64_t>().data(), last_seen.flat<int64_t>().data(),
                            counts.flat<int64_t>().data(), keys.NumElements())));
  }
};

class TableImportOp : public TableOpKernel {
 public:
  explicit TableImportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx, kWritesTable) {}

  void ComputeWithTable(OpKernelContext* ctx, TableResource* table) override {
    EmbeddingTable* t = table->table();
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    OP_REQUIRES(
        ctx, keys.dims() == 1,
        errors::InvalidArgument("import keys of table '", t->name(),
                                "' must be a vector, got shape ", keys.shape().DebugString()));
    OP_REQUIRES_OK(ctx, CheckRowsShape("import values", values, keys.shape(), t));
    const int64_t n = keys.NumElements();
    const bool has_slots = slots.NumElements() > 0;
    OP_REQUIRES(ctx,
                !has_slots || (slots.dims() == 3 && slots.dim_size(1) == n &&
                               (slots.dim_size(2) == t->dim() || slots.dim_size(2) == 1)),
                errors::InvalidArgument("import slots of table '", t->name(),
                                        "' must have shape [num_slots, ", n, ", ", t->dim(),
                                        "] (or [num_slots, ", n,
                                        ", 1] for a row-wise "
                                        "optimizer's), got ",
                                        slots.shape().DebugString()));
    std::vector<int64_t> scratch;
    const int64_t* key_data;
    OP_REQUIRES_OK(ctx, KeysAsInt64(keys, table, &scratch, &key_data));
    OP_REQUIRES_OK(ctx, ToTfStatus(t->Import(key_data, values.flat<float>().data(),
                                             has_slots ? slots.flat<float>().data() : nullptr,
                                             has_slots ? static_cast<int>(slots.dim_size(0)) : 0, n,
                                             has_slots ? static_cast<int>(slots.dim_size(2)) : 0)));
  }
};

REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(EmbeddingTable)).Device(DEVICE_CPU), EmbeddingTableOp);
REC_SDK_REGISTER_KEYED(TableFindOrInsert, TableFindOrInsertOp<false>);
REC_SDK_REGISTER_KEYED(TableFindOrInsertRows, TableFindOrInsertOp<true>);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableGather)).Device(DEVICE_CPU), TableGatherOp);
REC_SDK_REGISTER_KEYED(TableLookup, TableLookupOp);
REC_SDK_REGISTER_KEYED(TableUpsert, TableUpsertOp);
REC_SDK_REGISTER_KEYED(TableRemove, TableRemoveOp);
REC_SDK_REGISTER_KEYED(TablePrefetchCold, TablePrefetchColdOp);
REC_SDK_REGISTER_KEYED(TablePrefetchColdByName, TablePrefetchColdByNameOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableSize)).Device(DEVICE_CPU), TableSizeOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableCapacity)).Device(DEVICE_CPU), TableSizeOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableClear)).Device(DEVICE_CPU), TableClearOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableStats)).Device(DEVICE_CPU), TableStatsOp);
REC_SDK_REGISTER_KEYED(TableExport, TableExportOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableExportAccess)).Device(DEVICE_CPU),
                        TableExportAccessOp);
REGISTER_KERNEL_BUILDER(Name(REC_SDK_OP_NAME(TableImportAccess)).Device(DEVICE_CPU),
                        TableImportAccessOp);
REC_SDK_REGISTER_KEYED(TableImport, TableImportOp);

}  // namespace rec_sdk

// A C entry point (ctypes, rec_sdk/ops/loader.py): whether index layout `layout` may serve a
// table with (`tiered` != 0) or without an SSD tier, by the core's rule (CheckIndexLayout).
// Returns 0 when it may; else 1, with the reason in `message` (NUL-terminated, cut to `size`).
extern "C" __attribute__((visibility("default"))) int rec_sdk_index_layout_error(const char* layout,
                                                                                 int tiered,
                                                                                 char* message,
                                                                                 int size) {
  rec_sdk::TableConfig config;
  rec_sdk::Status status = layout == nullptr
                               ? rec_sdk::Status::InvalidArgument("index_layout must be a name")
                               : rec_sdk::IndexLayoutFromName(layout, &config.index_layout);
  if (status.ok() && tiered) config.ssd_paths.push_back("/");
  if (status.ok()) status = rec_sdk::CheckIndexLayout(config);
  if (status.ok()) return 0;
  if (message != nullptr && size > 0) {
    const std::string text = status.message();
    const size_t n = std::min(text.size(), static_cast<size_t>(size - 1));
    text.copy(message, n);
    message[n] = '\0';
  }
  return 1;
}

// A C entry point of the op library (Python reaches it with ctypes, see
// rec_sdk/ops/loader.py): the size and capacity of the table named `name` that a session of
// this process created last and still holds. Returns 1 and sets both, or 0 when no session
// holds such a table. The SDK's table.size() / capacity() return Python ints this way, with no
// op added to the user's graph and no session needed.
extern "C" __attribute__((visibility("default"))) int rec_sdk_table_size(const char* name,
                                                                         int64_t* size,
                                                                         int64_t* capacity) {
  if (name == nullptr || size == nullptr || capacity == nullptr) return 0;
  return rec_sdk::TableResource::LiveSizeOf(name, size, capacity) ? 1 : 0;
}
