"""The table object: `SparseEmbedding` (what `create_table` returns and what a de.Variable's
shards are) and where a graph's tables are found (`tables_of_graph`, `table_of`).

A SparseEmbedding is made from a TableSpec (rec_sdk.tables.table_spec), which it never changes,
by `create`; it owns its handle op, its checkpoint ops (rec_sdk.tables.checkpoint_ops) and the
thresholds its lookups configured; what the lookups did is recorded in the graph's GraphState
(`table.lookups`).
"""

import threading

import tensorflow as tf
from tensorflow.core.framework.attr_value_pb2 import NameAttrList
from tensorflow.python.framework import ops as framework_ops

from rec_sdk.base import tf_processors
from rec_sdk.base.graph_state import state_of
from rec_sdk.constants.constants import TABLE_COLLECTION
from rec_sdk.ops import loader, serving_ops, table_ops
from rec_sdk.tables import checkpoint_ops, table_files
from rec_sdk.tables.admission import TableAdmission
from rec_sdk.tables.keys import as_keys
from rec_sdk.tables.table_spec import TableSpec

_uid_lock = threading.Lock()
_next_uid = [0]


def uid():
    """A number used once per process (eager tables' resource names)."""
    with _uid_lock:
        _next_uid[0] += 1
        return _next_uid[0]


def _from_spec(field, doc):
    return property(lambda self: getattr(self.spec, field), doc=doc)


