"""DynamicEmbeddingOptimizer: stock optimizers on de.Variables, in graph mode and TF2.

`DynamicEmbeddingOptimizer(opt)` returns `opt` itself with apply_gradients extended: the
(gradient, trainable) pairs of de lookups are applied to the rows of the lookup's keys (keys
met for the first time are inserted then, starting from the values the forward pass read);
every other pair goes to opt's own apply_gradients. The optimizer's slots live in the
variable's rows. Three families of optimizers (see optimizer_kinds):

  optimizer (v1 / Keras name)        rec_sdk kernel               slots (get_slot_variables)
  AdamOptimizer / Adam               LazyAdam, bias-corrected     m, v   (v1: from float32
                                     rate computed as TF's           beta powers, as TF's
                                                                     Adam; Keras: from
                                                                     its iteration count)
  AdagradOptimizer / Adagrad         Adagrad (Keras: epsilon)     accumulator
  de.RowwiseAdagradOptimizer         RowwiseAdagrad (1 float/row) accumulator (reads as
                                                                     the row's value, dim times)
  GradientDescentOptimizer / SGD     GradientDescent              -
  MomentumOptimizer / SGD(momentum)  Momentum (Keras: velocity)   momentum
  FtrlOptimizer / Ftrl               FTRL (ApplyFtrlV2)           accum / accumulator, linear
  any other (Adadelta, AdagradDA, ProximalAdagrad, ProximalGradientDescent, RMSProp,
  Adamax, Nadam, AdamW, Lion, Adam(amsgrad), subclasses, Keras weight decay):
                                     the optimizer's own update on the step's rows and slots,
                                     read from and written back to the table (TableReadRows /
                                     TableWriteRows); slots as the optimizer names them

The generic path reads, updates and writes the rows in three ops, so unlike the fused
kernels it is not atomic against another thread training the same table at once. A Keras
optimizer's generic path runs a private copy of the optimizer (same class and config), built
once per table on variables of any row count, at the wrapped optimizer's iteration and
current hyperparameters; optimizer-wide state (Nadam's momentum cache) advances once per step.
"""

import threading
import weakref

import tensorflow as tf

from rec_sdk.base import tf_patches, tf_processors
from rec_sdk.base.graph_state import state_of
from rec_sdk.dynamic_embedding.lookup import LookupRecord, record_of
from rec_sdk.dynamic_embedding.optimizer_kinds import (
    family,
    legacy_var_key,
    name_of,
    private_call,
    private_state,
)
from rec_sdk.dynamic_embedding.optimizer_rows import RowUpdate
from rec_sdk.ops import table_ops


def _rows_of(grad, record):
    """Gradient rows [n_unique, dim] of a lookup's unique keys."""
    n = tf.size(record.unique_keys)
    dim = record.params.dim
    if isinstance(grad, tf.IndexedSlices):
        indices = grad.indices
        if (
            not tf.executing_eagerly()
            and indices.op.type == "Range"
            and indices.op.name in state_of(indices.graph).row_ranges
        ):
            return tf.reshape(grad.values, [-1, dim])
        return table_ops.sum_rows(tf.reshape(grad.values, [-1, dim]), tf.cast(indices, tf.int32), n)
    return tf.reshape(tf.convert_to_tensor(grad), [-1, dim])


def _shard_triples(params, grads_and_records):
    """[(table, addresses, gradient rows)] per shard of one variable, for all its lookups in
    the step: keys met by several lookups are merged first (one update and one access count
    per key); missing keys are inserted, after the lookups read them."""
    keys = [r.unique_keys for _, r in grads_and_records]
    rows = [_rows_of(g, r) for g, r in grads_and_records]
    if len(keys) == 1 and not getattr(grads_and_records[0][1].shadow, "may_repeat", False):
        keys, rows = keys[0], rows[0]
    else:
        keys, index = table_ops.unique_keys(tf.concat(keys, 0))
        rows = table_ops.sum_rows(tf.concat(rows, 0), index, tf.size(keys))
    parts, shard_keys, _ = params.split_keys(keys)
    shard_rows = params.by_shard(parts, rows)
    triples = []
    with tf.control_dependencies(
        [r.read for _, r in grads_and_records if r.read is not None] + params.access_tracking
    ):
        for table, k, r in zip(params.shards, shard_keys, shard_rows):
            if not tf.executing_eagerly():
                table_ops.mark_keys_unique(k)
                table.lookups.training += 1  # this graph trains the table (see share_tables)
            triples.append((table, table.find_or_insert(k, is_train=True, lookup=params.name), r))
    return triples


def _split(grads_and_vars):
    """({de.Variable: [(gradient, record)]}, [other (gradient, variable)])."""
    de_pairs, others = {}, []
    for grad, var in grads_and_vars:
        record = record_of(var)
        if record is None:
            others.append((grad, var))
        elif grad is not None and record.params.trainable:
            grad, record = _keyed(grad, record)
            de_pairs.setdefault(record.params, []).append((grad, record))
    return de_pairs, others


