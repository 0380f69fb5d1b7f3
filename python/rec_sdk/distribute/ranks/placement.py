"""Where a table sharded over ranks lives: RankShards (its rank, rank count, devices and
routes), which shards a process manages (managed_shards) and the owner of each key."""
import tensorflow as tf

from rec_sdk.tables import shard_names
from rec_sdk.distribute.ranks.routes import routes as _routes
from rec_sdk.distribute.cluster import worker_addresses


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




def owner_of(keys, size):
    """The rank owning each key: abs(key % size), with C's remainder (the checkpoints' rule)."""
    return tf.abs(tf.truncatemod(tf.cast(keys, tf.int64), tf.constant(size, tf.int64)))