class SparseEmbedding(TableAdmission, tf.saved_model.experimental.TrackableResource):
    """A rec_sdk embedding table, as returned by `create_table`.

    Attributes: table_name, key_dtype, dim, value_dtype, is_save, capacity_rows (the fixed
    capacity, or None in dynamic-expansion mode), handle (the table's resource tensor).
    Converts to its handle tensor, so it can be passed to tf.gradients.

    A TrackableResource: in TF2 (eager, tf.function) its handle is created once, eagerly,
    captured by the functions that use it, and the table is destroyed with the object;
    tf.train.Checkpoint and SavedModel reach it through the object graph and save its keys,
    rows and slots as tensors (_serialize_to_tensors). Tables created
    eagerly get a resource name of their own (TensorFlow's eager resource manager is one
    per process), so two objects never share a table by name.
    """

    def __init__(self, spec, handle=None):
        self.spec = spec
        self.graph = tf.compat.v1.get_default_graph()
        self._init_admission(spec)
        # A table over ranks: {rank: the table object of that rank's shard}, set by the ranks
        # (rec_sdk.distribute.ranks.set_shards, shards_of); None in one process.
        self.rank_shards = None
        self._tracking_access = spec.track_access  # turned on later by start_tracking_access
        super().__init__()
        self.eager = tf.executing_eagerly()
        self._shared_name = spec.name
        if self.eager:
            self._shared_name = "%s_eager_%d" % (spec.name, uid())
        # `handle`: the table op of a graph loaded from a MetaGraph (see table_from_op).
        self._resource_handle = self._create_resource() if handle is None else handle
        if handle is not None:
            self.checkpoint_ops = checkpoint_ops.find(handle.op)
        elif not self.eager:
            self.checkpoint_ops = checkpoint_ops.build(
                self._resource_handle, spec.name, spec.key_dtype
            )
        else:
            self.checkpoint_ops = None  # TF2: tf.train.Checkpoint saves the object

    table_name = _from_spec("name", "The table's name.")
    key_dtype = _from_spec("key_dtype", "tf.int64 or tf.int32.")
    dim = _from_spec("dim", "Floats per row of embedding.")
    initializer_spec = _from_spec("initializer", "The C++ row initialiser (a dict).")
    dynamic_expansion = _from_spec("dynamic_expansion", "The table grows without bound.")
    capacity_rows = _from_spec(
        "capacity_rows", "The fixed capacity (None in dynamic-expansion mode)."
    )
    device_vocabulary_size = _from_spec("initial_rows", "Rows reserved up front.")
    tier = _from_spec("tier", "The SSD tier (rec_sdk.tables.tier.TierConfig), or None.")
    is_save = _from_spec("is_save", "Checkpoints include the table.")
    saved_by_owner = _from_spec(
        "saved_by_owner",
        "A de.Variable's shard: the variable serializes its shards together "
        "(so that a checkpoint restores into another number of shards).",
    )
    steps_to_live = _from_spec("steps_to_live", "Evict keys not trained for this many steps.")
    evict_when_full = _from_spec("evict_when_full", "A full table evicts instead of failing.")
    track_changes = _from_spec("track_changes", "Changed keys are kept for delta checkpoints.")
    padding_keys = _from_spec("padding_keys", "The SDK's padding keys (never trained).")
    padding_keys_mask = _from_spec("padding_keys_mask", "Whether padding keys are masked.")
    padding_keys_len = _from_spec("padding_keys_len", "Keys per step with padding keys.")
    shard_keys_filter = _from_spec(
        "shard_keys_filter", "keys -> which of them a de.Variable's shard keeps."
    )
    ranks = _from_spec(
        "placement",
        "Where the shards of a table sharded over ranks are "
        "(a RankPlacement), or None in one process.",
    )
    value_dtype = tf.float32

    @property
    def track_access(self):
        """Whether the table keeps last-seen steps and update counts per key."""
        return self._tracking_access

    def start_tracking_access(self):
        """Makes the table keep access statistics from now on (a restrict policy given to a
        de.Variable later): at once in eager mode (returns None), else returns the op (built
        at the graph's top level) that the counting updates must run after. None when the
        table keeps them already."""
        if self._tracking_access:
            return None
        self._tracking_access = True
        with tf.init_scope():
            return table_ops.track_access(self.handle)

    def _create_resource(self):
        """The table op (TrackableResource: SavedModel re-creates the table with it)."""
        return table_ops.create_table(shared_name=self._shared_name, **self.spec.op_attrs())

    def _destroy_resource(self):
        """Frees an eagerly created table when its object goes (graph-mode tables belong to
        their sessions)."""
        if self.eager and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self._resource_handle, ignore_lookup_error=True)

    # --- key and value files (TFRA's save_to_file_system; see rec_sdk.tables.table_files) ---
    def save_to_file_system(
        self,
        dirpath,
        file_name=None,
        dirpath_env=table_files.DIRPATH_ENV,
        append_to_file=False,
        buffer_size=None,
        name=None,
    ):
        """Op writing the table's keys and rows to `<dirpath>/<file_name>-keys` / `-values`
        (file_name: the table_name; the environment variable dirpath_env, when set, replaces
        dirpath); returns the number of keys written. buffer_size is accepted for TFRA."""
        del buffer_size
        path = table_files.directory(dirpath, dirpath_env)
        keys, rows, _ = table_ops.export(self.resource_handle, self.key_dtype, self.dim)
        return table_files.save_op(
            (keys, rows), path, file_name or self.table_name, append_to_file, name
        )

    def load_from_file_system(
        self,
        dirpath,
        file_name=None,
        dirpath_env=table_files.DIRPATH_ENV,
        load_entire_dir=False,
        buffer_size=None,
        name=None,
    ):
        """Op upserting the keys and rows saved by save_to_file_system under file_name (or,
        with load_entire_dir, of every table saved in dirpath)."""
        del buffer_size
        path = table_files.directory(dirpath, dirpath_env)
        keys, rows = table_files.load_tensors(
            path, file_name or self.table_name, self.key_dtype, self.dim, load_entire_dir, name
        )
        return table_ops.upsert(self.resource_handle, keys, rows)

    # --- tf.train.Checkpoint / SavedModel (the graph-mode Saver uses rec_sdk.saver) ---
    def _serialize_to_tensors(self):
        """The table's contents as tensors: every key with its row and optimizer slots (none
        when a de.Variable saves its shards together, see `saved_by_owner`)."""
        if self.saved_by_owner:
            return {}
        keys, values, slots = table_ops.export(self.resource_handle, self.key_dtype, self.dim)
        return {"keys": keys, "values": values, "slots": slots}

    def _restore_from_tensors(self, restored_tensors):
        """Replaces the table's contents with a checkpoint's (one exclusive C++ section: no
        lookup sees a half-restored table)."""
        if self.saved_by_owner or "keys" not in restored_tensors:
            return tf.no_op()
        return table_ops.import_rows(
            self.resource_handle,
            restored_tensors["keys"],
            restored_tensors["values"],
            restored_tensors["slots"],
        )

    @property
    def handle(self):
        """The table's resource tensor (`resource_handle`, TFRA's and TrackableResource's
        name for it)."""
        return self.resource_handle

    @property
    def lookups(self):
        """What this graph's lookups did with the table (a TableLookups record, kept in the
        graph's GraphState)."""
        return state_of(self.graph).lookups_of(self.table_name)

    @property
    def shared_name(self):
        """The name of the table in the session's resource manager."""
        return self._shared_name

    @property
    def op(self):
        """The table op (what TensorFlow's optimizers read of a variable in a var_list)."""
        return self.handle.op

    @property
    def saveable(self):
        """TFRA's tables have a `saveable` whose specs name their keys and values tensors in
        the TF checkpoint (its warm-start demo restores them with io_ops.restore_v2). A
        rec_sdk table's checkpoint is its own files beside the TF checkpoint (keys, rows,
        slots, counts), so there are no such tensors: this says what to use instead."""
        raise AttributeError(
            "rec_sdk table %r has no TFRA `saveable`: its checkpoint is rec_sdk's table files "
            "beside the TF checkpoint, not keys/values tensors in it. To restore de.Variables "
            "from another model's checkpoint (warm start), use de.WarmStartHook(ckpt_path, "
            "[variables or name patterns]) (e.g. in an Estimator's training_chief_hooks) or "
            "the op de.warm_start(ckpt_path, vars_to_warm_start)" % self.table_name
        )

    @property
    def device(self):
        """The device of the table op."""
        return self.handle.device

    @property
    def dtype(self):
        """The rows' dtype, float32 (as the SDK's table variable's)."""
        return self.value_dtype

    @property
    def name(self):
        """The table's name (table_name; a de.Variable's tables are <name>_mht_<i>of<n>, as
        TFRA names them). The handle tensor is `handle`."""
        return self.table_name

    def __repr__(self):
        if self.tier is not None:
            ssd = "unbounded" if self.tier.ssd_rows is None else self.tier.ssd_rows
            size = "memory_rows=%d ssd_rows=%s" % (self.tier.memory_rows, ssd)
        elif self.dynamic_expansion:
            size = "dynamic expansion"
        else:
            size = "capacity=%d" % self.capacity_rows
        return "<rec_sdk table %r dim=%d key_dtype=%s %s>" % (
            self.table_name,
            self.dim,
            self.key_dtype.name,
            size,
        )

    def size(self):
        """The number of keys stored, a Python int, as the SDK's table.size() gives it: read
        from the table that a session of this process holds (the one created last when
        several sessions hold a table of this name; 0 before any session has created it).
        It adds no op to the graph, so a script may log it every step. In a graph, use
        size_tensor()."""
        if self.eager and tf.executing_eagerly():
            return int(table_ops.size(self.handle))
        live = loader.live_table_size(self.table_name)
        return 0 if live is None else live[0]

    def size_tensor(self, name=None):
        """Scalar int64 tensor: the number of keys stored (an op of the graph)."""
        return table_ops.size(self.handle, name=name)

    def prefetch(self, ids, name=None):
        """Op reading the rows of `ids` that are on SSD into memory ahead of the training
        lookup that needs them (for a table with an SSD tier; otherwise it does nothing):
        run it on the next batch's ids in the same step as the current batch's training, and
        that lookup copies them instead of waiting for the disk. Returns the number of rows
        read. The FeatureSpec pipeline (get_asc_insert_func) does this by itself."""
        ids = tf.reshape(tf.convert_to_tensor(ids), [-1])
        if ids.dtype != self.key_dtype:
            ids = tf.cast(ids, self.key_dtype)
        return table_ops.prefetch_cold(self.handle, ids, name=name)

    def capacity(self):
        """Rows the table holds without growing, a Python int as the SDK's table.capacity()
        gives it: its fixed capacity, or in dynamic-expansion mode the rows allocated so far
        (read as size() reads the size). In a graph, use capacity_tensor()."""
        if self.eager and tf.executing_eagerly():
            return int(table_ops.capacity(self.handle))
        live = loader.live_table_size(self.table_name)
        return (self.capacity_rows or 0) if live is None else live[1]

    def capacity_tensor(self, name=None):
        """Scalar int64 tensor: rows the table holds without growing (an op of the graph)."""
        return table_ops.capacity(self.handle, name=name)

    def checked_keys(self, keys, param="keys"):
        """keys as this table's key dtype (as_keys), errors naming `param` and the table."""
        return as_keys(keys, self.key_dtype, "%s of table '%s'" % (param, self.table_name))

    def _values(self, values, keys, param="values"):
        """values of keys: float, shaped keys.shape + [dim] (checked where shapes are known)."""
        values = tf.convert_to_tensor(values)
        if not values.dtype.is_floating:
            raise TypeError(
                "%s of table '%s' must be float32, got %s"
                % (param, self.table_name, values.dtype.name)
            )
        expected = keys.shape.concatenate([self.dim])
        if not values.shape.is_compatible_with(expected):
            raise ValueError(
                "%s of table '%s' must have shape keys.shape + [dim] = %s, got %s"
                % (param, self.table_name, expected, values.shape)
            )
        return tf.cast(values, tf.float32)

    def lookup(self, keys, init_missing=False, name=None):
        """(values, exists) for keys of any shape, without inserting. Missing keys read zeros,
        or with init_missing=True the values the initializer would give them."""
        return table_ops.lookup(
            self.handle, self.checked_keys(keys), self.dim, init_missing, name=name
        )

    def upsert(self, keys, values, name=None):
        """Op that inserts or overwrites the embeddings of keys with values (keys.shape+[dim])."""
        keys = self.checked_keys(keys)
        return table_ops.upsert(self.handle, keys, self._values(values, keys), name=name)

    def remove(self, keys, name=None):
        """Removes keys; returns the number removed (int64 scalar)."""
        return table_ops.remove(self.handle, self.checked_keys(keys), name=name)

    def clear(self, name=None):
        return table_ops.clear(self.handle, name=name)

    def find_or_insert(self, keys, is_train, counts=None, times=None, name=None, lookup=None):
        """keys (this table's key dtype, any shape) -> int64 row addresses; in training new keys
        get rows (subject to admission), in eval they map to -1. See table_ops.find_or_insert
        for counts and times; `lookup` names the lookup in errors."""
        table = (
            self.configured_handle("training lookup %r" % (lookup or name))
            if is_train
            else self.handle
        )
        return table_ops.find_or_insert(
            table, keys, is_train, counts=counts, times=times, name=name
        )

    def find_or_insert_rows(self, keys, is_train, counts=None, times=None, name=None, lookup=None):
        """find_or_insert and the rows of its addresses in one op: -> (addresses, rows)."""
        table = (
            self.configured_handle("training lookup %r" % (lookup or name))
            if is_train
            else self.handle
        )
        return table_ops.find_or_insert_rows(
            table, keys, is_train, self.dim, counts=counts, times=times, name=name
        )

    def stats(self, name=None):
        """Dict of int64 scalar tensors: size, capacity, admitted, rejected (training lookups
        of keys not admitted), evicted, pending (keys counting towards admission),
        newest_clock (the newest timestamp or step seen), and for a table with an SSD tier
        (zero otherwise): hot and cold (keys in memory and on SSD), promotions and demotions
        (rows moved into and out of memory), ssd_bytes_read, ssd_bytes_written and
        ssd_file_bytes (the bytes its record files take)."""
        values = table_ops.stats(self.handle, name=name)
        return {key: values[i] for i, key in enumerate(table_ops.stat_names())}

    def export(self, name=None):
        """(keys [n], values [n, dim], slots [num_slots, n, dim]) of every stored row (slots
        [num_slots, n, 1] for a row-wise optimizer's)."""
        return table_ops.export(self.handle, self.key_dtype, self.dim, name=name)

    def take_changes(self, full=False, name=None):
        """serving_ops.Changes(keys, values, removed, replace, since, push_id): the rows changed
        and the keys removed since the last push (all rows, replace=True, when `full`, at the first
        push or after a clear or restore), taken atomically; see rec_sdk.serving.push."""
        if not self.spec.track_changes:
            raise ValueError(
                "table '%s' does not track changes: create it with "
                "track_changes=True (or is_incremental_checkpoint) to push "
                "serving updates" % self.table_name
            )
        return serving_ops.take_changes(self.handle, self.key_dtype, self.dim, full, name=name)

    def import_rows(self, keys, values, slots=None, name=None):
        """Op replacing the table's contents; slots [num_slots, n, dim] (or [num_slots, n, 1],
        a row-wise optimizer's) may be omitted."""
        keys = self.checked_keys(keys)
        values = self._values(values, keys)
        if slots is None:
            slots = tf.zeros([0, 0, self.dim], tf.float32)
        slots = tf.convert_to_tensor(slots)
        if not slots.dtype.is_floating:
            raise TypeError(
                "slots of table '%s' must be float32, got %s" % (self.table_name, slots.dtype.name)
            )
        if not (
            slots.shape.is_compatible_with([None, None, self.dim])
            or slots.shape.is_compatible_with([None, None, 1])
        ):
            raise ValueError(
                "slots of table '%s' must have shape [num_slots, keys, %d] (or "
                "[num_slots, keys, 1] for a row-wise optimizer's), got %s"
                % (self.table_name, self.dim, slots.shape)
            )
        return table_ops.import_rows(
            self.handle, keys, values, tf.cast(slots, tf.float32), name=name
        )


