"""The SDK API over N ranks: tables sharded by key over the training tasks of a cluster, trained
synchronously (as the SDK's ranks train).

Rank r of N (the r-th training task, chief first; see rec_sdk.util.cluster.training_task) owns
the keys with abs(key % N) == r, the rule rec_sdk's checkpoints restore by. Each rank holds
its shard in its own process. A lookup on rank r:

1. deduplicates its keys locally (the lookup core, rec_sdk.core.embedding, did that) and
   sorts them by owner;
2. gathers every rank's number of keys per owner (an N x N matrix, a small all_gather), so
   every rank knows how many keys each rank sends each other rank;
3. sends each owner only the keys it owns, with their admission counts and clocks, in one
   all-to-all (TensorFlow's CollectiveAllToAllV2 over the cluster's gRPC runtime; each part
   padded to the largest count any rank sends any rank, the parts to a power of two: see
   rec_sdk.util.cluster.all_to_all_blocks);
4. each owner deduplicates the keys it was sent, sums each key's counts over the ranks
   (admission sees the count of the whole global batch), takes the newest clock, and runs
   find-or-insert and gather on its own shard, once per key;
5. each owner sends each rank the rows of the keys that rank asked for, in the same slots
   (a second all-to-all), and each rank puts them back in its keys' order.

Gradients go back the same way: each rank sends each owner the gradients of the keys it asked
that owner for, and each owner sums them per key over the ranks (the SDK's "sum_gradients";
divided by N with all2all_gradients_op="sum_gradients_and_div_by_ranksize") and applies its
sparse optimizer once, in place on its shard. No rank receives keys or rows it did not ask
for or does not own: the bytes per key do not grow with N (beyond the padding). An update ends
with a barrier (a one-number all-reduce), so a step finishes on every rank only when every
shard has been updated: a checkpoint taken between steps is of one step on every shard.

The lookups an optimizer trains share their collectives (fuse_lookups: one per stage for all
of them, and one for all their gradients). Rank 0 saves, restores and evicts every shard
(managed_shards); in MonitoredTrainingSession and tf.estimator every rank's variables are set
to rank 0's in the session's local initialisation (broadcast_variables).

Every rank must build the same graph (the same lookups and optimizer calls in the same order:
the n-th collective of each graph meets the n-th of the others) and run the same steps.
"""
import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.core import shard_names
from rec_sdk.core.table import tables_of_graph
from rec_sdk.util.cluster import (all_gather, all_reduce, all_to_all_blocks, next_instance_key,
                                rank_of, worker_devices)
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

    @property
    def device(self):
        return self.devices[self.rank]

    def checkpoint_dir_name(self, table_name, rank):
        return shard_names.rank_shard(table_name, rank, self.size)

    def __repr__(self):
        return "<rank %d of %d>" % (self.rank, self.size)


_ROWS_GRADIENT = "RecSdkRankRows"


@tf.RegisterGradient(_ROWS_GRADIENT)
def _rows_gradient(op, grad_rows, *unused):
    """The table's gradient from the rows of one lookup: IndexedSlices of their gradients,
    keyed by the lookup's token (optimizers send them to the owners: owner_gradients)."""
    del unused
    if grad_rows is None:
        return [None, None, None]
    if isinstance(grad_rows, tf.IndexedSlices):
        grad_rows = tf.convert_to_tensor(grad_rows)
    token = op.outputs[2]
    return [None, tf.IndexedSlices(grad_rows, token, tf.shape(grad_rows, out_type=tf.int64)),
            None]


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
    out = []
    for rank, shard in sorted(table.ranks.shards.items()):
        out.append((table.ranks.checkpoint_dir_name(table.table_name, rank), shard, rank,
                    table.ranks.size))
    return out


def owner_of(keys, size):
    """The rank owning each key: abs(key % size), with C's remainder (the checkpoints' rule)."""
    return tf.abs(tf.truncatemod(tf.cast(keys, tf.int64), tf.constant(size, tf.int64)))


class _Stage:
    """One collective of an exchange: its input (this rank's part), the cap its parts were
    padded to (None: a fixed shape), and its output."""

    def __init__(self, part, cap, output):
        self.part = part
        self.cap = cap
        self.output = output


