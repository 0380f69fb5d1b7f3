"""The SDK API over N ranks: tables sharded by key over the training tasks of a cluster, trained
synchronously (as the SDK's ranks train).

Rank r of N (the r-th training task, chief first; see rec_sdk.util.cluster.training_task) owns
the keys with abs(key % N) == r, the rule rec_sdk's checkpoints restore by. Each rank holds
its shard in its own process. A lookup on rank r:

1. deduplicates its keys locally (the lookup core, rec_sdk.core.embedding, did that) and
   sorts them by owner;
2. sends each owner only the keys it owns, with their admission counts and clocks, in one
   all-to-all (TensorFlow's CollectiveAllToAllV2 over the cluster's gRPC runtime), each part
   padded to a size class every rank already knows: the batch's hint, one class above the
   largest count any rank sent any rank in earlier steps (tf_ops/core/size_class.h). Before
   it, every rank gathers each rank's largest count (a few bytes), so all keep the same hint
   and a rank that is gone fails the step at once; in a step whose keys did not fit the
   hint's class, all send them again in a class that holds them;
3. each owner deduplicates the keys it was sent, sums each key's counts over the ranks
   (admission sees the count of the whole global batch), takes the newest clock, and runs
   find-or-insert and gather on its own shard, once per key;
4. each owner sends each rank the rows of the keys that rank asked for, in the same slots
   (a second all-to-all), and each rank puts them back in its keys' order.

Gradients go back the same way: each rank sends each owner the gradients of the keys it asked
that owner for, and each owner sums them per key over the ranks (the SDK's "sum_gradients";
divided by N with all2all_gradients_op="sum_gradients_and_div_by_ranksize") and applies its
sparse optimizer once, in place on its shard. No rank receives keys or rows it did not ask
for or does not own: the bytes per key do not grow with N (beyond the padding). A step has no
barrier: a rank's next step cannot start its exchange before every rank finished this one,
and every rank updates its own shard. Rank 0, which saves and evicts every shard between
steps, first waits until each rank has finished as many update steps as it has (fence), so
a checkpoint is of one step on every shard.

Lookups are exchanged in batches (batch_lookups): the lookups an optimizer trains, of any
tables and dims, share one exchange (the needs gather, the keys all-to-all,
the rows all-to-all, the gradient all-to-all), their bookkeeping done once for the batch, so
a step's ops do not grow with the number of tables; so do the graph's evaluation lookups
(batched when MonitoredTrainingSession or Estimator finalizes the graph). Rank 0 saves,
restores and evicts every shard (managed_shards); in MonitoredTrainingSession and
tf.estimator every rank's variables are set to rank 0's in the session's local
initialisation (broadcast_variables).

Per-host dedup (REC_SDK_RANKS_PER_HOST, rec_sdk.core.rank_routes): the exchange runs in two
levels, each a whole exchange in collective groups of its own: the ranks of a host (each key
to the rank of its host in its owner's place, which deduplicates the host's keys), then the
ranks of a place across the hosts (to the owner); gradients are summed at each level.

Every rank must build the same graph (the same lookups and optimizer calls in the same order:
the n-th collective of each graph meets the n-th of the others) and run the same steps.
"""
import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.core import shard_names
from rec_sdk.core.table import tables_of_graph
from rec_sdk.ops import table_ops
from rec_sdk.core.rank_routes import (RANKS_PER_HOST_ENV, ranks_per_host,  # noqa: F401
                                      routes as _routes)
from rec_sdk.util.cluster import (all_gather, all_to_all_in_class, next_instance_key,
                                rank_of, worker_addresses, worker_devices)
from rec_sdk import tf_patches
from rec_sdk.util.graph_state import state_of
from rec_sdk.util.log import logger


