"""Thin wrappers over the table ops (tf_ops/ops/table_ops.cc) and the gradient of a gather.

Arguments are checked by the public API (rec_sdk.core.embedding); these functions only build
the ops.
"""

import functools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import op_def_registry

from rec_sdk.base import tf_patches
from rec_sdk.base.graph_state import state_of
from rec_sdk.ops.loader import OP_NAMESPACE, load_ops

GATHER_OP = OP_NAMESPACE + ">TableGather"
FIND_OR_INSERT_OP = OP_NAMESPACE + ">TableFindOrInsert"
FIND_OR_INSERT_ROWS_OP = OP_NAMESPACE + ">TableFindOrInsertRows"
# The ops whose output 0 is the row addresses of keys.
ADDRESS_OPS = (FIND_OR_INSERT_OP, FIND_OR_INSERT_ROWS_OP)
CONFIGURE_ADMISSION_OP = OP_NAMESPACE + ">TableConfigureAdmission"
UNIQUE_OP = OP_NAMESPACE + ">UniqueKeys"
TRAINABLE_ROWS_OP = OP_NAMESPACE + ">TrainableRows"
RESTORE_OP = OP_NAMESPACE + ">TableRestore"


def create_table(
    table_name,
    key_dtype,
    dim,
    dynamic_expansion,
    capacity,
    initializer,
    initial_capacity=0,
    evict_when_full=False,
    track_changes=False,
    track_access=False,
    shared_name=None,
    ssd_paths=(),
    ssd_rows=0,
    ssd_direct_io=False,
    emb_dtype="float32",
    slot_dtype="float32",
    index_layout="auto",
):
    """Builds the op that creates (on first run) the table and returns its resource handle.

    `initializer` is a dict from rec_sdk.tables.initializer_spec.describe_initializer. Admission
    and eviction thresholds are set by configure_admission. With ssd_paths (a fixed-capacity
    table), `capacity` rows stay in memory and the others go to files there (ssd_rows at
    most, 0: no bound; with ssd_direct_io they bypass the page cache). emb_dtype: the element
    type the rows store their embeddings in ("float32", "bfloat16", "float16"); slot_dtype:
    their optimizer slots of dim values ("float32", "bfloat16"); index_layout: the hash
    index's entries ("auto", "full", "compact"; see TableSpec).
    """
    return load_ops().rec_sdk_embedding_table(
        table_name=table_name,
        key_dtype=key_dtype,
        dim=dim,
        emb_dtype=emb_dtype,
        slot_dtype=slot_dtype,
        dynamic_expansion=dynamic_expansion,
        capacity=capacity,
        initial_capacity=initial_capacity,
        initializer=initializer["kind"],
        init_value=initializer["value"],
        init_values=initializer.get("values", []),
        init_minval=initializer["minval"],
        init_maxval=initializer["maxval"],
        init_mean=initializer["mean"],
        init_stddev=initializer["stddev"],
        init_seed=initializer["seed"],
        init_scale=initializer["scale"],
        evict_when_full=evict_when_full,
        track_changes=track_changes,
        track_access=track_access,
        ssd_paths=list(ssd_paths),
        ssd_rows=ssd_rows,
        ssd_direct_io=ssd_direct_io,
        index_layout=index_layout,
        shared_name=shared_name or table_name,
        name=op_scope_name(table_name + "_handle"),
    )


def op_scope_name(name):
    """`name` made valid as a TensorFlow op or scope name at the graph root (which may not
    start with '_'): table names may."""
    return name if not name.startswith("_") else "rec_sdk" + name


def set_share_attr(handle, share):
    """How the table may share its storage with other sessions of the process ("": never,
    "reader": a graph that only reads it, "trainer": a graph that trains it); see
    TableResource in tf_ops/kernels/table_resource.h. Graph construction only."""
    tf_patches.set_op_attr(handle.op, "share", attr_value_pb2.AttrValue(s=share.encode()))