def _keyed(grad, record):
    """(gradient, record) of a shadow's gradient that carries its rows' keys (lookups under
    ParameterServerStrategy, see ShadowVariable.rows): the record's keys are the distinct
    keys of the gradient, and the gradient's indices point into them."""
    shadow = record.shadow
    if shadow is None or not shadow.keys_in_gradient:
        return grad, record
    if not isinstance(grad, tf.IndexedSlices):
        raise ValueError(
            "the gradient of de lookup %r reached the optimizer as a dense %r: under "
            "ParameterServerStrategy the gradient carries the keys of its rows, so it must "
            "stay tf.IndexedSlices (do not convert or densify it before apply_gradients)"
            % (shadow.name, grad)
        )
    keys, index = table_ops.unique_keys(grad.indices)
    return (tf.IndexedSlices(grad.values, index), LookupRecord(record.params, keys, None))


def _de_update(row_update, de_pairs):
    """The update ops of the de lookups' rows, then the re-reads of the TF2 shadows."""
    triples = []
    with tf.name_scope("dynamic_embedding"):
        for params, pairs in de_pairs.items():
            triples.extend(_shard_triples(params, pairs))
        updates = [u for u in tf.nest.flatten(row_update.apply(triples)) if u is not None]
        shadows = {
            id(r.shadow): r.shadow
            for pairs in de_pairs.values()
            for _, r in pairs
            if r.shadow is not None
        }
        if shadows:
            with tf.control_dependencies(updates):
                refreshed = [shadow.refresh() for shadow in shadows.values()]
            updates.extend(r for r in refreshed if r is not None)
            for shadow in shadows.values():
                shadow.step_applied()
    return updates


# {optimizer: the keys of the trainables whose slots _list_slots listed}.
_listed_slots = weakref.WeakKeyDictionary()


def _list_slots(optimizer, fam, grads_and_vars):
    """The de trainables' slots in the optimizer's own slot dict, as TFRA's are
    (tf.compat.v1: _slots[slot name][trainable's key]; legacy Keras: _slots[trainable's
    key][slot name]), as TrainableSlots. They are not variables: tf.compat.v1's variables()
    leaves them out (of no graph) and Keras' lists its _weights only."""
    if fam not in ("v1", "legacy"):
        return
    slots = private_state(optimizer, "_slots")
    listed = _listed_slots.setdefault(optimizer, set())
    for grad, var in grads_and_vars:
        record = record_of(var)
        if grad is None or record is None or not record.params.trainable:
            continue
        key = tf_patches.var_key(var) if fam == "v1" else legacy_var_key(optimizer)(var)
        if key in listed:
            continue  # listed at an earlier step (eagerly: every step applies)
        listed.add(key)
        for view in record.params.get_slot_variables(optimizer):
            if fam == "v1":
                slots.setdefault(view.slot_name, {}).setdefault(key, TrainableSlot(view))
            else:
                slots.setdefault(key, {}).setdefault(view.slot_name, TrainableSlot(view))


def _apply_gradients(optimizer, row_update, original, grads_and_vars, global_step=None, name=None):
    """apply_gradients of a wrapped tf.compat.v1.train optimizer."""
    grads_and_vars = list(grads_and_vars)
    _list_slots(optimizer, "v1", grads_and_vars)
    de_pairs, others = _split(grads_and_vars)
    updates = []
    with tf.name_scope(name or optimizer.get_name()):
        if de_pairs:
            updates.extend(_de_update(row_update, de_pairs))
    if any(g is not None for g, _ in others) or not de_pairs:
        updates.append(original(others, name=name))
    if tf.executing_eagerly():
        if global_step is not None:
            global_step.assign_add(1)
        return None
    if global_step is None:
        return tf.group(updates, name=name)
    with tf.control_dependencies(updates):
        return tf.compat.v1.assign_add(global_step, 1, name=name).op


def _keras_clipped(optimizer, fam, pairs):
    """The de (gradient, variable) pairs clipped as the Keras optimizer clips gradients
    (clipnorm, clipvalue, global_clipnorm over these pairs)."""
    if not any(getattr(optimizer, a, None) for a in ("clipnorm", "clipvalue", "global_clipnorm")):
        return pairs
    if fam == "legacy":
        return list(private_call(optimizer, "_transform_gradients", pairs))
    grads = private_call(optimizer, "_clip_gradients", [g for g, _ in pairs])
    return list(zip(grads, [v for _, v in pairs]))


