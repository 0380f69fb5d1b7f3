"""From a lookup's keys to its rows and embeddings (rec_sdk.core.embedding's sparse_lookup
builds on it): the rows of a batch's unique keys from this process's table or, over ranks, by
the ranks' exchange (lookup_rows, shard_rows); the rows a FeatureSpec batch's lookups share
(pipeline_rows); the embeddings in the ids' shape (finish_lookup)."""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import tensor_util

from rec_sdk.base import tf_patches
from rec_sdk.base.validation import INT32_MAX
from rec_sdk.constants.constants import (
    LOOKUP_COLLECTIONS,
)
from rec_sdk.core.asc import helper
from rec_sdk.core.sdk_table import as_dim, create_table  # noqa: F401 (create_table: the SDK's path)
from rec_sdk.distribute import ranks
from rec_sdk.ops import table_ops
from rec_sdk.tables.table import SparseEmbedding, table_of, tables_of_graph  # noqa: F401 (re-exported)


def global_step_clock(table, where):
    step = tf.compat.v1.train.get_global_step()
    if step is None:
        raise ValueError(
            "%s: table %r evicts by steps_to_live, which needs a global step; "
            "create it with tf.compat.v1.train.get_or_create_global_step() "
            "before the lookup" % (where, table.table_name)
        )
    return tf.reshape(tf.cast(tf.convert_to_tensor(step), tf.int64), [1])


def send_count_check(table, lookup_name, num_unique, send_count):
    """Static shape: an assert that a step's distinct keys fit in send_count. Returns
    (assert op, the Const holding the limit) so that later lookups sharing the keys can
    raise the limit (the send counts of a table's lookups add up)."""
    limit = tf.constant(send_count, tf.int32, name="send_count")
    check = tf.debugging.Assert(
        tf.less_equal(num_unique, limit),
        [
            tf.strings.format(
                "sparse_lookup %s on table %s: {} distinct keys in the batch, "
                "more than send_count={}; raise send_count" % (lookup_name, table.table_name),
                (num_unique, limit),
            )
        ],
        name="check_send_count",
    )
    return check, limit


def raise_limit(limit, total):
    tf_patches.set_op_attr(
        limit.op,
        "value",
        attr_value_pb2.AttrValue(tensor=tensor_util.make_tensor_proto(total, tf.int32)),
    )


def gather_rows_of(table, keys, addresses, is_train):
    """(rows of the unique keys [n, dim], the addresses their gradients go to). With padding
    keys (padding_keys_mask) in training, a padding key's row is read as any row but its
    gradient address is -1, which the optimizers skip: the row, and its slots, never change."""
    if not (table.padding_keys_mask and is_train):
        return table_ops.gather(table.handle, addresses, table.dim, name="gather"), addresses
    pad = tf.reduce_any(
        tf.equal(
            tf.expand_dims(tf.cast(keys, tf.int64), 1), tf.constant(table.padding_keys, tf.int64)
        ),
        1,
    )
    trained = tf.where(pad, tf.constant(-1, tf.int64), addresses, name="trained_addresses")
    table.lookups.trained_address_names.add(trained.name)
    rows = table_ops.gather(table.handle, trained, table.dim, name="gather")
    frozen = tf.stop_gradient(
        table_ops.gather(table.handle, addresses, table.dim, name="gather_padding")
    )
    return tf.where(tf.expand_dims(pad, 1), frozen, rows), trained


def finish_lookup(
    table,
    local_emb,
    addresses,
    inverse,
    ids,
    is_train,
    is_grad,
    serving_default_value,
    register,
    trained_addresses=None,
):
    """Embeddings of the ids (ids.shape + [dim]) from the rows of their unique keys.
    `trained_addresses` (default: addresses) are those the lookup collections pair with the
    rows for the optimizers."""
    if register and is_train and is_grad:
        # The addresses are those of distinct keys already, so the SDK's "unique keys" entry
        # is the same tensor as its "id offsets" entry.
        trained = addresses if trained_addresses is None else trained_addresses
        for collection, value in zip(LOOKUP_COLLECTIONS, (local_emb, trained, trained)):
            tf.compat.v1.add_to_collection(collection, value)
    if not is_grad:
        local_emb = tf.stop_gradient(local_emb)
    if serving_default_value is not None:
        default = tf.broadcast_to(tf.cast(serving_default_value, tf.float32), [table.dim])
        missing = tf.expand_dims(tf.equal(addresses, -1), 1)
        local_emb = tf.where(missing, default[tf.newaxis, :], local_emb)
    out_shape = tf.concat([tf.shape(inverse, out_type=tf.int32), [table.dim]], 0)
    embeddings = tf.reshape(
        table_ops.gather_rows(local_emb, tf.reshape(inverse, [-1])), out_shape, name="embeddings"
    )
    embeddings.set_shape(ids.shape.concatenate([table.dim]))
    return embeddings


def pipeline_thresholds(table, spec):
    """(access, eviction) thresholds of a table in FeatureSpec mode: the spec's, or those of
    the table's specs in the graph's insert functions."""
    if spec.access_threshold is not None:
        return spec.access_threshold, spec.eviction_threshold
    for specs, _ in helper.registered_specs(table.graph):
        for other in specs:
            if other.table_name == table.table_name and other.access_threshold is not None:
                return other.access_threshold, other.eviction_threshold
    return None


