"""The cluster layer: tasks, TF_CONFIG, servers and collectives on TensorFlow's own distributed
runtime (gRPC, graph mode); rec_sdk.distribute re-exports the public names.

Every process of the cluster, ps or worker, starts its server here (or with
`python -m rec_sdk.distribute.server`): that loads rec_sdk's op library into the process
first, so its server can run the table ops placed on it. Then the TFRA recipe works as is:

    server = rec_sdk.distribute.start_server()            # cluster and task from TF_CONFIG
    var = de.get_variable("emb", dim=16, devices=rec_sdk.distribute.ps_devices(server))
    ...
    with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=..., config=worker_config(server)) as sess: ...

Shard i of a de.Variable lives on its device (`devices[i]`, keys routed by the partitioner,
by default key % shard_num); lookups and updates run there, the model on the worker.
Workers that train dense variables data-parallel and synchronously reduce their gradients
with `all_reduce` (TensorFlow's CollectiveReduceV2 over the same runtime).

TF_CONFIG is TensorFlow's: {"cluster": {"ps": ["host:port", ...], "worker": [...],
"chief": [...]}, "task": {"type": "ps", "index": 0}}.
"""

import json
import math
import os
import threading
import weakref

import numpy as np
import tensorflow as tf

from rec_sdk.ops.loader import load_ops

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
    "all_to_all_in_class",
    "CollectiveGroup",
]

_current = [None]  # the ClusterTask whose server this process started
# Collective instance keys used so far, per graph: the n-th collective built in a graph gets
# the same key in every task, since every task builds the same graph.
_instances = weakref.WeakKeyDictionary()
_instances_lock = threading.Lock()
_graphs = [0]  # graphs of this process that built collectives
_KEYS_PER_GRAPH = 1 << 20
_REDUCTIONS = {
    "sum": ("Add", "Id"),
    "mean": ("Add", "Div"),
    "max": ("Max", "Id"),
    "min": ("Min", "Id"),
    "prod": ("Mul", "Id"),
}


class ClusterTask:
    """A cluster (tf.train.ClusterSpec) and this process's task in it (job name, index)."""

    def __init__(self, cluster, job_name, task_index):
        if not isinstance(cluster, tf.train.ClusterSpec):
            try:
                cluster = tf.train.ClusterSpec(cluster)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    "cluster must be a tf.train.ClusterSpec or a dict "
                    '{job: ["host:port", ...]}, got %r (%s)' % (cluster, e)
                ) from None
        if job_name not in cluster.jobs:
            raise ValueError(
                "job_name %r is not a job of the cluster (jobs: %s)"
                % (job_name, ", ".join(sorted(cluster.jobs)))
            )
        tasks = cluster.num_tasks(job_name)
        if (
            isinstance(task_index, bool)
            or not isinstance(task_index, int)
            or not 0 <= task_index < tasks
        ):
            raise ValueError(
                "task_index must be an integer in [0, %d) (job %r has %d tasks), "
                "got %r" % (tasks, job_name, tasks, task_index)
            )
        self.cluster = cluster
        self.job_name = job_name
        self.task_index = task_index

    def __repr__(self):
        return "<ClusterTask /job:%s/task:%d of %s>" % (
            self.job_name,
            self.task_index,
            self.cluster.as_dict(),
        )


def task_from_tf_config(tf_config=None):
    """The ClusterTask that TF_CONFIG (a JSON string or dict; default: the environment
    variable) describes."""
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise ValueError(
                "TF_CONFIG is not set: give the cluster and task explicitly or set "
                'TF_CONFIG=\'{"cluster": {"ps": ["host:port"], "worker": '
                '[...]}, "task": {"type": "ps", "index": 0}}\''
            )
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except ValueError as e:
            raise ValueError("TF_CONFIG is not JSON (%s): %r" % (e, tf_config)) from None
    if (
        not isinstance(tf_config, dict)
        or not isinstance(tf_config.get("cluster"), dict)
        or not isinstance(tf_config.get("task"), dict)
    ):
        raise ValueError(
            'TF_CONFIG must have a "cluster" dict and a "task" dict '
            '({"type": job, "index": i}), got %r' % (tf_config,)
        )
    task = tf_config["task"]
    return ClusterTask(tf_config["cluster"], task.get("type"), task.get("index", 0))


