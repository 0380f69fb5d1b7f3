"""The checkpoint ops of a table, built with the table (graph mode) so that checkpoints work
once the graph is finalized (MonitoredTrainingSession, tf.estimator): save (full or delta),
commit, restore (from one or several directories, re-sharding), the stored keys, removal of
keys, and applying a delta. rec_sdk.saver runs them; a graph loaded from a MetaGraph finds them
by name (`find`).
"""

import tensorflow as tf

from rec_sdk.ops import table_ops

# {key: name in the table's checkpoint scope} (":<i>" for a tensor, else an op).
_NAMES = {
    "keys": "keys:0",
    "remove_keys": "remove_keys:0",
    "remove": "remove",
    "save_dir": "save_dir:0",
    "delta": "delta:0",
    "save": "save:0",
    "save_id": "save:1",
    "commit_id": "commit_id:0",
    "commit": "commit",
    "apply_delta": "apply_delta:0",
    "restore_dirs": "restore_dirs:0",
    "rank_id": "rank_id:0",
    "rank_size": "rank_size:0",
    "restore": "restore:0",
    "restore_note": "restore:1",
}


def build(handle, table_name, key_dtype):
    """{key: op or tensor} of the checkpoint ops of the table `handle` (named table_name, keys
    of key_dtype), built in the default graph."""
    with tf.name_scope(table_ops.op_scope_name(table_name + "_checkpoint")) as scope:
        save_dir = tf.compat.v1.placeholder(tf.string, [], name="save_dir")
        delta = tf.compat.v1.placeholder_with_default(False, [], name="delta")
        restore_dirs = tf.compat.v1.placeholder(tf.string, [None], name="restore_dirs")
        rank_id = tf.compat.v1.placeholder_with_default(
            tf.constant(0, tf.int64), [], name="rank_id"
        )
        rank_size = tf.compat.v1.placeholder_with_default(
            tf.constant(1, tf.int64), [], name="rank_size"
        )
        table_ops.restore(handle, restore_dirs, rank_id, rank_size, name="restore")
        table_ops.save(handle, save_dir, delta, name="save")
        commit_id = tf.compat.v1.placeholder(tf.int64, [], name="commit_id")
        remove_keys = tf.compat.v1.placeholder(key_dtype, [None], name="remove_keys")
        table_ops.export_access(handle, name="keys")
        table_ops.remove(handle, remove_keys, name="remove")
        table_ops.commit_save(handle, commit_id, name="commit")
        table_ops.apply_delta(handle, save_dir, name="apply_delta")
    return _found(tf.compat.v1.get_default_graph(), scope)


def _found(graph, scope):
    return {key: graph.as_graph_element(scope + name) for key, name in _NAMES.items()}


def find(op):
    """The checkpoint ops `build` made for the table op `op` (of a graph loaded from a
    MetaGraph: found by name), or None (a table saved by no checkpoint)."""
    for consumer in op.outputs[0].consumers():
        if consumer.type == table_ops.RESTORE_OP and consumer.name.endswith("/restore"):
            return _found(op.graph, consumer.name[: -len("restore")])
    return None
