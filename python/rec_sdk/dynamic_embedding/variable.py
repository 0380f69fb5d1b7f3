"""de.Variable: a TFRA-style dynamic embedding variable whose shards are rec_sdk tables.

One rec_sdk table per entry of `devices` (a shard); keys are routed by
`partitioner(keys, shard_num)` and results stitched back in the callers' order. Each shard
keeps its embedding, the optimizer's slots and the restrict policy's access statistics in one
row per key (one hash probe for all of them), unlike TFRA's one hash table per slot.
"""

import numbers

import numpy as np
import tensorflow as tf

from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_bool
from rec_sdk.dynamic_embedding import key_codec, value_codec
from rec_sdk.dynamic_embedding.kv_creator import KVCreator, TieredTableCreator
from rec_sdk.dynamic_embedding.optimizer_kinds import name_of, slot_info
from rec_sdk.dynamic_embedding.shadow_ops import shadow_of
from rec_sdk.dynamic_embedding.shards import (  # noqa: F401
    ShardKeys,
    default_partition_fn,
    defaults_of,
    describe,
    init_rows,
    table_names,
)
from rec_sdk.dynamic_embedding.slots_and_policies import (
    RestrictPolicy,
    SlotVariable,
)
from rec_sdk.dynamic_embedding.tfra_table import TfraTable
from rec_sdk.dynamic_embedding.variable_checkpoint import VariableCheckpoint
from rec_sdk.dynamic_embedding.variable_files import KeyValueFiles
from rec_sdk.dynamic_embedding.variable_ops import VariableOps
from rec_sdk.ops import table_ops
from rec_sdk.tables import shard_names, tier
from rec_sdk.tables import table as table_module
from rec_sdk.tables.table_spec import TableSpec

_KEY_DTYPES = (tf.int64, tf.int32, tf.string)
# {value dtype: the Variable subclass of variables of those values} (string_values fills it).
VALUE_DTYPE_CLASSES = {}


def _shape_checked(x, want, message):
    """x, once an assertion that its shape is `want` (an int64 vector) passed when it runs."""
    got = tf.shape(x, out_type=tf.int64)
    rank = tf.maximum(tf.size(got), tf.size(want))  # ranks may differ: pad unequally
    check = tf.debugging.Assert(
        tf.reduce_all(
            tf.equal(
                tf.pad(got, [[0, rank - tf.size(got)]], constant_values=-1),
                tf.pad(want, [[0, rank - tf.size(want)]], constant_values=-2),
            )
        ),
        [message + ", got", got],
    )
    with tf.control_dependencies([check]):
        return tf.identity(x)


def checked_devices(devices):
    """A variable's devices argument as a non-empty list of device names (none or an empty
    list: the CPU, as TFRA's `devices or default devices`)."""
    if devices is None or (isinstance(devices, (list, tuple, str)) and not devices):
        devices = ["/CPU:0"]
    elif isinstance(devices, str):
        devices = [devices]
    devices = list(devices)
    if not devices or not all(isinstance(d, str) for d in devices):
        raise ValueError("devices must be a non-empty list of device names, got %r" % (devices,))
    return devices


class DtypeError(TypeError, ValueError):
    """Keys or values of the wrong dtype (a ValueError too, as TFRA raises)."""