def configure_admission(table, access_threshold, eviction_threshold, name=None):
    """Gives the table its admission and eviction thresholds (-1: off) and returns its handle
    for the ops that read them (training find_or_insert, evict, set_access_threshold): the
    first run sets them, a later run with other values fails."""
    return load_ops().rec_sdk_table_configure_admission(
        table, access_threshold=access_threshold, eviction_threshold=eviction_threshold, name=name
    )


def _empty_int64():
    return tf.zeros([0], tf.int64)


def find_or_insert(table, keys, is_train, counts=None, times=None, name=None):
    """keys (any shape) -> int64 row addresses; eval (is_train=False) never inserts (-1).
    A training find takes the table handle that configure_admission returns.

    counts (int64, keys' shape): how much each key's admission count grows (default 1 each);
    times (int64, keys' shape or one element): the clock each key is seen with, for eviction
    (default: the table's own tick).
    """
    counts = _empty_int64() if counts is None else tf.cast(counts, tf.int64)
    times = _empty_int64() if times is None else tf.reshape(tf.cast(times, tf.int64), [-1])
    return load_ops().rec_sdk_table_find_or_insert(
        table, keys, counts, times, is_train=is_train, name=name
    )


def find_or_insert_rows(table, keys, is_train, dim, counts=None, times=None, name=None):
    """find_or_insert and gather of its addresses in one op (the rows are copied where the
    keys are placed): -> (addresses, rows of keys.shape + [dim]); gradients of the rows go to
    the table as those of gather do."""
    counts = _empty_int64() if counts is None else tf.cast(counts, tf.int64)
    times = _empty_int64() if times is None else tf.reshape(tf.cast(times, tf.int64), [-1])
    return load_ops().rec_sdk_table_find_or_insert_rows(
        table, keys, counts, times, is_train=is_train, dim=dim, name=name
    )


def set_access_threshold(table, threshold, name=None):
    return load_ops().rec_sdk_table_set_access_threshold(
        table, tf.cast(threshold, tf.int64), name=name
    )


def track_access(table, name=None):
    """Op making the table keep access counts and last-seen clocks from now on."""
    return load_ops().rec_sdk_table_track_access(table, name=name)


def evict(table, name=None):
    """-> (rows evicted, pending counts evicted), int64 scalars."""
    return load_ops().rec_sdk_table_evict(table, name=name)


def save(table, directory, delta=False, name=None):
    """Streams the table (or with delta, its changes since the last committed save) into
    `directory` (must not exist); -> (rows written, save id for commit_save)."""
    return load_ops().rec_sdk_table_save(table, directory, delta, name=name)


def commit_save(table, save_id, name=None):
    """Marks a save durable: later deltas are relative to it."""
    return load_ops().rec_sdk_table_commit_save(table, save_id, name=name)


def apply_delta(table, directory, name=None):
    """Applies a delta checkpoint directory onto the table; -> rows written."""
    return load_ops().rec_sdk_table_apply_delta(table, directory, name=name)


def restore(table, directories, rank_id, rank_size, name=None):
    """Replaces the table's contents from checkpoint table directories; -> (rows, note)."""
    return load_ops().rec_sdk_table_restore(table, directories, rank_id, rank_size, name=name)


def _attr_def(op_name, attr):
    """The definition of an attribute of one of the library's ops: how the core's limits and
    names reach Python (written once, in C++)."""
    load_ops()
    for item in op_def_registry.get(op_name).attr:
        if item.name == attr:
            return item
    raise KeyError("op %s has no attribute %r" % (op_name, attr))


@functools.lru_cache(maxsize=None)
def stat_names():
    """The names of the counters RecSdk>TableStats returns, in its order."""
    return tuple(
        n.decode() for n in _attr_def("RecSdk>TableStats", "stat_names").default_value.list.s
    )


@functools.lru_cache(maxsize=None)
def allowed_values(attr, op_name="RecSdk>EmbeddingTable"):
    """The values a string attribute of one of the library's ops allows, in the order the op
    definition lists them (the first is its default)."""
    return tuple(v.decode() for v in _attr_def(op_name, attr).allowed_values.list.s)


