"""DynamicEmbeddingOptimizer: stock tf.compat.v1.train optimizers on de.Variables.

`DynamicEmbeddingOptimizer(opt)` returns `opt` itself with apply_gradients extended: the
(gradient, trainable) pairs of de lookups are applied by rec_sdk's sparse kernels with opt's
hyperparameters, to the rows of the lookup's keys (keys met for the first time are inserted
then, starting from the values the forward pass read); every other pair goes to opt's own
apply_gradients. The optimizer's slots live in the variable's rows:

  tf.compat.v1.train optimizer   rec_sdk kernel           slots (get_slot_variables names)
  AdamOptimizer                  LazyAdam                 m, v   (bias correction from float32
                                                                  beta powers, as TF's Adam)
  AdagradOptimizer               Adagrad                  accumulator
  GradientDescentOptimizer       GradientDescent          -
  MomentumOptimizer              Momentum (Nesterov too)  momentum
  FtrlOptimizer                  FTRL (ApplyFtrlV2)       accum, linear
  Adadelta, AdagradDA, ProximalAdagrad, ProximalGradientDescent, RMSProp optimizers:
                                 the optimizer's own TensorFlow kernel on the step's rows
                                 and slots, read from and written back to the table
                                 (TableReadRows / TableWriteRows); slots as the optimizer
                                 names them

The generic path reads, updates and writes the rows in three ops, so unlike the fused
kernels it is not atomic against another thread training the same table at once.
"""
import tensorflow as tf
from tensorflow.python.training import optimizer as tf_optimizer
from tensorflow.python.training.optimizer import _var_key  # pylint: disable=protected-access

from rec_sdk.dynamic_embedding.lookup import record_of
from rec_sdk.dynamic_embedding.optimizer_kinds import SUPPORTED, hyper, kind, slot_info
from rec_sdk.ops import optimizer_ops, table_ops
from rec_sdk.optimizers.base import SparseOptimizer
from rec_sdk.util.graph_state import state_of

