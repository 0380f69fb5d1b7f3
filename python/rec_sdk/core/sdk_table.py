"""The SDK's `create_table` (public as rec_sdk.core.embedding.create_table): its arguments,
checked as the SDK names them, become a TableSpec (rec_sdk.tables.table_spec) and the table
(rec_sdk.tables.table.create); over several ranks, a shard per rank (rec_sdk.distribute.ranks)."""

import math
import numbers
import os
import re

import tensorflow as tf

from rec_sdk.base.validation import INT32_MAX, check_bool, check_float, check_int
from rec_sdk.constants.constants import (
    MAX_VOCABULARY_SIZE,
    All2allGradientsOp,
    ApplyGradientsStrategy,
    MxRecMode,
)
from rec_sdk.distribute import cluster
from rec_sdk.distribute.ranks import set_shards
from rec_sdk.ops import table_ops
from rec_sdk.tables import table as table_module
from rec_sdk.tables import tier
from rec_sdk.tables.initializer_spec import describe_initializer
from rec_sdk.tables.table import tables_of_graph
from rec_sdk.tables.table_spec import (
    RankPlacement,
    TableSpec,
    emb_dtype_name,
    index_layout_name,
    slot_dtype_name,
)
from rec_sdk.util import initialize

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.]{1,100}$")


def _as_key_dtype(key_dtype):
    try:
        return tf.as_dtype(key_dtype)
    except TypeError:
        raise ValueError("key_dtype must be tf.int32 or tf.int64, got %r" % (key_dtype,)) from None


def as_dim(dim):
    """dim as an int (the table's spec checks its range)."""
    if isinstance(dim, tf.TensorShape):
        if dim.rank != 1 or dim[0] is None:
            raise ValueError(
                "dim must be an int or a rank-1 TensorShape with a known size in "
                "[1, %d], got %s" % (table_ops.max_dim(), dim)
            )
        dim = dim[0]
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(
            "dim must be an int in [1, %d], got %r (%s)"
            % (table_ops.max_dim(), dim, type(dim).__name__)
        )
    return int(dim)