class RankShards:
    """Where a table of the SDK API lives in a cluster of `size` ranks: this process is rank
    `rank`; `devices[r]` holds rank r's shard. `shards[r]` is that shard's table object
    (this process's own is the table itself; rank 0 also has a handle of every other shard,
    for checkpoints and eviction). `divide_gradients`: divide the summed gradients by the
    rank count."""

    def __init__(self, task, rank, size, devices, divide_gradients):
        self.task = task
        self.rank = rank
        self.size = size
        self.devices = list(devices)
        self.divide_gradients = divide_gradients
        self.shards = {}
        self._routes = None

    @property
    def routes(self):
        """The levels of this table's exchanges (rank_routes.routes): one, or two with
        per-host dedup."""
        if self._routes is None:
            self._routes = _routes(self.rank, self.devices, worker_addresses(self.task))
        return self._routes

    @property
    def device(self):
        return self.devices[self.rank]

    def checkpoint_dir_name(self, table_name, rank):
        return shard_names.rank_shard(table_name, rank, self.size)

    def __repr__(self):
        return "<rank %d of %d>" % (self.rank, self.size)


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
        out[segments + i] = tf.IndexedSlices(grad_rows, op.outputs[2 * segments + i],
                                             tf.shape(grad_rows, out_type=tf.int64))
    return out


def managed_shards(table):
    """[(label, table object, rank, ranks)]: what a process saves, restores and evicts of
    `table`. One process: the table itself, labelled with its name. A table sharded over
    ranks: rank 0 manages every rank's shard, labelled <table>@<rank>of<ranks> (each by ops
    on the shard's own task, so that a checkpoint or an eviction at the end of a step is of
    that step on every shard); the other ranks nothing."""
    if table.ranks is None:
        return [(table.table_name, table, 0, 1)]
    if table.ranks.rank != 0:
        return []
    if not table.handle.graph.finalized:
        fence(table)
    out = []
    for rank, shard in sorted(table.ranks.shards.items()):
        out.append((table.ranks.checkpoint_dir_name(table.table_name, rank), shard, rank,
                    table.ranks.size))
    return out


def owner_of(keys, size):
    """The rank owning each key: abs(key % size), with C's remainder (the checkpoints' rule)."""
    return tf.abs(tf.truncatemod(tf.cast(keys, tf.int64), tf.constant(size, tf.int64)))


class _Lookup:
    """One lookup of a table sharded over ranks: what its exchange needs, and (once its
    lookups were batched: batch_lookups) the batch serving it."""

    def __init__(self, table, columns, has_counts, times_per_key, times, owner_rows,
                 is_train, outputs):
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

    def __init__(self, lookups, ranks, slots, cap, size_class, valid_at, index, owned_count,
                 owned_sizes, owned_segment, trained, outputs):
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


def _by_owner(keys, ranks, route):
    """(order, [N] keys per destination, destinations in that order, each key's slot in its
    destination's part, destinations) of distinct keys at a level of the exchange (`route`;
    N its size): `order` sorts them by destination (stable)."""
    size = route.size
    owners = tf.cast(route.owner(owner_of(keys, ranks.size)), tf.int32)
    order = tf.argsort(owners, stable=True)
    per_owner = _bincount(owners, size, tf.int32)
    sorted_owners = tf.gather(owners, order)
    starts = tf.cumsum(per_owner, exclusive=True)
    within = tf.range(tf.size(keys, out_type=tf.int32)) - tf.gather(starts, sorted_owners)
    return order, per_owner, sorted_owners, within, owners


def _parts(values, slots, size, cap):
    """values [n, w] placed at `slots` of [size * cap, w] (zeros elsewhere), as [size, cap,
    w]: part d holds what goes to rank d."""
    width = tf.shape(values)[1]
    placed = tf.scatter_nd(tf.reshape(slots, [-1, 1]), values,
                           tf.stack([size * cap, width]))
    return tf.reshape(placed, tf.stack([size, cap, width]))


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
            columns.append(tf.cast(tf.reshape(counts, [-1]), tf.int64) if has_counts
                           else tf.zeros_like(keys64))
        if per_key:
            columns.append(tf.cast(tf.reshape(times, [-1]), tf.int64))
        lookup = _Lookup(table, tf.stack(columns, 1), has_counts, per_key,
                         None if per_key else times, owner_rows, is_train, None)
        if has_counts:
            lookup.counts_dtype = counts.dtype
        if per_key:
            lookup.times_dtype = times.dtype
        batch = _exchange([lookup])
    lookup.outputs = batch.outputs[0]  # its own exchange: not batched yet
    state = state_of(keys64.graph)
    with state.lock:
        state.rank_lookups[lookup.outputs["trained"].name] = lookup
    table.lookups.trained_address_names.add(lookup.outputs["trained"].name)
    return dict(lookup.outputs)


