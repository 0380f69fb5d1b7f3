"""Training lookups of de.Variables: embedding_lookup and its sparse / unique variants.

A lookup deduplicates the ids, reads each unique key once (missing keys: the initializer's
values; nothing is inserted) and passes the rows through a `TrainableRows` op whose
gradient goes to a per-lookup "trainable" (a resource variable in TRAINABLE_VARIABLES that is
never read), so stock `compute_gradients` / `minimize` find it. DynamicEmbeddingOptimizer maps
the trainable back to its keys and updates their rows in place (inserting keys met for the
first time), with the gradients of duplicate ids summed.
"""

import weakref

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from rec_sdk.base.graph_state import state_of, trainable_lookup
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_float
from rec_sdk.dynamic_embedding import mode
from rec_sdk.dynamic_embedding.shadow_ops import (
    ShadowVariable,
    TrainableWrapper,
    shadow_of,
    shaped,
    shared_by_workers,
)
from rec_sdk.dynamic_embedding.variable import Variable
from rec_sdk.ops import table_ops

_COMBINERS = ("sum", "mean", "sqrtn")
_WARNED_READ_ONLY = weakref.WeakSet()  # de.Variables whose lookups were said to only read


class LookupRecord:
    """What the optimizer needs of one training lookup: the variable, its unique keys and the
    rows it read (updates wait for the read); `shadow` is None (graph mode)."""

    shadow = None

    def __init__(self, params, unique_keys, read):
        self.params = params
        self.unique_keys = unique_keys
        self.read = read


class ShadowRecord:
    """The LookupRecord of a TF2 lookup's ShadowVariable: its keys are those of the step's
    lookups when the optimizer applies the step where they ran (the same tf.function, or
    the same eager tape), else read from the shadow's `ids`. (Under ParameterServerStrategy,
    where every worker's step uses the coordinator's shadow at once, the keys come with
    the gradient instead: see optimizer._keyed.)"""

    read = None

    def __init__(self, shadow):
        self.shadow = shadow
        self.params = shadow.params
        self._keys = None

    @property
    def unique_keys(self):
        if self._keys is None:
            self._keys = self.shadow.step_keys()
            if self._keys is None:
                _check_shared_shadow(self.shadow)
                self._keys = self.shadow.ids.read_value()
        return self._keys


def _check_shared_shadow(shadow):
    """Under ParameterServerStrategy the workers run their steps at once on the
    coordinator's shadow, so an update must know its keys from its own step (lookups built
    under the strategy put them in the gradient): refused when they are not known, rather
    than racing with the other workers' steps."""
    if not shared_by_workers():
        return
    raise ValueError(
        "de lookup %r was built outside %s but is applied under it: the workers' steps "
        "share the layer's shadow variable, so the lookup must run under the strategy "
        "(in its scope or a function it runs) for its keys to travel with the gradient"
        % (shadow.name, type(tf.distribute.get_strategy()).__name__)
    )


def record_of(var):
    """The LookupRecord of a trainable created by embedding_lookup (or a ShadowVariable),
    else None."""
    if isinstance(var, ShadowVariable):
        return ShadowRecord(var)
    return trainable_lookup(var)


def tf2():
    """Whether lookups are built for TF2 (eager, or a tf.function of an eager program): they
    then go through persistent ShadowVariables."""
    return tf.compat.v1.executing_eagerly_outside_functions()


def _params(params):
    """-> (the de.Variable, the ShadowVariable to look up through or None) of params: a
    de.Variable or a ShadowVariable, or a list of one."""
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            raise ValueError(
                "params must be one de.Variable (or a list of one), got %d" % len(params)
            )
        params = params[0]
    if isinstance(params, ShadowVariable):
        return params.params, params
    if not isinstance(params, Variable):
        raise TypeError(
            "params should be a rec_sdk.dynamic_embedding.Variable or a "
            "de.shadow_ops.ShadowVariable, got %r" % (params,)
        )
    return params, None