class ShapeError(ValueError, tf.errors.InvalidArgumentError):
    """Values of the wrong shape found when the op is built: a ValueError, and the
    InvalidArgumentError that the same values give at run time when their shape is known
    only then."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


class Variable(VariableOps, KeyValueFiles, VariableCheckpoint, tf.__internal__.tracking.Trackable):
    """A dynamic embedding variable (TFRA's `dynamic_embedding.Variable`) on rec_sdk tables.

    See the module docstring of rec_sdk.dynamic_embedding for the arguments and where this
    differs from TFRA. A trackable that saves its shards' keys, rows and slots as one set of
    tensors (see _serialize_to_tensors), so that tf.train.Checkpoint and SavedModel save the
    tables of a model that holds the variable, restorable into any number of shards.
    """

    def __new__(cls, *args, **kwargs):
        """A variable of values with their own class (string values) is made of that class."""
        value_dtype = kwargs.get("value_dtype", args[1] if len(args) > 1 else None)
        try:
            special = (
                VALUE_DTYPE_CLASSES.get(tf.as_dtype(value_dtype))
                if cls is Variable and value_dtype is not None
                else None
            )
        except TypeError:
            special = None  # __init__ names the bad dtype
        return super().__new__(special or cls)

    def __init__(
        self,
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        dim=1,
        devices=None,
        partitioner=default_partition_fn,
        shared_name=None,
        name="DynamicEmbedding_Variable",
        initializer=None,
        trainable=True,
        checkpoint=True,
        init_size=0,
        kv_creator=None,
        restrict_policy=None,
        bp_v2=False,
        servable=False,
    ):
        try:
            key_dtype, value_dtype = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
        except TypeError as e:
            raise TypeError("key_dtype / value_dtype: %s" % e) from None
        if key_dtype not in _KEY_DTYPES:
            raise TypeError(
                "key-value dtype (%s-%s) is not supported: key_dtype must be "
                "tf.int64, tf.int32 or tf.string" % (key_dtype.name, value_dtype.name)
            )
        value_dtype = value_codec.check(value_dtype)
        max_dim = (
            table_ops.max_dim()
            if value_codec.native(value_dtype)
            else table_ops.max_dim() * 4 // (1 if value_dtype == tf.bool else value_dtype.size)
        )
        if (
            isinstance(dim, bool)
            or not isinstance(dim, numbers.Integral)
            or not 1 <= dim <= max_dim
        ):
            raise ValueError(
                "dim must be an integer in [1, %d] (for %s values), got %r"
                % (max_dim, value_dtype.name, dim)
            )
        devices = checked_devices(devices)
        if not callable(partitioner):
            raise TypeError(
                "partitioner must be a function (keys, shard_num) -> shard of each "
                "key, got %r" % (partitioner,)
            )
        if (
            isinstance(init_size, bool)
            or not isinstance(init_size, numbers.Integral)
            or init_size < 0
        ):
            raise ValueError("init_size must be an integer >= 0, got %r" % (init_size,))
        if restrict_policy is not None and not (
            isinstance(restrict_policy, type)
            and issubclass(restrict_policy, RestrictPolicy)
            and restrict_policy.by in ("last_seen", "count")
        ):
            raise TypeError(
                "restrict_policy must be de.TimestampRestrictPolicy, "
                "de.FrequencyRestrictPolicy or a subclass, got %r" % (restrict_policy,)
            )
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, got %r" % (name,))
        for flag, value in (
            ("trainable", trainable),
            ("checkpoint", checkpoint),
            ("bp_v2", bp_v2),
            ("servable", servable),
        ):
            check_bool(flag, value)
        if kv_creator is not None and not isinstance(kv_creator, KVCreator):
            raise TypeError(
                "kv_creator must be None or a de.KVCreator (e.g. "
                "de.CuckooHashTableCreator()), got %r" % (kv_creator,)
            )
        self.key_dtype = key_dtype
        self.table_key_dtype = key_codec.table_dtype(key_dtype)  # what the tables index
        self.value_dtype = value_dtype
        self.dim = int(dim)
        self.devices = devices
        self.shard_num = len(devices)
        self.partition_fn = partitioner
        self.shared_name = shared_name
        self.name = name
        self.trainable = bool(trainable)
        self.checkpoint = bool(checkpoint)
        self.init_size = int(init_size)
        # Accepted for TFRA scripts (the store is rec_sdk's table); a TieredTableCreator gives
        # every shard an SSD tier.
        self.kv_creator = kv_creator
        self.bp_v2 = bool(bp_v2)
        # Beyond TFRA: the shards track their changes for serving pushes (rec_sdk.serving).
        self.servable = servable
        self.initializer = initializer
        self.stored_dim = value_codec.stored_dim(value_dtype, self.dim)
        native = value_codec.native(value_dtype)
        self.default_rows = None if native else defaults_of(initializer, value_dtype, self.dim)
        # The rows' element type: a half value_dtype's own, else the creator's (float32).
        self.emb_dtype = (
            value_dtype.name
            if native and value_dtype != tf.float32
            else (getattr(kv_creator, "emb_dtype", None) or "float32")
        )
        if value_dtype != tf.float32 and getattr(kv_creator, "emb_dtype", None) not in (
            None,
            value_dtype.name,
        ):
            raise ValueError(
                "kv_creator's emb_dtype (%s) is for float32 variables; this one "
                "holds %s values, stored as they are" % (kv_creator.emb_dtype, value_dtype.name)
            )
        self._trainable_store = {}
        self._access_ops = []  # see access_tracking
        self._size_ops = {}  # (graph, shard index or None) -> size op
        self.graph = tf.compat.v1.get_default_graph()
        rows = init_rows(self.init_size, self.shard_num)
        shard_tier = (
            tier.split(kv_creator.tier, self.shard_num)
            if isinstance(kv_creator, TieredTableCreator)
            else None
        )
        self._shards = []
        # Tables outlive any tf.function: one created while tracing is created eagerly.
        with tf.init_scope(), tf.name_scope(name.split("/")[-1]):
            self.eager = tf.executing_eagerly()
            for i, (device, table_name) in enumerate(
                zip(devices, table_names(name, self.shard_num))
            ):
                spec = TableSpec(
                    table_name,
                    self.table_key_dtype,
                    self.stored_dim,
                    describe(initializer, self.dim, table_name)
                    if native
                    else describe(0.0, self.stored_dim, table_name),
                    dynamic_expansion=shard_tier is None or shard_tier.ssd_rows is None,
                    capacity_rows=None
                    if shard_tier is None or shard_tier.ssd_rows is None
                    else shard_tier.memory_rows + shard_tier.ssd_rows,
                    initial_rows=rows,
                    tier=shard_tier,
                    is_save=self.checkpoint,
                    saved_by_owner=True,
                    track_access=restrict_policy is not None,
                    track_changes=servable,
                    emb_dtype=self.emb_dtype,
                    slot_dtype=getattr(kv_creator, "slot_dtype", None) or "float32",
                    index_layout=getattr(kv_creator, "index_layout", "auto"),
                    shard_keys_filter=ShardKeys(
                        partitioner, self.table_key_dtype, self.shard_num, i
                    ),
                )
                with tf.device(device):
                    self._shards.append(table_module.create(spec))
            # String keys: the fingerprint -> string dictionary (see key_codec).
            self.key_strings = (
                key_codec.KeyStrings(
                    shard_names.key_strings_name(
                        shard_names.parse_variable_shard(table_names(name, 1)[0])[0]
                    ),
                    self.checkpoint,
                )
                if key_dtype == tf.string
                else None
            )
        self._restrict_policy = restrict_policy(self) if restrict_policy is not None else None
        if not self.eager:
            state_of(self.graph).all_de_variables.append(self)

    # --- properties (TFRA names) ---
    @property
    def tables(self):
        """The shards with TFRA's table interface (de.TfraTable: size() is an int64 tensor)."""
        return [TfraTable(self, i) for i in range(self.shard_num)]

    @property
    def _tables(self):
        """TFRA's private name of `tables`, which its warm-start recipes and tests use."""
        return self.tables

    @property
    def shards(self):
        """The shards: one rec_sdk table (rec_sdk.core.embedding.SparseEmbedding) per device."""
        return list(self._shards)

    @property
    def restrict_policy(self):
        return self._restrict_policy

    @property
    def trainable_store(self):
        """{lookup name: trainable} of the embedding_lookup calls on this variable."""
        return self._trainable_store

    def __repr__(self):
        return "<de.Variable %r dim=%d shards=%d>" % (self.name, self.dim, self.shard_num)

    # --- the protocol of rec_sdk.dynamic_embedding's own modules (lookups, the optimizer,
    # shadows, slots and policies call these; they are not TFRA's API): checked_keys,
    # table_keys, public_keys, note_writes, split_keys, by_shard, read_rows, lookup_rows,
    # start_tracking_access, table_key_dtype ---
    @staticmethod
    def _converted(x, dtype, integer):
        """Python and NumPy values become tensors of `dtype` (lists, float64 arrays), as TFRA
        converts them; a tensor keeps its dtype (a mismatch is the caller's error)."""
        if isinstance(x, (tf.Tensor, tf.Variable, tf.SparseTensor)) or hasattr(x, "op"):
            return tf.convert_to_tensor(x)
        array = np.asarray(x)
        if array.dtype.kind in ("i", "u") or (not integer and array.dtype.kind == "f"):
            return tf.convert_to_tensor(array.astype(dtype.as_numpy_dtype))
        return tf.convert_to_tensor(x)

    def checked_keys(self, keys, what="keys", record=False):
        """keys, checked, as the tables index them (string keys: their fingerprints; with
        record, remembering their strings when the fingerprints are used)."""
        keys = self._converted(keys, self.key_dtype, integer=True)
        if keys.dtype != self.key_dtype:
            raise DtypeError(
                "%s of %r must be %s (the key_dtype), got %s"
                % (what, self.name, self.key_dtype.name, keys.dtype.name)
            )
        return self.table_keys(keys, record)

    def table_keys(self, keys, record=False):
        """Checked keys as the tables index them (see _keys)."""
        if self.key_strings is None:
            return keys
        hashed = key_codec.fingerprints(keys)
        if not record:
            return hashed
        with tf.control_dependencies([self.key_strings.record(keys, hashed)]):
            return tf.identity(hashed)

    def public_keys(self, keys):
        """Keys of the tables as the variable's keys (string keys: their strings)."""
        if self.key_strings is None:
            return tf.cast(keys, self.key_dtype)
        return self.key_strings.strings(keys)

    def _no_string_keys(self, what):
        if self.key_strings is not None:
            raise TypeError(
                "%s: de.Variable %r has string keys, which these files cannot hold "
                "(they store the keys' int64 fingerprints); use a Saver, "
                "tf.train.Checkpoint or export()" % (what, self.name)
            )

    def checked_values(self, values, keys, what="values"):
        """values of `keys`, checked: the value_dtype, shaped keys.shape + [dim] (when the op
        is built, ShapeError; or, for shapes known only then, when it runs)."""
        values = self._converted(values, self.value_dtype, integer=False)
        if values.dtype != self.value_dtype:
            raise DtypeError(
                "%s of %r must be %s (the value_dtype), got %s"
                % (what, self.name, self.value_dtype.name, values.dtype.name)
            )
        expected = keys.shape.concatenate([self.dim])
        message = "%s of %r: Expected shape keys.shape + [dim] = %s" % (
            what,
            self.name,
            expected.as_list() if expected.rank is not None else "[..., %d]" % self.dim,
        )
        if not values.shape.is_compatible_with(expected):
            raise ShapeError(
                "%s, got %s"
                % (message, values.shape.as_list() if values.shape.rank is not None else "?")
            )
        if values.shape.is_fully_defined() and expected.is_fully_defined():
            return values
        return _shape_checked(
            values, tf.concat([tf.shape(keys, out_type=tf.int64), [self.dim]], 0), message
        )

    def checked_exists(self, exists, keys):
        """accum's exists: a bool tensor of keys' shape (ShapeError when built, or when it
        runs for shapes known only then)."""
        exists = tf.convert_to_tensor(exists)
        if exists.dtype != tf.bool:
            raise TypeError("exists must be a bool tensor, got %s" % exists.dtype.name)
        message = "exists of %r must have the keys' shape %s" % (
            self.name,
            keys.shape.as_list() if keys.shape.rank is not None else "?",
        )
        if not exists.shape.is_compatible_with(keys.shape):
            raise ShapeError("%s, got %s" % (message, exists.shape))
        if exists.shape.is_fully_defined() and keys.shape.is_fully_defined():
            return exists
        return _shape_checked(exists, tf.shape(keys, out_type=tf.int64), message)

    def note_writes(self):
        """Records that this graph changes the shards (a "trainer" when tables are shared
        across sessions, see rec_sdk.graph.modifier.share_tables)."""
        for table in self._shards:
            table.lookups.training += 1

    def split_keys(self, flat):
        """Partition of flat keys [n]: (shard of each key, [keys per shard], [their positions])."""
        if self.shard_num == 1:
            return None, [flat], None
        parts = tf.cast(self.partition_fn(flat, self.shard_num), tf.int32)
        keys = tf.dynamic_partition(flat, parts, self.shard_num)
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), parts, self.shard_num)
        return parts, keys, positions

    def by_shard(self, parts, x):
        """x [n, ...] split like the keys whose shards are `parts` (None: one shard)."""
        return [x] if parts is None else tf.dynamic_partition(x, parts, self.shard_num)

    @property
    def access_tracking(self):
        """Graph-mode ops turning access statistics on in tables created without them (a
        restrict policy given to the variable later): updates that count run after them."""
        return [op for op in self._access_ops if op.graph is tf.compat.v1.get_default_graph()]

    def start_tracking_access(self):
        """Makes the tables keep access statistics (a restrict policy needs them): at once in
        eager mode; in graph mode with ops that the counting updates depend on."""
        for table in self._shards:
            op = table.start_tracking_access()
            if op is not None:
                self._access_ops.append(op)

    def restrict(self, num_reserved, **kwargs):
        """Keeps about num_reserved keys by the restrict policy (see RestrictPolicy); None
        (with a warning) when the variable has no policy."""
        if self._restrict_policy is None:
            logger.warning(
                "de.Variable %r has no restrict_policy: restrict() does nothing", self.name
            )
            return None
        return self._restrict_policy.apply_restriction(num_reserved, **kwargs)

    def get_slot_variables(self, optimizer):
        """The optimizer's slots of this variable (views of the slot values kept in the
        variable's rows), one per slot name; [] for an optimizer without slots."""
        row_update = getattr(
            getattr(optimizer, "apply_gradients", None), "rec_sdk_row_update", None
        )
        slots, owner = slot_info(optimizer, row_update.generic_slots if row_update else _unwrapped)
        return [
            SlotVariable(self, name_of(optimizer), name, i, initial, owner)
            for i, (name, initial) in enumerate(slots)
        ]

    def get_trainable_by_name(self, name):
        """The trainable of embedding_lookup(..., name=name) on this variable (what stock
        optimizers' var_list take). In TF2 (eager, tf.function) it is the lookup's
        persistent ShadowVariable, made here if the lookup has not run yet (so a var_list can
        name it before the first trace); in graph mode the lookup's trainable, or None."""
        if not isinstance(name, str):
            raise TypeError("name must be a string, got %r" % (name,))
        found = self._trainable_store.get(name)
        if found is None and self.trainable and tf.compat.v1.executing_eagerly_outside_functions():
            scope = tf.compat.v1.get_variable_scope().name
            found = shadow_of(self, name, (scope + "/" if scope else "") + name)
        return found

    get_eager_trainable_by_name = get_trainable_by_name


