"""get_dense_and_sparse_variable (mirrors mx_rec.util.variable)."""
import tensorflow as tf

from rec_sdk.core.embedding import tables_of_graph


def get_dense_and_sparse_variable():
    """(dense trainable variables, rec_sdk tables) of the default graph.

    Tables are not tf.Variables; `tf.gradients(loss, tables)` gives IndexedSlices keyed by row
    address, which the sparse optimizers' apply_gradients accepts.
    """
    return tf.compat.v1.trainable_variables(), tables_of_graph()