class _RowUpdate(SparseOptimizer):
    """Applies one stock optimizer's update to de rows with rec_sdk's kernels."""

    def __init__(self, optimizer):
        super().__init__(optimizer.get_name(), by_address=None)
        self.kind, self.slot_names = kind(optimizer)
        self.optimizer = optimizer
        # graph -> Adam's float32 beta powers (one optimizer, many graphs)
        self._beta_powers = {}
        self._generic_locals = {}  # (graph, table name) -> the generic path's variables
        self._powers = None
        self._adam_lr = None

    def _prepare(self):
        if self.kind == "generic":
            self.optimizer._prepare()  # pylint: disable=protected-access
            return
        if self.kind != "adam":
            return
        # As TensorFlow's AdamOptimizer: float32 beta1_power and beta2_power, multiplied by
        # beta1 and beta2 after each step, give the bias-corrected rate, so that a de.Variable
        # trains exactly as a dense variable with the same optimizer (a step count and double
        # precision would differ from it by ~1e-6 after a few steps).
        o = self.optimizer
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._beta_powers:
            with tf.init_scope():
                self._beta_powers[graph] = tuple(
                    tf.compat.v1.Variable(tf.cast(hyper(beta), tf.float32), trainable=False,
                                          name="%s_de_%s_power" % (self._name, which))
                    for which, beta in (("beta1", o._beta1), ("beta2", o._beta2)))  # pylint: disable=protected-access
        self._powers = self._beta_powers[graph]
        beta1_power, beta2_power = (p.read_value() for p in self._powers)
        self._adam_lr = (_f(o._lr) * tf.sqrt(1.0 - beta2_power) /  # pylint: disable=protected-access
                         (1.0 - beta1_power))

    def _finish(self, update_ops):
        if self.kind != "adam":
            return update_ops
        o = self.optimizer
        with tf.control_dependencies(update_ops):
            return [power.assign(power * _f(beta)).op for power, beta in
                    zip(self._powers, (o._beta1, o._beta2))]  # pylint: disable=protected-access

    def _locals(self, table, slot_names):
        """The resource variables the generic path runs the optimizer's kernel on: one for
        the rows of a step and one per slot, of the table's dim and any row count, registered
        as the optimizer's slots of the first (per graph and table)."""
        graph = tf.compat.v1.get_default_graph()
        key = (graph, table.table_name)
        if key not in self._generic_locals:
            def local(name):
                # Of unknown row count, so that no shape inference takes a step's rows
                # (or the gradients feeding them) for the initial value's 0 rows.
                return tf.compat.v1.Variable(
                    tf.zeros([0, table.dim]), trainable=False, use_resource=True,
                    shape=tf.TensorShape([None, table.dim]),
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], name=name)
            with tf.init_scope(), tf.compat.v1.variable_scope(
                    None, default_name=table_ops.op_scope_name(table.table_name) + "_" +
                    self._name + "_rows"):
                rows = local("rows")
                slots = [local(name) for name in slot_names]
            for name, slot in zip(slot_names, slots):
                self.optimizer._slots.setdefault(name, {})[_var_key(rows)] = slot  # pylint: disable=protected-access
            self._generic_locals[key] = (rows, slots)
        return self._generic_locals[key]

    def _apply_generic(self, table, addresses, grads):
        slots, kernel_name = slot_info(self.optimizer)
        names = [name for name, _ in slots]
        initial = [value for _, value in slots]
        rows, slot_vars = self._locals(table, names)
        values, slot_values = optimizer_ops.read_rows(table.handle, addresses, kernel_name,
                                                      initial)
        assigns = [rows.assign(values, read_value=False)] + [
            var.assign(slot_values[i], read_value=False) for i, var in enumerate(slot_vars)]
        with tf.control_dependencies(assigns):
            update = self.optimizer._resource_apply_dense(grads, rows)  # pylint: disable=protected-access
        with tf.control_dependencies([update]):
            new_values = rows.read_value()
            new_slots = (tf.stack([var.read_value() for var in slot_vars]) if slot_vars else
                         tf.zeros([0, tf.shape(addresses)[0], table.dim]))
            return optimizer_ops.write_rows(table.handle, addresses, new_values, new_slots,
                                            kernel_name, initial)

    def _apply(self, table, addresses, grads):
        o = self.optimizer
        if self.kind == "generic":
            return self._apply_generic(table, addresses, grads)
        if self.kind == "adam":
            return optimizer_ops.apply_lazy_adam(
                table.handle, addresses, grads, self._adam_lr, _f(o._beta1), _f(o._beta2),
                _f(o._epsilon), tf.constant(1, tf.int64), unique_addresses=True,
                bias_corrected=True)
        if self.kind == "adagrad":
            return optimizer_ops.apply_adagrad(
                table.handle, addresses, grads, _f(o._learning_rate),
                float(hyper(o._initial_accumulator_value)), unique_addresses=True)
        if self.kind == "momentum":
            return optimizer_ops.apply_momentum(
                table.handle, addresses, grads, _f(o._learning_rate), _f(o._momentum),
                use_nesterov=bool(o._use_nesterov), unique_addresses=True)
        if self.kind == "ftrl":
            lr = _f(o._learning_rate)
            l2 = _f(o._l2_regularization_strength)
            beta = float(hyper(getattr(o, "_beta", 0.0)) or 0.0)
            if beta:
                l2 = l2 + beta / (2.0 * lr)
            return optimizer_ops.apply_ftrl(
                table.handle, addresses, grads, lr, _f(o._learning_rate_power),
                _f(o._l1_regularization_strength), l2,
                _f(o._l2_shrinkage_regularization_strength),
                float(hyper(o._initial_accumulator_value)), unique_addresses=True)
        return optimizer_ops.apply_gradient_descent(table.handle, addresses, grads,
                                                    _f(o._learning_rate), 0.0,
                                                    unique_addresses=True)


def _f(value):
    return tf.cast(hyper(value), tf.float32)


def _rows_of(grad, record):
    """Gradient rows [n_unique, dim] of a lookup's unique keys."""
    n = tf.size(record.unique_keys)
    dim = record.params.dim
    if isinstance(grad, tf.IndexedSlices):
        if grad.indices.op.type == "Range" and grad.indices.op.name in state_of(
                grad.indices.graph).row_ranges:
            return tf.reshape(grad.values, [-1, dim])
        return table_ops.sum_rows(tf.reshape(grad.values, [-1, dim]),
                                  tf.cast(grad.indices, tf.int32), n)
    return tf.reshape(tf.convert_to_tensor(grad), [-1, dim])


def _shard_pairs(params, grads_and_records):
    """[(gradient rows, addresses)] per shard of one variable, for all its lookups in the
    step: keys met by several lookups are merged first (one update and one access count per
    key); missing keys are inserted, after the lookups read them."""
    keys = [r.unique_keys for _, r in grads_and_records]
    rows = [_rows_of(g, r) for g, r in grads_and_records]
    if len(keys) == 1:
        keys, rows = keys[0], rows[0]
    else:
        keys, index = table_ops.unique_keys(tf.concat(keys, 0))
        rows = table_ops.sum_rows(tf.concat(rows, 0), index, tf.size(keys))
    parts, shard_keys, _ = params._split(keys)  # pylint: disable=protected-access
    shard_rows = params._by_shard(parts, rows)  # pylint: disable=protected-access
    pairs = []
    with tf.control_dependencies([r.read for _, r in grads_and_records]):
        for table, k, r in zip(params.tables, shard_keys, shard_rows):
            table_ops.mark_keys_unique(k)
            table.lookups.training += 1  # this graph trains the table (see share_tables)
            pairs.append((r, table.find_or_insert(k, is_train=True, lookup=params.name)))
    return pairs