def _sparse(ids, what):
    """A SparseTensor of ids: a RaggedTensor [batch, (k)] becomes one (as TFRA takes)."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.to_sparse()
    if ids is not None and not isinstance(ids, tf.SparseTensor):
        raise TypeError("%s must be a SparseTensor or a RaggedTensor, got %r" % (what, ids))
    return ids


def _ids(params, ids, what="ids"):
    """ids checked against params.key_dtype, as the tables index them (string ids: their
    fingerprints, remembered when a training lookup may insert them)."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype != params.key_dtype:
        raise TypeError(
            "params.key_dtype (%s) should be the same as %s.dtype (%s)"
            % (params.key_dtype.name, what, ids.dtype.name)
        )
    return params.table_keys(ids, record=params.trainable and mode.training())


def _device_of(ids):
    """The device of ids (a SparseTensor's or RaggedTensor's values)."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.flat_values.device
    return ids.values.device


def _sparse_ids(params, ids, what):
    """A SparseTensor or RaggedTensor of ids with _ids' values."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(_ids(params, ids.flat_values, what))
    return tf.SparseTensor(ids.indices, _ids(params, ids.values, what), ids.dense_shape)


def _unique_rows(params, unique, name, trainable_name, shadow=None, ids_device=""):
    """Rows [n_unique, dim] of deduplicated keys, differentiable through a trainable when
    params.trainable; -> (rows, trainable or None). The trainable is named as TFRA names
    its TrainableWrapper: <variable scope>/<trainable_name>/<trainable_name> (made unique),
    trainable_name being the lookup's name path (e.g. "emb", or "sp_emb/embedding_lookup"
    for a sparse lookup named sp_emb), so scripts that find it by name work. A lookup given
    a ShadowVariable goes through it. A graph-mode trainable is placed with the ids
    (ids_device, as TFRA does): the rows flow to where the ids come from."""
    values, _ = params.read_rows(unique, name="read", as_rows=True)
    if not params.trainable or not mode.training():
        return _as_values(params, values), None
    if params.row_dtype != tf.float32:
        if params not in _WARNED_READ_ONLY:
            _WARNED_READ_ONLY.add(params)
            logger.warning(
                "de.Variable %r holds %s values: rec_sdk trains float32, float16 "
                "and bfloat16 variables only, so its lookups read without a "
                "trainable",
                params.name,
                params.value_dtype.name,
            )
        return values, None
    scope = tf.compat.v1.get_variable_scope().name
    path = (scope + "/" if scope else "") + trainable_name
    if shadow is not None or tf2():
        if shadow is None:
            shadow = shadow_of(params, name or trainable_name, path)
        return _as_values(params, shadow.rows(unique, values)), shadow
    # Outside control flow and control dependencies, like any variable.
    with tf.init_scope(), tf.compat.v1.name_scope(path + "/"), tf.device(ids_device):
        trainable = TrainableWrapper(
            tf.zeros([0, params.dim]),
            trainable=True,
            validate_shape=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            name=trainable_name,
        )
    # TFRA's TrainableWrapper.update_op(): writes the rows the lookup read into the variable
    # (keys met for the first time get their initial values stored).
    trainable.update_op = lambda: params.upsert(
        unique, _as_values(params, values), name="update_op"
    )
    trainable.lookup_rows = values
    state = state_of(trainable.graph)
    with state.lock:
        state.trainable_lookups[trainable.op.name] = LookupRecord(params, unique, values)
    store = params.trainable_store
    key = name
    if key is None:
        key = "_anonymous_trainable_store_key"
        n = 0
        while key in store:
            n += 1
            key = "_anonymous_trainable_store_key_%d" % n
    store[key] = trainable
    resource_variable_ops.variable_accessed(trainable)  # a GradientTape watches it
    return _as_values(params, table_ops.trainable_rows(trainable.handle, values)), trainable


def _as_values(params, rows):
    """Rows in the variable's value_dtype (half-precision variables train float32 rows)."""
    return rows if rows.dtype == params.value_dtype else tf.cast(rows, params.value_dtype)


