"""Tables and lookups: `create_table` and `sparse_lookup` (mirrors mx_rec.core.embedding).

A table is a rec_sdk C++ hash table (one per process) whose rows hold the embedding and the
sparse optimizer's slots. A lookup maps ids to row addresses (inserting new keys in training),
reads the rows, and registers the embeddings and addresses in the graph collections the SDK's
"by address" training flow uses. The gradient of a lookup with respect to the table is an
IndexedSlices keyed by row address, so `tf.gradients(loss, table)` works too.
"""
import math
import os
import re

import tensorflow as tf

import rec_sdk
from rec_sdk.core.initializer_spec import describe_initializer
from rec_sdk.ops import table_ops
from rec_sdk.util import initialize
from rec_sdk.util.validation import INT32_MAX, check_bool, check_float, check_int

MAX_DIM = 8192
MAX_VOCABULARY_SIZE = 10**9
MAX_LOOKUPS_PER_TABLE = 128
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.]{1,100}$")


def _as_key_dtype(key_dtype):
    try:
        dtype = tf.as_dtype(key_dtype)
    except TypeError:
        dtype = None
    if dtype not in (tf.int32, tf.int64):
        raise ValueError("key_dtype must be tf.int32 or tf.int64, got %r" % (key_dtype,))
    return dtype


def _as_dim(dim):
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError("dim must be an int or a rank-1 TensorShape with a known size in "
                             "[1, %d], got %s" % (MAX_DIM, dim))
        dim = dim[0]
    return check_int("dim", dim, 1, MAX_DIM)


class SparseEmbedding:
    """A rec_sdk embedding table, as returned by `create_table`.

    Attributes: table_name, key_dtype, dim, value_dtype, is_save, capacity_rows (the fixed
    capacity, or None in dynamic-expansion mode), handle (the table's resource tensor).
    Converts to its handle tensor, so it can be passed to tf.gradients.
    """

    def __init__(self, table_name, key_dtype, dim, initializer_spec, dynamic_expansion,
                 capacity_rows, device_vocabulary_size, host_vocabulary_size,
                 ssd_vocabulary_size, ssd_data_path, is_save, init_param):
        self.table_name = table_name
        self.key_dtype = key_dtype
        self.dim = dim
        self.value_dtype = tf.float32
        self.initializer_spec = initializer_spec
        self.dynamic_expansion = dynamic_expansion
        self.capacity_rows = capacity_rows
        self.device_vocabulary_size = device_vocabulary_size
        self.host_vocabulary_size = host_vocabulary_size
        self.ssd_vocabulary_size = ssd_vocabulary_size
        self.ssd_data_path = ssd_data_path
        self.is_save = is_save
        self.init_param = init_param
        self.graph = tf.compat.v1.get_default_graph()
        self.lookup_count = 0
        self.handle = table_ops.create_table(
            table_name, key_dtype, dim, dynamic_expansion,
            capacity=0 if dynamic_expansion else capacity_rows, initializer=initializer_spec,
            initial_capacity=device_vocabulary_size if dynamic_expansion else 0)

    def __repr__(self):
        return "<rec_sdk table %r dim=%d key_dtype=%s %s>" % (
            self.table_name, self.dim, self.key_dtype.name,
            "dynamic expansion" if self.dynamic_expansion else "capacity=%d" % self.capacity_rows)

    def size(self, name=None):
        """Scalar int64 tensor: the number of keys stored."""
        return table_ops.size(self.handle, name=name)

    def capacity(self, name=None):
        """Scalar int64 tensor: rows the table holds without growing (its fixed capacity, or the
        rows allocated so far in dynamic-expansion mode)."""
        return table_ops.capacity(self.handle, name=name)

    def _keys(self, keys, param="keys"):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype == self.key_dtype:
            return keys
        if keys.dtype == tf.int32 and self.key_dtype == tf.int64:
            return tf.cast(keys, tf.int64)
        raise TypeError("%s of table '%s' must be %s, got %s"
                        % (param, self.table_name, self.key_dtype.name, keys.dtype.name))

    def lookup(self, keys, init_missing=False, name=None):
        """(values, exists) for keys of any shape, without inserting. Missing keys read zeros,
        or with init_missing=True the values the initializer would give them."""
        return table_ops.lookup(self.handle, self._keys(keys), self.dim, init_missing, name=name)

    def upsert(self, keys, values, name=None):
        """Op that inserts or overwrites the embeddings of keys with values (keys.shape+[dim])."""
        return table_ops.upsert(self.handle, self._keys(keys),
                                tf.convert_to_tensor(values, tf.float32), name=name)

    def remove(self, keys, name=None):
        """Removes keys; returns the number removed (int64 scalar)."""
        return table_ops.remove(self.handle, self._keys(keys), name=name)

    def clear(self, name=None):
        return table_ops.clear(self.handle, name=name)

    def export(self, name=None):
        """(keys [n], values [n, dim], slots [num_slots, n, dim]) of every stored row."""
        return table_ops.export(self.handle, self.key_dtype, self.dim, name=name)

    def import_rows(self, keys, values, slots=None, name=None):
        """Op replacing the table's contents; slots [num_slots, n, dim] may be omitted."""
        if slots is None:
            slots = tf.zeros([0, 0, self.dim], tf.float32)
        return table_ops.import_rows(self.handle, self._keys(keys),
                                     tf.convert_to_tensor(values, tf.float32),
                                     tf.convert_to_tensor(slots, tf.float32), name=name)


