"""The SDK API over N ranks: tables sharded by key over the training tasks of a cluster, trained
synchronously (as the SDK's ranks train).

Rank r of N (the r-th training task, chief first; see rec_sdk.distribute.training_task) owns
the keys with abs(key % N) == r, the rule rec_sdk's checkpoints restore by. Each rank holds
its shard in its own process. A lookup on rank r:

1. deduplicates its keys locally (the lookup core, rec_sdk.core.embedding, did that);
2. exchanges the distinct keys, with their admission counts and clocks, with every rank
   (TensorFlow's CollectiveGatherV2 over the cluster's gRPC runtime; see
   rec_sdk.distribute.all_gather_varying for the padding);
3. every rank now holds the same union of keys: the owner of each key sums its counts over
   the ranks (admission sees the count of the whole global batch), takes the newest clock,
   and runs find-or-insert and gather on its own shard, once per key;
4. the owners' rows are exchanged back, and each rank reads the rows of its keys in their
   original order.

Gradients go back the same way: each rank contributes the gradients of its distinct keys, and
each owner sums them per key over the ranks (the SDK's "sum_gradients"; divided by N with
all2all_gradients_op="sum_gradients_and_div_by_ranksize") and applies its sparse optimizer
once, in place on its shard. An update ends with a barrier (a one-number all-reduce), so a
step finishes on every rank only when every shard has been updated: a checkpoint taken
between steps is of one step on every shard.

Exchanging with all-gathers sends each rank every other rank's keys and the owners' rows of
all of them: N times the bytes of an all-to-all. That is cheap for the few ranks one host
or a small cluster runs; see benchmarks/RESULTS.md for the model of larger clusters.

Every rank must build the same graph (the same lookups and optimizer calls in the same order:
the n-th collective of each graph meets the n-th of the others) and run the same steps.
"""
import tensorflow as tf

from rec_sdk.distribute import all_gather, all_gather_varying, all_reduce
from rec_sdk.util.graph_state import state_of

CHECKPOINT_SHARD_FORMAT = "%s@%dof%d"  # a rank's shard of table %s in checkpoints


class RankShards:
    """Where a table of the SDK API lives in a cluster of `size` ranks: this process is rank
    `rank`; `devices[r]` holds rank r's shard. `shards[r]` is that shard's table object
    (this process's own is the table itself; rank 0 also has a handle of every other shard,
    for checkpoints). `divide_gradients`: divide the summed gradients by the rank count."""

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
        return CHECKPOINT_SHARD_FORMAT % (table_name, rank, self.size)

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


def owner_of(keys, size):
    """The rank owning each key: abs(key % size), with C's remainder (the checkpoints' rule)."""
    return tf.abs(tf.truncatemod(tf.cast(keys, tf.int64), tf.constant(size, tf.int64)))