def _max_norm(max_norm):
    """max_norm is a number > 0 or a float tensor (checked where it is a number)."""
    if isinstance(max_norm, (tf.Tensor, tf.Variable)):
        return max_norm
    return check_float("max_norm", max_norm, 0.0, float("inf"), low_open=True, high_open=True)


def embedding_lookup(
    params,
    ids,
    partition_strategy=None,
    name=None,
    validate_indices=None,
    max_norm=None,
    return_trainable=False,
):
    """Embeddings of ids (any shape) -> ids.shape + [dim].

    Missing keys read the initializer's values; training (DynamicEmbeddingOptimizer) inserts
    them. max_norm clips each embedding to that L2 norm (as tf.nn.embedding_lookup). With
    return_trainable, also returns the lookup's trainable (None if params is not trainable).
    partition_strategy and validate_indices are accepted for TFRA's signature.
    """
    del partition_strategy, validate_indices
    params, shadow = _params(params)
    if isinstance(ids, tf.RaggedTensor):
        emb, trainable = embedding_lookup(
            params if shadow is None else shadow,
            ids.flat_values,
            name=name,
            max_norm=max_norm,
            return_trainable=True,
        )
        emb = ids.with_flat_values(emb)
        return (emb, trainable) if return_trainable else emb
    ids = tf.convert_to_tensor(ids)
    device = ids.device
    ids = _ids(params, ids)
    with tf.name_scope(name or "embedding_lookup"):
        flat = tf.reshape(ids, [-1])
        unique, inverse = table_ops.unique_keys(flat)
        rows, trainable = _unique_rows(
            params, unique, name, name or "embedding_lookup", shadow, device
        )
        if max_norm is not None:
            rows = tf.clip_by_norm(rows, _max_norm(max_norm), axes=[1])
        emb = shaped(table_ops.gather_rows(rows, inverse), ids, params.dim)
    graph = tf.compat.v1.get_default_graph()
    if not tf.executing_eagerly() and not graph.building_function:
        state = state_of(graph)
        with state.lock:
            state.de_lookups.append(
                {"variable": params, "ids": ids, "embeddings": emb, "max_norm": max_norm}
            )
    return (emb, trainable) if return_trainable else emb


def embedding_lookup_unique(
    params, ids, partition_strategy=None, name=None, max_norm=None, return_trainable=False
):
    """The same as embedding_lookup, which deduplicates ids already."""
    return embedding_lookup(
        params,
        ids,
        partition_strategy=partition_strategy,
        name=name,
        max_norm=max_norm,
        return_trainable=return_trainable,
    )


def _check_combiner(combiner):
    if combiner not in _COMBINERS:
        raise ValueError("combiner must be one of %s, got %r" % (", ".join(_COMBINERS), combiner))


def embedding_lookup_sparse(
    params,
    sp_ids,
    sp_weights,
    partition_strategy=None,
    name="embedding_lookup_sparse",
    combiner="mean",
    max_norm=None,
    return_trainable=False,
):
    """Combined embeddings of each row of sp_ids (a SparseTensor [batch, k] of ids) ->
    [rows, dim] for rows 0 .. the last row with ids (as tf.nn.embedding_lookup_sparse).

    sp_weights: None or a float SparseTensor with sp_ids' indices. combiner: "sum", "mean"
    (sum / sum of weights) or "sqrtn" (sum / sqrt(sum of squared weights)).
    """
    del partition_strategy
    _check_combiner(combiner)
    params, shadow = _params(params)
    sp_ids, sp_weights = _sparse(sp_ids, "sp_ids"), _sparse(sp_weights, "sp_weights")
    if sp_ids is None:
        raise TypeError("sp_ids must be a SparseTensor or a RaggedTensor, got None")
    device = _device_of(sp_ids)
    sp_ids = _sparse_ids(params, sp_ids, "sp_ids")
    out, trainable = _lookup_sparse(
        params, sp_ids, sp_weights, name, combiner, max_norm, name, shadow, device
    )
    return (out, trainable) if return_trainable else out