@functools.lru_cache(maxsize=None)
def max_dim():
    """The largest embedding dim a table may have."""
    return int(_attr_def("RecSdk>EmbeddingTable", "max_dim").default_value.i)


def stats(table, name=None):
    """int64 vector of the counters named by stat_names()."""
    return load_ops().rec_sdk_table_stats(table, name=name)


def gather(table, addresses, dim, name=None):
    """addresses (any shape) -> addresses.shape + [dim] float32; -1 gives zeros."""
    return load_ops().rec_sdk_table_gather(table, addresses, dim=dim, name=name)


def lookup(
    table, keys, dim, init_missing=False, slot=-1, slot_default=0.0, slot_optimizer="", name=None
):
    """keys -> (values, exists) without inserting; slot >= 0 reads that optimizer slot
    (slot_default before any optimizer attached slots; slot_optimizer: the owner it must
    have)."""
    return load_ops().rec_sdk_table_lookup(
        table,
        keys,
        dim=dim,
        init_missing=init_missing,
        slot=slot,
        slot_default=slot_default,
        slot_optimizer=slot_optimizer,
        name=name,
    )


def upsert(table, keys, values, name=None):
    return load_ops().rec_sdk_table_upsert(table, keys, values, name=name)


def remove(table, keys, name=None):
    return load_ops().rec_sdk_table_remove(table, keys, name=name)


def prefetch_cold(table, keys, name=None):
    """Op reading the SSD records of `keys` ahead of their training lookup (a tiered table;
    otherwise it does nothing); returns how many records it read."""
    return load_ops().rec_sdk_table_prefetch_cold(table, keys, name=name)


def prefetch_cold_by_name(shared_name, keys, name=None):
    """prefetch_cold of the table `shared_name` found at run time (inside tf.data, which
    cannot capture the table op); reads nothing while the table does not exist."""
    return load_ops().rec_sdk_table_prefetch_cold_by_name(keys, shared_name=shared_name, name=name)


def size(table, name=None):
    return load_ops().rec_sdk_table_size(table, name=name)


def capacity(table, name=None):
    return load_ops().rec_sdk_table_capacity(table, name=name)


def clear(table, name=None):
    return load_ops().rec_sdk_table_clear(table, name=name)


def export(table, key_dtype, dim, name=None):
    """-> (keys [n], values [n, dim], slots [num_slots, n, dim])."""
    return load_ops().rec_sdk_table_export(table, key_dtype=key_dtype, dim=dim, name=name)


def import_access(table, keys, last_seen, counts, name=None):
    """Op giving the stored keys among `keys` (int64) these last-seen clocks and access
    counts (an export_access of an earlier table) and moving the table's clock past them."""
    return load_ops().rec_sdk_table_import_access(table, keys, last_seen, counts, name=name)


def export_access(table, name=None):
    """-> (keys [n] as int64, last-seen clocks [n], access counts [n]) of the stored keys."""
    return load_ops().rec_sdk_table_export_access(table, name=name)


def restrict(table, num_reserved, by, name=None):
    """Keeps the num_reserved rows seen last (by="last_seen") or most often (by="count");
    -> rows removed."""
    return load_ops().rec_sdk_table_restrict(
        table, tf.cast(num_reserved, tf.int64), by=by, name=name
    )


def trainable_rows(trainable, rows, keys=None, name=None):
    """rows, whose gradient goes to the resource `trainable` as IndexedSlices (see
    _trainable_rows_grad) over the rows' positions, or with `keys` (graph mode) over those
    keys: the gradient then says which keys its rows belong to."""
    out = load_ops().rec_sdk_trainable_rows(trainable, rows, name=name)
    if keys is not None and not tf.executing_eagerly():
        state = state_of(out.graph)
        with state.lock:
            state.gradient_keys[out.name] = keys
    return out


def import_rows(table, keys, values, slots, name=None):
    return load_ops().rec_sdk_table_import(table, keys, values, slots, name=name)


