"""Sparse gradient descent with optional weight decay: w -= lr * (g + weight_decay * w)."""

import tensorflow as tf

from rec_sdk.base.validation import check_float
from rec_sdk.ops import optimizer_ops
from rec_sdk.optimizers.base import SparseOptimizer, check_learning_rate


class GradientDescentOptimizer(SparseOptimizer):
    def __init__(self, learning_rate, weight_decay, name, by_address):
        super().__init__(name, by_address)
        self.learning_rate = check_learning_rate("learning_rate", learning_rate)
        self.weight_decay = weight_decay

    def _apply(self, table, addresses, grads):
        return optimizer_ops.apply_gradient_descent(
            table.handle,
            addresses,
            grads,
            tf.cast(self.learning_rate, tf.float32),
            float(self.weight_decay or 0.0),
            unique_addresses=True,
        )


def create_hash_optimizer(learning_rate, weight_decay=None, name="GradientDescent"):
    """Gradient descent for tables without dynamic expansion; weight_decay is None or in
    [1e-5, 1e-2]."""
    if weight_decay is not None:
        weight_decay = check_float("weight_decay", weight_decay, 1e-5, 1e-2)
    return GradientDescentOptimizer(learning_rate, weight_decay, name, by_address=False)
