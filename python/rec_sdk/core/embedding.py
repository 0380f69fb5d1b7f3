"""Tables and lookups: `create_table` (made in rec_sdk.core.sdk_table) and `sparse_lookup`
(mirrors mx_rec.core.embedding).

A table is a rec_sdk C++ hash table (one per process) whose rows hold the embedding and the
sparse optimizer's slots. A lookup maps ids to row addresses (inserting new keys in training),
reads the rows, and registers the embeddings and addresses in the graph collections the SDK's
"by address" training flow uses. The gradient of a lookup with respect to the table is an
IndexedSlices keyed by row address, so `tf.gradients(loss, table)` works too.
"""

import numpy as np
import tensorflow as tf

from rec_sdk.base.validation import INT32_MAX, check_bool, check_int
from rec_sdk.constants.constants import (
    ASCEND_SPARSE_LOOKUP_ENTRANCE,
    ASCEND_TIMESTAMP,
    MULTI_LOOKUP_TIMES,
)
from rec_sdk.core import anchors, lookup_rows
from rec_sdk.core.asc import helper
from rec_sdk.core.asc.feature_spec import FeatureSpec, check_thresholds
from rec_sdk.core.sdk_table import as_dim, create_table  # noqa: F401 (create_table: the SDK's path)
from rec_sdk.ops import table_ops
from rec_sdk.tables.table import SparseEmbedding, table_of, tables_of_graph  # noqa: F401 (re-exported)
from rec_sdk.util import initialize
from rec_sdk_graph_rewrite.iterator_sources import GET_NEXT_OPS

MAX_LOOKUPS_PER_TABLE = MULTI_LOOKUP_TIMES


def _parse_access_and_evict_config(config, where):
    """-> (access_threshold, eviction_threshold, faae_coefficient) from a lookup's
    access_and_evict_config dict (None: (None, None, 1))."""
    if config is None:
        return None, None, 1
    if not isinstance(config, dict):
        raise TypeError(
            "%s: access_and_evict_config must be a dict with keys "
            "access_threshold, eviction_threshold, faae_coefficient; got %r" % (where, config)
        )
    unknown = sorted(set(config) - {"access_threshold", "eviction_threshold", "faae_coefficient"})
    if unknown:
        raise ValueError(
            "%s: access_and_evict_config has unknown keys %s; allowed: "
            "access_threshold, eviction_threshold, faae_coefficient" % (where, unknown)
        )
    access, evict = check_thresholds(
        config.get("access_threshold"), config.get("eviction_threshold"), where
    )
    coefficient = check_int(
        "%s faae_coefficient" % where, config.get("faae_coefficient", 1), 1, INT32_MAX
    )
    return access, evict, coefficient


def _iterators_of(tensor):
    """Names of the IteratorGetNext ops `tensor` is computed from."""
    found, seen, stack = set(), set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in GET_NEXT_OPS:
            found.add(op.name)
            continue
        stack.extend(t.op for t in op.inputs)
    return found


def _timestamps_of_lookup(timestamps, ids, where):
    """The per-sample timestamps of a tensor lookup: the argument, or the tensor of
    rec_sdk.TIMESTAMP_COLLECTION (the SDK's ASCEND_TIMESTAMP). The collection may hold one
    tensor per input pipeline (a tensor added twice counts once): the lookup takes the one
    that comes from the same iterator as its ids."""
    if timestamps is not None:
        return tf.convert_to_tensor(timestamps)
    registered = []
    for tensor in tf.compat.v1.get_collection(ASCEND_TIMESTAMP):
        if not any(tensor is seen for seen in registered):
            registered.append(tensor)
    sources = _iterators_of(ids)
    if sources:  # ids from an input pipeline take that pipeline's timestamps
        registered = [t for t in registered if _iterators_of(t) & sources]
    if len(registered) == 1:
        return registered[0]
    if not registered:
        raise ValueError(
            "%s: eviction by eviction_threshold needs per-sample timestamps: pass "
            "timestamps=<tensor> or add the tensor to the %r collection (from the "
            "iterator the ids come from: %s)" % (where, ASCEND_TIMESTAMP, sorted(sources) or "none")
        )
    raise ValueError(
        "%s: the %r collection holds %d tensors from the iterator of the ids; "
        "pass timestamps= to say which one this lookup uses"
        % (where, ASCEND_TIMESTAMP, len(registered))
    )


