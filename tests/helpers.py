"""Small helpers shared by the test modules (graph-mode sessions)."""
import tensorflow as tf


def session_config():
    """A small session config: the test machine has 2 cores."""
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2,
                                    inter_op_parallelism_threads=2)


def new_session(graph=None):
    return tf.compat.v1.Session(graph=graph, config=session_config())


def sorted_export(keys, values, slots):
    """An export's (keys, values, slots) ordered by key, so two exports compare row by row."""
    order = keys.argsort(kind="stable")
    return keys[order], values[order], slots[:, order, :]