class _Exchange:
    """What the backward pass of one lookup needs from its forward exchange."""

    def __init__(self, table, count, lengths, width, valid, index, union_size, mine, trained):
        self.table = table
        self.count = count  # this rank's distinct keys
        self.lengths = lengths  # [N]: every rank's distinct keys
        self.width = width  # what the key gather was padded to (>= max(lengths))
        self.valid = valid  # [N * width]: which gathered entries are keys, not padding
        self.index = index  # [sum(lengths)]: each gathered key's position in the union
        self.union_size = union_size
        self.mine = mine  # positions in the union of the keys this rank owns
        self.trained = trained  # their row addresses in this rank's shard (-1: untrained)


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
        lengths = all_gather(tf.reshape(count, [1]), task=task, name="gather_lengths")
        width = tf.reduce_max(lengths)
        columns = [keys64]
        if counts is not None:
            columns.append(tf.cast(tf.reshape(counts, [-1]), tf.int64))
        if times is not None and times_per_key:
            columns.append(tf.cast(tf.reshape(times, [-1]), tf.int64))
        gathered, width = all_gather_varying(tf.stack(columns, 1), width, task, "gather_keys")
        valid = tf.reshape(tf.sequence_mask(lengths, width), [-1])
        gathered = tf.boolean_mask(gathered, valid)
        union, index = tf.unique(gathered[:, 0], out_idx=tf.int32)
        union_size = tf.size(union, out_type=tf.int32)
        owners = tf.cast(owner_of(union, size), tf.int32)
        mine = tf.reshape(tf.where(tf.equal(owners, rank)), [-1])
        owned = tf.cast(tf.gather(union, mine), table.key_dtype)
        column = 1
        owned_counts = owned_times = None
        if counts is not None:
            summed = tf.math.unsorted_segment_sum(gathered[:, column], index, union_size)
            owned_counts = tf.cast(tf.gather(summed, mine), counts.dtype)
            column += 1
        if times is not None and times_per_key:
            newest = tf.math.unsorted_segment_max(gathered[:, column], index, union_size)
            owned_times = tf.cast(tf.gather(newest, mine), times.dtype)
        elif times is not None:
            owned_times = times
        local = owner_rows(owned, owned_counts, owned_times)
        # The owners' rows (and whether each key has one) back to every rank.
        found = tf.cast(tf.greater_equal(local["addresses"], 0), tf.float32)[:, tf.newaxis]
        payload = tf.concat([local["emb"], found], 1)
        per_owner = tf.math.bincount(owners, minlength=size, maxlength=size, dtype=tf.int32)
        rows, rows_width = all_gather_varying(payload, tf.reduce_max(per_owner), task,
                                              "gather_rows")
        one_hot = tf.one_hot(owners, size, dtype=tf.int32)
        within = tf.reduce_sum(tf.cumsum(one_hot, 0, exclusive=True) * one_hot, 1)
        slot = owners * rows_width + within  # where each union key's row arrived
        offset = tf.reduce_sum(lengths[:rank])
        my_index = index[offset:offset + count]
        received = tf.gather(rows, tf.gather(slot, my_index))
        present = received[:, table.dim] > 0.5
        addresses = tf.where(present, tf.range(tf.cast(count, tf.int64)),
                             tf.constant(-1, tf.int64), name="addresses")
        # The rows, the table and the token in one op whose gradient gives the table an
        # IndexedSlices keyed by the token: tf.gradients(loss, table) works as in one process.
        with tf.compat.v1.get_default_graph().gradient_override_map(
                {"IdentityN": _ROWS_GRADIENT}):
            emb, _, trained = tf.identity_n([received[:, :table.dim], table.handle, addresses],
                                            name="rows")
    record = _Exchange(table, count, lengths, width, valid, index, union_size, mine,
                       local["trained"])
    state = state_of(trained.graph)
    with state.lock:
        state.rank_exchanges[trained.name] = record
    table.lookups.trained_address_names.add(trained.name)
    return {"emb": emb, "addresses": addresses, "trained": trained}


_RECORD_TENSORS = ("count", "lengths", "width", "valid", "index", "union_size", "mine",
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


def owner_gradients(addresses, grads):
    """The gradients [n, dim] of the rows a lookup's exchange returned (addresses: its token)
    -> (row addresses in this rank's shard, the gradients summed over every rank's lookups
    of the same keys) for the keys this rank owns."""
    record = exchange_of(addresses)
    table = record.table
    ranks = table.ranks
    with tf.device(ranks.device), tf.name_scope("rank_gradients"):
        grads = tf.reshape(tf.cast(grads, tf.float32), [-1, table.dim])
        gathered, _ = all_gather_varying(grads, record.width, ranks.task, "gather_gradients")
        gathered = tf.boolean_mask(gathered, record.valid)
        summed = tf.math.unsorted_segment_sum(gathered, record.index, record.union_size)
        owned = tf.gather(summed, record.mine)
        if ranks.divide_gradients:
            owned = owned / float(ranks.size)
        return record.trained, owned


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


def barrier(updates, task):
    """An op that finishes once `updates` ran here and on every other rank."""
    with tf.control_dependencies(tf.nest.flatten(updates)):
        return all_reduce(tf.constant(0, tf.int32), task=task, name="rank_barrier").op