def start_server(cluster=None, job_name=None, task_index=None, config=None, collective=False):
    """Loads rec_sdk's op library into this process, then starts its tf.distribute.Server for
    `job_name` / `task_index` of `cluster` (default: all three from TF_CONFIG) and returns
    it. config: the server's default session tf.compat.v1.ConfigProto (default:
    worker_config of the task, with `collective` for workers that all_reduce)."""
    if cluster is None and job_name is None and task_index is None:
        task = task_from_tf_config()
    else:
        task = ClusterTask(cluster, job_name, 0 if task_index is None else task_index)
    load_ops()  # before the server starts: its graphs may hold rec_sdk ops
    server = tf.distribute.Server(
        task.cluster,
        job_name=task.job_name,
        task_index=task.task_index,
        config=pinned_config(config) if config else worker_config(task, collective),
        start=True,
    )
    server.rec_sdk_task = task
    _current[0] = task
    return server


def current_task():
    """The ClusterTask of the server start_server started in this process, or None."""
    return _current[0]


def _task_of(where):
    task = getattr(where, "rec_sdk_task", where)
    if not isinstance(task, ClusterTask):
        raise TypeError("expected a server from start_server or a ClusterTask, got %r" % (where,))
    return task


def _cluster_of(where):
    return where if isinstance(where, tf.train.ClusterSpec) else _task_of(where).cluster


def _device(job, index):
    return "/job:%s/replica:0/task:%d/device:CPU:0" % (job, index)


def _training_tasks(cluster):
    """[(job, index)] of the training tasks in rank order: the chief (if any), the workers."""
    return [
        (job, i)
        for job in ("chief", "worker")
        if job in cluster.jobs
        for i in cluster.task_indices(job)
    ]


def ps_devices(where, job_name="ps"):
    """One device per task of the ps job (the `devices` of a de.Variable sharded over them):
    "/job:ps/replica:0/task:<i>/device:CPU:0". where: a server from start_server, a
    ClusterTask or a tf.train.ClusterSpec."""
    cluster = _cluster_of(where)
    if job_name not in cluster.jobs:
        raise ValueError(
            "the cluster has no %r job (jobs: %s)" % (job_name, ", ".join(sorted(cluster.jobs)))
        )
    return [_device(job_name, i) for i in cluster.task_indices(job_name)]


def worker_addresses(where):
    """The addresses ("host:port") of the training tasks, in rank order (worker_devices)."""
    cluster = _cluster_of(where)
    return [cluster.task_address(job, i) for job, i in _training_tasks(cluster)]


def worker_devices(where):
    """The devices of the training tasks, in rank order: the chief's (if the cluster has one),
    then each worker's ("/job:worker/replica:0/task:<i>/device:CPU:0")."""
    return [_device(job, i) for job, i in _training_tasks(_cluster_of(where))]


def worker_config(where, collective=False):
    """The session config of a task. It sees the ps tasks and itself only (device_filters), so
    a worker neither waits for nor depends on the other workers; with collective (workers
    that all_reduce), it sees every training task too, and the first leads the collective
    group."""
    task = _task_of(where)
    filters = ["/job:ps"] if "ps" in task.cluster.jobs else []
    training = _training_tasks(task.cluster)
    if collective and (task.job_name, task.task_index) in training:
        filters += ["/job:%s/task:%d" % t for t in training]
    else:
        filters.append("/job:%s/task:%d" % (task.job_name, task.task_index))
    config = pinned_config(tf.compat.v1.ConfigProto(device_filters=filters))
    if collective and training:
        config.experimental.collective_group_leader = "/job:%s/replica:0/task:%d" % training[0]
    return config


