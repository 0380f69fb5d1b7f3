"""LazyAdam for fixed-capacity tables: Adam that updates only the rows in the batch."""

import tensorflow as tf

from rec_sdk.base.validation import check_float
from rec_sdk.ops import optimizer_ops
from rec_sdk.optimizers.base import SparseOptimizer, check_learning_rate


class LazyAdamOptimizer(SparseOptimizer):
    """m and v live in the table rows; bias correction uses the optimizer's own step count,
    incremented once per apply_gradients (saved with the graph's variables)."""

    slot_names = ("m", "v")

    def __init__(
        self,
        learning_rate=0.001,
        beta1=0.9,
        beta2=0.999,
        epsilon=1e-8,
        name="LazyAdam",
        by_address=False,
    ):
        super().__init__(name, by_address)
        self.learning_rate = check_learning_rate("learning_rate", learning_rate)
        self.beta1 = check_float("beta1", beta1, 0.0, 1.0, low_open=True, high_open=True)
        self.beta2 = check_float("beta2", beta2, 0.0, 1.0)
        self.epsilon = check_float("epsilon", epsilon, 0.0, 1.0, low_open=True)
        self._step = None
        self._next_step = None

    def _prepare(self):
        if self._step is None:
            with tf.init_scope():
                self._step = tf.compat.v1.Variable(
                    0, dtype=tf.int64, trainable=False, name=self._name + "_step"
                )
        # One step per apply_gradients, shared by every table it updates.
        self._next_step = self._step.read_value() + 1

    def _apply(self, table, addresses, grads):
        return optimizer_ops.apply_lazy_adam(
            table.handle,
            addresses,
            grads,
            tf.cast(self.learning_rate, tf.float32),
            self.beta1,
            self.beta2,
            self.epsilon,
            self._next_step,
            unique_addresses=True,
        )

    def _finish(self, update_ops, name_scope=None):
        del name_scope
        with tf.control_dependencies(update_ops):
            return [self._step.assign(self._next_step).op]


def create_hash_optimizer(
    learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="LazyAdam"
):
    """LazyAdam for tables without dynamic expansion (lr >= 0, beta1 in (0,1), beta2 in [0,1],
    epsilon in (0,1])."""
    return LazyAdamOptimizer(learning_rate, beta1, beta2, epsilon, name, by_address=False)
