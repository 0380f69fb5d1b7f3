"""Sparse FTRL-proximal (TensorFlow's ApplyFtrlV2 formulas) on the rows in the batch only."""

import tensorflow as tf

from rec_sdk.base.validation import check_float
from rec_sdk.ops import optimizer_ops
from rec_sdk.optimizers.base import SparseOptimizer, check_learning_rate


class FtrlOptimizer(SparseOptimizer):
    slot_names = ("accumulator", "linear")

    def __init__(
        self,
        learning_rate,
        learning_rate_power,
        initial_accumulator_value,
        l1,
        l2,
        l2_shrinkage,
        name,
        by_address,
        names=(
            "l1_regularization_strength",
            "l2_regularization_strength",
            "l2_shrinkage_regularization_strength",
        ),
    ):
        super().__init__(name, by_address)
        self.learning_rate = check_learning_rate("learning_rate", learning_rate, positive=True)
        self.learning_rate_power = check_float(
            "learning_rate_power", learning_rate_power, float("-inf"), 0.0, low_open=True
        )
        self.initial_accumulator_value = check_float(
            "initial_accumulator_value", initial_accumulator_value, 0.0, float("inf")
        )
        self.l1 = check_float(names[0], l1, 0.0, 1e4)
        self.l2 = check_float(names[1], l2, 0.0, 1e4)
        self.l2_shrinkage = check_float(names[2], l2_shrinkage, 0.0, 1e4)

    def _apply(self, table, addresses, grads):
        return optimizer_ops.apply_ftrl(
            table.handle,
            addresses,
            grads,
            tf.cast(self.learning_rate, tf.float32),
            self.learning_rate_power,
            self.l1,
            self.l2,
            self.l2_shrinkage,
            self.initial_accumulator_value,
            unique_addresses=True,
        )


def create_hash_optimizer(
    learning_rate,
    learning_rate_power=-0.5,
    initial_accumulator_value=0.1,
    l1_regularization_strength=0.0,
    l2_regularization_strength=0.0,
    l2_shrinkage_regularization_strength=0.0,
    name="Ftrl",
    **kwargs,
):
    """FTRL for tables without dynamic expansion. learning_rate is required; l1, l2 and
    l2_shrinkage strengths in [0, 1e4]; learning_rate_power <= 0. The short names l1, l2 and
    l2_shrinkage are accepted as keywords too."""
    # Errors name the keyword the caller used.
    values, names = [], []
    for short, long_name, value in (
        ("l1", "l1_regularization_strength", l1_regularization_strength),
        ("l2", "l2_regularization_strength", l2_regularization_strength),
        (
            "l2_shrinkage",
            "l2_shrinkage_regularization_strength",
            l2_shrinkage_regularization_strength,
        ),
    ):
        if short in kwargs:
            values.append(kwargs.pop(short))
            names.append(short)
        else:
            values.append(value)
            names.append(long_name)
    if kwargs:
        raise TypeError("create_hash_optimizer got unexpected arguments %s" % sorted(kwargs))
    return FtrlOptimizer(
        learning_rate,
        learning_rate_power,
        initial_accumulator_value,
        *values,
        name,
        by_address=False,
        names=tuple(names),
    )
