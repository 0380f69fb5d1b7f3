"""The forward exchange of a batch of lookups over the ranks: keys sorted by owner, sent in
size-classed all-to-alls, looked up once per key by their owners, rows sent back
(exchange_rows), and the gradient of the rows op that feeds the owners' updates."""

import numpy as np
import tensorflow as tf

from rec_sdk.base.graph_state import state_of
from rec_sdk.distribute.cluster import all_gather, all_to_all_in_class, next_instance_key
from rec_sdk.distribute.ranks import input_end
from rec_sdk.distribute.ranks.headers import checked_need
from rec_sdk.distribute.ranks.placement import routes as placement_routes
from rec_sdk.ops import rank_parts, table_ops

_ROWS_GRADIENT = "RecSdkRankRows"


@tf.RegisterGradient(_ROWS_GRADIENT)
def _rows_gradient(op, *grads):
    """The tables' gradients from the rows of a batch of lookups (the op's inputs: the rows
    of each lookup, then each lookup's table handle, then each lookup's token): per lookup an
    IndexedSlices of its rows' gradients keyed by its token, for its table (optimizers send
    them to the owners: owner_gradients)."""
    segments = len(op.inputs) // 3
    out = [None] * len(op.inputs)
    for i in range(segments):
        grad_rows = grads[i]
        if grad_rows is None:
            continue
        if isinstance(grad_rows, tf.IndexedSlices):
            grad_rows = tf.convert_to_tensor(grad_rows)
        out[segments + i] = tf.IndexedSlices(
            grad_rows, op.outputs[2 * segments + i], tf.shape(grad_rows, out_type=tf.int64)
        )
    return out


class _Lookup:
    """One lookup of a table sharded over ranks: what its exchange needs, and (once its
    lookups were batched: batch_lookups) the batch serving it."""

    def __init__(
        self, table, columns, has_counts, times_per_key, times, owner_rows, is_train, outputs
    ):
        self.table = table
        self.columns = columns  # [n, w] int64: the distinct keys (then counts, then times)
        self.has_counts = has_counts
        self.times_per_key = times_per_key
        self.times = times  # the one clock of all keys (times not per key), or None
        self.owner_rows = owner_rows
        self.is_train = is_train
        self.outputs = outputs  # {"emb", "addresses", "trained"} of its own exchange
        self.batch = None  # the _Batch serving it, and its segment there
        self.segment = None


class _Batch:
    """The one exchange of a batch of lookups (of any tables and dims): what the backward
    pass needs from the forward one."""

    def __init__(
        self,
        lookups,
        ranks,
        slots,
        cap,
        size_class,
        valid_at,
        index,
        owned_count,
        owned_sizes,
        owned_segment,
        trained,
        outputs,
    ):
        self.lookups = lookups
        self.ranks = ranks
        self.slots = slots  # [n]: each key's slot in the [N * cap] parts (packed order)
        self.cap = cap  # the keys per part (a size class: size_class)
        self.size_class = size_class
        self.valid_at = valid_at  # where in the received [N * cap] entries the keys are
        self.index = index  # each received key's position among the keys this rank owns
        self.owned_count = owned_count  # (segment, key) pairs this rank owns of the step
        self.owned_sizes = owned_sizes  # [T] of them per segment (lookup)
        self.owned_segment = owned_segment  # [owned_count] their segments
        self.trained = trained  # per segment: their row addresses in this rank's shard
        self.outputs = outputs  # per segment: {"emb", "addresses", "trained"}
        self.dims = [lookup.table.dim for lookup in lookups]
        self.width = max(self.dims)
        self.gradients = None  # ({segment: gradient rows sent}, {segment: owned sums})
        self.route = None  # the level of the exchange (rank_routes.Route)
        self.inner = None  # with per-host dedup, the next level's _Batch
        self.last_gradients = None  # the last gradient all-to-all built (the next waits for it)


