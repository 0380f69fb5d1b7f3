"""Where a table sharded over ranks lives: its placement (the TableSpec's RankPlacement: rank,
rank count, devices), the routes of its exchanges, the table objects of its shards (shards_of).
The owner of each key is the core's (tf_ops/core/rank_parts.h: OwnerOf), through the
exchange's routing op."""

import functools

from rec_sdk.distribute.cluster import worker_addresses
from rec_sdk.distribute.ranks.routes import routes as _routes


def set_shards(table, shards):
    """Records the table objects of the shards of `table` (this process's shard of a table
    over ranks), {rank: table}: its own, and on rank 0 a handle of every other rank's shard
    (for checkpoints and eviction). They are held by the table (table.rank_shards)."""
    if table.ranks is None or shards.get(table.ranks.rank) is not table:
        raise ValueError("set_shards: %r must be a table over ranks and its own shard" % (table,))
    table.rank_shards = dict(shards)


def shards_of(table):
    """{rank: the table object of that rank's shard} of this process's shard `table` of a
    table over ranks: its own on every rank, every rank's on rank 0."""
    if table.rank_shards is None:
        raise ValueError("table %r is not sharded over ranks" % (table.table_name,))
    return table.rank_shards


@functools.lru_cache(maxsize=256)
def routes(placement):
    """The levels of the exchanges of a table placed at `placement` (a RankPlacement;
    rec_sdk.distribute.ranks.routes): one, or two with per-host dedup."""
    return _routes(placement.rank, list(placement.devices), worker_addresses(placement.task))
