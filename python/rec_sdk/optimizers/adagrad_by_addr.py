"""Sparse Adagrad for dynamic-expansion tables, applied by row address."""

from rec_sdk.optimizers.adagrad import AdagradOptimizer


def create_hash_optimizer_by_address(
    learning_rate=0.001, initial_accumulator_value=0.9, name="AdagradByAddress"
):
    """Adagrad for init(use_dynamic_expansion=True); see adagrad.create_hash_optimizer."""
    return AdagradOptimizer(learning_rate, initial_accumulator_value, name, by_address=True)
