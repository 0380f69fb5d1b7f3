// Op definitions of the embedding table (kernels/table_kernels.cc): creation, key -> address,
// reads, writes, size and statistics, export and import.
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_ops/core/embedding_table.h"
#include "tf_ops/ops/op_prefix.h"

namespace rec_sdk {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

// values = keys.shape + [dim]
// Output `output` is rows of input 1 (keys or addresses): its shape + [dim].
absl::Status SetRowsOfInputShape(InferenceContext* c, int output) {
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(dim), &out));
  c->set_output(output, out);
  return absl::OkStatus();
}

absl::Status RowsOfInputShape(InferenceContext* c) { return SetRowsOfInputShape(c, 0); }

// Limits and names the Python package reads from the op definitions (their attributes'
// defaults), so that each is written once, in the core.
std::string StatNamesAttr() {
  std::string spec = "stat_names: list(string) = [";
  for (int i = 0; i < TableStats::kCount; ++i) {
    spec += std::string(i ? ", " : "") + "\"" + TableStats::kNames[i] + "\"";
  }
  return spec + "]";
}

std::string MaxDimAttr() { return "max_dim: int = " + std::to_string(EmbeddingTable::kMaxDim); }

// "attr: {'a', 'b'} = 'a'": a string attribute allowing the names of the core's `values`
// (the first is the default), so the op definition lists what the core accepts.
template <typename T, size_t N, typename NameOf>
std::string NamesAttr(const char* attr, const T (&values)[N], NameOf name_of) {
  std::string spec = std::string(attr) + ": {";
  for (size_t i = 0; i < N; ++i)
    spec += std::string(i ? ", " : "") + "'" + name_of(values[i]) + "'";
  return spec + "} = '" + name_of(values[0]) + "'";
}

}  // namespace

REGISTER_OP(REC_SDK_OP_NAME(EmbeddingTable))
    .Output("table: resource")
    .Attr("table_name: string")
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
    .Attr(NamesAttr("emb_dtype", kRowDtypes, RowDtypeName))
    .Attr(NamesAttr("slot_dtype", kSlotDtypes, RowDtypeName))
    .Attr(NamesAttr("index_layout", kIndexLayouts, IndexLayoutName))
    .Attr(MaxDimAttr())
    .Attr("dynamic_expansion: bool")
    .Attr("capacity: int >= 0")
    .Attr("initial_capacity: int >= 0 = 0")
    .Attr("initializer: string")
    .Attr("init_value: float = 0.0")
    .Attr("init_values: list(float) = []")
    .Attr("init_minval: float = 0.0")
    .Attr("init_maxval: float = 1.0")
    .Attr("init_mean: float = 0.0")
    .Attr("init_stddev: float = 1.0")
    .Attr("init_seed: int = 0")
    .Attr("init_scale: float = 1.0")
    .Attr("evict_when_full: bool = false")
    .Attr("track_changes: bool = false")
    .Attr("track_access: bool = false")
    .Attr("ssd_paths: list(string) = []")
    .Attr("ssd_rows: int >= 0 = 0")
    .Attr("ssd_direct_io: bool = false")
    .Attr("share: {'', 'reader', 'trainer'} = ''")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (on first run) or finds the embedding table `shared_name` and returns its handle.
New rows are initialised from the described initializer: constant (init_value),
random_uniform (init_minval, init_maxval), random_normal or truncated_normal (init_mean,
init_stddev), each scaled by init_scale and deterministic for a given init_seed and key.
evict_when_full lets a fixed-capacity table evict its least recently seen rows instead of
failing when full. With ssd_paths (a fixed-capacity table), `capacity` rows stay in memory and
the least recently used rows move to record files in those directories, at most ssd_rows of
them (0: no bound), read and written with O_DIRECT when ssd_direct_io. index_layout: the
hash index's entries, "full" (16 bytes: key and row), "compact" (8 bytes: the key is read back
from the row; not with ssd_paths) or "auto" (compact for bfloat16 and float16 rows, full
otherwise). A second handle of an existing table must ask for the same configuration
(InvalidArgument naming each differing field otherwise). Admission and eviction thresholds
are set by TableConfigureAdmission.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableFindOrInsert))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("counts: int64")
    .Input("times: int64")
    .Output("addresses: int64")
    .Attr("key_dtype: {int32, int64}")
    .Attr("is_train: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Maps keys (any shape) to row addresses. With is_train, absent keys get a new row (once their
admission count reaches the table's access threshold, if it has one); in eval they map to -1
and nothing changes. counts: per key, how much its admission count grows (shape of keys, or
empty for 1 each). times: the clock of each key (shape of keys), one clock for all (one
element), or none (empty: the table's own tick), for eviction.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableFindOrInsertRows))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("counts: int64")
    .Input("times: int64")
    .Output("addresses: int64")
    .Output("values: float")
    .Attr("key_dtype: {int32, int64}")
    .Attr("is_train: bool")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return SetRowsOfInputShape(c, 1);
    })
    .Doc(R"doc(
TableFindOrInsert and TableGather of its addresses in one op: the rows (keys.shape + [dim];
-1 addresses give zeros) are copied in the same hold of the table as the keys are placed.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableStats))
    .Input("table: resource")
    .Output("stats: int64")
    .Attr(StatNamesAttr())
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(TableStats::kCount));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The table's counters, in the order the stat_names attribute lists them (its default; not
meant to be set): size, capacity, admitted, rejected, evicted, pending, newest_clock.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableGather))
    .Input("table: resource")
    .Input("addresses: int64")
    .Output("values: float")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(RowsOfInputShape)
    .Doc("Reads the rows at addresses (any shape) -> addresses.shape + [dim]; -1 gives zeros.");