class _TableProcessor:
    """tf.compat.v1 optimizers' processor of a table in a var_list: compute_gradients gives
    its gradient, the IndexedSlices that tf.gradients(loss, table) gives (rows by address),
    as the SDK's table variables do. Only rec_sdk's sparse optimizers and CustomizedOptimizer
    subclasses apply it (their apply_gradients takes tables before TensorFlow's would)."""

    def __init__(self, table):
        self._v = table

    def target(self):
        return self._v.handle

    def update_op(self, optimizer, grad):
        del grad
        raise TypeError(
            "%s.apply_gradients got rec_sdk table %r: TensorFlow's optimizers cannot update "
            "its rows. Train tables with a rec_sdk sparse optimizer (rec_sdk.optimizers.*."
            "create_hash_optimizer) or a subclass of rec_sdk.optimizers.base."
            "CustomizedOptimizer, and give this optimizer only the dense variables"
            % (type(optimizer).__name__, self._v.table_name)
        )


tf_processors.register(lambda v: _TableProcessor(v) if isinstance(v, SparseEmbedding) else None)


def _table_to_tensor(table, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and not dtype.is_compatible_with(tf.resource):
        raise ValueError("a rec_sdk table converts only to a resource tensor, not %s" % dtype)
    return table.handle


tf.register_tensor_conversion_function(SparseEmbedding, _table_to_tensor)


def tables_of_graph(graph=None):
    """Every rec_sdk table created in `graph` (default: the default graph)."""
    graph = graph or tf.compat.v1.get_default_graph()
    return [t for t in graph.get_collection(TABLE_COLLECTION) if isinstance(t, SparseEmbedding)]


def create(spec, register=True):
    """The table of `spec`, created (on the current device) with its checkpoint ops (graph
    mode); with `register`, added to the graph's TABLE_COLLECTION (what checkpoints, evictions
    and graph modification find; a rank's shard held by rank 0 for checkpoints is not)."""
    table = SparseEmbedding(spec)
    if register and not table.eager:
        tf.compat.v1.add_to_collection(TABLE_COLLECTION, table)
    return table


def table_from_op(op):
    """The table object of the table op `op` of a graph loaded from a MetaGraph (which keeps
    ops, not Python objects), read from the op's attributes; it adds no op. Checkpoints
    include it when the graph has its checkpoint ops."""
    with op.graph.as_default():
        found = checkpoint_ops.find(op)
        return SparseEmbedding(
            TableSpec.from_op(op, is_save=found is not None), handle=op.outputs[0]
        )


def _table_to_proto(table, export_scope=None):
    """A MetaGraph records a table of TABLE_COLLECTION as its table op's name."""
    name = table.handle.op.name
    if export_scope and not name.startswith(export_scope):
        return None
    return NameAttrList(name=framework_ops.strip_name_scope(name, export_scope))


def _table_from_proto(proto, import_scope=None):
    """The table object of an imported MetaGraph's table op (import_meta_graph)."""
    return table_from_op(
        tf.compat.v1.get_default_graph().get_operation_by_name(
            framework_ops.prepend_name_scope(proto.name, import_scope)
        )
    )


framework_ops.register_proto_function(
    TABLE_COLLECTION,
    proto_type=NameAttrList,
    to_proto=_table_to_proto,
    from_proto=_table_from_proto,
)


def table_of(value):
    """The table behind `value`: a table, its handle, or addresses from one of its lookups."""
    if isinstance(value, SparseEmbedding):
        return value
    if isinstance(value, tf.Tensor):
        handle = value
        if value.op.type in table_ops.ADDRESS_OPS:
            handle = value.op.inputs[0]
        if handle.op.type == table_ops.CONFIGURE_ADMISSION_OP:
            handle = handle.op.inputs[0]
        for table in tables_of_graph(value.graph):
            if (
                table.handle is handle
                or table.handle.name == handle.name
                or value.name in table.lookups.trained_address_names
            ):
                return table
    return None
