"""TFRA's `de.data_flow`: dynamic_partition and dynamic_stitch. TFRA gives them GPU kernels;
on CPU they are TensorFlow's own ops (gradients included), which these names call."""

import tensorflow as tf


def dynamic_partition(data, partitions, num_partitions, name=None):
    """tf.dynamic_partition."""
    return tf.dynamic_partition(data, partitions, num_partitions, name=name)


def dynamic_stitch(indices, data, use_fast=True, name=None):
    """tf.dynamic_stitch. use_fast (TFRA's choice between two GPU kernels of the same
    result) is accepted and changes nothing on CPU."""
    del use_fast
    return tf.dynamic_stitch(indices, data, name=name)