def _apply_gradients(optimizer, row_update, original, grads_and_vars, global_step=None,
                     name=None):
    grads_and_vars = list(grads_and_vars)
    de_pairs, others = {}, []
    for grad, var in grads_and_vars:
        record = record_of(var)
        if record is None:
            others.append((grad, var))
        elif grad is not None and record.params.trainable:
            de_pairs.setdefault(record.params, []).append((grad, record))
    updates = []
    with tf.name_scope(name or optimizer.get_name()):
        if de_pairs:
            rows = []
            with tf.name_scope("dynamic_embedding"):
                for params, pairs in de_pairs.items():
                    rows.extend(_shard_pairs(params, pairs))
            updates.append(row_update.apply_gradients(rows, name="dynamic_embedding_update"))
    if any(g is not None for g, _ in others) or not de_pairs:
        updates.append(original(others, name=name))
    if global_step is None:
        return tf.group(updates, name=name)
    with tf.control_dependencies(updates):
        return tf.compat.v1.assign_add(global_step, 1, name=name).op


class _UnwrappedTrainable:
    """tf.compat.v1 optimizers' processor for a de trainable: gradients are computed as for
    any resource variable; applying them without DynamicEmbeddingOptimizer is an error at
    graph construction (the trainable holds no values: the rows live in the table)."""

    def __init__(self, var):
        self._v = var

    def target(self):
        return self._v

    def update_op(self, optimizer, grad):
        del grad
        params = record_of(self._v).params
        raise TypeError(
            "%s.apply_gradients got the trainable %r of de.Variable %r without "
            "DynamicEmbeddingOptimizer: wrap the optimizer (opt = "
            "de.DynamicEmbeddingOptimizer(opt)) or leave de trainables out of its var_list "
            "(rec_sdk.util.variable.get_dense_and_sparse_variable()[0] does)"
            % (type(optimizer).__name__, self._v.name, params.name))


def _install_processor():
    """Routes de trainables to _UnwrappedTrainable in tf.compat.v1 optimizers (wrapping
    TensorFlow's processor lookup, as TFRA does for its trainables)."""
    original = tf_optimizer._get_processor  # pylint: disable=protected-access
    if getattr(original, "_rec_sdk", False):
        return

    def get_processor(v):
        if record_of(v) is not None:
            return _UnwrappedTrainable(v)
        return original(v)

    get_processor._rec_sdk = True  # pylint: disable=protected-access
    tf_optimizer._get_processor = get_processor  # pylint: disable=protected-access


_install_processor()


class TrainableSlot:
    """What optimizer.get_slot(trainable, name) gives for a de lookup's trainable (TFRA: the
    slot's own trainable): `params` is the slot's view on the variable's rows
    (de.SlotVariable)."""

    def __init__(self, view):
        self.params = view
        self.name = view.name


def _add_slot_views(optimizer, slot_names):
    """get_slot and get_slot_names of `optimizer` also answer for de trainables."""
    original_get_slot = optimizer.get_slot
    original_names = optimizer.get_slot_names

    def get_slot(var, name):
        record = record_of(var)
        if record is None:
            return original_get_slot(var, name)
        for view in record.params.get_slot_variables(optimizer):
            if view.slot_name == name:
                return TrainableSlot(view)
        return None

    def get_slot_names():
        return sorted(set(original_names()) | set(slot_names))

    get_slot.__doc__ = original_get_slot.__doc__
    get_slot_names.__doc__ = original_names.__doc__
    optimizer.get_slot = get_slot
    optimizer.get_slot_names = get_slot_names


def DynamicEmbeddingOptimizer(self, bp_v2=False, synchronous=False, **kwargs):  # pylint: disable=invalid-name
    """Makes the tf.compat.v1.train optimizer `self` train de.Variables too; returns it.

    bp_v2 is accepted for TFRA scripts: rec_sdk's updates always add a delta to the current
    row in place, so concurrent workers never overwrite each other's updates. synchronous
    (Horovod) is not supported.
    """
    del bp_v2, kwargs
    if synchronous:
        raise ValueError("DynamicEmbeddingOptimizer(synchronous=True) (Horovod) is not "
                         "supported by rec_sdk")
    if not isinstance(self, tf.compat.v1.train.Optimizer):
        raise TypeError("DynamicEmbeddingOptimizer: the optimizer it wraps must be one of %s; "
                        "got %r" % (SUPPORTED, self))
    if getattr(self.apply_gradients, "rec_sdk_row_update", None) is not None:
        return self  # wrapped already
    row_update = _RowUpdate(self)
    original = self.apply_gradients
    _add_slot_views(self, row_update.slot_names)

    def apply_gradients(grads_and_vars, global_step=None, name=None):
        return _apply_gradients(self, row_update, original, grads_and_vars, global_step, name)

    apply_gradients.__doc__ = original.__doc__
    apply_gradients.rec_sdk_row_update = row_update
    self.apply_gradients = apply_gradients
    return self
