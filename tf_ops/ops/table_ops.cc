// Op definitions of the embedding table: creation, key -> address, reads, writes, export.
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
absl::Status RowsOfInputShape(InferenceContext* c) {
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(dim), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

// Limits and names the Python package reads from the op definitions (their attributes'
// defaults), so that each is written once, in the core.
std::string StatNamesAttr() {
  std::string spec = "stat_names: list(string) = [";
  for (int i = 0; i < TableStats::kCount; ++i) {
    spec += std::string(i ? ", " : "") + "\"" + TableStats::kNames[i] + "\"";
  }
  return spec + "]";
}

std::string MaxDimAttr() {
  return "max_dim: int = " + std::to_string(EmbeddingTable::kMaxDim);
}

}  // namespace

REGISTER_OP(REC_SDK_OP_NAME(EmbeddingTable))
    .Output("table: resource")
    .Attr("table_name: string")
    .Attr("key_dtype: {int32, int64}")
    .Attr("dim: int >= 1")
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
them (0: no bound), read and written with O_DIRECT when ssd_direct_io. A second handle of an
existing table must ask for the same configuration (InvalidArgument naming each differing
field otherwise). Admission and eviction thresholds
are set by TableConfigureAdmission.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(UniqueKeys))
    .Input("keys: T")
    .Output("unique: T")
    .Output("inverse: int32")
    .Attr("T: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, keys);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Deduplicates a vector of keys in parallel: unique[inverse[i]] == keys[i]. Unique keys are
grouped by hash shard (deterministic for a given input), not sorted.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(KeyAccessStats))
    .Input("inverse: int32")
    .Input("num_unique: int32")
    .Input("weights: int64")
    .Input("sample_times: int64")
    .Output("counts: int64")
    .Output("newest: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle inverse;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &inverse));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per unique key of a deduplicated lookup (inverse from UniqueKeys, in the ids' shape): counts[u]
= sum of the weights of its ids (weights: one scalar for all ids, or one per id in row-major
order), and, when sample_times is not empty, newest[u] = the newest timestamp of the samples
it appears in. A sample is a slice of the ids' leading dimension: sample_times has one value
per sample, or one for all (InvalidArgument naming both counts otherwise). newest is empty
without sample_times.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(GatherRowsByIndex))
    .Input("values: float")
    .Input("index: int32")
    .Output("rows: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, index;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
      c->set_output(0, c->Matrix(c->Dim(index, 0), c->Dim(values, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
rows[i] = values[index[i]]: spreads the rows of a deduplicated lookup over the id positions,
in parallel. Its gradient is SumRowsByIndex.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(SumRowsByIndex))
    .Input("values: float")
    .Input("index: int32")
    .Input("num_rows: int32")
    .Output("sums: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(values, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
sums[r] = sum of values[i] over i with index[i] == r, for r in [0, num_rows): the gradient of
gathering rows by `index`, summed in parallel.
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

REGISTER_OP(REC_SDK_OP_NAME(TableConfigureAdmission))
    .Input("table: resource")
    .Output("configured: resource")
    .Attr("access_threshold: int >= -1 = -1")
    .Attr("eviction_threshold: int >= -1 = -1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Gives the table its admission and eviction thresholds (-1: off; eviction_threshold in clock
units) and forwards its handle: the ops that read the thresholds (training TableFindOrInsert,
TableEvict, TableSetAccessThreshold) take `configured` as their table, so they always run
after it. The first run sets the thresholds; later runs with the same values change nothing
(an access threshold changed by TableSetAccessThreshold stays); other values fail with
InvalidArgument naming the table and each differing threshold with both values.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableSetAccessThreshold))
    .Input("table: resource")
    .Input("threshold: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Sets the admission threshold of the table for later lookups (-1 turns admission off).
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableTrackAccess))
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Makes the table keep access counts and last-seen clocks current from now on, as a table
created with track_access does (a restrict policy given to a variable after it was created).
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableEvict))
    .Input("table: resource")
    .Output("rows_evicted: int64")
    .Output("pending_evicted: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Evicts the rows and pending admission counts whose last-seen clock is at least the table's
eviction threshold older than the newest clock it has seen.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TrainableRows))
    .Input("trainable: resource")
    .Input("rows: float")
    .Output("values: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Returns rows unchanged. Its registered gradient sends the rows' gradient to `trainable` (the
handle of a dynamic_embedding lookup's trainable) as IndexedSlices, so that stock
optimizers' compute_gradients find it; the resource is never read.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableRestrict))
    .Input("table: resource")
    .Input("num_reserved: int64")
    .Output("removed: int64")
    .Attr("by: {'last_seen', 'count'}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Keeps the num_reserved rows seen most recently (by last_seen) or most often (by count; the
table needs track_access) and removes the others with their slots; returns how many went.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableSave))
    .Input("table: resource")
    .Input("directory: string")
    .Input("delta: bool")
    .Output("rows: int64")
    .Output("save_id: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Streams the table (rows, slots, admission counts, clocks, pending keys) into `directory`, which
must not exist, with a checksummed meta.txt written last (see tf_ops/core/checkpoint.h).
With delta (tables created with track_changes), only what changed since the last committed
save. Run TableCommitSave with save_id once the files are durable.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableCommitSave))
    .Input("table: resource")
    .Input("save_id: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Marks the save `save_id` (from TableSave) complete: later deltas are relative to it.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableApplyDelta))
    .Input("table: resource")
    .Input("directory: string")
    .Output("rows: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Applies a delta checkpoint directory onto the table, which must hold the checkpoint the delta
follows.
)doc");

REGISTER_OP(REC_SDK_OP_NAME(TableRestore))
    .Input("table: resource")
    .Input("directories: string")
    .Input("rank_id: int64")
    .Input("rank_size: int64")
    .Output("rows: int64")
    .Output("note: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Replaces the table's contents with the rows saved in `directories` (one per rank that saved)
whose key satisfies abs(key % rank_size) == rank_id. Checks metadata, sizes and checksums;
on an error the table is left empty. note says what happened to optimizer slots.
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
    .Doc("Rows the table holds without allocating: its fixed capacity, or in dynamic-expansion "
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