def exchange_rows(table, keys, counts, times, times_per_key, owner_rows, is_train=True):
    """The rows of this rank's distinct `keys` [n] (see the module doc).

    counts ([n] or None) and times ([n] when times_per_key, else one clock for all, or None)
    go to the owners with the keys. owner_rows(owned keys, their summed counts, their times)
    runs the lookup core on this rank's shard and returns {"emb", "addresses", "trained"}.
    Returns {"emb" [n, dim], "addresses" [n] (the key's position, -1 when its owner has no
    row for it), "trained" (the token the optimizers apply gradients through)}.

    The lookup gets an exchange of its own at once; optimizers (and MonitoredTrainingSession
    or Estimator, for the rest) later move it into the one exchange of its batch of lookups
    (batch_lookups)."""
    with tf.device(table.ranks.device), tf.name_scope("ranks"):
        keys64 = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        columns = [keys64]
        has_counts = counts is not None
        per_key = times is not None and times_per_key
        if has_counts or per_key:
            columns.append(
                tf.cast(tf.reshape(counts, [-1]), tf.int64) if has_counts else tf.zeros_like(keys64)
            )
        if per_key:
            columns.append(tf.cast(tf.reshape(times, [-1]), tf.int64))
        lookup = _Lookup(
            table,
            tf.stack(columns, 1),
            has_counts,
            per_key,
            None if per_key else times,
            owner_rows,
            is_train,
            None,
        )
        if has_counts:
            lookup.counts_dtype = counts.dtype
        if per_key:
            lookup.times_dtype = times.dtype
        batch = exchange_batch([lookup])
    lookup.outputs = batch.outputs[0]  # its own exchange: not batched yet
    state = state_of(keys64.graph)
    with state.lock:
        state.rank_lookups[lookup.outputs["trained"].name] = lookup
    table.lookups.trained_address_names.add(lookup.outputs["trained"].name)
    return dict(lookup.outputs)


