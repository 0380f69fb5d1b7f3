"""The generic path of a Keras optimizer on de rows: a private copy of the optimizer per table,
run on variables of any row count (see KerasRows)."""

import numpy as np
import tensorflow as tf

from rec_sdk.base.tf_compat import keras
from rec_sdk.dynamic_embedding.optimizer_kinds import legacy_var_key, private_call, private_state
from rec_sdk.optimizers.row_update import row_variable, through_variables


def _constant_initial(initializer, dtype):
    """The one value a slot initializer fills with (zeros, ones, a constant)."""
    if isinstance(initializer, str):
        initializer = keras.initializers.get(initializer)
    value = (
        tf.get_static_value(initializer(shape=[1], dtype=dtype))
        if callable(initializer)
        else tf.get_static_value(tf.convert_to_tensor(initializer))
    )
    if value is None:
        raise NotImplementedError(
            "a slot initializer of rows trained by the generic path must "
            "be constant, got %r" % (initializer,)
        )
    return float(np.asarray(value).reshape(-1)[0])


class KerasRows:
    """The generic path of a Keras optimizer for one table: a private copy of the optimizer
    (same class and config) built on a rows variable, whose slots are variables of any row
    count; each step loads the step's rows and slots into them, runs the copy's own
    apply_gradients (at the wrapped optimizer's iteration) and writes them back."""

    def __init__(self, optimizer, fam, dim, name):
        with tf.init_scope():  # Keras 2's get_config reads its variables' values
            inner = type(optimizer).from_config(optimizer.get_config())
        self.inner = inner
        self.legacy = fam == "legacy"
        self.slots = []  # [(slot name, variable, initial value)]
        with tf.init_scope():
            self.rows = row_variable(dim, name + "/rows", trainable=True)
            if fam == "legacy":
                var_key = legacy_var_key(inner)

                def add_slot(var, slot_name, initializer="zeros", shape=None):
                    slots = private_state(inner, "_slots").setdefault(var_key(var), {})
                    if slot_name in slots:
                        return slots[slot_name]
                    self._check_shape(optimizer, shape)
                    slot = row_variable(dim, "%s/%s" % (name, slot_name))
                    self.slots.append((slot_name, slot, _constant_initial(initializer, tf.float32)))
                    slots[slot_name] = slot
                    slot_names = private_state(inner, "_slot_names")
                    if slot_name not in slot_names:
                        slot_names.append(slot_name)
                    return slot

                inner.add_slot = add_slot
                private_call(inner, "_create_all_weights", [self.rows])
            else:

                def add_variable_from_reference(
                    model_variable, variable_name, shape=None, initial_value=None
                ):
                    del model_variable
                    self._check_shape(optimizer, shape)
                    slot = row_variable(dim, "%s/%s" % (name, variable_name))
                    initial = (
                        0.0
                        if initial_value is None
                        else _constant_initial(initial_value, tf.float32)
                    )
                    self.slots.append((variable_name, slot, initial))
                    private_state(inner, "_variables").append(slot)
                    return slot

                inner.add_variable_from_reference = add_variable_from_reference
                try:
                    inner.build([self.rows])
                except (ValueError, TypeError) as e:  # slots shaped from the variable's shape
                    raise NotImplementedError(
                        "%s cannot build its slots for rows of a dynamic embedding (%s); use "
                        "another optimizer for de.Variables" % (type(optimizer).__name__, e)
                    ) from None

    @staticmethod
    def _check_shape(optimizer, shape):
        if shape is not None:
            raise NotImplementedError(
                "%s keeps slots of their own shape (factored), which rows of a "
                "dynamic embedding cannot have; use another optimizer for de.Variables"
                % type(optimizer).__name__
            )

    def slot_info(self):
        return [(name, initial) for name, _, initial in self.slots]

    def state(self):
        """The copy's own variables that are neither slots nor rows nor hyperparameters nor
        the iteration count (e.g. Nadam's momentum cache): state of the optimizer as a whole,
        which every table's copy shares (see optimizer_rows.RowUpdate._keras_generic)."""
        inner = self.inner
        skip = {id(v) for _, v, _ in self.slots} | {id(self.rows), id(inner.iterations)}
        if self.legacy:
            skip |= {id(v) for v in private_state(inner, "_hyper").values()}
            return [w for w in private_state(inner, "_weights") if id(w) not in skip]
        return [
            v
            for v in inner.variables
            if id(v) not in skip and v is not private_state(inner, "_learning_rate", None)
        ]

    def sync(self, optimizer):
        """Ops giving the copy the wrapped optimizer's iteration and current hyperparameters
        (a callback may have changed the learning rate since the copy was made)."""
        inner = self.inner
        ops = [inner.iterations.assign(optimizer.iterations, read_value=False)]
        if self.legacy:
            for name, var in private_state(inner, "_hyper").items():
                value = private_call(optimizer, "_get_hyper", name)
                if isinstance(var, tf.Variable) and not isinstance(
                    value, keras.optimizers.schedules.LearningRateSchedule
                ):
                    ops.append(var.assign(tf.cast(value, var.dtype), read_value=False))
        else:
            lr = private_state(inner, "_learning_rate", None)
            if isinstance(lr, tf.Variable):
                ops.append(lr.assign(tf.cast(optimizer.learning_rate, lr.dtype), read_value=False))
        return ops

    def apply(self, table, addresses, grads, owner, loads):
        return through_variables(
            table,
            addresses,
            owner,
            [value for _, _, value in self.slots],
            self.rows,
            [var for _, var, _ in self.slots],
            lambda: self.inner.apply_gradients([(grads, self.rows)]),
            loads,
        )