def _lookup_sparse(
    params, sp_ids, sp_weights, name, combiner, max_norm, store_name, shadow=None, ids_device=""
):
    """-> (combined rows, trainable) of embedding_lookup_sparse; the trainable is stored
    under store_name (or is `shadow`), placed on ids_device (see _unique_rows)."""
    with tf.name_scope(name or "embedding_lookup_sparse"):
        segments = tf.cast(sp_ids.indices[:, 0], tf.int32)
        unique, inverse = table_ops.unique_keys(sp_ids.values)
        rows, trainable = _unique_rows(
            params,
            unique,
            store_name,
            (store_name or "embedding_lookup_sparse") + "/embedding_lookup",
            shadow,
            ids_device,
        )
        if max_norm is not None:
            rows = tf.clip_by_norm(rows, _max_norm(max_norm), axes=[1])
        if sp_weights is None:
            op = {
                "sum": tf.sparse.segment_sum,
                "mean": tf.sparse.segment_mean,
                "sqrtn": tf.sparse.segment_sqrt_n,
            }[combiner]
            out = op(rows, inverse, segments)
        else:
            weights = tf.cast(sp_weights.values, rows.dtype)
            emb = table_ops.gather_rows(rows, inverse) * weights[:, None]
            out = tf.math.segment_sum(emb, segments)
            # Rows without ids (between rows with ids) give zeros, not 0 / 0.
            if combiner == "mean":
                out = tf.math.divide_no_nan(out, tf.math.segment_sum(weights, segments)[:, None])
            elif combiner == "sqrtn":
                out = tf.math.divide_no_nan(
                    out, tf.sqrt(tf.math.segment_sum(weights * weights, segments))[:, None]
                )
        out.set_shape([None, params.dim])
    return out, trainable


def fill_empty_ragged_rows(ids, default_id):
    """tf.sparse.fill_empty_rows for a RaggedTensor [rows, (k)]: -> (ids with [default_id]
    in each row that has no value, a bool [rows] tensor True for those rows)."""
    if not isinstance(ids, tf.RaggedTensor) or ids.ragged_rank != 1:
        raise TypeError("ids must be a RaggedTensor [rows, (k)] (ragged_rank 1), got %r" % (ids,))
    lengths = ids.row_lengths()
    empty = tf.equal(lengths, 0)
    filled_lengths = tf.where(empty, tf.ones_like(lengths), lengths)
    rows = tf.repeat(tf.range(tf.size(lengths, out_type=lengths.dtype)), filled_lengths)
    offset = tf.range(tf.reduce_sum(filled_lengths)) - tf.gather(
        tf.cumsum(filled_lengths, exclusive=True), rows
    )
    # An empty row's one value is the default, appended after the ids' own values.
    source = tf.where(
        tf.gather(empty, rows),
        tf.size(ids.flat_values, out_type=rows.dtype),
        tf.gather(ids.row_starts(), rows) + offset,
    )
    values = tf.gather(
        tf.concat([ids.flat_values, tf.cast([default_id], ids.flat_values.dtype)], 0), source
    )
    return tf.RaggedTensor.from_row_lengths(values, filled_lengths, validate=False), empty


def _filled_ragged(ids, weights, combiner, default_id):
    """Ragged ids [rows, (k)] (and weights) of a safe lookup as SparseTensors with every row
    present (for mean and sqrtn, ids of weights <= 0 dropped first) -> (ids, weights, the
    rows that had no id)."""
    if weights is not None and combiner != "sum":
        keep = weights > 0
        ids, weights = tf.ragged.boolean_mask(ids, keep), tf.ragged.boolean_mask(weights, keep)
    ids, empty = fill_empty_ragged_rows(ids, 0 if default_id is None else default_id)
    if weights is not None:
        weights = fill_empty_ragged_rows(weights, 1.0)[0].to_sparse()
    return ids.to_sparse(), weights, empty


