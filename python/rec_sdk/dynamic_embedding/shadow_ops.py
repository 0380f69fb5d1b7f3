"""de.shadow_ops: the trainable of TF2 lookups (TFRA's ShadowVariable).

In TF2 (eager, tf.function, Keras) a de lookup cannot hand the tape a fresh variable per call
as graph mode does: variables outlive the call. Each named lookup of a de.Variable keeps one
persistent ShadowVariable instead, a resource variable of shape [None, dim] that holds the rows
of the last lookup (their keys in `ids`, deduplicated). The lookup's rows pass through a
TrainableRows op whose gradient goes to the shadow, so tapes and stock optimizers find it;
DynamicEmbeddingOptimizer maps the shadow back to `ids` and updates the rows in the table
(fused kernel or generic path), then re-reads them into the shadow, so that the shadow always
holds the current values of its ids.
"""

import tensorflow as tf
from tensorflow.python.eager import record as tape_record
from tensorflow.python.ops import resource_variable_ops

from rec_sdk.dynamic_embedding import mode
from rec_sdk.ops import table_ops


class TrainableWrapper(resource_variable_ops.ResourceVariable):
    """The trainable of a de lookup (TFRA's name): a graph-mode lookup's trainable, and the
    base of the TF2 ShadowVariable. Its gradient rows belong to the lookup's keys;
    DynamicEmbeddingOptimizer applies them to the de.Variable's rows.

    A graph-mode lookup's trainable reads (`trainable * 2`, `read_value()`, a loss of it) as
    the rows its lookup read, with their gradient going to it, as TFRA's does."""

    lookup_rows = None  # a graph-mode lookup's rows (set by the lookup)

    def _read_variable_op(self, no_copy=False):
        rows = self.lookup_rows
        if rows is None or rows.graph is not tf.compat.v1.get_default_graph():
            return super()._read_variable_op(no_copy=no_copy)
        resource_variable_ops.variable_accessed(self)
        return table_ops.trainable_rows(self.handle, rows)