def _exchange(lookups, level=0):
    """The exchange of `lookups` (one or more, any tables): one keys all-to-all and one rows
    all-to-all, whatever their number (see the module doc), at each level of the tables'
    routes from `level` on. -> _Batch."""
    ranks = lookups[0].table.ranks
    route = ranks.routes[level]
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
        packed, sizes = table_ops.pack_rows([lookup.columns for lookup in lookups], width,
                                            name="pack_keys")
    count = tf.shape(packed, out_type=tf.int32)[0]
    order, per_owner, sorted_owners, within, owners = _by_owner(packed[:, 0], ranks, route)
    inverse = tf.math.invert_permutation(order)
    if segments == 1:
        segment = None
        position = tf.range(count)
        per_lookup = tf.cast(per_owner, tf.int64)[:, tf.newaxis]
    else:
        segment = tf.searchsorted(tf.cumsum(sizes), tf.range(count), side="right")
        position = tf.range(count) - tf.gather(tf.cumsum(sizes, exclusive=True), segment)
        per_lookup = tf.reshape(
            _bincount(owners * segments + segment, size * segments, tf.int64),
            [size, segments])
    received, cap, size_class = _send_keys(packed, per_owner, sorted_owners, within, inverse,
                                           per_lookup, ranks, route)
    slots = tf.gather(sorted_owners * cap + within, inverse)
    # Each part: its keys per lookup, then the keys lookup by lookup.
    from_lookup = received[:, :segments, 0]
    received_valid = tf.reshape(
        tf.sequence_mask(tf.cast(tf.reduce_sum(from_lookup, 1), tf.int32), cap), [-1])
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
            tf.tile(tf.range(tf.cast(cap, tf.int64))[tf.newaxis], [size, 1]), side="right")
        asked_segment = tf.gather(tf.reshape(slot_segment, [-1]), valid_at)
        # (lookup, key) pairs, each once: keys are deduplicated, then pairs of (key's
        # position, lookup), ordered by lookup.
        distinct, key_index = table_ops.unique_keys(asked[:, 0])
        pair_ids, pair_index = table_ops.unique_keys(
            tf.cast(key_index, tf.int64) * segments + tf.cast(asked_segment, tf.int64))
        by_segment = tf.argsort(tf.cast(pair_ids % segments, tf.int32), stable=True)
        pair_ids = tf.gather(pair_ids, by_segment)
        index = tf.gather(tf.math.invert_permutation(by_segment), pair_index)
        owned_segment = tf.cast(pair_ids % segments, tf.int32)
        owned_count = tf.size(pair_ids, out_type=tf.int32)
        owned_sizes = _bincount(owned_segment, segments, tf.int32)
        owned_keys = _split(tf.gather(distinct, pair_ids // segments), owned_sizes, segments)
    owned_counts = owned_times = [None] * segments
    if any(lookup.has_counts for lookup in lookups):
        owned_counts = _split(tf.math.unsorted_segment_sum(asked[:, 1], index, owned_count),
                              owned_sizes, segments)
    if any(lookup.times_per_key for lookup in lookups):
        owned_times = _split(tf.math.unsorted_segment_max(asked[:, 2], index, owned_count),
                             owned_sizes, segments)
    inner = None
    if route.last:
        local = []
        for i, lookup in enumerate(lookups):
            counts = times = None
            if lookup.has_counts:
                counts = tf.cast(owned_counts[i], lookup.counts_dtype)
            if lookup.times_per_key:
                times = tf.cast(owned_times[i], lookup.times_dtype)
            elif lookup.times is not None:
                times = lookup.times
            local.append(lookup.owner_rows(tf.cast(owned_keys[i], lookup.table.key_dtype),
                                           counts, times))
    else:
        # This rank holds its host's distinct keys of one place: they go on to their owners
        # (the next level), as one batch.
        inner = _exchange([_passed_on(lookup, owned_keys[i], owned_counts[i], owned_times[i])
                           for i, lookup in enumerate(lookups)], level + 1)
        local = inner.outputs
    # The rows (and whether each key has one) back to the ranks that asked, in the slots
    # their keys came in.
    if segments == 1:
        rows, found = local[0]["emb"], local[0]["addresses"] >= 0
    else:
        rows, _ = table_ops.pack_rows([out["emb"] for out in local], dim, name="pack_rows")
        found = tf.concat([out["addresses"] for out in local], 0) >= 0
    payload = tf.gather(tf.concat([rows, tf.cast(found, tf.float32)[:, tf.newaxis]], 1),
                        index)
    back = _all_to_all(_parts(payload, valid_at, size, cap), size_class, task, route,
                       "exchange_rows")
    back = tf.gather(tf.reshape(back, [size * cap, dim + 1]), slots)
    addresses = tf.where(back[:, dim] > 0.5, tf.cast(position, tf.int64),
                         tf.constant(-1, tf.int64))
    if segments == 1:
        embs = [back[:, :dim]]
    else:
        embs = table_ops.split_rows(back, sizes, dims, name="split_rows")
    addresses = _split(addresses, sizes, segments)
    # The rows, the tables and the tokens in one op whose gradient gives each table an
    # IndexedSlices keyed by its token: tf.gradients(loss, table) works as in one process.
    with tf.compat.v1.get_default_graph().gradient_override_map(
            {"IdentityN": _ROWS_GRADIENT}):
        outs = tf.identity_n(list(embs) + [lookup.table.handle for lookup in lookups]
                             + list(addresses), name="rows")
    outputs = [{"emb": outs[i], "addresses": addresses[i], "trained": outs[2 * segments + i]}
               for i in range(segments)]
    trained = inner.trained if inner else [out["trained"] for out in local]
    batch = _Batch(lookups, ranks, slots, cap, size_class, valid_at, index, owned_count,
                   owned_sizes, owned_segment, trained, outputs)
    batch.route, batch.inner = route, inner
    return batch


def _passed_on(lookup, keys, counts, times):
    """The _Lookup that passes `lookup`'s keys this rank was sent (their summed counts and
    newest times, as int64) on to the next level of the exchange."""
    columns = [keys]
    if lookup.has_counts or lookup.times_per_key:
        columns.append(counts if lookup.has_counts else tf.zeros_like(keys))
    if lookup.times_per_key:
        columns.append(times)
    passed = _Lookup(lookup.table, tf.stack(columns, 1), lookup.has_counts,
                     lookup.times_per_key, lookup.times, lookup.owner_rows, lookup.is_train,
                     None)
    for attribute in ("counts_dtype", "times_dtype"):
        if hasattr(lookup, attribute):
            setattr(passed, attribute, getattr(lookup, attribute))
    return passed


def _send_keys(packed, per_owner, sorted_owners, within, inverse, per_lookup, ranks, route):
    """The keys all-to-all of a batch: -> (received [N, T + cap, width], cap: keys per part,
    its size class).

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
    full = _parts(packed, tf.gather(sorted_owners * most + within, inverse), size, most)
    head = tf.pad(per_lookup[:, :, tf.newaxis], [[0, 0], [0, 0], [0, width - 1]])

    def part(cap):  # [N, T + cap, width]: the keys cut or padded to cap per part
        keys = tf.pad(full, [[0, 0], [0, tf.maximum(cap - most, 0)], [0, 0]])[:, :cap]
        return tf.concat([head, keys], 1)

    size_class, cap = table_ops.rank_size_class(hint)
    largest = tf.reduce_max(all_gather(tf.reshape(tf.cast(most, tf.int64), [1]), task=task,
                                       name="gather_needs", group=group))
    with tf.control_dependencies([largest]):
        sent = _all_to_all(part(cap), size_class, task, route, "exchange_keys")
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
    resent = _all_to_all(part(again[0]), again[1], task, route, "resend_keys")
    return tuple(tf.raw_ops.Merge(inputs=[a, b]).output
                 for a, b in zip(kept, [resent] + again))


def _all_to_all(parts, size_class, task, route, name):
    """The all-to-all of [route.size, ...] parts in a size class, in the route's group."""
    return all_to_all_in_class(parts, size_class, table_ops.SIZE_CLASSES, task, name,
                               group=route.group)


def _switch(value, pred):
    """(value where pred is false, value where pred is true): the other one is dead."""
    return tf.raw_ops.Switch(data=value, pred=pred)


def _bincount(values, length, dtype):
    """[length] counts of each value of int32 `values` in [0, length) (one op)."""
    return tf.raw_ops.Bincount(arr=values, size=tf.constant(length, tf.int32),
                               weights=tf.constant([], dtype))


def _split(values, sizes, parts):
    """tf.split of `values` by `sizes` into `parts` (one op; a list even of one part)."""
    if parts == 1:
        return [values]
    return tf.split(values, sizes, num=parts)


def lookup_of(token):
    """The lookup of tables sharded over ranks whose token `token` is (the addresses its
    gradients go to), or None."""
    if not isinstance(token, tf.Tensor):
        return None
    return state_of(token.graph).rank_lookups.get(token.name)



def replace_lookups(pairs):
    """Graph modification replaces lookups by the input pipeline's: [(old token, new token)]
    -> {old tensor name: new tensor name} taking what read the old lookups over to the new
    ones, for lookups of tables sharded over ranks (empty for others). Where the old lookups
    were batched (an optimizer built on them), their batch is rebuilt from the new lookups
    (several old ones may share one new one): its forward outputs, and its gradients' (the
    gradients the optimizer sends for the old lookups now go, summed per new lookup, through
    the new batch)."""
    mapping = {}
    replaced = {}
    for old_token, new_token in pairs:
        old, new = lookup_of(old_token), lookup_of(new_token)
        if old is not None and new is not None and old.batch is not None:
            replaced[old] = new
    batches = []
    for old in replaced:
        if old.batch not in batches:
            batches.append(old.batch)
    for old_batch in batches:
        targets, where = [], []
        for lookup in old_batch.lookups:
            target = replaced.get(lookup, lookup)
            if target.batch is not None and target.batch is not old_batch:
                raise ValueError("graph modification: lookup of table %r is in two batches "
                                 "of lookups over ranks" % target.table.table_name)
            if target not in targets:
                targets.append(target)
            where.append(targets.index(target))
        for target in targets:
            target.batch = None
        ranks = old_batch.ranks
        graph = old_batch.cap.graph
        with graph.as_default(), graph.control_dependencies(None), \
                tf.device(ranks.device), tf.name_scope("rank_batch"):
            batch = _exchange(targets)
            for i, j in enumerate(where):
                for field in ("emb", "addresses", "trained"):
                    mapping[old_batch.outputs[i][field].name] = batch.outputs[j][field].name
                mapping[old_batch.trained[i].name] = batch.trained[j].name
            if old_batch.gradients is not None:
                grads_in, grads_out = old_batch.gradients
                by_segment = {}
                for i, grad in grads_in.items():
                    j = where[i]
                    by_segment[j] = grad if j not in by_segment else by_segment[j] + grad
                new_out = dict(_batch_gradients(batch, by_segment, pairs_out=False))
                first = set()
                for i, out in grads_out.items():
                    j = where[i]
                    if j in first:  # the new lookup's gradients are applied once
                        mapping[out.name] = tf.zeros_like(new_out[j]).name
                    else:
                        mapping[out.name] = new_out[j].name
                        first.add(j)
        _register(batch, graph)
    return mapping


def _register(batch, graph):
    """Marks the lookups of `batch` batched, under their batch tokens too."""
    state = state_of(graph)
    for i, lookup in enumerate(batch.lookups):
        lookup.batch, lookup.segment = batch, i
        token = batch.outputs[i]["trained"]
        with state.lock:
            state.rank_lookups[token.name] = lookup
        lookup.table.lookups.trained_address_names.add(token.name)


def batch_lookups(tokens, graph=None):
    """Moves the lookups whose tokens these are (of tables sharded over ranks, not yet run)
    into one exchange: one needs gather, one keys all-to-all and one rows all-to-all
    for all of them, their bookkeeping done once for the batch rather than once per lookup
    (tables of any dims; each keeps its own settings). Each collective costs a round of
    messages and its CPU whatever its size, and each op its scheduling, so a model with many
    tables steps as fast as one with one table of the same keys. The lookups' consumers are
    rewired to the batch (their own exchanges stay in the graph, unused). A step then runs
    all of them together: fetching one of these lookups runs the others' (and their inputs)
    too.
    Returns the number of lookups batched."""
    lookups = []
    for token in tokens:
        lookup = lookup_of(token)
        if lookup is not None and lookup.batch is None and lookup not in lookups:
            lookups.append(lookup)
    if not lookups:
        return 0
    ranks = lookups[0].table.ranks
    graph = graph or lookups[0].columns.graph
    # Outside any control dependencies of the caller (e.g. minimize() under UPDATE_OPS): the
    # lookups' forward pass must not wait for ops that depend on it.
    with graph.as_default(), graph.control_dependencies(None), tf.device(ranks.device), \
            tf.name_scope("rank_batch"):
        batch = _exchange(lookups)
    mapping = {}
    for i, lookup in enumerate(lookups):
        for field in ("emb", "addresses", "trained"):
            mapping[lookup.outputs[field].name] = batch.outputs[i][field].name
    _register(batch, graph)
    final, _ = graph_rewrite.run_passes(graph.as_graph_def(),
                                        [graph_rewrite.RerouteInputs(mapping, {})])
    graph_rewrite.update_live_graph(graph, final, "batch_lookups")
    logger.info("rec_sdk: %d lookups over %d ranks batched into one exchange", len(lookups),
                ranks.size)
    return len(lookups)



def batch_pending_lookups(graph):
    """Batches the lookups over ranks of `graph` that no optimizer batched (evaluation
    lookups, and training lookups nothing trains): one batch of each kind. Called when
    MonitoredTrainingSession or Estimator finalizes the graph. Returns the number batched."""
    state = state_of(graph)
    with state.lock:
        pending = [(name, lookup) for name, lookup in state.rank_lookups.items()
                   if lookup.batch is None and lookup.outputs["trained"].name == name]
    done = 0
    for is_train in (False, True):
        tokens = [lookup.outputs["trained"] for _, lookup in pending
                  if lookup.is_train == is_train]
        done += batch_lookups(tokens, graph) if tokens else 0
    return done


def owner_gradients(pairs):
    """[(token, gradients [n, dim] of the rows its lookup returned)] -> [(row addresses in
    this rank's shard, the gradients summed over every rank's lookups of the same keys)] for
    the keys this rank owns, per lookup: each rank sends each owner the gradients of the keys
    it asked that owner for, those of a whole batch of lookups in one all-to-all. Batches the
    lookups first (batch_lookups) if they were not."""
    batch_lookups([token for token, _ in pairs])
    by_batch = {}
    for token, grads in pairs:
        lookup = lookup_of(token)
        entry = by_batch.setdefault(id(lookup.batch), (lookup.batch, {}))
        grads = tf.reshape(tf.cast(grads, tf.float32), [-1, lookup.table.dim])
        previous = entry[1].get(lookup.segment)
        entry[1][lookup.segment] = grads if previous is None else previous + grads
    out = []
    for batch, by_segment in by_batch.values():
        out.extend(_batch_gradients(batch, by_segment))
    return out


def _batch_gradients(batch, by_segment, pairs_out=True):
    """The owners' side of the gradients {segment: gradient rows} of `batch`: -> [(row
    addresses in this rank's shard, summed gradients)] per segment given (pairs_out=False:
    [(segment, summed gradients)])."""
    ranks, route = batch.ranks, batch.route
    size = route.size
    with tf.device(ranks.device), tf.name_scope("rank_gradients"):
        grads = []
        for i, lookup in enumerate(batch.lookups):
            grad = by_segment.get(i)
            if grad is None:  # a lookup of the batch that this optimizer does not train
                grad = tf.zeros_like(batch.outputs[i]["emb"])
            grads.append(grad)
        packed, _ = table_ops.pack_rows(grads, batch.width, name="pack_gradients")
        received = _all_to_all(_parts(packed, batch.slots, size, batch.cap),
                               batch.size_class, ranks.task, route, "exchange_gradients")
        received = tf.gather(tf.reshape(received, [size * batch.cap, batch.width]),
                             batch.valid_at)
        owned = table_ops.sum_rows(received, batch.index, batch.owned_count)
        scale = [1.0 / ranks.size if lookup.table.ranks.divide_gradients and route.last
                 else 1.0 for lookup in batch.lookups]
        if len(set(scale)) == 1 and scale[0] != 1.0:
            owned = owned * scale[0]
        elif len(set(scale)) > 1:
            owned = owned * tf.gather(tf.constant(scale), batch.owned_segment)[:, tf.newaxis]
        if len(batch.lookups) == 1:
            per_lookup = [owned]
        else:
            per_lookup = table_ops.split_rows(owned, batch.owned_sizes, batch.dims,
                                              name="split_gradients")
        if batch.inner is not None:
            # This rank's host's sums of one place's keys: on to their owners.
            out = _batch_gradients(batch.inner, {i: per_lookup[i] for i in by_segment},
                                   pairs_out)
            batch.gradients = (dict(by_segment), batch.inner.gradients[1])
            return out
        batch.gradients = (dict(by_segment), {i: per_lookup[i] for i in by_segment})
        if not pairs_out:
            return [(i, per_lookup[i]) for i in sorted(by_segment)]
        return [(batch.trained[i], per_lookup[i]) for i in sorted(by_segment)]


def split_table_gradient(grad):
    """The IndexedSlices gradient of a table sharded over ranks (one lookup's, or several
    concatenated by tf.gradients) -> [(token, gradient rows)] per lookup; None when `grad`
    is not keyed by lookup tokens."""
    indices = grad.indices
    while indices.op.type == "Identity":
        indices = indices.op.inputs[0]
    if lookup_of(indices) is not None:
        return [(indices, grad.values)]
    if indices.op.type != "ConcatV2":
        return None
    tokens = list(indices.op.inputs[:-1])
    for i, token in enumerate(tokens):
        while token.op.type == "Identity":
            token = token.op.inputs[0]
        if lookup_of(token) is None:
            return None
        tokens[i] = token
    sizes = [tf.shape(token)[0] for token in tokens]
    return list(zip(tokens, tf.split(grad.values, sizes, axis=0)))


def broadcast_variables(variables, task):
    """An op setting `variables` (fully defined shapes; the same list, in the same order, in
    every rank's graph) to rank 0's values: one CollectiveBcastSendV2 on rank 0 and one
    CollectiveBcastRecvV2 elsewhere per dtype, of the flattened values."""
    rank, size = rank_of(task)
    by_dtype = {}
    for variable in variables:
        if not variable.shape.is_fully_defined():
            raise ValueError("variable %s has shape %s; broadcasting rank 0's values needs "
                             "fully defined shapes" % (variable.name, variable.shape))
        by_dtype.setdefault(variable.dtype.base_dtype, []).append(variable)
    assigns = []
    with tf.device(worker_devices(task)[rank]), tf.name_scope("broadcast_variables"):
        for dtype, group in by_dtype.items():
            instance = next_instance_key(task)
            sizes = [v.shape.num_elements() for v in group]
            if rank == 0:
                flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], 0)
                values = tf.raw_ops.CollectiveBcastSendV2(
                    input=flat, group_size=tf.constant(size), group_key=tf.constant(1),
                    instance_key=tf.constant(instance))
            else:
                values = tf.raw_ops.CollectiveBcastRecvV2(
                    group_size=tf.constant(size), group_key=tf.constant(1),
                    instance_key=tf.constant(instance), shape=tf.constant([sum(sizes)]),
                    T=dtype)
            for variable, part in zip(group, tf.split(values, sizes)):
                assigns.append(tf.compat.v1.assign(variable, tf.reshape(part, variable.shape)))
    return tf.group(assigns)


