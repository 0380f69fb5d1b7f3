"""Small helpers shared by the test modules (graph-mode sessions, small tables)."""

import tensorflow as tf

from rec_sdk.core.embedding import create_table

_DEFAULT = object()


def session_config():
    """A small session config: the test machine has 2 cores."""
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)


def new_session(graph=None):
    return tf.compat.v1.Session(graph=graph, config=session_config())


def sorted_export(keys, values, slots):
    """An export's (keys, values, slots) ordered by key, so two exports compare row by row."""
    order = keys.argsort(kind="stable")
    return keys[order], values[order], slots[:, order, :]


def const_initializer(value=0.5):
    return tf.compat.v1.constant_initializer(value)


def make_table(name="t", dim=4, initializer=_DEFAULT, key_dtype=tf.int64, **kwargs):
    """A table of 1000 rows (unless said otherwise) initialised to 0.5 (by default)."""
    kwargs.setdefault("device_vocabulary_size", 1000)
    return create_table(
        key_dtype,
        dim,
        name,
        const_initializer() if initializer is _DEFAULT else initializer,
        **kwargs,
    )