def create_table(
    key_dtype,
    dim,
    name,
    emb_initializer,
    device_vocabulary_size=1,
    host_vocabulary_size=0,
    ssd_vocabulary_size=0,
    ssd_data_path=None,
    is_save=True,
    init_param=1.0,
    value_dtype=tf.float32,
    steps_to_live=None,
    evict_when_full=False,
    ssd_direct_io=False,
    servable=False,
    emb_dtype=tf.float32,
    slot_dtype=tf.float32,
    index_layout="auto",
    **kwargs,
):
    """Creates a sparse embedding table.

    Args:
      key_dtype: tf.int32 or tf.int64.
      dim: embedding size, an int or rank-1 TensorShape in [1, 8192].
      name: 1-100 characters of [A-Za-z0-9_.], unique in the graph.
      emb_initializer: initializer of new rows (truncated/random normal, random uniform,
        constant, zeros, ones, or a number); run in C++, deterministic for a given seed.
      device_vocabulary_size, host_vocabulary_size, ssd_vocabulary_size: rows per level,
        each in [0, 1e9] (an SSD size needs host_vocabulary_size > 0), divided over ranks.
        On CPU the device and host levels are main memory. Without an SSD level: without
        dynamic expansion the table holds at most device + host rows and a full table is an
        error; with dynamic expansion device_vocabulary_size rows are reserved up front and
        the table grows without bound. With ssd_vocabulary_size > 0 the table is larger than
        memory: device + host rows stay in memory, and the least recently used rows (with
        their optimizer slots) move to record files under ssd_data_path, up to
        ssd_vocabulary_size rows (with dynamic expansion: without bound), and back into
        memory when a training lookup needs them. It trains exactly as an all-in-memory
        table would.
      ssd_data_path: the SSD level's directories (a path or a list of paths; the record
        files are spread over them; default: the working directory): each must exist and be
        writable when ssd_vocabulary_size > 0. The files are scratch space, deleted with the table;
        checkpoints hold every row of both levels.
      is_save: whether checkpoints include this table.
      init_param: in [-10, 10]; multiplies every initial value.
      value_dtype: tf.float32 (the only supported value type).
      steps_to_live: beyond the SDK: evict keys not seen in training for this many global
        steps (an int >= 1) when an EvictHook fires or table.evict() runs; for models
        without a timestamp feature. Lookups then read the graph's global step.
      evict_when_full: beyond the SDK: a fixed-capacity table that is full evicts its least
        recently seen rows (about 1% of its capacity more than a batch needs) instead of
        failing; with an SSD level, a full SSD level evicts its least recently seen rows.
      ssd_direct_io: beyond the SDK: the SSD level's files are read and written with
        O_DIRECT, past the page cache (which otherwise keeps recently used parts of them in
        memory the operating system can spare).
      emb_dtype: beyond the SDK: the element type the rows store their embeddings in:
        tf.float32 (the default), tf.bfloat16 or tf.float16 (half the bytes per element;
        optimizer updates round stochastically, deterministic per key and step). Lookups
        return float32 whatever it is, and checkpoints of any emb_dtype restore into a table
        of any other.
      slot_dtype: beyond the SDK: the element type of the optimizer slots of dim values per
        row (LazyAdam's moments, Adagrad's and FTRL's accumulators): tf.float32 (the default)
        or tf.bfloat16 (rounded stochastically on update, as the rows). Row-wise Adagrad's
        one float per row stays float32; float16 is refused (squared gradients below 6e-8
        would vanish). Checkpoints hold slots in float32 and restore into either.
      index_layout: beyond the SDK: the hash index's entries: "full" (16 bytes a slot, the
        key beside its row), "compact" (8 bytes: the key is read back from its row; about 17
        bytes less per key, a training lookup about 10% slower) or "auto" (the default:
        compact for bfloat16 and float16 rows, full for float32). Tables with an SSD level
        keep a full index ("compact" is refused).
      servable: beyond the SDK: the table tracks its changes so that a serving Pusher can
        send them (rec_sdk.serving); the SDK's incremental checkpoints turn it on as well.
      padding_keys, padding_keys_mask, padding_keys_len: the SDK's padding keys: with
        padding_keys_mask=True, the keys in padding_keys (an int or a list of ints) are looked
        up as any key but their rows are never trained; padding_keys_len (an int >= 1) is then
        required and replaces every lookup's send_count in static-shape mode.
      is_dp, all2all_gradients_op ("sum_gradients" or "sum_gradients_and_div_by_ranksize"),
        shard_num, optimizer_list, mode ("ASC"), apply_gradients_strategy, enable_merge,
        fusion_optimizer_var, hashtable_threshold: the SDK's options for placing and training
        a table over NPU ranks; checked, and without effect in one process. Any other keyword
        is an error.
    """
    options = _table_options(name, kwargs)
    config = initialize.get_config()
    key_dtype = _as_key_dtype(key_dtype)
    dim = as_dim(dim)
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError("name must be 1-100 characters of [A-Za-z0-9_.], got %r" % (name,))
    for table in tables_of_graph():
        if table.table_name == name:
            raise ValueError("name %r is already used by another table in this graph" % name)
    device_vocabulary_size = check_int(
        "device_vocabulary_size", device_vocabulary_size, 0, MAX_VOCABULARY_SIZE
    )
    host_vocabulary_size = check_int(
        "host_vocabulary_size", host_vocabulary_size, 0, MAX_VOCABULARY_SIZE
    )
    ssd_vocabulary_size = check_int(
        "ssd_vocabulary_size", ssd_vocabulary_size, 0, MAX_VOCABULARY_SIZE
    )
    if ssd_vocabulary_size > 0 and host_vocabulary_size == 0:
        raise ValueError(
            "ssd_vocabulary_size=%d needs host_vocabulary_size > 0" % ssd_vocabulary_size
        )
    if ssd_data_path is None:  # the SDK's default: the working directory at the call
        ssd_data_path = (os.getcwd(),)
    ssd_data_path = tier.check_paths(
        "ssd_data_path", ssd_data_path, must_exist=ssd_vocabulary_size > 0
    )
    check_bool("is_save", is_save)
    check_bool("servable", servable)
    init_param = check_float("init_param", init_param, -10.0, 10.0)
    if tf.as_dtype(value_dtype) != tf.float32:
        raise ValueError("value_dtype must be tf.float32, got %r" % (value_dtype,))
    if emb_initializer is None:
        raise ValueError(
            "emb_initializer is required, e.g. tf.compat.v1.truncated_normal_initializer()"
        )
    if steps_to_live is not None:
        steps_to_live = check_int("steps_to_live", steps_to_live, 1, 2**62)
    check_bool("evict_when_full", evict_when_full)
    emb_dtype = emb_dtype_name(emb_dtype)
    slot_dtype = slot_dtype_name(slot_dtype)
    index_layout = index_layout_name(index_layout, tiered=ssd_vocabulary_size > 0)

    # The sizes are per level over all ranks; each rank holds its share of each.
    rank_size = config.rank_size
    device_rows, host_rows, ssd_rows = (
        math.ceil(size / rank_size)
        for size in (device_vocabulary_size, host_vocabulary_size, ssd_vocabulary_size)
    )
    dynamic_expansion = config.use_dynamic_expansion
    table_tier = None
    if ssd_rows > 0:
        # device + host rows in memory, the rest on SSD (unbounded with dynamic expansion).
        table_tier = tier.make(
            device_rows + host_rows,
            None if dynamic_expansion else ssd_rows,
            ssd_data_path,
            ssd_direct_io,
            names=("device_vocabulary_size + host_vocabulary_size", "ssd_vocabulary_size"),
        )
    else:
        check_bool("ssd_direct_io", ssd_direct_io)
    # The shape the SDK gives a table's variable in HBM mode, [device rows of this rank, dim]:
    # what shape-dependent initializers (variance scaling) take their fans from.
    shape = None if dynamic_expansion else (device_rows or host_rows + ssd_rows, dim)
    spec = TableSpec(
        name,
        key_dtype,
        dim,
        describe_initializer(emb_initializer, name, scale=init_param, shape=shape),
        dynamic_expansion=dynamic_expansion,
        capacity_rows=None if dynamic_expansion else device_rows + host_rows + ssd_rows,
        initial_rows=device_rows,
        tier=table_tier,
        is_save=is_save,
        steps_to_live=steps_to_live,
        evict_when_full=evict_when_full,
        track_changes=config.is_incremental_checkpoint or servable,
        emb_dtype=emb_dtype,
        slot_dtype=slot_dtype,
        index_layout=index_layout,
        **options["padding"],
    )
    placement = _placement(name, rank_size, options["divide_gradients"])
    if placement is None:
        return table_module.create(spec)
    with tf.device(placement.device):
        table = table_module.create(spec.replace(placement=placement))
    shards = {placement.rank: table}
    if placement.rank == 0:
        # Rank 0 saves, restores and evicts every rank's shard (each by an op on the shard's
        # own task, which reads or writes its files): a handle of each other shard, by name,
        # with the table's admission and eviction thresholds.
        for rank, device in enumerate(placement.devices):
            if rank != 0:
                with tf.device(device):
                    shards[rank] = table_module.create(spec, register=False)
                shards[rank].follow_admission(table)
    set_shards(table, shards)
    return table