def _keras_apply_gradients(
    optimizer, fam, row_update, original, grads_and_vars, name=None, **kwargs
):
    """apply_gradients of a wrapped Keras optimizer (both families): the de pairs by
    row_update at the optimizer's current iteration, then the others by the optimizer itself,
    which counts the step (or the step is counted here when there are no others)."""
    grads_and_vars = list(grads_and_vars)
    de_vars = [(g, v) for g, v in grads_and_vars if record_of(v) is not None]
    if de_vars:
        clipped = {id(v): g for g, v in _keras_clipped(optimizer, fam, de_vars)}
        grads_and_vars = [(clipped.get(id(v), g), v) for g, v in grads_and_vars]
    _list_slots(optimizer, fam, grads_and_vars)
    de_pairs, others = _split(grads_and_vars)
    if not de_pairs:
        return original(others, name=name, **kwargs)
    with tf.name_scope(name or name_of(optimizer)):
        updates = _de_update(row_update, de_pairs)
    graph_updates = [] if tf.executing_eagerly() else updates
    with tf.control_dependencies(graph_updates):  # the step is counted after the update read it
        if any(g is not None for g, _ in others):
            return original(others, name=name, **kwargs)
        step = optimizer.iterations.assign_add(1)
    return step if fam == "keras" or tf.executing_eagerly() else step.op


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
            % (type(optimizer).__name__, self._v.name, params.name)
        )


_checkpoint_listing = threading.local()  # depth > 0: TensorFlow is listing slot variables


def _listing_slots(original, *args, **kwargs):
    """Marks the thread while TensorFlow's checkpoint code lists optimizers' slot variables
    (tensorflow.python.checkpoint.util.serialize_slot_variables)."""
    _checkpoint_listing.depth = getattr(_checkpoint_listing, "depth", 0) + 1
    try:
        return original(*args, **kwargs)
    finally:
        _checkpoint_listing.depth -= 1


tf_patches.install("checkpoint.util.serialize_slot_variables", _listing_slots)


def _trainable_processor(v):
    """tf.compat.v1 optimizers' processor of a de trainable (as TFRA routes its trainables)."""
    return _UnwrappedTrainable(v) if record_of(v) is not None else None


tf_processors.register(_trainable_processor)


class TrainableSlot:
    """What optimizer.get_slot(trainable, name) gives for a graph-mode de lookup's trainable
    (TFRA: the slot's own trainable): `params` is the slot's view on the variable's rows
    (de.SlotVariable)."""

    # Not a variable of any graph (tf.compat.v1's Optimizer.variables() asks).
    _in_graph_mode = False
    _graph_key = None

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
        if record.shadow is not None and getattr(_checkpoint_listing, "depth", 0):
            # A TF2 shadow's slots live in the table's rows and are saved with them: none
            # for checkpoints and SavedModels to list (or re-create on load).
            return None
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
    """Makes the optimizer `self` train de.Variables too; returns it (the same object).

    `self` is a tf.compat.v1.train optimizer, a Keras OptimizerV2
    (tf.keras.optimizers.legacy) or a Keras 2 optimizer (tf.keras.optimizers). Its
    apply_gradients (and so minimize, and Keras' model.fit) then applies the gradients of de
    lookups' trainables to the rows of their keys, with rec_sdk's fused kernel where the
    optimizer's update is Adam, Adagrad, SGD, momentum or Ftrl, and with the optimizer's own
    update on the gathered rows and slots otherwise; every other variable is left to the
    optimizer as before.

    bp_v2 is accepted for TFRA scripts: rec_sdk's updates always add a delta to the current
    row in place, so concurrent workers never overwrite each other's updates. synchronous
    (Horovod) is not supported.
    """
    del bp_v2, kwargs
    if synchronous:
        raise ValueError(
            "DynamicEmbeddingOptimizer(synchronous=True) (Horovod) is not supported by rec_sdk"
        )
    fam = family(self)
    if getattr(self.apply_gradients, "rec_sdk_row_update", None) is not None:
        return self  # wrapped already
    if fam == "keras" and getattr(self, "use_ema", False):
        raise ValueError(
            "DynamicEmbeddingOptimizer: use_ema=True (moving averages of every "
            "variable) is not supported for dynamic embeddings"
        )
    row_update = RowUpdate(self)
    original = self.apply_gradients
    if fam != "keras":
        _add_slot_views(self, row_update.slot_names or ())

    if fam == "v1":

        def apply_gradients(grads_and_vars, global_step=None, name=None):
            return _apply_gradients(self, row_update, original, grads_and_vars, global_step, name)
    else:

        def apply_gradients(grads_and_vars, name=None, **kwargs):
            return _keras_apply_gradients(
                self, fam, row_update, original, grads_and_vars, name, **kwargs
            )

    apply_gradients.__doc__ = original.__doc__
    apply_gradients.rec_sdk_row_update = row_update
    self.apply_gradients = apply_gradients
    return self
