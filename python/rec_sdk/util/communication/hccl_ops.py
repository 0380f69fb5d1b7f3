"""This process's place among the training processes (mirrors
mx_rec.util.communication.hccl_ops): `get_rank_id()`, `get_rank_size()`.

This module is the one place that knows the rank: `create_table` (per-rank shards and
sizes) and scripts read it here. A single process is rank 0 of 1, with or without init().
In a cluster (rec_sdk.distribute: TF_CONFIG or start_server), init() sets the rank to this
process's place among the training tasks (chief first, then the workers) and the size to
their number.
"""

import threading

_lock = threading.Lock()
_rank_id = 0
_rank_size = 1
_local_rank_size = 1


def set_rank_info(rank_id, rank_size, local_rank_size=None):
    """Records this process's rank (called by init and by a cluster start)."""
    global _rank_id, _rank_size, _local_rank_size
    if rank_size < 1:
        raise ValueError("rank_size must be >= 1, got %r" % (rank_size,))
    if not 0 <= rank_id < rank_size:
        raise ValueError("rank_id must be in [0, rank_size=%d), got %d" % (rank_size, rank_id))
    with _lock:
        _rank_id, _rank_size = int(rank_id), int(rank_size)
        _local_rank_size = int(local_rank_size or rank_size)


def get_rank_id():
    """This process's rank, in [0, get_rank_size())."""
    return _rank_id


def get_rank_size():
    """How many processes train together (each owns the keys with key % rank_size == rank)."""
    return _rank_size


def get_local_rank_size():
    """How many of them run on this machine."""
    return _local_rank_size


def get_device_id():
    """The device of this rank on its machine (rank_id % local_rank_size); on CPU it names no
    accelerator and is kept for scripts that log or branch on it."""
    return _rank_id % _local_rank_size