def _broadcasting_finalize(original, self):
    """tf.compat.v1.train.Scaffold.finalize, in a graph with tables sharded over ranks: batches
    the lookups no optimizer batched (batch_pending_lookups: evaluation lookups), and adds
    broadcast_variables of every global variable to the local_init_op (and makes it ready to
    run at once), unless the scaffold or the graph's collections set those ops.
    MonitoredTrainingSession and tf.estimator then need no chief for the other ranks'
    variables: the chief (rank 0) initialises or restores its variables, then sends them;
    every other rank, chief or not, receives them in its local initialisation, so all ranks
    start from the same values (those of a restored checkpoint too). Scaffold keeps the two
    ops in its private _local_init_op and _ready_for_local_init_op (TensorFlow 2.15, 2.21),
    set only by its constructor."""
    graph = tf.compat.v1.get_default_graph()
    tables = [t for t in tables_of_graph(graph) if t.ranks is not None]
    keys = tf.compat.v1.GraphKeys
    custom = (self._local_init_op is not None  # pylint: disable=protected-access
              or self._ready_for_local_init_op is not None  # pylint: disable=protected-access
              or graph.get_collection(keys.LOCAL_INIT_OP)
              or graph.get_collection(keys.READY_FOR_LOCAL_INIT_OP))
    if tables and not graph.finalized and custom:
        logger.warning("rec_sdk: the scaffold sets its own local_init_op or "
                       "ready_for_local_init_op: rank 0's variables are not broadcast; "
                       "add rec_sdk.distribute.broadcast_variables to it, or start "
                       "every rank's variables equal")
    if tables and not graph.finalized:
        batch_pending_lookups(graph)
    if tables and not graph.finalized and not custom:
        task = tables[0].ranks.task
        self._local_init_op = tf.group(  # pylint: disable=protected-access
            tf.compat.v1.train.Scaffold.default_local_init_op(),
            broadcast_variables(tf.compat.v1.global_variables(), task),
            name="rec_sdk_local_init_and_broadcast")
        self._ready_for_local_init_op = tf.constant(  # pylint: disable=protected-access
            [], tf.string, name="rec_sdk_ready_for_broadcast")
    return original(self)


