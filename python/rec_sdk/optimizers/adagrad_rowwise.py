"""Sparse row-wise Adagrad (TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD), on the rows in the batch
only: one accumulator per row instead of one per element,

    a += mean(g^2) over the row's dim elements;  w -= lr * g / (sqrt(a) + epsilon)

where g is the row's gradient summed over the batch's occurrences of its key. The state is one
float per row (a dim-16 row with element-wise Adagrad carries 16), so rows are smaller and the
update does one square root per row."""

import tensorflow as tf

from rec_sdk.base.validation import check_float
from rec_sdk.ops import optimizer_ops
from rec_sdk.optimizers.base import SparseOptimizer, check_learning_rate


class RowwiseAdagradOptimizer(SparseOptimizer):
    slot_names = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value, epsilon, name, by_address):
        super().__init__(name, by_address)
        self.learning_rate = check_learning_rate("learning_rate", learning_rate, high=10.0)
        self.epsilon = check_float("epsilon", epsilon, 0.0, 1.0)
        # A zero accumulator is allowed when epsilon keeps the first step finite.
        self.initial_accumulator_value = check_float(
            "initial_accumulator_value",
            initial_accumulator_value,
            0.0,
            1.0,
            low_open=self.epsilon == 0.0,
        )

    def _apply(self, table, addresses, grads):
        return optimizer_ops.apply_rowwise_adagrad(
            table.handle,
            addresses,
            grads,
            tf.cast(self.learning_rate, tf.float32),
            self.initial_accumulator_value,
            self.epsilon,
            unique_addresses=True,
        )


def create_hash_optimizer(
    learning_rate=0.001, initial_accumulator_value=0.0, epsilon=1e-8, name="RowwiseAdagrad"
):
    """Row-wise Adagrad for tables without dynamic expansion (lr in [0, 10],
    initial_accumulator_value in [0, 1] (> 0 when epsilon is 0), epsilon in [0, 1])."""
    return RowwiseAdagradOptimizer(
        learning_rate, initial_accumulator_value, epsilon, name, by_address=False
    )


def create_hash_optimizer_by_address(
    learning_rate=0.001, initial_accumulator_value=0.0, epsilon=1e-8, name="RowwiseAdagradByAddress"
):
    """Row-wise Adagrad for init(use_dynamic_expansion=True), applied by row address; see
    create_hash_optimizer."""
    return RowwiseAdagradOptimizer(
        learning_rate, initial_accumulator_value, epsilon, name, by_address=True
    )
