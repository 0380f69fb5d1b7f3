"""How a de.Variable's shards are made: their table names, the rows each reserves, the row
initialiser of its initializer, which keys each shard keeps (default_partition_fn,
ShardKeys), and the initial values of variables of other value dtypes."""

import os

import numpy as np
import tensorflow as tf

from rec_sdk.tables import shard_names
from rec_sdk.tables.initializer_spec import describe_initializer
from rec_sdk.tables.table import tables_of_graph

DEFAULT_INIT_SIZE = 8192  # rows reserved per shard when neither init_size nor the env var says


def default_partition_fn(keys, shard_num):
    """Shard of each key: keys mod shard_num (floor modulo, so negative keys too)."""
    if shard_num <= 1:
        return tf.zeros_like(keys, dtype=tf.int32)
    return tf.cast(tf.math.floormod(keys, tf.cast(shard_num, keys.dtype)), tf.int32)


def table_names(name, shard_num):
    """rec_sdk table names ([A-Za-z0-9_.], unique in the graph) of the shards of the variable
    `name` (see rec_sdk.tables.shard_names), with a counter added to the base name when a table
    of the graph has one of the names already. Derived from the variable's name (not from
    op-creation order), so a training, an evaluation and an export graph built by the same
    code name their tables alike, as checkpoints need."""
    base = shard_names.table_base_name(name)
    if tf.executing_eagerly():
        return shard_names.variable_shards(base, shard_num)
    taken = {t.table_name for t in tables_of_graph()}
    candidate, n = base, 0
    while taken.intersection(shard_names.variable_shards(candidate, shard_num)):
        n += 1
        candidate = "%s_%d" % (base, n)
    return shard_names.variable_shards(candidate, shard_num)


def init_rows(init_size, shard_num):
    rows = int(init_size / shard_num) if init_size else 0
    if rows <= 0:
        env = os.environ.get("TF_HASHTABLE_INIT_SIZE")
        try:
            rows = int(env) if env else DEFAULT_INIT_SIZE
        except ValueError:
            raise ValueError(
                "environment variable TF_HASHTABLE_INIT_SIZE must be an integer, got %r" % env
            ) from None
    return max(rows, 1)


def describe(initializer, dim, table_name):
    """The C++ row initialiser of `initializer`: None (zeros), a number, an array or constant
    tensor of dim values (or one value), or a TF initializer (run per key, deterministic)."""
    if initializer is None:
        initializer = 0.0
    if isinstance(initializer, (tf.Tensor, np.ndarray, list, tuple)) and not isinstance(
        initializer, bool
    ):
        value = (
            tf.get_static_value(initializer)
            if isinstance(initializer, tf.Tensor)
            else np.asarray(initializer)
        )
        if value is None:
            raise ValueError(
                "initializer: a tensor initializer must be a constant, got %r" % (initializer,)
            )
        value = np.asarray(value, dtype=np.float64).reshape(-1)
        if value.size == 1:
            initializer = float(value[0])
        elif value.size == dim:
            spec = describe_initializer(0.0, table_name, param_name="initializer")
            spec["values"] = [float(v) for v in value]
            return spec
        else:
            raise ValueError(
                "initializer: an array must hold 1 or dim=%d values, got shape %s"
                % (dim, np.shape(initializer))
            )
    if callable(initializer) and not hasattr(initializer, "get_config"):
        raise ValueError(
            "initializer: %r cannot be run per key by rec_sdk; use a number, an "
            "array of dim values or a tf initializer (truncated/random normal, "
            "random uniform, constant, zeros, ones)" % (initializer,)
        )
    return describe_initializer(initializer, table_name, param_name="initializer")


class ShardKeys:  # pylint: disable=too-few-public-methods
    """keys (NumPy) -> whether the partitioner sends each to shard `index`: what a shard keeps
    when a Saver checkpoint of another shard count is restored into it (rec_sdk.saver). The
    partitioner runs in a graph and session of its own (the model's graph may be final)."""

    def __init__(self, partitioner, key_dtype, shard_num, index):
        self._args = (partitioner, key_dtype, shard_num)
        self._index = index
        self._run = None

    def __call__(self, keys):
        if self._run is None:
            partitioner, key_dtype, shard_num = self._args
            graph = tf.Graph()
            with graph.as_default():
                placeholder = tf.compat.v1.placeholder(key_dtype, [None])
                parts = tf.cast(partitioner(placeholder, shard_num), tf.int32)
            session = tf.compat.v1.Session(graph=graph)
            self._run = lambda k: session.run(parts, {placeholder: k})
        return np.asarray(self._run(keys)) == self._index


def defaults_of(initializer, dtype, dim):
    """n -> initial values [n, dim] of missing keys of a variable of another dtype than
    float32 (None: zeros, the bytes such a table initializes rows with)."""
    if initializer is None:
        return None
    if callable(initializer) and not isinstance(initializer, (tf.Tensor, np.ndarray)):
        if not hasattr(initializer, "get_config"):
            raise ValueError(
                "initializer: %r cannot be run per key by rec_sdk; use a value, "
                "an array of dim values or a tf initializer" % (initializer,)
            )
        return lambda n: tf.cast(initializer(shape=tf.stack([n, dim]), dtype=dtype), dtype)
    value = (
        tf.get_static_value(initializer)
        if isinstance(initializer, tf.Tensor)
        else np.asarray(initializer)
    )
    if value is None:
        raise ValueError(
            "initializer: a tensor initializer must be a constant, got %r" % (initializer,)
        )
    value = np.asarray(value).astype(dtype.as_numpy_dtype).reshape(-1)
    if value.size not in (1, dim):
        raise ValueError(
            "initializer: an array must hold 1 or dim=%d values, got shape %s"
            % (dim, np.shape(initializer))
        )
    if not value.any():
        return None
    row = tf.constant(value if value.size == dim else np.repeat(value, dim), dtype)
    return lambda n: tf.tile(row[None, :], tf.stack([n, 1]))
