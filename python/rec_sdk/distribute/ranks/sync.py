"""What keeps ranks in step: rank 0's variables broadcast in the session's local
initialisation, each rank's count of finished update steps and rank 0's wait for it
(fence) before it saves or evicts a shard."""

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.distribute.cluster import next_instance_key, rank_of, worker_devices
from rec_sdk.distribute.ranks import input_end
from rec_sdk.distribute.ranks.batching import batch_pending_lookups
from rec_sdk.distribute.ranks.placement import shards_of
from rec_sdk.ops import table_ops
from rec_sdk.tables.table import tables_of_graph


def broadcast_variables(variables, task):
    """An op setting `variables` (fully defined shapes; the same list, in the same order, in
    every rank's graph) to rank 0's values: one CollectiveBcastSendV2 on rank 0 and one
    CollectiveBcastRecvV2 elsewhere per dtype, of the flattened values."""
    rank, size = rank_of(task)
    by_dtype = {}
    for variable in variables:
        if not variable.shape.is_fully_defined():
            raise ValueError(
                "variable %s has shape %s; broadcasting rank 0's values needs "
                "fully defined shapes" % (variable.name, variable.shape)
            )
        by_dtype.setdefault(variable.dtype.base_dtype, []).append(variable)
    assigns = []
    with tf.device(worker_devices(task)[rank]), tf.name_scope("broadcast_variables"):
        for dtype, group in by_dtype.items():
            instance = next_instance_key(task)
            sizes = [v.shape.num_elements() for v in group]
            if rank == 0:
                flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], 0)
                values = tf.raw_ops.CollectiveBcastSendV2(
                    input=flat,
                    group_size=tf.constant(size),
                    group_key=tf.constant(1),
                    instance_key=tf.constant(instance),
                )
            else:
                values = tf.raw_ops.CollectiveBcastRecvV2(
                    group_size=tf.constant(size),
                    group_key=tf.constant(1),
                    instance_key=tf.constant(instance),
                    shape=tf.constant([sum(sizes)]),
                    T=dtype,
                )
            for variable, part in zip(group, tf.split(values, sizes)):
                assigns.append(tf.compat.v1.assign(variable, tf.reshape(part, variable.shape)))
    return tf.group(assigns)


def _broadcasting_finalize(original, self):
    """tf.compat.v1.train.Scaffold.finalize, in a graph with tables sharded over ranks: batches the
    lookups no optimizer batched (batch_pending_lookups: evaluation lookups), and adds
    broadcast_variables of every global variable to the local_init_op (and makes it ready to
    run at once), unless the scaffold or the graph's collections set those ops. It also
    wires the ends of the ranks' inputs (input_end.prepare) and builds rank 0's fence (its
    wait before it saves). MonitoredTrainingSession and tf.estimator then need no chief for
    the other ranks' variables: the chief (rank 0) initialises or restores its variables,
    then sends them; every other rank, chief or not, receives them in its local
    initialisation, so all ranks start from the same values (those of a restored checkpoint
    too). Scaffold keeps the two ops in its private _local_init_op and
    _ready_for_local_init_op (TensorFlow 2.15, 2.21), set only by its constructor."""
    graph = tf.compat.v1.get_default_graph()
    tables = [t for t in tables_of_graph(graph) if t.ranks is not None]
    keys = tf.compat.v1.GraphKeys
    custom = (
        any(op is not None for op in tf_patches.scaffold_local_init(self))
        or graph.get_collection(keys.LOCAL_INIT_OP)
        or graph.get_collection(keys.READY_FOR_LOCAL_INIT_OP)
    )
    if tables and not graph.finalized and custom:
        logger.warning(
            "rec_sdk: the scaffold sets its own local_init_op or "
            "ready_for_local_init_op: rank 0's variables are not broadcast; "
            "add rec_sdk.distribute.broadcast_variables to it, or start "
            "every rank's variables equal"
        )
    if tables and not graph.finalized:
        batch_pending_lookups(graph)
        input_end.prepare(graph, every_read=True)
        # Rank 0's wait before a save, built now: MonitoredTrainingSession's first
        # checkpoint is saved after the graph is finalized.
        for table in tables:
            fence(table)
    if tables and not graph.finalized and not custom:
        task = tables[0].ranks.task
        tf_patches.set_scaffold_local_init(
            self,
            tf.group(
                tf.compat.v1.train.Scaffold.default_local_init_op(),
                broadcast_variables(tf.compat.v1.global_variables(), task),
                name="rec_sdk_local_init_and_broadcast",
            ),
            tf.constant([], tf.string, name="rec_sdk_ready_for_broadcast"),
        )
    return original(self)


tf_patches.install("Scaffold.finalize", _broadcasting_finalize)


def step_done(updates, task):
    """The op ending a training step's updates of this rank's shards: once `updates` ran,
    this process's count of finished update steps goes up by one (no collective: the next
    step's exchange cannot start on any rank before every rank finished this step; rank 0
    waits for the count before it saves or evicts a shard: fence)."""
    with (
        tf.control_dependencies(tf.nest.flatten(updates)),
        tf.device(worker_devices(task)[rank_of(task)[0]]),
    ):
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
    for rank, shard in sorted(shards_of(table).items()):
        out.append(
            (table.ranks.checkpoint_dir_name(table.table_name, rank), shard, rank, table.ranks.size)
        )
    return out