REGISTER_OP(REC_SDK_OP_NAME(TableLookup))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Output("values: float")
    .Output("exists: bool")
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
    .Attr("init_missing: bool = false")
    .Attr("slot: int >= -1 = -1")
    .Attr("slot_default: float = 0.0")
    .Attr("slot_optimizer: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsOfInputShape(c));
      c->set_output(1, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Reads the embeddings of keys without inserting. Absent keys give zeros, or with init_missing
the values the initializer would give them; `exists` tells which keys are stored. slot >= 0
reads that optimizer slot instead (absent keys: zeros, or with init_missing its initial value;
every key reads slot_default while no optimizer has attached slots); slot_optimizer, when set,
must be the optimizer that owns the table's slots.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableUpsert))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: float")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Inserts or overwrites the embeddings of keys with values (keys.shape + [dim]).");

REGISTER_OP(REC_SDK_OP_NAME(TableRemove))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Output("removed: int64")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Removes keys (absent keys are ignored) and returns how many were removed.");

REGISTER_OP(REC_SDK_OP_NAME(TablePrefetchCold))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Output("read: int64")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Reads the SSD records of `keys` ahead of the training lookup that will bring them into memory
(run it on the next batch's keys while the current batch trains); returns how many records
it read. Does nothing for a table without an SSD tier.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TablePrefetchColdByName))
    .Input("keys: key_dtype")
    .Output("read: int64")
    .Attr("key_dtype: {int32, int64}")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
TablePrefetchCold of the table `shared_name` (none when it does not exist yet), for tf.data
functions, which cannot capture the table op.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableSize))
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Number of keys stored in the table.");

REGISTER_OP(REC_SDK_OP_NAME(TableCapacity))
    .Input("table: resource")
    .Output("capacity: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(
        "Rows the table holds without allocating: its fixed capacity, or in dynamic-expansion "
        "mode the rows allocated so far.");

REGISTER_OP(REC_SDK_OP_NAME(TableClear))
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Removes every key.");

REGISTER_OP(REC_SDK_OP_NAME(TableExportAccess))
    .Input("table: resource")
    .Output("keys: int64")
    .Output("last_seen: int64")
    .Output("counts: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle n = c->UnknownDim();
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Every stored key (as int64) with its last-seen clock and access count (counted when the table
tracks accesses): the status restrict policies rank keys by.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableImportAccess))
    .Input("table: resource")
    .Input("keys: int64")
    .Input("last_seen: int64")
    .Input("counts: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Gives the stored keys among keys [n] the last-seen clocks and access counts of an earlier
TableExportAccess (absent keys are skipped) and raises the table's clock to the newest of
them. InvalidArgument for a negative clock or count, or vectors of different lengths.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableExport))
    .Input("table: resource")
    .Output("keys: key_dtype")
    .Output("values: float")
    .Output("slots: float")
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, dim));
      // Slots are dim floats per row, or 1 for a row-wise optimizer's.
      c->set_output(2, c->MakeShape({c->UnknownDim(), n, c->UnknownDim()}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Returns every stored row: keys [n], values [n, dim] and the optimizer slots
[num_slots, n, dim] ([num_slots, n, 1] for a row-wise optimizer's), in row order.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableImport))
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: float")
    .Input("slots: float")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Replaces the table's contents with keys [n], values [n, dim] and slots [num_slots, n, dim]
(num_slots may be 0: slots then start from their initial values).
)doc");

}  // namespace rec_sdk