def _placement(name, rank_size, divide_gradients):
    """Where a new table's shards go: None in one process, else a RankPlacement over the
    training tasks of this process's cluster."""
    if rank_size == 1:
        return None
    task = cluster.training_task()
    if task is None:
        raise ValueError(
            "create_table(name=%r): init() found %d ranks but this process is not "
            "a training task of a cluster (TF_CONFIG)" % (name, rank_size)
        )
    if "ps" in task.cluster.jobs:
        raise ValueError(
            "create_table(name=%r): the cluster has ps tasks; tables of the SDK API are "
            "sharded over the ranks (the chief and worker tasks) and trained synchronously. "
            "Use a cluster without ps tasks, or de.Variable(devices=rec_sdk.distribute."
            "ps_devices(server)) to shard over ps tasks" % name
        )
    rank, size = cluster.rank_of(task)
    return RankPlacement(task, rank, size, cluster.worker_devices(task), divide_gradients)


def _table_options(name, options):
    """Checks create_table's SDK options (see its doc); returns the padding-key settings."""
    options = dict(options)
    where = "create_table(name=%r)" % (name,)
    if "is_dp" in options:
        check_bool("is_dp", options.pop("is_dp"))
    chosen = {}
    for key, enum_class in (
        ("all2all_gradients_op", All2allGradientsOp),
        ("mode", MxRecMode),
        ("apply_gradients_strategy", ApplyGradientsStrategy),
    ):
        if key in options:
            try:
                chosen[key] = enum_class.mapping(options.pop(key))
            except KeyError as error:
                raise ValueError("%s: %s: %s" % (where, key, error.args[0])) from None
    divide = (
        chosen.get("all2all_gradients_op") == All2allGradientsOp.SUM_GRADIENTS_AND_DIV_BY_RANKSIZE
    )
    if "shard_num" in options:
        check_int("shard_num", options.pop("shard_num"), 1, INT32_MAX)
    for key in ("enable_merge", "fusion_optimizer_var"):
        if key in options:
            check_bool(key, options.pop(key))
    if "hashtable_threshold" in options:
        check_int("hashtable_threshold", options.pop("hashtable_threshold"), 0, INT32_MAX)
    optimizers = options.pop("optimizer_list", None)
    if optimizers is not None and not isinstance(optimizers, (list, tuple)):
        raise TypeError(
            "%s: optimizer_list must be a list of sparse optimizers, got %r" % (where, optimizers)
        )
    keys = options.pop("padding_keys", None)
    mask = check_bool("padding_keys_mask", options.pop("padding_keys_mask", False))
    length = options.pop("padding_keys_len", None)
    if options:
        raise TypeError("create_table() got unexpected keyword arguments %s" % sorted(options))
    if length is not None:
        length = check_int("padding_keys_len", length, 1, INT32_MAX)
    if keys is None:
        if mask:
            raise ValueError("%s: padding_keys_mask=True needs padding_keys" % where)
        return {"padding": {}, "divide_gradients": divide}
    if isinstance(keys, numbers.Integral) and not isinstance(keys, bool):
        keys = [keys]
    if (
        not isinstance(keys, (list, tuple))
        or not keys
        or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in keys)
    ):
        raise TypeError(
            "%s: padding_keys must be an int or a non-empty list of ints, got %r" % (where, keys)
        )
    for key in keys:
        check_int("padding_keys", key, -(2**63), 2**63 - 1)
    if not mask:
        raise ValueError("%s: padding_keys=%r needs padding_keys_mask=True" % (where, keys))
    if length is None:
        raise ValueError(
            "%s: padding_keys=%r needs padding_keys_len (the keys per step in "
            "static-shape mode)" % (where, keys)
        )
    return {
        "padding": {
            "padding_keys": tuple(sorted({int(k) for k in keys})),
            "padding_keys_mask": True,
            "padding_keys_len": length,
        },
        "divide_gradients": divide,
    }
