"""Sparse Adagrad: a += g^2; w -= lr * g / sqrt(a), on the rows in the batch only."""

import tensorflow as tf

from rec_sdk.base.validation import check_float
from rec_sdk.ops import optimizer_ops
from rec_sdk.optimizers.base import SparseOptimizer, check_learning_rate


class AdagradOptimizer(SparseOptimizer):
    slot_names = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value, name, by_address):
        super().__init__(name, by_address)
        self.learning_rate = check_learning_rate("learning_rate", learning_rate, high=10.0)
        self.initial_accumulator_value = check_float(
            "initial_accumulator_value", initial_accumulator_value, 0.0, 1.0, low_open=True
        )

    def _apply(self, table, addresses, grads):
        return optimizer_ops.apply_adagrad(
            table.handle,
            addresses,
            grads,
            tf.cast(self.learning_rate, tf.float32),
            self.initial_accumulator_value,
            unique_addresses=True,
        )


def create_hash_optimizer(learning_rate=0.001, initial_accumulator_value=0.9, name="Adagrad"):
    """Adagrad for tables without dynamic expansion (lr in [0, 10], initial_accumulator_value
    in (0, 1])."""
    return AdagradOptimizer(learning_rate, initial_accumulator_value, name, by_address=False)
