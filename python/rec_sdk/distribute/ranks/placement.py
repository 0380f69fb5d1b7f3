"""Where a table sharded over ranks lives: its placement (the TableSpec's RankPlacement: rank,
rank count, devices), the routes of its exchanges, the table objects of its shards (shards_of)
and the owner of each key."""

import functools
import weakref

import tensorflow as tf

from rec_sdk.distribute.cluster import worker_addresses
from rec_sdk.distribute.ranks.routes import routes as _routes

# This process's table of each sharded table -> {rank: that rank's shard's table object}: its
# own, and on rank 0 a handle of every other rank's shard (for checkpoints and eviction).
_SHARDS = weakref.WeakKeyDictionary()


def set_shards(table, shards):
    """Records the shards' table objects of `table` (this process's shard), {rank: table}."""
    if table.ranks is None or shards.get(table.ranks.rank) is not table:
        raise ValueError("set_shards: %r must be a table over ranks and its own shard" % (table,))
    _SHARDS[table] = dict(shards)


def shards_of(table):
    """{rank: the table object of that rank's shard} of this process's shard `table` of a
    table over ranks: its own on every rank, every rank's on rank 0."""
    if table not in _SHARDS:
        raise ValueError("table %r is not sharded over ranks" % (table.table_name,))
    return _SHARDS[table]


@functools.lru_cache(maxsize=None)
def routes(placement):
    """The levels of the exchanges of a table placed at `placement` (a RankPlacement;
    rec_sdk.distribute.ranks.routes): one, or two with per-host dedup."""
    return _routes(placement.rank, list(placement.devices), worker_addresses(placement.task))


def owner_of(keys, size):
    """The rank owning each key: abs(key % size), with C's remainder (the checkpoints' rule)."""
    return tf.abs(tf.truncatemod(tf.cast(keys, tf.int64), tf.constant(size, tf.int64)))