def _check_timestamp_shape(shape, ids_shape, where):
    """Timestamps are one per sample ([batch] or [batch, 1], batch = the ids' first
    dimension) or one for all (a scalar); checked where the shapes are known."""
    if shape.rank is None:
        return
    if shape.rank > 2 or (shape.rank == 2 and shape[1] not in (None, 1)):
        raise ValueError(
            "%s: timestamps must have shape [batch] or [batch, 1] (one per sample) "
            "or be a scalar, got %s" % (where, shape)
        )
    batch = ids_shape[0] if ids_shape.rank else None
    if shape.rank >= 1 and None not in (shape[0], batch) and shape[0] not in (1, batch):
        raise ValueError(
            "%s: timestamps has %d values, the ids' batch has %d samples" % (where, shape[0], batch)
        )


def sparse_lookup(
    hash_table,
    ids,
    send_count=None,
    is_train=True,
    name=None,
    modify_graph=False,
    batch=None,
    access_and_evict_config=None,
    is_grad=True,
    serving_default_value=None,
    dim=None,
    timestamps=None,
    **kwargs,
):
    """Looks up the embeddings of `ids` in `hash_table`.

    `ids` is a tf.Tensor of any shape, or a FeatureSpec whose preprocessed keys come from
    `batch` (a batch of a dataset mapped with get_asc_insert_func). Returns a float32 tensor
    of shape ids.shape (or batch[spec.index_key].shape) + [dim]. The table sees each distinct
    key once per lookup (FeatureSpec lookups: once per table and batch, however many features
    share it); the collections receive the embeddings of the unique keys [n_unique, dim] and
    their row addresses [n_unique]. In training (is_train=True) new keys get rows initialised
    from the table's initializer (once admitted, with admission on); in evaluation nothing is
    inserted or counted and unknown keys read zeros (or serving_default_value).

    Args:
      hash_table: a table from create_table.
      ids: integer tf.Tensor of keys (int32 ids are widened for an int64 table), or a
        FeatureSpec of this table (its table_name must be the table's name).
      send_count: keys per step in static-shape mode (init(use_dynamic=False)), where it is
        required: an int in [1, 2**31-1]. A batch with more distinct keys is an error; the
        send counts of several FeatureSpec lookups of one table on one batch add up.
      is_train: whether this lookup trains (inserts and counts keys, and records its
        embeddings and addresses in rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET).
      name: name of the lookup (default: "<table>_lookup").
      modify_graph: for tensor ids: record the lookup so that
        rec_sdk.graph.modifier.modify_graph_and_start_emb_cache() (or GraphModifierHook)
        moves its key dedup, admission counting and timestamps into the input pipeline of
        the iterator its ids come from. Without the call the lookup works as is.
      batch: the batch (dict or tuple from iterator.get_next()): for FeatureSpec ids, where
        their preprocessed keys are; with modify_graph, what get_target_batch() rebuilds.
      access_and_evict_config: for tensor ids, {"access_threshold": n, "eviction_threshold":
        seconds, "faae_coefficient": k} (see FeatureSpec); every lookup of a table that sets
        it must agree. With a FeatureSpec the spec's thresholds apply (as in the SDK); a
        config given too must hold the same values.
      is_grad: False stops gradients to the table.
      serving_default_value: embedding for keys without a row (default zeros): a scalar or
        a [dim] vector.
      dim: optional; must equal the table's dim.
      timestamps: for tensor ids with eviction_threshold: per-sample int timestamps (seconds,
        shape [batch]) of the ids' first dimension; default: the one tensor in
        rec_sdk.TIMESTAMP_COLLECTION.
    """
    if kwargs:
        raise TypeError("sparse_lookup() got unexpected keyword arguments %s" % sorted(kwargs))
    if not isinstance(hash_table, SparseEmbedding):
        raise TypeError("hash_table must be a table from create_table, got %r" % (hash_table,))
    lookup_name = name if name is not None else hash_table.table_name + "_lookup"
    if not isinstance(lookup_name, str) or not lookup_name:
        raise ValueError("name must be a non-empty string, got %r" % (name,))
    where = "sparse_lookup %r" % lookup_name
    is_spec = isinstance(ids, FeatureSpec)
    if (
        not is_spec
        and not isinstance(ids, (tf.Tensor, tf.SparseTensor))
        and hasattr(ids, "table_name")
    ):
        raise TypeError(
            "%s: ids must be a tf.Tensor or a rec_sdk FeatureSpec, got %r" % (where, ids)
        )
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(
            "%s: ids must be a dense tf.Tensor (%s is not supported; a padded dense tensor "
            "with padding_keys, or one lookup of its flat values, is)" % (where, type(ids).__name__)
        )
    check_bool("is_train", is_train)
    check_bool("modify_graph", modify_graph)
    check_bool("is_grad", is_grad)
    if dim is not None and as_dim(dim) != hash_table.dim:
        raise ValueError(
            "%s: dim=%r does not match the dim %d of table %r"
            % (where, dim, hash_table.dim, hash_table.table_name)
        )
    _check_serving_default(serving_default_value, hash_table.dim, where)
    static = not initialize.get_use_dynamic()
    if static and hash_table.padding_keys_mask:
        send_count = hash_table.padding_keys_len  # as the SDK does
    if send_count is not None:
        check_int("send_count", send_count, 1, INT32_MAX)
    elif static:
        raise ValueError(
            "%s: send_count is required in static-shape mode "
            "(init(use_dynamic=False)); got None" % where
        )
    if hash_table.graph is not tf.compat.v1.get_default_graph():
        raise ValueError("%s: table %r belongs to another graph" % (where, hash_table.table_name))
    if hash_table.lookups.count >= MAX_LOOKUPS_PER_TABLE:
        raise ValueError(
            "table %r already has %d lookups, the most allowed"
            % (hash_table.table_name, MAX_LOOKUPS_PER_TABLE)
        )
    if is_spec:
        _check_spec_against_config(ids, access_and_evict_config, where)
        result = _feature_spec_lookup(
            hash_table,
            ids,
            send_count if static else None,
            is_train,
            lookup_name,
            batch,
            is_grad,
            serving_default_value,
        )
    else:
        result = _tensor_lookup(
            hash_table,
            ids,
            send_count if static else None,
            is_train,
            lookup_name,
            access_and_evict_config,
            is_grad,
            serving_default_value,
            timestamps,
            modify_graph,
            batch,
        )
    hash_table.lookups.count += 1
    hash_table.lookups.training += int(is_train)
    hash_table.lookups.names.add(lookup_name)
    return result


