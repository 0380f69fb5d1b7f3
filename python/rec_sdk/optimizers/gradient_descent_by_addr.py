"""Sparse gradient descent for dynamic-expansion tables, applied by row address."""

from rec_sdk.base.validation import check_float
from rec_sdk.optimizers.gradient_descent import GradientDescentOptimizer


def create_hash_optimizer_by_addr(learning_rate, weight_decay=0.0001, name="GradientDescentByAddr"):
    """Gradient descent for init(use_dynamic_expansion=True); weight_decay in [0, 1]."""
    weight_decay = check_float("weight_decay", weight_decay, 0.0, 1.0)
    return GradientDescentOptimizer(learning_rate, weight_decay, name, by_address=True)


# The name the other *_by_addr modules use.
create_hash_optimizer_by_address = create_hash_optimizer_by_addr