class _Exchange:
    """What the backward pass of one lookup needs from its forward exchange, and its three
    collectives (fuse_lookups merges those of several lookups)."""

    def __init__(self, table, order, send_at, cap, received_valid, index, owned_count,
                 trained, stages):
        self.table = table
        self.order = order  # this rank's distinct keys, by owner (a permutation of them)
        self.send_at = send_at  # [n]: where each (in that order) is in the [N * cap] parts
        self.cap = cap  # the most keys any rank sent any rank: the rows per part
        self.received_valid = received_valid  # [N * cap]: which received entries are keys
        self.index = index  # each received key's position among the keys this rank owns
        self.owned_count = owned_count  # distinct keys this rank owns of the step
        self.trained = trained  # their row addresses in this rank's shard (-1: untrained)
        self.stages = stages  # {"counts", "keys", "rows"}: _Stage
        self.fused = False


def _by_owner(keys, size):
    """(order, [N] keys per owner, each key's slot in its owner's part) of distinct keys:
    `order` sorts them by owner (stable)."""
    owners = tf.cast(owner_of(keys, size), tf.int32)
    order = tf.argsort(owners, stable=True)
    per_owner = tf.math.bincount(owners, minlength=size, maxlength=size, dtype=tf.int32)
    sorted_owners = tf.gather(owners, order)
    starts = tf.cumsum(per_owner, exclusive=True)
    within = tf.range(tf.size(keys, out_type=tf.int32)) - tf.gather(starts, sorted_owners)
    return order, per_owner, sorted_owners, within


def _parts(values, send_at, size, cap):
    """values [n, w] placed at `send_at` of [size * cap, w] (zeros elsewhere), as [size, cap,
    w]: part d holds what goes to rank d."""
    width = tf.shape(values)[1]
    placed = tf.scatter_nd(tf.reshape(send_at, [-1, 1]), values,
                           tf.stack([size * cap, width]))
    return tf.reshape(placed, tf.stack([size, cap, width]))