tf_patches.install("Scaffold.finalize", _broadcasting_finalize)


def step_done(updates, task):
    """The op ending a training step's updates of this rank's shards: once `updates` ran,
    this process's count of finished update steps goes up by one (no collective: the next
    step's exchange cannot start on any rank before every rank finished this step; rank 0
    waits for the count before it saves or evicts a shard: fence)."""
    with tf.control_dependencies(tf.nest.flatten(updates)), \
            tf.device(worker_devices(task)[rank_of(task)[0]]):
        return table_ops.rank_step_done(name="rank_step_done")


def fence(table):
    """An op (or None: one process, or not rank 0) that finishes once every rank has
    finished as many update steps as rank 0: rank 0 runs it before it saves or evicts the
    shards of `table` between steps, so that each shard holds the same step (the other ranks
    may still be applying the step's gradients when rank 0's step ends). Built on first use,
    once per graph; the graph must not be finalized then (managed_shards builds it)."""
    shards = table.ranks
    if shards is None or shards.rank != 0 or shards.size == 1:
        return None
    graph = table.handle.graph
    state = state_of(graph)
    with state.lock:
        built = state.rank_fence
    if built is not None:
        return built
    with graph.as_default(), graph.control_dependencies(None), tf.name_scope("rank_fence"):
        with tf.device(shards.devices[0]):
            target = table_ops.rank_steps()
        waits = []
        for device in shards.devices[1:]:
            with tf.device(device):
                waits.append(table_ops.rank_wait_for_steps(target))
        built = tf.group(waits, name="every_rank_updated")
    with state.lock:
        state.rank_fence = built
    return built
