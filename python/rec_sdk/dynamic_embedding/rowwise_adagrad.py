"""de.RowwiseAdagradOptimizer: row-wise Adagrad (TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD) as a
tf.compat.v1.train optimizer, so DynamicEmbeddingOptimizer can train de.Variables with it (on
rec_sdk's fused RowwiseAdagrad kernel: one float of state per row) and it also trains ordinary
variables with the same update:

    a += mean(g^2) over the last axis;  w -= lr * g / (sqrt(a) + epsilon)

A "row" is a slice along the last axis: a [n, dim] variable has n accumulators (its slot
"accumulator" has shape [n]). g is a row's gradient summed over the batch's duplicates.
"""

import tensorflow as tf

from rec_sdk.base.validation import check_float


class RowwiseAdagradOptimizer(tf.compat.v1.train.Optimizer):
    """Row-wise Adagrad (learning_rate > 0, initial_accumulator_value >= 0 (> 0 when epsilon
    is 0), epsilon in [0, 1])."""

    def __init__(
        self,
        learning_rate,
        initial_accumulator_value=0.0,
        epsilon=1e-8,
        use_locking=False,
        name="RowwiseAdagrad",
    ):
        super().__init__(use_locking, name)
        self._learning_rate = learning_rate
        self._epsilon = check_float("epsilon", epsilon, 0.0, 1.0)
        self._initial_accumulator_value = check_float(
            "initial_accumulator_value",
            initial_accumulator_value,
            0.0,
            float("inf"),
            low_open=self._epsilon == 0.0,
            high_open=True,
        )

    def _create_slots(self, var_list):
        for var in var_list:
            shape = var.get_shape()[:-1]
            self._get_or_make_slot_with_initializer(
                var,
                tf.compat.v1.constant_initializer(self._initial_accumulator_value),
                shape,
                var.dtype.base_dtype,
                "accumulator",
                self._name,
            )

    def _step(self, grad, accumulator_rows):
        """(new accumulator rows, the update of the rows)."""
        lr = tf.cast(self._call_if_callable(self._learning_rate), grad.dtype)
        new = accumulator_rows + tf.reduce_mean(tf.square(grad), axis=-1)
        return new, lr * grad / (tf.sqrt(new) + self._epsilon)[..., None]

    def _resource_apply_dense(self, grad, handle):
        acc = self.get_slot(handle, "accumulator")
        new, delta = self._step(grad, acc.read_value())
        with tf.control_dependencies([acc.assign(new)]):
            return tf.raw_ops.AssignSubVariableOp(resource=handle.handle, value=delta)

    def _resource_apply_sparse(self, grad, handle, indices):
        # Indices are unique here (_resource_apply_sparse_duplicate_indices sums duplicates).
        acc = self.get_slot(handle, "accumulator")
        new, delta = self._step(grad, tf.gather(acc, indices))
        with tf.control_dependencies([acc.scatter_update(tf.IndexedSlices(new, indices))]):
            return tf.raw_ops.ResourceScatterSub(
                resource=handle.handle, indices=indices, updates=delta
            )

    def _apply_dense(self, grad, var):
        acc = self.get_slot(var, "accumulator")
        new, delta = self._step(grad, acc)
        with tf.control_dependencies([tf.compat.v1.assign(acc, new)]):
            return tf.compat.v1.assign_sub(var, delta, use_locking=self._use_locking)

    def _apply_sparse(self, grad, var):
        # Indices are unique here (_apply_sparse_duplicate_indices sums duplicates).
        acc = self.get_slot(var, "accumulator")
        new, delta = self._step(grad.values, tf.gather(acc, grad.indices))
        with tf.control_dependencies([tf.compat.v1.scatter_update(acc, grad.indices, new)]):
            return tf.compat.v1.scatter_sub(var, grad.indices, delta, use_locking=self._use_locking)