def _unwrapped(optimizer):
    raise TypeError(
        "get_slot_variables: wrap %r with de.DynamicEmbeddingOptimizer first (its "
        "slots are known once it is)" % (optimizer,)
    )


def get_variable(
    name,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    dim=1,
    devices=None,
    partitioner=default_partition_fn,
    shared_name="get_variable",
    initializer=None,
    trainable=True,
    checkpoint=True,
    init_size=0,
    kv_creator=None,
    restrict_policy=None,
    bp_v2=False,
    servable=False,
):
    """The de.Variable `name` under the current variable scope: created when absent; when it
    exists, returned if the scope reuses variables and a ValueError otherwise."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string, got %r" % (name,))
    scope = tf.compat.v1.get_variable_scope()
    full_name = "%s/%s" % (scope.name, name) if scope.name else name
    store = state_of(tf.compat.v1.get_default_graph()).de_variables
    if full_name in store:
        if scope.reuse is False or scope.reuse is None:
            raise ValueError(
                "Variable %s already exists, disallowed. Did you mean to set "
                "reuse=True or reuse=tf.AUTO_REUSE in VarScope?" % full_name
            )
        return store[full_name]
    var = Variable(
        key_dtype=key_dtype,
        value_dtype=value_dtype,
        dim=dim,
        devices=devices,
        partitioner=partitioner,
        shared_name=shared_name,
        name=full_name,
        initializer=initializer,
        trainable=trainable,
        checkpoint=checkpoint,
        init_size=init_size,
        kv_creator=kv_creator,
        restrict_policy=restrict_policy,
        bp_v2=bp_v2,
        servable=servable,
    )
    store[full_name] = var
    return var