def exchange_rows(table, keys, counts, times, times_per_key, owner_rows):
    """The rows of this rank's distinct `keys` [n] (see the module doc).

    counts ([n] or None) and times ([n] when times_per_key, else one clock for all, or None)
    go to the owners with the keys. owner_rows(owned keys, their summed counts, their times)
    runs the lookup core on this rank's shard and returns {"emb", "addresses", "trained"}.
    Returns {"emb" [n, dim], "addresses" [n] (the key's position, -1 when its owner has no
    row for it), "trained" (the token the optimizers apply gradients through)}."""
    ranks = table.ranks
    task = ranks.task
    size, rank = ranks.size, ranks.rank
    with tf.device(ranks.device), tf.name_scope("ranks"):
        keys64 = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        count = tf.size(keys64, out_type=tf.int32)
        order, per_owner, sorted_owners, within = _by_owner(keys64, size)
        stages = {}
        # Every rank's count per owner: [N, N], row s holding what rank s sends each rank.
        counts_matrix = tf.reshape(all_gather(per_owner, task=task, name="gather_counts"),
                                   [size, size])
        stages["counts"] = _Stage(per_owner, None, counts_matrix)
        cap = tf.reduce_max(counts_matrix)
        send_at = sorted_owners * cap + within
        columns = [keys64]
        if counts is not None:
            columns.append(tf.cast(tf.reshape(counts, [-1]), tf.int64))
        if times is not None and times_per_key:
            columns.append(tf.cast(tf.reshape(times, [-1]), tf.int64))
        part = _parts(tf.gather(tf.stack(columns, 1), order), send_at, size, cap)
        [received] = all_to_all_blocks([(part, cap)], task, "exchange_keys")
        stages["keys"] = _Stage(part, cap, received)
        # The owner's side: the keys every rank asked this rank for, each once.
        received_valid = tf.reshape(tf.sequence_mask(counts_matrix[:, rank], cap), [-1])
        asked = tf.boolean_mask(tf.reshape(received, [size * cap, len(columns)]),
                                received_valid)
        owned64, index = tf.unique(asked[:, 0], out_idx=tf.int32)
        owned_count = tf.size(owned64, out_type=tf.int32)
        owned = tf.cast(owned64, table.key_dtype)
        column = 1
        owned_counts = owned_times = None
        if counts is not None:
            summed = tf.math.unsorted_segment_sum(asked[:, column], index, owned_count)
            owned_counts = tf.cast(summed, counts.dtype)
            column += 1
        if times is not None and times_per_key:
            newest = tf.math.unsorted_segment_max(asked[:, column], index, owned_count)
            owned_times = tf.cast(newest, times.dtype)
        elif times is not None:
            owned_times = times
        local = owner_rows(owned, owned_counts, owned_times)
        # The rows (and whether each key has one) back to the ranks that asked, in the slots
        # their keys came in.
        found = tf.cast(tf.greater_equal(local["addresses"], 0), tf.float32)[:, tf.newaxis]
        payload = tf.gather(tf.concat([local["emb"], found], 1), index)
        reply = _parts(payload, tf.cast(tf.where(received_valid)[:, 0], tf.int32), size, cap)
        [rows] = all_to_all_blocks([(reply, cap)], task, "exchange_rows")
        stages["rows"] = _Stage(reply, cap, rows)
        by_owner = tf.gather(tf.reshape(rows, [size * cap, table.dim + 1]), send_at)
        received_rows = tf.gather(by_owner, tf.math.invert_permutation(order))
        present = received_rows[:, table.dim] > 0.5
        addresses = tf.where(present, tf.range(tf.cast(count, tf.int64)),
                             tf.constant(-1, tf.int64), name="addresses")
        # The rows, the table and the token in one op whose gradient gives the table an
        # IndexedSlices keyed by the token: tf.gradients(loss, table) works as in one process.
        with tf.compat.v1.get_default_graph().gradient_override_map(
                {"IdentityN": _ROWS_GRADIENT}):
            emb, _, trained = tf.identity_n([received_rows[:, :table.dim], table.handle,
                                             addresses], name="rows")
    record = _Exchange(table, order, send_at, cap, received_valid, index, owned_count,
                       local["trained"], stages)
    state = state_of(trained.graph)
    with state.lock:
        state.rank_exchanges[trained.name] = record
    table.lookups.trained_address_names.add(trained.name)
    return {"emb": emb, "addresses": addresses, "trained": trained}


_RECORD_TENSORS = ("order", "send_at", "cap", "received_valid", "index", "owned_count",
                   "trained")


def record_reroutes(old_token, new_token):
    """{old tensor name: new tensor name} taking what the backward pass of the lookup whose
    token is `old_token` reads over to the exchange of `new_token` (graph modification
    replaces a lookup by the input pipeline's: the optimizers built on the old one follow);
    empty for lookups of tables in one process."""
    old, new = exchange_of(old_token), exchange_of(new_token)
    if old is None or new is None:
        return {}
    return {getattr(old, field).name: getattr(new, field).name for field in _RECORD_TENSORS}


def exchange_of(addresses):
    """The forward exchange whose token `addresses` is, or None."""
    if not isinstance(addresses, tf.Tensor):
        return None
    return state_of(addresses.graph).rank_exchanges.get(addresses.name)


def owner_gradients(pairs):
    """[(token, gradients [n, dim] of the rows its lookup returned)] -> [(row addresses in
    this rank's shard, the gradients summed over every rank's lookups of the same keys)] for
    the keys this rank owns, per pair: each rank sends each owner the gradients of the keys it
    asked that owner for, all the lookups' in one all-to-all."""
    records = [exchange_of(token) for token, _ in pairs]
    ranks = records[0].table.ranks
    size = ranks.size
    with tf.device(ranks.device), tf.name_scope("rank_gradients"):
        blocks = []
        for (_, grads), record in zip(pairs, records):
            grads = tf.reshape(tf.cast(grads, tf.float32), [-1, record.table.dim])
            blocks.append((_parts(tf.gather(grads, record.order), record.send_at, size,
                                  record.cap), record.cap))
        received = all_to_all_blocks(blocks, ranks.task, "exchange_gradients")
        out = []
        for record, grads in zip(records, received):
            grads = tf.boolean_mask(tf.reshape(grads, [size * record.cap, record.table.dim]),
                                    record.received_valid)
            owned = tf.math.unsorted_segment_sum(grads, record.index, record.owned_count)
            if record.table.ranks.divide_gradients:
                owned = owned / float(size)
            out.append((record.trained, owned))
        return out