def exchange_batch(lookups, level=0):
    """The exchange of `lookups` (one or more, any tables): one keys all-to-all and one rows
    all-to-all, whatever their number (see the module doc), at each level of the tables'
    routes from `level` on. -> _Batch."""
    ranks = lookups[0].table.ranks
    route = placement_routes(ranks)[level]
    task, size = ranks.task, route.size
    segments = len(lookups)
    width = max(int(lookup.columns.shape[1]) for lookup in lookups)
    dims = [lookup.table.dim for lookup in lookups]
    dim = max(dims)
    # This rank's side: every lookup's keys (and counts, times) in one matrix, by lookup.
    if segments == 1:
        packed = lookups[0].columns
        sizes = tf.reshape(tf.shape(packed, out_type=tf.int32)[0], [1])
    else:
        packed, sizes = table_ops.pack_rows(
            [lookup.columns for lookup in lookups], width, name="pack_keys"
        )
    with tf.name_scope("route_keys"):
        count = tf.shape(packed, out_type=tf.int32)[0]
        # Each key's part (its owner's place in the route) and slot there, in one op.
        dest_of_owner = np.asarray(route.owner(np.arange(ranks.size)), np.int32)
        dest, within, per_owner = rank_parts.route_keys(packed[:, 0], dest_of_owner, size)
        if segments == 1:
            segment = None
            position = tf.range(count)
            per_lookup = tf.cast(per_owner, tf.int64)[:, tf.newaxis]
        else:
            segment = tf.searchsorted(tf.cumsum(sizes), tf.range(count), side="right")
            position = tf.range(count) - tf.gather(tf.cumsum(sizes, exclusive=True), segment)
            per_lookup = tf.reshape(
                _bincount(dest * segments + segment, size * segments, tf.int64), [size, segments]
            )
        phase = (
            table_ops.PHASE_TRAIN if any(lk.is_train for lk in lookups) else table_ops.PHASE_EVAL
        )
        received, cap, size_class = _send_keys(
            packed, per_owner, dest, within, per_lookup, ranks, route, level, phase
        )
        slots = dest * cap + within
    with tf.name_scope("owner_keys"):
        # Each part: its keys per lookup, then the keys lookup by lookup.
        from_lookup = received[:, :segments, 0]
        received_valid = tf.reshape(
            tf.sequence_mask(tf.cast(tf.reduce_sum(from_lookup, 1), tf.int32), cap), [-1]
        )
        valid_at = tf.cast(tf.where(received_valid)[:, 0], tf.int32)
        asked = tf.gather(tf.reshape(received[:, segments:], [size * cap, width]), valid_at)
        if segments == 1:
            # The owner's side: the keys every rank asked this rank for, each once.
            owned_keys, index = table_ops.unique_keys(asked[:, 0])
            owned_count = tf.size(owned_keys, out_type=tf.int32)
            owned_sizes = tf.reshape(owned_count, [1])
            owned_segment = None
            owned_keys = [owned_keys]
        else:
            # The owner's side: the keys every rank asked this rank for, each once per lookup.
            slot_segment = tf.searchsorted(
                tf.cumsum(from_lookup, axis=1),
                tf.tile(tf.range(tf.cast(cap, tf.int64))[tf.newaxis], [size, 1]),
                side="right",
            )
            asked_segment = tf.gather(tf.reshape(slot_segment, [-1]), valid_at)
            # (lookup, key) pairs, each once: keys are deduplicated, then pairs of (key's
            # position, lookup), ordered by lookup.
            distinct, key_index = table_ops.unique_keys(asked[:, 0])
            pair_ids, pair_index = table_ops.unique_keys(
                tf.cast(key_index, tf.int64) * segments + tf.cast(asked_segment, tf.int64)
            )
            by_segment = tf.argsort(tf.cast(pair_ids % segments, tf.int32), stable=True)
            pair_ids = tf.gather(pair_ids, by_segment)
            index = tf.gather(tf.math.invert_permutation(by_segment), pair_index)
            owned_segment = tf.cast(pair_ids % segments, tf.int32)
            owned_count = tf.size(pair_ids, out_type=tf.int32)
            owned_sizes = _bincount(owned_segment, segments, tf.int32)
            owned_keys = _split(tf.gather(distinct, pair_ids // segments), owned_sizes, segments)
        owned_counts = owned_times = [None] * segments
        if any(lookup.has_counts for lookup in lookups):
            owned_counts = _split(
                tf.math.unsorted_segment_sum(asked[:, 1], index, owned_count), owned_sizes, segments
            )
        if any(lookup.times_per_key for lookup in lookups):
            owned_times = _split(
                tf.math.unsorted_segment_max(asked[:, 2], index, owned_count), owned_sizes, segments
            )
    inner = None
    if route.last:
        local = []
        last_of = {}  # table name -> the op of the batch's last training lookup of it
        for i, lookup in enumerate(lookups):
            counts = times = None
            if lookup.has_counts:
                counts = tf.cast(owned_counts[i], lookup.counts_dtype)
            if lookup.times_per_key:
                times = tf.cast(owned_times[i], lookup.times_dtype)
            elif lookup.times is not None:
                times = lookup.times
            # Training lookups of one table run in the batch's order (as in one process: the
            # order shows in what a full or admitting table keeps).
            name = lookup.table.table_name
            after = [last_of[name]] if lookup.is_train and name in last_of else []
            with tf.control_dependencies(after):
                local.append(
                    lookup.owner_rows(tf.cast(owned_keys[i], lookup.table.key_dtype), counts, times)
                )
            if lookup.is_train:
                last_of[name] = local[-1]["addresses"].op
    else:
        # This rank holds its host's distinct keys of one place: they go on to their owners
        # (the next level), as one batch.
        inner = exchange_batch(
            [
                _passed_on(lookup, owned_keys[i], owned_counts[i], owned_times[i])
                for i, lookup in enumerate(lookups)
            ],
            level + 1,
        )
        local = inner.outputs
    with tf.name_scope("rows_back"):
        # The rows (and whether each key has one) back to the ranks that asked, in the slots
        # their keys came in.
        if segments == 1:
            rows, found = local[0]["emb"], local[0]["addresses"] >= 0
        else:
            rows, _ = table_ops.pack_rows([out["emb"] for out in local], dim, name="pack_rows")
            found = tf.concat([out["addresses"] for out in local], 0) >= 0
        # Each received key's row, in the part and slot the key came in (one op).
        parts = rank_parts.fill_parts(
            tf.concat([rows, tf.cast(found, tf.float32)[:, tf.newaxis]], 1),
            valid_at // cap,
            valid_at % cap,
            cap,
            size,
            take=tf.cast(index, tf.int32),
        )
        back = all_to_all(parts, size_class, task, route, "exchange_rows")
        back = tf.gather(tf.reshape(back, [size * cap, dim + 1]), slots)
        addresses = tf.where(
            back[:, dim] > 0.5, tf.cast(position, tf.int64), tf.constant(-1, tf.int64)
        )
        if segments == 1:
            embs = [back[:, :dim]]
        else:
            embs = table_ops.split_rows(back, sizes, dims, name="split_rows")
        addresses = _split(addresses, sizes, segments)
    # The rows, the tables and the tokens in one op whose gradient gives each table an
    # IndexedSlices keyed by its token: tf.gradients(loss, table) works as in one process.
    with tf.compat.v1.get_default_graph().gradient_override_map({"IdentityN": _ROWS_GRADIENT}):
        outs = tf.identity_n(
            list(embs) + [lookup.table.handle for lookup in lookups] + list(addresses), name="rows"
        )
    outputs = [
        {"emb": outs[i], "addresses": addresses[i], "trained": outs[2 * segments + i]}
        for i in range(segments)
    ]
    trained = inner.trained if inner else [out["trained"] for out in local]
    batch = _Batch(
        lookups,
        ranks,
        slots,
        cap,
        size_class,
        valid_at,
        index,
        owned_count,
        owned_sizes,
        owned_segment,
        trained,
        outputs,
    )
    batch.route, batch.inner = route, inner
    batch.dest, batch.within = dest, within  # each key's part and slot (the gradients')
    return batch


def _passed_on(lookup, keys, counts, times):
    """The _Lookup that passes `lookup`'s keys this rank was sent (their summed counts and
    newest times, as int64) on to the next level of the exchange."""
    columns = [keys]
    if lookup.has_counts or lookup.times_per_key:
        columns.append(counts if lookup.has_counts else tf.zeros_like(keys))
    if lookup.times_per_key:
        columns.append(times)
    passed = _Lookup(
        lookup.table,
        tf.stack(columns, 1),
        lookup.has_counts,
        lookup.times_per_key,
        lookup.times,
        lookup.owner_rows,
        lookup.is_train,
        None,
    )
    for attribute in ("counts_dtype", "times_dtype"):
        if hasattr(lookup, attribute):
            setattr(passed, attribute, getattr(lookup, attribute))
    return passed


def _send_keys(packed, per_owner, dest, within, per_lookup, ranks, route, level, phase):
    """The keys all-to-all of a batch: -> (received [N, T + cap, width], cap: keys per part,
    its size class). At the first level the needs travel in the step's headers
    (rec_sdk.distribute.ranks.headers: checked before any other collective of the batch).

    Each part holds a header (how many of the part's keys are of each of the T lookups) and
    `cap` rows of keys, cap a size class (rec_sdk.ops.table_ops.SIZE_CLASSES) no rank has to
    be told: the one the batch's hint (table_ops.rank_size_class) holds. Every rank gathers
    every rank's need (the most keys it sends any rank), so each observes the same largest
    need and their hints stay equal (one class above the needs seen; see
    tf_ops/core/size_class.h). When a rank's keys did not fit, every rank knows it from the
    same needs and all send again, in the need's class (a second all-to-all, in that step
    only). The gather runs before the all-to-all: it makes the step fail at once when a rank
    is gone, where an all-to-all would wait for it (run beside the all-to-all, it left a
    step over TensorFlow 2.21 waiting once when a rank failed), and it gives the step a
    collective executor (TensorFlow sets none up for an all-to-all alone)."""
    task, size, group = ranks.task, route.size, route.group
    width = int(packed.shape[1])
    hint = "rec_sdk_exchange_%d" % next_instance_key(task)  # the same name on every rank
    most = tf.reduce_max(per_owner)
    head = tf.pad(per_lookup[:, :, tf.newaxis], [[0, 0], [0, 0], [0, width - 1]])

    def part(cap):  # [N, T + cap, width]: each part's header, then its keys that fit in cap
        return rank_parts.fill_parts(packed, dest, within, cap, size, head=head)

    size_class, cap = table_ops.rank_size_class(hint)
    need = tf.cast(most, tf.int64)
    largest = None
    if level == 0:
        largest = checked_need(ranks, need, input_end.has_data([packed]), phase)
    if group is not None:  # a level of per-host dedup: the needs in its group, after the header
        with tf.control_dependencies([] if largest is None else [largest]):
            largest = tf.reduce_max(
                all_gather(tf.reshape(need, [1]), task=task, name="gather_needs", group=group)
            )
    with tf.control_dependencies([largest]):
        sent = all_to_all(part(cap), size_class, task, route, "exchange_keys")
    # The hint changes only after this step read it: a rank whose read ran after its
    # observation (an op with no input may run late) would take another class than the
    # other ranks, and their all-to-alls would wait for each other forever.
    with tf.control_dependencies([size_class, cap]):
        exact_class, exact_cap = table_ops.rank_observe_size(largest, hint)
    overflow = largest > tf.cast(cap, tf.int64)
    # Only one of the two sides below runs (the other's tensors are dead): every rank takes
    # the same one, as all saw the same needs.
    kept = [_switch(t, overflow)[0] for t in (sent, cap, size_class)]
    again = [_switch(t, overflow)[1] for t in (exact_cap, exact_class)]
    resent = all_to_all(part(again[0]), again[1], task, route, "resend_keys")
    return tuple(tf.raw_ops.Merge(inputs=[a, b]).output for a, b in zip(kept, [resent] + again))


def all_to_all(parts, size_class, task, route, name):
    """The all-to-all of [route.size, ...] parts in a size class, in the route's group."""
    return all_to_all_in_class(
        parts, size_class, table_ops.SIZE_CLASSES, task, name, group=route.group
    )


def _switch(value, pred):
    """(value where pred is false, value where pred is true): the other one is dead."""
    return tf.raw_ops.Switch(data=value, pred=pred)


def _bincount(values, length, dtype):
    """[length] counts of each value of int32 `values` in [0, length) (one op)."""
    return tf.raw_ops.Bincount(
        arr=values, size=tf.constant(length, tf.int32), weights=tf.constant([], dtype)
    )


def _split(values, sizes, parts):
    """tf.split of `values` by `sizes` into `parts` (one op; a list even of one part)."""
    if parts == 1:
        return [values]
    return tf.split(values, sizes, num=parts)


def batch_gradients(batch, by_segment, pairs_out=True):
    """The owners' side of the gradients {segment: gradient rows} of `batch`: -> [(row
    addresses in this rank's shard, summed gradients)] per segment given (pairs_out=False:
    [(segment, summed gradients)])."""
    ranks, route = batch.ranks, batch.route
    size = route.size
    with tf.device(ranks.device), tf.name_scope("rank_gradients"):
        grads = []
        for i, _lookup in enumerate(batch.lookups):
            grad = by_segment.get(i)
            if grad is None:  # a lookup of the batch that this optimizer does not train
                grad = tf.zeros_like(batch.outputs[i]["emb"])
            grads.append(grad)
        with tf.name_scope("send"):
            packed, _ = table_ops.pack_rows(grads, batch.width, name="pack_gradients")
            # Optimizers of one batch send their gradients one after the other, in the order
            # they were built: the same on every rank.
            previous = [] if batch.last_gradients is None else [batch.last_gradients]
            with tf.control_dependencies(previous):
                received = all_to_all(
                    rank_parts.fill_parts(packed, batch.dest, batch.within, batch.cap, size),
                    batch.size_class,
                    ranks.task,
                    route,
                    "exchange_gradients",
                )
        batch.last_gradients = received
        received = tf.gather(tf.reshape(received, [size * batch.cap, batch.width]), batch.valid_at)
        owned = table_ops.sum_rows(received, batch.index, batch.owned_count)
        scale = [
            1.0 / ranks.size if lookup.table.ranks.divide_gradients and route.last else 1.0
            for lookup in batch.lookups
        ]
        if len(set(scale)) == 1 and scale[0] != 1.0:
            owned = owned * scale[0]
        elif len(set(scale)) > 1:
            owned = owned * tf.gather(tf.constant(scale), batch.owned_segment)[:, tf.newaxis]
        if len(batch.lookups) == 1:
            per_lookup = [owned]
        else:
            per_lookup = table_ops.split_rows(
                owned, batch.owned_sizes, batch.dims, name="split_gradients"
            )
        if batch.inner is not None:
            # This rank's host's sums of one place's keys: on to their owners.
            out = batch_gradients(batch.inner, {i: per_lookup[i] for i in by_segment}, pairs_out)
            batch.gradients = (dict(by_segment), batch.inner.gradients[1])
            return out
        batch.gradients = (dict(by_segment), {i: per_lookup[i] for i in by_segment})
        if not pairs_out:
            return [(i, per_lookup[i]) for i in sorted(by_segment)]
        return [(batch.trained[i], per_lookup[i]) for i in sorted(by_segment)]
