"""TFRA's `de.math`: sparse segment and fill operations. TFRA gives them GPU kernels; on CPU
they are TensorFlow's own ops (gradients included), which these names call."""

import tensorflow as tf


def sparse_segment_sum(data, indices, segment_ids, name=None, num_segments=None):
    """tf.sparse.segment_sum with TFRA's argument order."""
    return tf.sparse.segment_sum(data, indices, segment_ids, num_segments=num_segments, name=name)


def sparse_fill_empty_rows(sp_input, default_value, name=None):
    """tf.sparse.fill_empty_rows: (the filled SparseTensor, the empty-row indicator)."""
    return tf.sparse.fill_empty_rows(sp_input, default_value, name=name)


def sparse_reshape(sp_input, shape, name=None):
    """tf.sparse.reshape."""
    return tf.sparse.reshape(sp_input, shape, name=name)