def unique_keys(keys, name=None):
    """keys [n] (int32/int64) -> (unique, inverse int32) with unique[inverse] == keys.

    rec_sdk's one dedup (a parallel C++ kernel): lookups use it on keys, optimizers on row
    addresses (dedup_rows).
    """
    return load_ops().rec_sdk_unique_keys(keys, name=name)


def key_access_stats(inverse, num_unique, weights=1, sample_times=None, name=None):
    """-> (counts [num_unique], newest [num_unique] or [0]) for a deduplicated lookup:
    counts[u] sums the weights (one int, or one per id) of the ids of unique key u; newest[u]
    is the newest of sample_times (one per sample: `inverse` has the ids' shape and its
    leading dimension is the sample; one value for every id; or None) of the samples u
    appears in. Another number of timestamps fails when the op runs."""
    sample_times = (
        tf.zeros([0], tf.int64)
        if sample_times is None
        else tf.reshape(tf.cast(sample_times, tf.int64), [-1])
    )
    inverse = tf.convert_to_tensor(inverse)
    if inverse.shape.rank == 0:
        inverse = tf.reshape(inverse, [1])
    return load_ops().rec_sdk_key_access_stats(
        inverse, tf.cast(num_unique, tf.int32), tf.cast(weights, tf.int64), sample_times, name=name
    )


def gather_rows(values, index, name=None):
    """rows[i] = values[index[i]] (values [u, dim], index int32 [n]) in parallel C++; its
    gradient is sum_rows, a dense [u, dim] tensor. Rows of other dtypes than float32 (de
    variables of other value dtypes): tf.gather."""
    values = tf.convert_to_tensor(values)
    if values.dtype != tf.float32:
        return tf.gather(values, index, name=name)
    return load_ops().rec_sdk_gather_rows_by_index(values, index, name=name)


def sum_rows(values, index, num_rows, name=None):
    """sums[r] = sum of values[i] with index[i] == r ([num_rows, dim]); the parallel C++
    replacement of tf.math.unsorted_segment_sum for the backward pass of lookups."""
    return load_ops().rec_sdk_sum_rows_by_index(
        values, index, tf.cast(num_rows, tf.int32), name=name
    )


def pack_rows(values, width, name=None):
    """Blocks of rows of different widths (a list of [n_i, d_i] matrices or [n_i] vectors, all
    float32 or all int64, d_i <= width) -> (packed [sum n_i, width], zero-padded, sizes int32
    [len(values)]): one op however many blocks (split_rows undoes it)."""
    return load_ops().rec_sdk_pack_rows(list(values), width=int(width), name=name)


def split_rows(packed, sizes, dims, name=None):
    """Undoes pack_rows: -> a list of sizes[i] rows of `packed` each, their first dims[i]
    columns (dims[i] == 0: the first column as a vector). One op."""
    dims = [int(d) for d in dims]
    return load_ops().rec_sdk_split_rows(packed, sizes, N=len(dims), dims=dims, name=name)


# The process-wide count of finished update steps of tables sharded over ranks.
RANK_STEPS_COUNTER = "rec_sdk_rank_updates"


def rank_step_done(name=None):
    """Op adding one to this process's count of finished update steps over ranks."""
    return load_ops().rec_sdk_rank_step_done(counter=RANK_STEPS_COUNTER, name=name)


def rank_steps(name=None):
    """This process's count of finished update steps over ranks (int64 scalar)."""
    return load_ops().rec_sdk_rank_steps(counter=RANK_STEPS_COUNTER, name=name)


def rank_wait_for_steps(target, name=None):
    """Op finishing once this process's count of finished update steps reaches `target`."""
    return load_ops().rec_sdk_rank_wait_for_steps(target, counter=RANK_STEPS_COUNTER, name=name)


# The size classes of the exchanges over ranks: class i holds (4 + i % 4) << (i / 4) rows
# (tf_ops/core/size_class.h's kSizeClasses; tests/test_rank_batches.py checks they agree).
SIZE_CLASSES = 116


