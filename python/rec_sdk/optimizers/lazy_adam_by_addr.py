"""LazyAdam for dynamic-expansion tables, applied by row address."""

from rec_sdk.optimizers.lazy_adam import LazyAdamOptimizer


def create_hash_optimizer_by_address(
    learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdamByAddress"
):
    """LazyAdam for init(use_dynamic_expansion=True); see lazy_adam.create_hash_optimizer."""
    return LazyAdamOptimizer(learning_rate, beta1, beta2, epsilon, name, by_address=True)