def _check_serving_default(value, dim, where):
    """serving_default_value is None, a number or a [dim] vector (a value or a float tensor)."""
    if value is None:
        return
    if isinstance(value, (tf.Tensor, tf.Variable)):
        shape = value.shape
        if not value.dtype.is_floating and not value.dtype.is_integer:
            raise TypeError(
                "%s: serving_default_value must be a number or a [%d] float vector, "
                "got a %s tensor" % (where, dim, value.dtype.name)
            )
    else:
        try:
            shape = tf.TensorShape(np.shape(np.asarray(value, np.float32)))
        except (TypeError, ValueError):
            raise TypeError(
                "%s: serving_default_value must be a number or a [%d] float vector, "
                "got %r" % (where, dim, value)
            ) from None
    if shape.rank is not None and not (shape.rank == 0 or shape.is_compatible_with([dim])):
        raise ValueError(
            "%s: serving_default_value must be a number or a [%d] vector (the "
            "table's dim), got shape %s" % (where, dim, shape)
        )


def _check_spec_against_config(spec, config, where):
    """A FeatureSpec lookup takes its thresholds from the spec, as in the SDK; an
    access_and_evict_config given too must say the same (the SDK ignores it, and a
    different setting would be silently dropped)."""
    if config is None:
        return
    access, evict, coefficient = _parse_access_and_evict_config(config, where)
    mine = (spec.access_threshold, spec.eviction_threshold, spec.faae_coefficient)

    def off(value):  # None and -1 both mean "off"
        return -1 if value is None else value

    given = [
        (key in config, a, b)
        for key, a, b in (
            ("access_threshold", off(access), off(mine[0])),
            ("eviction_threshold", off(evict), off(mine[1])),
            ("faae_coefficient", coefficient, mine[2]),
        )
    ]
    if any(present and a != b for present, a, b in given):
        raise ValueError(
            "%s: a FeatureSpec lookup takes its thresholds from FeatureSpec %r "
            "(access_threshold=%r, eviction_threshold=%r, faae_coefficient=%r); "
            "access_and_evict_config=%r says otherwise. Set them on the FeatureSpec (or "
            "pass the same values)" % (where, spec.name, mine[0], mine[1], mine[2], config)
        )