def size_class_rows(index):
    """The rows size class `index` holds (for models and tests; the graph asks the ops)."""
    return (4 + index % 4) << (index // 4)


def size_class_of(rows):
    """The smallest size class holding `rows` rows (as RankObserveSize computes it)."""
    index = 0
    while size_class_rows(index) < rows:
        index += 1
    return index


def rank_size_class(hint, name=None):
    """The size class (index, rows: int32 scalars) this process's hint named `hint` holds."""
    return tuple(load_ops().rec_sdk_rank_size_class(hint=hint, name=name))


def rank_observe_size(need, hint, name=None):
    """Records a step's largest need (rows, the same on every rank) in the hint named `hint`;
    -> the smallest size class holding it (index, rows: int32 scalars)."""
    return tuple(
        load_ops().rec_sdk_rank_observe_size(tf.cast(need, tf.int64), hint=hint, name=name)
    )


# The steps' headers (tf_ops/core/step_header.h; tests/test_step_headers.py checks these agree
# with the kernels): the process-wide record of a process's steps, the phases a header
# carries, and the collective instance key of the first position in a step's plan.
STEP_HEADERS = "rec_sdk_steps"
PHASE_TRAIN, PHASE_EVAL, PHASE_LEFT, PHASE_ENDED = 1, 2, 3, 4
PHASE_NAMES = {0: "unknown", 1: "train", 2: "eval", 3: "left", 4: "input ended"}
FIRST_HEADER_KEY = 1
MAX_PLAN_POSITIONS = 64


def rank_step_header(plan, need, has_data, batch, phase, restart, name=None):
    """This rank's header of batch `batch` in this step -> (collective instance key, header
    [8] int64, position in the plan): see the op's doc (RankStepHeader)."""
    return tuple(
        load_ops().rec_sdk_rank_step_header(
            plan,
            tf.cast(need, tf.int64),
            has_data,
            headers=STEP_HEADERS,
            batch=batch,
            phase=phase,
            restart=restart,
            name=name,
        )
    )


def rank_check_headers(gathered, position, name=None):
    """Checks the ranks' gathered headers -> the largest need (int64 scalar); fails the step
    (OutOfRange: a rank's input ended; FailedPrecondition: they differ) otherwise."""
    return load_ops().rec_sdk_rank_check_headers(
        gathered, position, headers=STEP_HEADERS, name=name
    )


def rank_leave_header(phase, restart, name=None):
    """The header [8] a rank sends when it leaves (phase PHASE_LEFT or PHASE_ENDED)."""
    return load_ops().rec_sdk_rank_leave_header(
        tf.cast(phase, tf.int64), headers=STEP_HEADERS, restart=restart, name=name
    )


def rank_header_activity(name=None):
    """What this process's steps are doing: [step, phase, began ms, checked ms (0: not yet),
    leave phase (0: none), now ms] int64."""
    return load_ops().rec_sdk_rank_header_activity(headers=STEP_HEADERS, name=name)


def dedup_rows(addresses, values):
    """Sums the rows of `values` [n, dim] that share an address; -> (unique addresses, sums).

    Optimizers call it so that each row is updated once per step with the sum of its
    gradients, however many lookups or positions its key came from.
    """
    unique, index = unique_keys(addresses)
    return unique, sum_rows(values, index, tf.size(unique))


def mark_keys_unique(keys):
    """Records that `keys` (e.g. from the input pipeline's dedup) hold no duplicates."""
    state = state_of(keys.graph)
    with state.lock:
        state.unique_keys.add(keys.name)


def addresses_are_unique(addresses):
    """True when `addresses` come from a find_or_insert of deduplicated keys (as sparse_lookup
    builds it), so its rows need no further deduplication."""
    op = addresses.op
    if op.type not in ADDRESS_OPS:
        return False
    keys = op.inputs[1]
    while keys.op.type == "Identity":
        keys = keys.op.inputs[0]
    if keys.name in state_of(keys.graph).unique_keys:
        return True
    return keys.op.type == UNIQUE_OP and keys.value_index == 0


@tf.RegisterGradient(GATHER_OP)
def _table_gather_grad(op, grad):
    """Gradient with respect to the table: IndexedSlices keyed by row address.

    This is what lets `tf.gradients(loss, table)` work (the SDK's non-expansion flow), like the
    gradient of ResourceGather on a resource variable. Addresses get no gradient.
    """
    return [_rows_gradient(op.get_attr("dim"), op.inputs[1], grad), None]


@tf.RegisterGradient(FIND_OR_INSERT_ROWS_OP)
def _table_find_or_insert_rows_grad(op, grad_addresses, grad):
    """As TableGather's, keyed by the op's own addresses; keys, counts and times get none."""
    del grad_addresses
    return [_rows_gradient(op.get_attr("dim"), op.outputs[0], grad), None, None, None]


def _rows_gradient(dim, addresses, grad):
    """IndexedSlices of the rows' gradient keyed by their addresses."""
    if addresses.shape.rank != 1:
        addresses = tf.reshape(addresses, [-1])
    if isinstance(grad, tf.IndexedSlices):
        # Sum the slices onto the gathered rows; cheaper than a dense conversion.
        values = sum_rows(
            tf.reshape(grad.values, [-1, dim]), tf.cast(grad.indices, tf.int32), tf.size(addresses)
        )
    else:
        values = tf.reshape(grad, [-1, dim])
    return tf.IndexedSlices(values, addresses)


@tf.RegisterGradient("RecSdk>GatherRowsByIndex")
def _gather_rows_grad(op, grad):
    values, index = op.inputs
    return [sum_rows(grad, index, tf.shape(values)[0]), None]


@tf.RegisterGradient(TRAINABLE_ROWS_OP)
def _trainable_rows_grad(op, grad):
    """IndexedSlices over the rows for the trainable (as ResourceGather gives a variable):
    row i of the gradient belongs to row i of the lookup."""
    rows = op.inputs[1]
    grad = tf.convert_to_tensor(grad)
    if not tf.executing_eagerly():
        out = op.outputs[0]  # (tapes hand a stand-in op without a graph or name)
        state = state_of(out.graph)
        with state.lock:
            keys = state.gradient_keys.get(out.name)
        if keys is not None:
            # The rows' keys themselves (see trainable_rows): the optimizer reads them from
            # the gradient, not from the trainable, which other workers' steps share.
            return [tf.IndexedSlices(grad, keys, tf.shape(rows, out_type=keys.dtype)), None]
    positions = tf.range(tf.shape(rows)[0])
    if not tf.executing_eagerly():
        # Lets the optimizer skip re-summing slices whose indices are exactly these positions.
        state = state_of(positions.graph)
        with state.lock:
            state.row_ranges.add(positions.op.name)
    return [tf.IndexedSlices(grad, positions, tf.shape(rows)), None]


tf.no_gradient(FIND_OR_INSERT_OP)
tf.no_gradient(UNIQUE_OP)


@tf.RegisterGradient(CONFIGURE_ADMISSION_OP)
def _configure_admission_grad(op, grad):
    """The configured handle is the table: a training lookup's rows (TableFindOrInsertRows on
    that handle) pass their gradient on to the table handle."""
    del op
    return [grad]


for _op in (
    "RecSdk>TableSetAccessThreshold",
    "RecSdk>TableEvict",
    "RecSdk>TableTrackAccess",
    "RecSdk>TableStats",
    "RecSdk>KeyAccessStats",
    "RecSdk>TableSave",
    "RecSdk>TableRestore",
    "RecSdk>TableApplyDelta",
    "RecSdk>TableCommitSave",
    "RecSdk>TableRestrict",
    "RecSdk>TableLookup",
    "RecSdk>TableExport",
    "RecSdk>TableImportAccess",
):
    tf.no_gradient(_op)
tf.no_gradient("RecSdk>SumRowsByIndex")