def safe_embedding_lookup_sparse(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    name="safe_embedding_lookup_sparse",
    partition_strategy=None,
    max_norm=None,
    return_trainable=False,
):
    """embedding_lookup_sparse for sparse_ids of any rank >= 2 ([d0, ..., dn-1, k]) ->
    [d0, ..., dn-1, dim], every row present: rows without ids (or, for mean and sqrtn, with
    only weights <= 0) give zeros, or the embedding of default_id when it is given.
    sparse_ids (and sparse_weights) are SparseTensors or RaggedTensors; ragged ids [rows,
    (k)] are filled in ragged form (fill_empty_ragged_rows)."""
    del partition_strategy
    _check_combiner(combiner)
    params, shadow = _params(embedding_weights)
    if sparse_weights is not None and sparse_weights.dtype != params.value_dtype:
        raise TypeError(
            "sparse_weights.dtype (%s) should be params.value_dtype (%s)"
            % (sparse_weights.dtype.name, params.value_dtype.name)
        )
    ragged = (
        isinstance(sparse_ids, tf.RaggedTensor)
        and sparse_ids.ragged_rank == 1
        and (sparse_weights is None or isinstance(sparse_weights, tf.RaggedTensor))
    )
    if not ragged:
        sparse_ids = _sparse(sparse_ids, "sparse_ids")
        sparse_weights = _sparse(sparse_weights, "sparse_weights")
        if sparse_ids is None:
            raise TypeError("sparse_ids must be a SparseTensor or a RaggedTensor, got None")
    device = _device_of(sparse_ids)
    sparse_ids = _sparse_ids(params, sparse_ids, "sparse_ids")
    if default_id is not None:  # a key like the ids (string keys: their fingerprint)
        default_id = _ids(
            params,
            tf.convert_to_tensor(default_id, tf.string)
            if params.key_dtype == tf.string
            else tf.cast(default_id, params.key_dtype),
            "default_id",
        )
    store_name = "%s/embedding_lookup_sparse" % (name or "safe_embedding_lookup_sparse")
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        if ragged:
            sparse_ids, sparse_weights, empty = _filled_ragged(
                sparse_ids, sparse_weights, combiner, default_id
            )
            out, trainable = _lookup_sparse(
                params,
                sparse_ids,
                sparse_weights,
                "embedding_lookup_sparse",
                combiner,
                max_norm,
                store_name,
                shadow,
                device,
            )
            if default_id is None:
                out = tf.where(empty[:, None], tf.zeros_like(out), out)
            return (out, trainable) if return_trainable else out
        rank = (
            sparse_ids.shape.rank
            if sparse_ids.shape.rank is not None
            else (sparse_ids.dense_shape.shape[0])
        )
        original_shape = tf.cast(sparse_ids.dense_shape, tf.int64)
        rows_shape = original_shape[:-1]
        num_rows = tf.reduce_prod(rows_shape)
        shape_2d = tf.stack([num_rows, original_shape[-1]])
        sparse_ids = tf.sparse.reshape(sparse_ids, shape_2d)
        if sparse_weights is not None:
            sparse_weights = tf.sparse.reshape(sparse_weights, shape_2d)
            if combiner != "sum":
                keep = sparse_weights.values > 0
                sparse_ids = tf.sparse.retain(sparse_ids, keep)
                sparse_weights = tf.sparse.retain(sparse_weights, keep)
        sparse_ids, empty = tf.sparse.fill_empty_rows(
            sparse_ids, tf.cast(0 if default_id is None else default_id, sparse_ids.dtype)
        )
        if sparse_weights is not None:
            sparse_weights, _ = tf.sparse.fill_empty_rows(sparse_weights, 1.0)
        out, trainable = _lookup_sparse(
            params,
            sparse_ids,
            sparse_weights,
            "embedding_lookup_sparse",
            combiner,
            max_norm,
            store_name,
            shadow,
            device,
        )
        # Rows after the last one with ids do not exist in `out`: fill_empty_rows gave every
        # row an id, so out has num_rows rows.
        if default_id is None:
            out = tf.where(empty[:, None], tf.zeros_like(out), out)
        out = tf.reshape(out, tf.concat([rows_shape, [params.dim]], 0))
        if rank is not None:
            out.set_shape([None] * (int(rank) - 1) + [params.dim])
    return (out, trainable) if return_trainable else out