def _tensor_lookup(
    table,
    ids,
    send_count,
    is_train,
    lookup_name,
    access_and_evict_config,
    is_grad,
    serving_default_value,
    timestamps,
    modify_graph=False,
    batch=None,
):
    where = "sparse_lookup %r" % lookup_name
    access, evict, coefficient = _parse_access_and_evict_config(access_and_evict_config, where)
    if access_and_evict_config is not None:
        table.configure_admission(where, access, evict)
    elif is_train and not table.admission and table.clock != "timestamp":
        table.lookups.uncounted_training.append(lookup_name)
    # Ids of another dtype (tf.strings.to_number's float32) are cast with a check; graph
    # modification and the slicer hooks move the ids as given into the input pipeline,
    # which casts them where it inserts them (as the SDK does).
    given_ids = tf.convert_to_tensor(ids)
    ids = table.checked_keys(given_ids, param="ids of %s" % where)
    with tf.name_scope(table_ops.op_scope_name(lookup_name)):
        # Each distinct key is looked up and trained once per lookup: the table sees only
        # the unique keys and `inverse` spreads their rows back over the ids.
        unique_ids, inverse = table_ops.unique_keys(tf.reshape(ids, [-1]), name="unique")
        counts = times = sample_times = None
        by_timestamp = is_train and table.clock == "timestamp"
        if is_train and table.admission or by_timestamp:
            sample_times = None
            if by_timestamp:
                sample_times = _timestamps_of_lookup(timestamps, ids, where)
                if not sample_times.dtype.is_integer:
                    raise TypeError(
                        "%s: timestamps must be integers (seconds), got %s"
                        % (where, sample_times.dtype.name)
                    )
                _check_timestamp_shape(sample_times.shape, ids.shape, where)
            counts, newest = table_ops.key_access_stats(
                tf.reshape(inverse, tf.shape(ids)),
                tf.size(unique_ids),
                coefficient,
                sample_times,
                name="access_stats",
            )
            counts = counts if table.admission else None
            times = newest if by_timestamp else None
        if is_train and table.clock == "step":
            times = lookup_rows.global_step_clock(table, where)
        rows = lookup_rows.lookup_rows(
            table,
            unique_ids,
            is_train,
            counts,
            times,
            send_count,
            lookup_name,
            in_order=not modify_graph,
        )
        local_emb, addresses, trained = rows["emb"], rows["addresses"], rows["trained"]
        inverse = tf.reshape(inverse, tf.shape(ids))
        embeddings = lookup_rows.finish_lookup(
            table,
            local_emb,
            addresses,
            inverse,
            ids,
            is_train,
            is_grad,
            serving_default_value,
            register=True,
            trained_addresses=trained,
        )
        # What a serving export needs to replace this lookup with stock TensorFlow ops.
        table.lookups.tensor.append(
            {
                "ids": given_ids,
                "embeddings": embeddings,
                "serving_default_value": serving_default_value,
                "addresses": addresses,
                "inverse": inverse,
                "name": lookup_name,
                "is_train": is_train,
            }
        )
        tf.compat.v1.add_to_collection(ASCEND_SPARSE_LOOKUP_ENTRANCE, given_ids)
        if modify_graph:
            anchors.record(
                table.graph,
                anchors.Anchor(
                    lookup_name,
                    table,
                    given_ids,
                    is_train,
                    send_count,
                    coefficient,
                    sample_times,
                    addresses,
                    local_emb,
                    inverse,
                    batch,
                    trained,
                ),
            )
        return embeddings


