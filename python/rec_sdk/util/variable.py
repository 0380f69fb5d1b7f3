"""get_dense_and_sparse_variable (mirrors mx_rec.util.variable)."""

import tensorflow as tf

from rec_sdk.base.graph_state import trainable_lookup
from rec_sdk.tables.table import tables_of_graph


def get_dense_and_sparse_variable():
    """(dense trainable variables, rec_sdk tables) of the default graph.

    Tables are not tf.Variables; `tf.gradients(loss, tables)` gives IndexedSlices keyed by row
    address, which the sparse optimizers' apply_gradients accepts.
    """
    dense = [
        v for v in tf.compat.v1.trainable_variables() if trainable_lookup(v) is None
    ]  # not dynamic_embedding trainables
    return dense, tables_of_graph()