def pipeline_keys(table, unique):
    """The pipeline's unique keys (int64) in the table's key dtype; an int32 table fails at run
    time on a key outside the int32 range rather than wrapping it."""
    if table.key_dtype == tf.int64:
        return unique
    check = tf.debugging.Assert(
        tf.reduce_all((unique >= -INT32_MAX - 1) & (unique <= INT32_MAX)),
        [
            "table %r has int32 keys; the batch holds a key outside the int32 range"
            % table.table_name
        ],
        name="check_int32_keys",
    )
    with tf.control_dependencies([check]):
        return tf.cast(unique, tf.int32)


def pipeline_rows(table, entries, is_train, send_count, lookup_name):
    """Maps a batch's preprocessed unique keys of `table` (from get_asc_insert_func) to rows:
    one find_or_insert (with the batch's admission counts and timestamps in training) and one
    gather. Shared by every lookup of the table on that batch (FeatureSpec lookups, and tensor
    lookups after graph modification). Returns {"emb", "addresses", "limit", "send_count",
    "registered"}."""
    where = "sparse_lookup %r" % lookup_name
    unique = entries[helper.unique_key(table.table_name)]
    counts = entries.get(helper.counts_key(table.table_name)) if is_train else None
    times = None
    if is_train and table.admission and counts is None:
        raise ValueError(
            "%s: table %r has feature admission but the batch comes from "
            "get_asc_insert_func(is_training=False); use is_training=True "
            "for training datasets" % (where, table.table_name)
        )
    if is_train and table.clock == "timestamp":
        times = entries.get(helper.times_key(table.table_name))
        if times is None:
            raise ValueError(
                "%s: table %r evicts by timestamp but the batch has none; "
                "add a FeatureSpec with is_timestamp=True to the "
                "training tgt_key_specs" % (where, table.table_name)
            )
    elif is_train and table.clock == "step":
        times = global_step_clock(table, where)
    keys = pipeline_keys(table, unique)
    table_ops.mark_keys_unique(keys)
    rows = lookup_rows(table, keys, is_train, counts, times, send_count, lookup_name)
    rows.update(send_count=send_count or 0, registered=False)
    return rows


def lookup_rows(table, keys, is_train, counts, times, send_count, lookup_name, in_order=True):
    """The one lookup core, for id-tensor and pipeline lookups alike: distinct `keys` ->
    (static shape: a check that they fit send_count) -> find_or_insert (with admission
    counts and clocks in training) -> the rows. Returns {"emb" (rows), "addresses",
    "trained" (the addresses gradients go to), "limit" (the send_count constant, or None)}.
    in_order: a training lookup runs after the table's previous one (in_build_order); not for
    lookups graph modification replaces (a dependency would keep their ops running)."""
    checks, limit = [], None
    if send_count is not None:
        check, limit = send_count_check(table, lookup_name, tf.size(keys), send_count)
        checks.append(check)

    def shard(owned, owned_counts, owned_times):
        return shard_rows(table, owned, is_train, owned_counts, owned_times, lookup_name)

    with tf.control_dependencies(checks):
        if table.ranks is None:
            rows = in_build_order(table, is_train and in_order, lambda: shard(keys, counts, times))
        else:
            # A table sharded over ranks: the owners of the keys look them up (in the order of
            # their batch: optimizers rebuild the lookups of a step as one batch, so the
            # lookups built here may not run).
            rows = ranks.exchange_rows(
                table, keys, counts, times, table.clock == "timestamp", shard, is_train=is_train
            )
    rows["limit"] = limit
    return rows


def in_build_order(table, is_train, build):
    """build() (-> {"addresses", ...}) made to run after the table's previous training lookup
    in this graph, when it is a training lookup in the same control-flow context. TensorFlow
    runs independent ops in any order, and the order of two training lookups of one table
    shows in what they leave (which keys a full or admitting table takes, their clocks);
    tf.function orders them already (its automatic control dependencies)."""
    if not is_train or tf.executing_eagerly():
        return build()
    graph = tf.compat.v1.get_default_graph()
    record = table.lookups
    context = tf_patches.control_flow_context(graph)
    last = record.last_training
    same = last is not None and last[0].graph is graph and last[1] is context
    after = [last[0]] if same else []
    with tf.control_dependencies(after):
        rows = build()
    record.last_training = (rows["addresses"].op, context)
    return rows


def shard_rows(table, keys, is_train, counts, times, lookup_name):
    """find_or_insert and gather in this process's table (or shard), one op unless padding
    keys need their own gather: {"emb", "addresses", "trained"}."""
    if not (table.padding_keys_mask and is_train):
        addresses, local_emb = table.find_or_insert_rows(
            keys, is_train, counts=counts, times=times, name="find_or_insert", lookup=lookup_name
        )
        return {"emb": local_emb, "addresses": addresses, "trained": addresses}
    addresses = table.find_or_insert(
        keys, is_train, counts=counts, times=times, name="find_or_insert", lookup=lookup_name
    )
    local_emb, trained = gather_rows_of(table, keys, addresses, is_train)
    return {"emb": local_emb, "addresses": addresses, "trained": trained}