def _table_to_tensor(table, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and not dtype.is_compatible_with(tf.resource):
        raise ValueError("a rec_sdk table converts only to a resource tensor, not %s" % dtype)
    return table.handle


tf.register_tensor_conversion_function(SparseEmbedding, _table_to_tensor)


def tables_of_graph(graph=None):
    """Every rec_sdk table created in `graph` (default: the default graph)."""
    graph = graph or tf.compat.v1.get_default_graph()
    return list(graph.get_collection(rec_sdk.TABLE_COLLECTION))


def table_of(value):
    """The table behind `value`: a table, its handle, or addresses from one of its lookups."""
    if isinstance(value, SparseEmbedding):
        return value
    if isinstance(value, tf.Tensor):
        handle = value
        if value.op.type == table_ops.FIND_OR_INSERT_OP:
            handle = value.op.inputs[0]
        for table in tables_of_graph(value.graph):
            if table.handle is handle or table.handle.name == handle.name:
                return table
    return None


def create_table(key_dtype, dim, name, emb_initializer, device_vocabulary_size=1,
                 host_vocabulary_size=0, ssd_vocabulary_size=0, ssd_data_path=(os.getcwd(),),
                 is_save=True, init_param=1.0, value_dtype=tf.float32, **kwargs):
    """Creates a sparse embedding table.

    Args:
      key_dtype: tf.int32 or tf.int64.
      dim: embedding size, an int or rank-1 TensorShape in [1, 8192].
      name: 1-100 characters of [A-Za-z0-9_.], unique in the graph.
      emb_initializer: initializer of new rows (truncated/random normal, random uniform,
        constant, zeros, ones, or a number); run in C++, deterministic for a given seed.
      device_vocabulary_size, host_vocabulary_size, ssd_vocabulary_size: rows per level,
        each in [0, 1e9] (an SSD size needs host_vocabulary_size > 0). On CPU every level is
        main memory: without dynamic expansion the table holds at most their sum (divided
        over ranks) and a full table is an error; with dynamic expansion
        device_vocabulary_size rows are reserved up front and the table grows without bound.
      ssd_data_path: directories for the SSD level (kept for the SDK's API).
      is_save: whether checkpoints include this table.
      init_param: in [-10, 10]; multiplies every initial value.
      value_dtype: tf.float32 (the only supported value type).
      **kwargs: other SDK options (is_dp, all2all_gradients_op, shard_num, ...) are accepted.
    """
    config = initialize.get_config()
    key_dtype = _as_key_dtype(key_dtype)
    dim = _as_dim(dim)
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError("name must be 1-100 characters of [A-Za-z0-9_.], got %r" % (name,))
    for table in tables_of_graph():
        if table.table_name == name:
            raise ValueError("name %r is already used by another table in this graph" % name)
    device_vocabulary_size = check_int("device_vocabulary_size", device_vocabulary_size, 0,
                                       MAX_VOCABULARY_SIZE)
    host_vocabulary_size = check_int("host_vocabulary_size", host_vocabulary_size, 0,
                                     MAX_VOCABULARY_SIZE)
    ssd_vocabulary_size = check_int("ssd_vocabulary_size", ssd_vocabulary_size, 0,
                                    MAX_VOCABULARY_SIZE)
    if ssd_vocabulary_size > 0 and host_vocabulary_size == 0:
        raise ValueError("ssd_vocabulary_size=%d needs host_vocabulary_size > 0"
                         % ssd_vocabulary_size)
    if isinstance(ssd_data_path, str):
        ssd_data_path = (ssd_data_path,)
    if not all(isinstance(p, str) for p in ssd_data_path):
        raise TypeError("ssd_data_path must be a sequence of directory paths, got %r"
                        % (ssd_data_path,))
    check_bool("is_save", is_save)
    init_param = check_float("init_param", init_param, -10.0, 10.0)
    if tf.as_dtype(value_dtype) != tf.float32:
        raise ValueError("value_dtype must be tf.float32, got %r" % (value_dtype,))
    if emb_initializer is None:
        raise ValueError("emb_initializer is required, e.g. "
                         "tf.compat.v1.truncated_normal_initializer()")
    spec = describe_initializer(emb_initializer, name, scale=init_param)

    rank_size = config.rank_size
    device_rows = math.ceil(device_vocabulary_size / rank_size)
    dynamic_expansion = config.use_dynamic_expansion
    capacity_rows = None
    if not dynamic_expansion:
        capacity_rows = device_rows + math.ceil(
            (host_vocabulary_size + ssd_vocabulary_size) / rank_size)
        if capacity_rows < 1:
            raise ValueError("table %r needs device_vocabulary_size + host_vocabulary_size >= 1 "
                             "without dynamic expansion, got 0" % name)
    table = SparseEmbedding(name, key_dtype, dim, spec, dynamic_expansion, capacity_rows,
                            device_rows, host_vocabulary_size, ssd_vocabulary_size,
                            tuple(ssd_data_path), is_save, init_param)
    tf.compat.v1.add_to_collection(rec_sdk.TABLE_COLLECTION, table)
    return table


def sparse_lookup(hash_table, ids, send_count=None, is_train=True, name=None,
                  modify_graph=False, batch=None, access_and_evict_config=None, is_grad=True,
                  serving_default_value=None, dim=None, **kwargs):
    """Looks up the embeddings of `ids` (a tf.Tensor of any shape) in `hash_table`.

    Returns a float32 tensor of shape ids.shape + [dim]. The ids are deduplicated first; the
    collections receive the embeddings of the unique keys [n_unique, dim] and their row
    addresses [n_unique]. In training (is_train=True) new keys
    get rows initialised from the table's initializer; in evaluation nothing is inserted and
    unknown keys read zeros (or serving_default_value).

    Args:
      hash_table: a table from create_table.
      ids: integer tf.Tensor of keys (int32 ids are widened for an int64 table).
      send_count: keys per step in static-shape mode (init(use_dynamic=False)), where it is
        required: an int in [1, 2**31-1], and a batch with more distinct ids is an error.
      is_train: whether this lookup trains (inserts keys and records its embeddings and
        addresses in rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET).
      name: name of the lookup (default: "<table>_lookup").
      modify_graph: accepted for the SDK's API; tensor lookups are wired directly.
      access_and_evict_config: feature admission/eviction settings (not supported yet).
      is_grad: False stops gradients to the table.
      serving_default_value: embedding for keys without a row (default zeros): a scalar or
        a [dim] vector.
      dim: optional; must equal the table's dim.
    """
    del kwargs, batch
    if not isinstance(hash_table, SparseEmbedding):
        raise TypeError("hash_table must be a table from create_table, got %r" % (hash_table,))
    lookup_name = name if name is not None else hash_table.table_name + "_lookup"
    if not isinstance(lookup_name, str) or not lookup_name:
        raise ValueError("name must be a non-empty string, got %r" % (name,))
    if not isinstance(ids, (tf.Tensor, tf.SparseTensor)) and hasattr(ids, "table_name"):
        raise TypeError("sparse_lookup %r: FeatureSpec ids need the FeatureSpec pipeline, which "
                        "this version does not provide; pass a tf.Tensor of ids" % lookup_name)
    if isinstance(ids, tf.SparseTensor):
        raise TypeError("sparse_lookup %r: ids must be a dense tf.Tensor (SparseTensor is not "
                        "supported)" % lookup_name)
    check_bool("is_train", is_train)
    check_bool("modify_graph", modify_graph)
    check_bool("is_grad", is_grad)
    if dim is not None and _as_dim(dim) != hash_table.dim:
        raise ValueError("sparse_lookup %r: dim=%r does not match the dim %d of table %r"
                         % (lookup_name, dim, hash_table.dim, hash_table.table_name))
    if send_count is not None:
        check_int("send_count", send_count, 1, INT32_MAX)
    elif not initialize.get_use_dynamic():
        raise ValueError("sparse_lookup %r: send_count is required in static-shape mode "
                         "(init(use_dynamic=False)); got None" % lookup_name)
    if access_and_evict_config is not None:
        raise NotImplementedError(
            "sparse_lookup %r: access_and_evict_config (feature admission and eviction) is not "
            "supported by this version of rec_sdk" % lookup_name)
    if hash_table.graph is not tf.compat.v1.get_default_graph():
        raise ValueError("sparse_lookup %r: table %r belongs to another graph"
                         % (lookup_name, hash_table.table_name))
    if hash_table.lookup_count >= MAX_LOOKUPS_PER_TABLE:
        raise ValueError("table %r already has %d lookups, the most allowed"
                         % (hash_table.table_name, MAX_LOOKUPS_PER_TABLE))
    hash_table.lookup_count += 1

    with tf.name_scope(table_ops.op_scope_name(lookup_name)):
        ids = hash_table._keys(ids, param="ids of sparse_lookup %r" % lookup_name)
        # Each distinct key is looked up and trained once per lookup: the table sees only
        # the unique keys and `inverse` spreads their rows back over the ids.
        unique_ids, inverse = table_ops.unique_keys(tf.reshape(ids, [-1]), name="unique")
        checks = []
        if send_count is not None and not initialize.get_use_dynamic():
            # Static shape: a step may carry at most send_count distinct keys per lookup.
            checks.append(tf.debugging.assert_less_equal(
                tf.size(unique_ids), send_count,
                message="sparse_lookup %r on table %r: more distinct keys in the batch than "
                        "send_count=%d; raise send_count" % (lookup_name, hash_table.table_name,
                                                             send_count)))
        with tf.control_dependencies(checks):
            addresses = table_ops.find_or_insert(hash_table.handle, unique_ids, is_train,
                                                 name="find_or_insert")
        local_emb = table_ops.gather(hash_table.handle, addresses, hash_table.dim, name="gather")
        if not is_grad:
            local_emb = tf.stop_gradient(local_emb)
        elif is_train:
            tf.compat.v1.add_to_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB, local_emb)
            tf.compat.v1.add_to_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET, addresses)
        if serving_default_value is not None:
            default = tf.broadcast_to(tf.cast(serving_default_value, tf.float32),
                                      [hash_table.dim])
            missing = tf.expand_dims(tf.equal(addresses, -1), 1)
            local_emb = tf.where(missing, default[tf.newaxis, :], local_emb)
        out_shape = tf.concat([tf.shape(ids, out_type=tf.int32), [hash_table.dim]], 0)
        embeddings = tf.reshape(table_ops.gather_rows(local_emb, inverse), out_shape,
                                name="embeddings")
        embeddings.set_shape(ids.shape.concatenate([hash_table.dim]))
        return embeddings