class ShadowVariable(TrainableWrapper):
    """The rows of a de.Variable that one named lookup read last, as a trainable variable.

    params: the de.Variable. name: the shadow's name (TFRA's: one shadow per name).
    max_norm: clip lookups through this shadow to this L2 norm. trainable: False makes
    lookups through it only read. distribute_strategy is accepted for TFRA scripts.
    `ids` (a variable) holds the keys of the rows the shadow holds.
    """

    def __init__(
        self,
        params,
        name="ShadowVariable",
        max_norm=None,
        trainable=True,
        distribute_strategy=None,
        **kwargs,
    ):
        del distribute_strategy, kwargs
        if type(params).__name__ != "Variable" or not hasattr(params, "trainable_store"):
            raise TypeError("params of a ShadowVariable must be a de.Variable, got %r" % (params,))
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, got %r" % (name,))
        self.params = params
        self.max_norm = max_norm
        # Several lookups through the shadow in one step (a Keras layer called on two inputs,
        # one lookup name used twice): their rows are appended, so `ids` may repeat a key.
        self.may_repeat = False
        self._segment = None  # (step key, ids, rows) of this step's lookups so far
        self._steps = 0  # steps applied by the optimizer (eager steps end there)
        # Lookups under ParameterServerStrategy: gradients over keys, not over `ids`.
        self.keys_in_gradient = False
        with tf.init_scope():
            super().__init__(
                initial_value=tf.zeros([0, params.dim], params.row_dtype),
                shape=tf.TensorShape([None, params.dim]),
                dtype=params.row_dtype,
                trainable=bool(trainable) and params.trainable,
                name=name,
            )
            # The keys as the tables index them (string keys: their fingerprints). Made as
            # the shadow itself is, not through a distribution strategy's variable creator:
            # under ParameterServerStrategy that would place a variable of unknown shape on
            # a ps task, and TensorFlow aborts the workers that assign it ("Check failed:
            # size >= 0"). Like the shadow, it lives with the coordinator.
            self.ids = resource_variable_ops.ResourceVariable(
                tf.zeros([0], params.table_key_dtype),
                trainable=False,
                shape=tf.TensorShape([None]),
                name=name + "-ids",
            )
        self._track_trackable(self.ids, name="ids")  # SavedModel functions capture it

    def __repr__(self):
        return "<de.shadow_ops.ShadowVariable %r of %r dim=%d>" % (
            self.name,
            self.params.name,
            self.params.dim,
        )

    @property
    def exists(self):
        """Whether each of `ids` is stored in the table (bool [n])."""
        return self.params.lookup(self.ids.read_value(), return_exists=True)[1]

    def _step_key(self):
        """What makes lookups one step's: the graph being built (a tf.function's trace), or
        in eager mode a recording tape until the optimizer applies the step (None: no tape,
        nothing to append to)."""
        if not tf.executing_eagerly():
            return id(tf.compat.v1.get_default_graph())
        if tape_record.could_possibly_record():
            return ("eager", self._steps)
        return None

    def rows(self, unique, values):
        """Makes the shadow hold `values`, the rows of the distinct keys `unique`, and returns
        them with their gradient going to the shadow (not trainable: values as they are).
        A further lookup in the same step appends its keys and rows, and its gradient goes
        to its own rows of the shadow."""
        if not self.trainable:
            return values
        resource_variable_ops.variable_accessed(self)  # the tape watches the shadow
        if shared_by_workers():
            # Every worker's step runs on this one shadow at once: it holds no rows, and the
            # gradient carries the keys of its rows (the optimizer takes them from there).
            self.keys_in_gradient = True
            return table_ops.trainable_rows(self.handle, values, keys=unique)
        key = self._step_key()
        previous = (
            self._segment
            if self._segment is not None and key is not None and self._segment[0] == key
            else None
        )
        if previous is None:
            self.ids.assign(unique, read_value=False)
            self.assign(values, read_value=False)
            self._segment = (key, unique, values)
            return table_ops.trainable_rows(self.handle, values)
        _, ids, rows = previous
        all_ids, all_rows = tf.concat([ids, unique], 0), tf.concat([rows, values], 0)
        self.ids.assign(all_ids, read_value=False)
        self.assign(all_rows, read_value=False)
        self._segment = (key, all_ids, all_rows)
        self.may_repeat = True
        # Zeros in place of the earlier lookups' rows: this lookup's gradient lands on its own
        # rows of the shadow (offset past the earlier ones).
        padded = tf.concat([tf.zeros_like(rows), values], 0)
        return table_ops.trainable_rows(self.handle, padded)[tf.shape(rows)[0] :]

    def step_keys(self):
        """The keys of this step's lookups through the shadow (all of them, in the order of
        the gradient's rows) as the step computed them, or None outside the step that made
        them."""
        key = self._step_key()
        if self._segment is None or key is None or self._segment[0] != key:
            return None
        return self._segment[1]

    def step_applied(self):
        """The optimizer applied this step's gradients: the next lookup starts a new step."""
        self._steps += 1
        self._segment = None

    def refresh(self):
        """Re-reads the rows of `ids` into the shadow (after the optimizer updated them in the
        table); returns the op (None in eager)."""
        values, _ = self.params.read_rows(self.ids.read_value(), as_rows=True)
        return self.assign(values, read_value=False)

    def read_value(self, do_prefetch=False):
        """The rows the shadow holds; with do_prefetch, first re-reads the rows of its `ids`
        from the table into it (TFRA's prefetch)."""
        if not do_prefetch:
            return super().read_value()
        refreshed = self.refresh()
        with tf.control_dependencies([refreshed] if refreshed is not None else []):
            return super().read_value()

    def _serialize_to_tensors(self):
        """Checkpoints hold no shadow rows (they live in the table, saved with it): the
        shadow is emptied first, as TFRA does, and refilled by the next lookup."""
        self.ids.assign(tf.zeros([0], self.params.table_key_dtype))
        self.assign(tf.zeros([0, self.params.dim], self.dtype))
        self._segment = None
        return super()._serialize_to_tensors()

    def _reset_ids(self, ids):
        """Makes the shadow's keys `ids` (its rows are read on the next prefetch)."""
        return self.ids.assign(self.params.checked_keys(ids))

    def size(self, index=None, name=None):
        """Keys stored in the shadow's de.Variable (see de.Variable.size)."""
        return self.params.size(index, name)


def shared_by_workers():
    """Whether lookups being built run as the steps of several workers on the same
    shadows at once: under tf.distribute ParameterServerStrategy, every worker runs the
    coordinator's functions, whose shadow variables live with the coordinator."""
    if not tf.distribute.has_strategy():
        return False
    return "ParameterServerStrategy" in type(tf.distribute.get_strategy()).__name__