def fuse_lookups(tokens):
    """Merges the forward exchanges of the lookups whose tokens these are (training lookups
    of one step, not yet run) stage by stage: one collective for all their counts, one for
    their keys, one for their rows, instead of three per lookup. Each collective costs a
    round of messages and its CPU whatever its size, so a model with many tables steps
    faster. The lookups' ops are rewired to the merged collectives' slices (the old ones stay
    in the graph, unused). A step then runs all of them together: fetching one of these
    lookups runs the others' exchanges (and their inputs) too. Returns the number of lookups
    merged."""
    records = []
    for token in tokens:
        record = exchange_of(token)
        if record is not None and not record.fused and record not in records:
            records.append(record)
    if len(records) < 2:
        return 0
    ranks = records[0].table.ranks
    size = ranks.size
    graph = records[0].cap.graph
    mapping = {}
    # Outside any control dependencies of the caller (e.g. minimize() under UPDATE_OPS): the
    # lookups' forward pass must not wait for ops that depend on it.
    with graph.as_default(), graph.control_dependencies(None), tf.device(ranks.device), \
            tf.name_scope("fused_lookups"):
        counts = all_gather(tf.concat([r.stages["counts"].part for r in records], 0),
                            task=ranks.task, name="gather_counts")
        counts = tf.reshape(counts, [size, len(records), size])
        for i, record in enumerate(records):
            mapping[record.stages["counts"].output.name] = counts[:, i, :].name
        for stage in ("keys", "rows"):
            # The caps are computed from the old counts, which the mapping takes over to the
            # merged ones: they are the merged ones' caps too.
            merged = all_to_all_blocks([(r.stages[stage].part, r.stages[stage].cap)
                                        for r in records], ranks.task, "exchange_" + stage)
            for record, received in zip(records, merged):
                mapping[record.stages[stage].output.name] = received.name
    final, _ = graph_rewrite.run_passes(graph.as_graph_def(),
                                        [graph_rewrite.RerouteInputs(mapping, {})])
    graph_rewrite.update_live_graph(graph, final, "fuse_lookups")
    logger.info("rec_sdk: the exchanges of %d lookups over %d ranks merged into one "
                "collective per stage", len(records), size)
    for record in records:
        record.fused = True
    return len(records)


def split_table_gradient(grad):
    """The IndexedSlices gradient of a table sharded over ranks (one lookup's, or several
    concatenated by tf.gradients) -> [(token, gradient rows)] per lookup; None when `grad`
    is not keyed by lookup tokens."""
    indices = grad.indices
    while indices.op.type == "Identity":
        indices = indices.op.inputs[0]
    if exchange_of(indices) is not None:
        return [(indices, grad.values)]
    if indices.op.type != "ConcatV2":
        return None
    tokens = list(indices.op.inputs[:-1])
    for i, token in enumerate(tokens):
        while token.op.type == "Identity":
            token = token.op.inputs[0]
        if exchange_of(token) is None:
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
    """tf.compat.v1.train.Scaffold.finalize, in a graph with tables sharded over ranks: adds
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
    elif tables and not graph.finalized:
        task = tables[0].ranks.task
        self._local_init_op = tf.group(  # pylint: disable=protected-access
            tf.compat.v1.train.Scaffold.default_local_init_op(),
            broadcast_variables(tf.compat.v1.global_variables(), task),
            name="rec_sdk_local_init_and_broadcast")
        self._ready_for_local_init_op = tf.constant(  # pylint: disable=protected-access
            [], tf.string, name="rec_sdk_ready_for_broadcast")
    return original(self)


tf_patches.install("Scaffold.finalize", _broadcasting_finalize)


def barrier(updates, task):
    """An op that finishes once `updates` ran here and on every other rank."""
    with tf.control_dependencies(tf.nest.flatten(updates)):
        return all_reduce(tf.constant(0, tf.int32), task=task, name="rank_barrier").op