def pinned_config(config=None):
    """`config` (a tf.compat.v1.ConfigProto, or None) with TensorFlow's intra- and inter-op
    thread counts set to the CPUs this process may run on, when it is pinned to fewer than
    the machine has (taskset, sched_setaffinity: one rank per core) and `config` does not set
    them (a copy: `config` is left as it is). TensorFlow sizes its pools by the machine's
    cores whatever the process's affinity: a process pinned to one core of two then runs two
    spinning pools on it, and a step of the table benchmark takes 11-33 ms instead of 5.
    Returns `config` unchanged (None included) when the process may run on every core."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    if not allowed or allowed >= (os.cpu_count() or 0):
        return config
    given, config = config, tf.compat.v1.ConfigProto()
    if given is not None:
        config.CopyFrom(given)
    if not config.intra_op_parallelism_threads:
        config.intra_op_parallelism_threads = allowed
    if not config.inter_op_parallelism_threads:
        config.inter_op_parallelism_threads = allowed
    return config


def training_task():
    """This process's ClusterTask when it is one of several training tasks (chief, workers) of
    a cluster: the task start_server started, else TF_CONFIG's (a script whose server
    tf.estimator starts). None otherwise: one process, or a ps task."""
    task = current_task()
    if task is None and os.environ.get("TF_CONFIG"):
        config = json.loads(os.environ["TF_CONFIG"])
        if config.get("cluster") and config.get("task", {}).get("type") in ("chief", "worker"):
            task = task_from_tf_config(config)
    if task is None or len(_training_tasks(task.cluster)) <= 1:
        return None
    if (task.job_name, task.task_index) not in _training_tasks(task.cluster):
        return None
    return task


def rank_of(task):
    """(rank, rank count) of a training task: its place among worker_devices(task)."""
    training = _training_tasks(task.cluster)
    return training.index((task.job_name, task.task_index)), len(training)


class CollectiveGroup:
    """Some of the training tasks, as a collective group of their own: group `count` of
    `count` disjoint groups that every task builds together (their n-th collectives share
    the n-th reservation of instance keys, each group using its own part of it: TensorFlow
    resolves an instance key once, whatever its group). `key`: the group key (1 is every
    training task's); `devices`: the members' devices, in their order in the group."""

    def __init__(self, key, devices, index, count):
        if key <= 1:
            raise ValueError(
                "a CollectiveGroup's key must be > 1 (1 is every training task's), got %d" % key
            )
        self.key, self.devices, self.index, self.count = key, list(devices), index, count

    def __repr__(self):
        return "<collective group %d: %s>" % (self.key, ", ".join(self.devices))


def _collective_call(task, name, keys=1, group=None):
    """(own device, group size, the first of `keys` new instance keys of the graph, group
    key) of a collective of `task` (default: current_task(), else training_task()) over every
    training task or over `group` (a CollectiveGroup), or None with one training task or
    none."""
    task = task or current_task() or training_task()
    devices = worker_devices(task) if task is not None else []
    if len(devices) <= 1:
        return None
    own = _device(task.job_name, task.task_index)
    if own not in devices:
        raise ValueError(
            "%s runs in the training tasks (%s), not in %s" % (name, ", ".join(devices), own)
        )
    if group is not None:
        if own not in group.devices:
            raise ValueError("%s of %r runs in its tasks, not in %s" % (name, group, own))
        first = _reserve(name, keys * group.count)
        return own, len(group.devices), first + group.index * keys, group.key
    return own, len(devices), _reserve(name, keys), 1


def _reserve(name, keys):
    """The first of `keys` new instance keys of the default graph."""
    graph = tf.compat.v1.get_default_graph()
    with _instances_lock:
        if graph not in _instances:
            # Each graph of the process gets its own range of instance keys (TensorFlow
            # keeps a collective instance's shape for the process's life; a second graph,
            # e.g. an Estimator's evaluation, must not reuse the first's keys). Every task
            # builds its graphs in the same order, so the ranges match.
            if (_graphs[0] + 2) * _KEYS_PER_GRAPH > 2**31:
                raise ValueError(
                    "%s: more than %d graphs of this process built collectives "
                    "(their instance keys are int32)" % (name, _graphs[0])
                )
            _graphs[0] += 1
            _instances[graph] = _graphs[0] * _KEYS_PER_GRAPH
        instance = _instances[graph] + 1
        _instances[graph] += keys
        if _instances[graph] >= (_graphs[0] + 1) * _KEYS_PER_GRAPH:
            raise ValueError(
                "%s: more than %d collective instance keys in one graph" % (name, _KEYS_PER_GRAPH)
            )
    return instance


def next_instance_key(task=None):
    """A new collective instance key of the default graph (for collectives built elsewhere,
    e.g. rec_sdk.distribute.ranks' broadcasts), or None outside a cluster."""
    call = _collective_call(task, "a collective")
    return None if call is None else call[2]


def all_reduce(tensor, reduction="sum", task=None, name=None):
    """`tensor` reduced over the training tasks (all_reduce runs in every task's graph, built
    in the same order: the n-th collective of each graph meets the n-th of the others):
    TensorFlow's CollectiveReduceV2 on CPU over the cluster's gRPC runtime. reduction:
    "sum", "mean", "max", "min" or "prod". task: default current_task(), else TF_CONFIG's
    training task; with one training task (or none) the tensor itself. The task's server and
    sessions need worker_config(task, collective=True)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(
            "reduction must be one of %s, got %r" % (", ".join(_REDUCTIONS), reduction)
        )
    call = _collective_call(task, "all_reduce")
    if call is None:
        return tf.identity(tensor, name=name)
    own, size, instance, _ = call
    merge, final = _REDUCTIONS[reduction]
    with tf.device(own), tf.name_scope(name or "all_reduce"):
        return tf.raw_ops.CollectiveReduceV2(
            input=tf.convert_to_tensor(tensor),
            group_size=tf.constant(size),
            group_key=tf.constant(1),
            instance_key=tf.constant(instance),
            ordering_token=[],
            merge_op=merge,
            final_op=final,
        )


def all_reduce_many(tensors, reduction="sum", task=None, name=None):
    """all_reduce of several tensors (one float dtype; their shapes the same in every task and
    at every step, as all_reduce needs) as one collective: they are flattened into one
    vector, reduced, and cut back. Each collective costs a round of
    messages between the tasks, so a model's dense gradients go faster this way than one by
    one. -> the reduced tensors, in order."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    with tf.name_scope(name or "all_reduce_many"):
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
        reduced = all_reduce(flat, reduction, task=task)
        sizes = [tf.size(t) for t in tensors]
        return [tf.reshape(part, tf.shape(t)) for part, t in zip(tf.split(reduced, sizes), tensors)]


def all_gather(tensor, task=None, name=None, group=None):
    """Every training task's `tensor` (the same shape in each) concatenated along the first
    dimension in rank order (worker_devices): TensorFlow's CollectiveGatherV2, built and run
    as all_reduce is. group: a CollectiveGroup (its members' tensors, in its order) instead
    of every training task. With one training task (or none) the tensor itself."""
    call = _collective_call(task, "all_gather", group=group)
    if call is None:
        return tf.identity(tensor, name=name)
    own, size, instance, group_key = call
    with tf.device(own), tf.name_scope(name or "all_gather"):
        return tf.raw_ops.CollectiveGatherV2(
            input=tf.convert_to_tensor(tensor),
            group_size=tf.constant(size),
            group_key=tf.constant(group_key),
            instance_key=tf.constant(instance),
            ordering_token=[],
        )


_SIZE_CLASSES = 32  # powers of two: what all_gather_blocks pads to


def _power_of_two(count):
    """(k, 2**k) as int64 scalars for the least power of two >= max(count, 1)."""
    count = tf.maximum(tf.cast(count, tf.int64), 1)
    power = tf.cast(tf.math.ceil(tf.math.log(tf.cast(count, tf.float64)) / math.log(2.0)), tf.int64)
    power += tf.cast(
        tf.bitwise.left_shift(tf.constant(1, tf.int64), power) < count, tf.int64
    )  # a log rounded down
    return power, tf.bitwise.left_shift(tf.constant(1, tf.int64), power)


def _size_class(width, first, what):
    """The instance key of a collective of `width` values per task (int64 scalar) padded to a
    power of two (the first of the site's _SIZE_CLASSES keys is `first`), and that padded
    width as int32."""
    power, total = _power_of_two(width)
    check = tf.debugging.assert_less(
        power, tf.constant(_SIZE_CLASSES - 1, tf.int64), message="%s: over 2**30 values" % what
    )
    with tf.control_dependencies([check]):
        return tf.cast(power, tf.int32) + first, tf.cast(total, tf.int32)


def _cut(per_task, tensors, rows, inner_from):
    """The columns of per_task [N, width] that hold each of `tensors` (rows[i] rows of its
    dimensions from `inner_from` on), in order: [N, rows[i] * inner size] each."""
    out, offset = [], tf.constant(0, tf.int32)
    for t, r in zip(tensors, rows):
        length = r * int(np.prod(t.shape[inner_from:].as_list(), dtype=np.int64))
        out.append(per_task[:, offset : offset + length])
        offset += length
    return out


def all_gather_blocks(blocks, task=None, name=None):
    """all_gather of tensors whose first dimension changes from step to step, several at once
    in one collective. blocks: [(tensor [n, ...], width)], one dtype, the inner dimensions
    known; `width` >= n is the same scalar tensor in every task (e.g. the all_gather'ed
    maximum of n). Each tensor is padded with zeros to `width` rows; the blocks are
    flattened into one vector, padded to a power of two, and gathered. -> [(the gathered
    [N * width, ...], width as int32)] per block. TensorFlow's collectives fix the shape of
    a collective instance at its first run, so each power of two has its own instance key
    (chosen at run time): the padding costs at most twice the bytes, and any size works."""
    call = _collective_call(task, "all_gather", keys=_SIZE_CLASSES)
    with tf.name_scope(name or "all_gather_blocks"):
        tensors = [tf.convert_to_tensor(t) for t, _ in blocks]
        rows = [tf.cast(width, tf.int32) for _, width in blocks]
        padded = [
            tf.pad(t, [[0, r - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1))
            for t, r in zip(tensors, rows)
        ]
        if call is None:
            return list(zip(padded, rows))
        own, size, first, _ = call
        with tf.device(own):
            flat = tf.concat([tf.reshape(t, [-1]) for t in padded], 0)
            key, total = _size_class(tf.size(flat, out_type=tf.int64), first, "all_gather_blocks")
            gathered = tf.raw_ops.CollectiveGatherV2(
                input=tf.pad(flat, [[0, total - tf.size(flat)]]),
                group_size=tf.constant(size),
                group_key=tf.constant(1),
                instance_key=key,
                ordering_token=[],
            )
            parts = _cut(tf.reshape(gathered, [size, -1]), tensors, rows, 1)
            return [
                (tf.reshape(part, [size * r] + t.shape[1:].as_list()), r)
                for part, t, r in zip(parts, tensors, rows)
            ]


def all_to_all_blocks(blocks, task=None, name=None):
    """All-to-all of tensors whose size changes from step to step, several at once in one
    collective: part d of each block goes to rank d, and part s of each result came from rank
    s. blocks: [(tensor [N, k, ...], cap)] with N the number of training tasks, one dtype, the
    inner dimensions known; `cap` >= k is the same scalar tensor in every task (e.g. the
    largest count any rank sends any rank, from an all_gather of the counts). Each tensor is
    padded to cap rows per destination; per destination the blocks are flattened, joined and
    padded to a power of two, and exchanged with TensorFlow's CollectiveAllToAllV2 (one hop:
    every rank sends each other rank its part, in parallel). -> [received [N, cap, ...]] per
    block. As with all_gather_blocks, each power of two has its own instance key (chosen at
    run time): the padding costs at most twice the bytes. A session step that runs it must
    also run an all_gather or all_reduce (TensorFlow sets up a step's collective executor
    for those, not for an all-to-all alone); the exchanges of rec_sdk.distribute.ranks do."""
    call = _collective_call(task, "all_to_all", keys=_SIZE_CLASSES)
    with tf.name_scope(name or "all_to_all_blocks"):
        tensors = [tf.convert_to_tensor(t) for t, _ in blocks]
        caps = [tf.cast(cap, tf.int32) for _, cap in blocks]
        padded = [
            tf.pad(t, [[0, 0], [0, c - tf.shape(t)[1]]] + [[0, 0]] * (t.shape.rank - 2))
            for t, c in zip(tensors, caps)
        ]
        if call is None:
            return padded
        own, size, first, _ = call
        with tf.device(own):
            flat = tf.concat([tf.reshape(t, [size, -1]) for t in padded], 1)
            width = tf.shape(flat)[1]
            key, total = _size_class(tf.cast(width, tf.int64), first, "all_to_all_blocks")
            received = tf.raw_ops.CollectiveAllToAllV2(
                input=tf.pad(flat, [[0, 0], [0, total - width]]),
                group_size=tf.constant(size),
                group_key=tf.constant(1),
                instance_key=key,
                ordering_token=[],
            )
            return [
                tf.reshape(part, [size, c] + t.shape[2:].as_list())
                for part, t, c in zip(_cut(received, tensors, caps, 2), tensors, caps)
            ]


def all_to_all_in_class(tensor, size_class, classes, task=None, name=None, group=None):
    """All-to-all of a tensor [N, ...] (N training tasks; part d goes to rank d, part s of the
    result came from rank s) whose shape changes from step to step in steps of size classes:
    `size_class` (an int32 scalar tensor in [0, classes), the same in every task; rec_sdk's
    exchanges use rec_sdk.ops.table_ops.SIZE_CLASSES) picks the collective instance, so the
    shape must be a function of it (the same in every task and step that uses the class).
    TensorFlow's CollectiveAllToAllV2,
    as all_to_all_blocks. group: a CollectiveGroup (N its members) instead of every training
    task. With one training task (or none) the tensor itself."""
    call = _collective_call(task, "all_to_all", keys=classes, group=group)
    if call is None:
        return tf.identity(tensor, name=name)
    own, size, first, group_key = call
    with tf.device(own), tf.name_scope(name or "all_to_all_in_class"):
        return tf.raw_ops.CollectiveAllToAllV2(
            input=tensor,
            group_size=tf.constant(size),
            group_key=tf.constant(group_key),
            instance_key=tf.cast(size_class, tf.int32) + first,
            ordering_token=[],
        )