def shadow_of(params, name, trainable_name=None):
    """The ShadowVariable of lookup `name` of params, made on first use (TF2)."""
    store = params.trainable_store
    shadow = store.get(name)
    if not isinstance(shadow, ShadowVariable):
        shadow = ShadowVariable(params, name=trainable_name or name)
        store[name] = shadow
    return shadow


def unique_lookup(params, ids, shadow, max_norm=None):
    """Embeddings of ids through `shadow` (None: read only) -> ids.shape + [dim]."""
    flat = tf.reshape(ids, [-1])
    unique, inverse = table_ops.unique_keys(flat)
    values, _ = params.read_rows(unique, name="read", as_rows=True)
    if shadow is not None and mode.training():
        values = shadow.rows(unique, values)
    if max_norm is not None:
        values = tf.clip_by_norm(values, max_norm, axes=[1])
    return shaped(
        tf.cast(table_ops.gather_rows(values, inverse), params.value_dtype), ids, params.dim
    )


def shaped(flat_values, keys, dim):
    """Rows [n, dim] of flat keys, shaped keys.shape + [dim]."""
    shape = tf.concat([tf.shape(keys), [dim]], 0)
    out = tf.reshape(flat_values, shape)
    out.set_shape(keys.shape.concatenate([dim]))
    return out


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None):
    """Embeddings of ids (any shape) through the ShadowVariable `shadow` -> ids.shape + [dim]:
    the shadow then holds the rows of the distinct ids, and training updates them."""
    del partition_strategy, validate_indices
    if not isinstance(shadow, ShadowVariable):
        raise TypeError("shadow must be a de.shadow_ops.ShadowVariable, got %r" % (shadow,))
    params = shadow.params
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != params.key_dtype:
        raise TypeError(
            "ids must be %s (the key_dtype of %r), got %s"
            % (params.key_dtype.name, params.name, ids.dtype.name)
        )
    ids = params.table_keys(ids, record=shadow.trainable and mode.training())
    with tf.name_scope(name or "shadow_embedding_lookup"):
        return unique_lookup(params, ids, shadow, shadow.max_norm)


def embedding_lookup_unique(shadow, ids, embedding_size=None, with_unique=True, name=None):
    """embedding_lookup through `shadow` of ids of any shape or a RaggedTensor of ids (then
    a RaggedTensor of embeddings); embedding_size (the dim) and with_unique are TFRA's
    arguments: the lookup deduplicates ids anyway."""
    del with_unique
    if not isinstance(shadow, ShadowVariable):
        raise TypeError("shadow must be a de.shadow_ops.ShadowVariable, got %r" % (shadow,))
    dim = shadow.params.dim
    if embedding_size is not None and embedding_size != dim:
        raise ValueError(
            "embedding_size (%r) must be the dim of %r (%d)"
            % (embedding_size, shadow.params.name, dim)
        )
    return embedding_lookup_unique_base(
        ids, dim, lambda k: embedding_lookup(shadow, k), False, name
    )


def embedding_lookup_unique_base(ids, embedding_size, lookup_function, with_unique=True, name=None):
    """lookup_function(flat ids) -> rows [n, embedding_size], applied to ids of any shape
    (-> ids.shape + [embedding_size]) or to a RaggedTensor of ids (-> a RaggedTensor of
    rows with ids' row lengths); with_unique calls it once per distinct id."""
    ragged = ids if isinstance(ids, tf.RaggedTensor) else None
    ids = ragged.flat_values if ragged is not None else tf.convert_to_tensor(ids)
    with tf.name_scope(name or "embedding_lookup_unique"):
        flat = tf.reshape(ids, [-1])
        if with_unique:
            unique, inverse = table_ops.unique_keys(flat)
            rows = tf.gather(lookup_function(unique), inverse)
        else:
            rows = lookup_function(flat)
        out = tf.reshape(rows, tf.concat([tf.shape(ids), [embedding_size]], 0))
    if ragged is not None:
        return ragged.with_flat_values(out)
    return out


class HvdVariable:  # pylint: disable=too-few-public-methods
    """TFRA's Horovod variable: out of scope in rec_sdk."""

    def __init__(self, *args, **kwargs):
        del args, kwargs
        raise NotImplementedError(
            "de.shadow_ops.HvdVariable needs Horovod, which rec_sdk does "
            "not support; see docs/DYNAMIC_EMBEDDING.md"
        )
