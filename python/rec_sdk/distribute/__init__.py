"""Training across processes on TensorFlow's own distributed runtime (gRPC, graph mode): the
public entry points.

Every process of the cluster, ps or worker, starts its server with `start_server()` (or
`python -m rec_sdk.distribute.server`), which loads rec_sdk's op library into the process
first, so its server can run the table ops placed on it. `python -m rec_sdk.distribute.launch`
starts a local cluster around a worker command. The cluster and collective functions live in
rec_sdk.distribute.cluster (the layer below the tables); the sharding of the SDK API's tables over
ranks in rec_sdk.distribute.ranks; docs/DISTRIBUTED.md says how to use them.
"""

from rec_sdk.distribute.cluster import (
    ClusterTask,
    all_gather,
    all_gather_blocks,
    all_reduce,
    all_reduce_many,
    all_to_all_blocks,
    current_task,
    next_instance_key,
    pinned_config,
    ps_devices,
    rank_of,
    start_server,
    task_from_tf_config,
    training_task,
    worker_config,
    worker_devices,
)
from rec_sdk.distribute.ranks import broadcast_variables

__all__ = [
    "ClusterTask",
    "task_from_tf_config",
    "start_server",
    "current_task",
    "training_task",
    "rank_of",
    "ps_devices",
    "worker_devices",
    "worker_config",
    "pinned_config",
    "all_reduce",
    "all_reduce_many",
    "all_gather",
    "all_gather_blocks",
    "all_to_all_blocks",
    "next_instance_key",
    "broadcast_variables",
]