def _feature_spec_lookup(
    table, spec, send_count, is_train, lookup_name, batch, is_grad, serving_default_value
):
    where = "sparse_lookup %r" % lookup_name
    if spec.is_timestamp:
        raise ValueError(
            "%s: FeatureSpec %r is a timestamp spec (is_timestamp=True); it is "
            "not looked up" % (where, spec.name)
        )
    if spec.table_name != table.table_name:
        raise ValueError(
            "%s: FeatureSpec %r has table_name=%r, not this table's %r"
            % (where, spec.name, spec.table_name, table.table_name)
        )
    if batch is None:
        raise ValueError(
            "%s: FeatureSpec ids need batch=<the batch from iterator.get_next()> "
            "of a dataset mapped with get_asc_insert_func" % where
        )
    entries = helper.pipeline_dict(batch)
    if entries is None or helper.unique_key(table.table_name) not in entries:
        raise ValueError(
            "%s: the batch has no preprocessed keys for table %r; map the dataset "
            "with get_asc_insert_func(tgt_key_specs=[...]) including FeatureSpec "
            "%r before making the iterator" % (where, table.table_name, spec.name)
        )
    if helper.inverse_key(spec.name) not in entries:
        raise ValueError(
            "%s: FeatureSpec %r was not among the tgt_key_specs of the "
            "get_asc_insert_func that made this batch" % (where, spec.name)
        )
    ids = helper.feature_of(batch, spec.index_key, "FeatureSpec %r" % spec.name)
    table.lookups.specs.add((spec.name, is_train))
    thresholds = lookup_rows.pipeline_thresholds(table, spec)
    if thresholds is not None:
        table.configure_admission(where, *thresholds)
    unique = entries[helper.unique_key(table.table_name)]
    key = (unique.name, is_train)
    shared = table.lookups.shared_rows.get(key)
    with tf.name_scope(table_ops.op_scope_name(lookup_name)):
        if shared is None:
            shared = lookup_rows.pipeline_rows(table, entries, is_train, send_count, lookup_name)
            table.lookups.shared_rows[key] = shared
        elif send_count is not None:
            if shared["limit"] is None:
                raise ValueError(
                    "%s: every lookup of table %r on one batch needs a send_count "
                    "in static-shape mode" % (where, table.table_name)
                )
            shared["send_count"] += send_count
            lookup_rows.raise_limit(shared["limit"], min(shared["send_count"], INT32_MAX))
        register = is_train and is_grad and not shared["registered"]
        if register:
            shared["registered"] = True
        inverse = entries[helper.inverse_key(spec.name)]
        return lookup_rows.finish_lookup(
            table,
            shared["emb"],
            shared["addresses"],
            inverse,
            ids,
            is_train,
            is_grad,
            serving_default_value,
            register,
            shared["trained"],
        )
