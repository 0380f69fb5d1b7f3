"""Framework configuration: `init` once per process, `terminate_config_initializer` at the end
(mirrors mx_rec.util.initialize).

The configuration is one `ConfigInitializer` object (`ConfigInitializer.get_instance()`), as in
the SDK; the module-level getters read it. The rank comes from
rec_sdk.util.communication.hccl_ops, the one place that knows it: rec_sdk trains in one
process (rank 0 of 1).
"""

import atexit
import os
import threading

import tensorflow as tf

from rec_sdk.base import graph_state
from rec_sdk.base.log import logger
from rec_sdk.base.validation import INT32_MAX, check_bool, check_int
from rec_sdk.constants.constants import (
    EVAL_CHANNEL_ID,
    GET_CONFIG_INSTANCE_ERR_MSG,
    TRAIN_CHANNEL_ID,
    EnvOption,
    apply_gradients_strategy,
)
from rec_sdk.distribute import cluster
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.ops import import_host_pipeline_ops

_lock = threading.Lock()
_atexit_registered = False

# Options of the SDK's init that tune NPU or host-thread performance: validated (bool) and
# without effect on the results of a CPU process.
_PERFORMANCE_OPTIONS = ("bind_cpu", "use_hot", "use_lccl", "use_shm_swap", "use_mpi")
# Options of the SDK's init that rec_sdk implements, with their checks.
_BOOL_OPTIONS = ("if_load", "enable_incremental_checkpoint", "is_incremental_checkpoint")
# Options whose behaviour rec_sdk does not have: refused unless left at their "off" value.
_UNSUPPORTED_OPTIONS = {
    "save_checkpoint_due_time": "timed checkpoints: save with tf.compat.v1.train.Saver or "
    "CheckpointSaverHook(save_secs=...)",
    "save_delta_checkpoints_secs": "timed incremental checkpoints: call "
    "rec_sdk.saver.save_tables(sess, dir, delta=True)",
    "restore_model_version": "restoring a chosen checkpoint version: pass its path to "
    "Saver.restore",
}
# Options of earlier SDK versions with no meaning here (accepted as the SDK accepts them).
_OBSOLETE_OPTIONS = (
    "prefetch_batch_number",
    "train_interval",
    "save_delta_steps",
    "save_delta_model",
    "recent_key_count_threshold",
)


class TrainParamsConfig:
    """The SDK's train_params_config: the iterators built by graph modification and the data
    channel ids."""

    def __init__(self):
        self._graph_modify_hook_running = False

    @staticmethod
    def get_initializer(is_training):
        return get_initializer(is_training)

    @staticmethod
    def get_target_batch(is_training):
        return get_target_batch(is_training)

    @staticmethod
    def get_training_mode_channel_id(is_training):
        """The SDK's data channel of a mode: 0 for training, 1 for evaluation."""
        check_bool("is_training", is_training)
        return TRAIN_CHANNEL_ID if is_training else EVAL_CHANNEL_ID

    @staticmethod
    def insert_training_mode_channel_id(is_training):
        check_bool("is_training", is_training)

    @property
    def is_graph_modify_hook_running(self):
        return self._graph_modify_hook_running

    @is_graph_modify_hook_running.setter
    def is_graph_modify_hook_running(self, value):
        self._graph_modify_hook_running = check_bool("is_graph_modify_hook_running", value)


def _checked_step(name, value):
    return check_int(name, value, -1, INT32_MAX)


class ConfigInitializer:
    """The process's rec_sdk configuration, made by init(). Attributes as in the SDK:
    max_steps, train_steps, eval_steps, save_steps, if_load (settable), use_dynamic,
    use_static, use_dynamic_expansion, use_hot, rank_id, rank_size, host_pipeline_ops,
    train_params_config, is_incremental_checkpoint."""

    _single_instance = None

    def __init__(
        self,
        max_steps,
        train_steps,
        eval_steps,
        save_steps,
        use_dynamic,
        use_dynamic_expansion,
        options,
    ):
        self._steps = {
            "max_steps": max_steps,
            "train_steps": train_steps,
            "eval_steps": eval_steps,
            "save_steps": save_steps,
        }
        self.use_dynamic = use_dynamic
        self.use_dynamic_expansion = use_dynamic_expansion
        self.options = options
        self._if_load = options.get("if_load", False)
        self.host_pipeline_ops = import_host_pipeline_ops()
        self.train_params_config = TrainParamsConfig()
        self.apply_gradients_strategy = apply_gradients_strategy()

    @classmethod
    def get_instance(cls):
        """The configuration made by init(); RuntimeError before init()."""
        instance = cls._single_instance
        if instance is None:
            raise RuntimeError(GET_CONFIG_INSTANCE_ERR_MSG)
        return instance

    def _step_property(name):  # pylint: disable=no-self-argument
        def get(self):
            return self._steps[name]

        def set_(self, value):
            self._steps[name] = _checked_step(name, value)

        return property(get, set_)

    max_steps = _step_property("max_steps")
    train_steps = _step_property("train_steps")
    eval_steps = _step_property("eval_steps")
    save_steps = _step_property("save_steps")
    del _step_property

    @property
    def use_static(self):
        return not self.use_dynamic

    @property
    def use_hot(self):
        return self.options.get("use_hot", False)

    @property
    def if_load(self):
        return self._if_load

    @if_load.setter
    def if_load(self, value):
        self._if_load = check_bool("if_load", value)

    @property
    def is_incremental_checkpoint(self):
        return bool(
            self.options.get("enable_incremental_checkpoint")
            or self.options.get("is_incremental_checkpoint")
        )

    @property
    def rank_id(self):
        return hccl_ops.get_rank_id()

    @property
    def rank_size(self):
        return hccl_ops.get_rank_size()


def _ranks(options):
    """(rank, rank count) of this process: its place among the training tasks of its cluster
    (rec_sdk.distribute.training_task), else 0 of 1. rank_id / rank_size options, when
    given, must say the same."""
    world = os.environ.get(EnvOption.OMPI_COMM_WORLD_SIZE.value)
    if world is not None and world.strip() not in ("", "1"):
        raise ValueError(
            "this process was started as one of %s=%s MPI ranks; rec_sdk's ranks "
            "are the training tasks of a TensorFlow cluster: start each with "
            "TF_CONFIG (see rec_sdk.distribute.launch) instead of mpirun"
            % (EnvOption.OMPI_COMM_WORLD_SIZE.value, world)
        )
    task = cluster.training_task()
    rank, size = cluster.rank_of(task) if task is not None else (0, 1)
    rank_id = options.pop("rank_id", None)
    rank_size = options.pop("rank_size", None)
    if rank_size is not None and check_int("rank_size", rank_size, 1, INT32_MAX) != size:
        raise ValueError(
            "rank_size=%d, but this process is one of %d training processes (%s); "
            "the ranks are the chief and worker tasks of TF_CONFIG's cluster"
            % (rank_size, size, "a cluster" if task else "no TF_CONFIG cluster")
        )
    if rank_id is not None and check_int("rank_id", rank_id, 0, INT32_MAX) != rank:
        raise ValueError(
            "rank_id=%d, but this process is rank %d of %d (its place among the "
            "chief and worker tasks of TF_CONFIG's cluster)" % (rank_id, rank, size)
        )
    return rank, size


def _check_options(options):
    for key, value in options.items():
        if key in _PERFORMANCE_OPTIONS or key in _BOOL_OPTIONS:
            check_bool(key, value)
        elif key in _UNSUPPORTED_OPTIONS:
            if value is not None:
                raise ValueError(
                    "init(%s=%r): rec_sdk has no %s" % (key, value, _UNSUPPORTED_OPTIONS[key])
                )
        elif key in _OBSOLETE_OPTIONS:
            logger.info("init: option %s=%r of earlier SDK versions has no effect", key, value)
        else:
            logger.warning("init: ignoring unknown option %s=%r", key, value)
    return options


def init(
    max_steps=-1,
    train_steps=-1,
    eval_steps=-1,
    save_steps=-1,
    use_dynamic=True,
    use_dynamic_expansion=False,
    **kwargs,
):
    """Initialises rec_sdk for this process. A second call raises until
    `terminate_config_initializer()` is called.

    Args:
      max_steps, train_steps, eval_steps, save_steps: -1 (unbounded) or a step count in
        [0, 2**31-1]; max_steps, train_steps and eval_steps may not all be 0.
      use_dynamic: True for dynamic-shape lookups; False for static shape, where every lookup
        needs a `send_count`.
      use_dynamic_expansion: True: tables grow by chunks without bound and are trained with
        the `*_by_addr` optimizers; False: tables have a fixed capacity
        (device_vocabulary_size + host_vocabulary_size) and use the plain optimizers.
      if_load: whether the script restores a checkpoint (ConfigInitializer.if_load,
        get_if_load()); restoring itself is Saver.restore's work.
      enable_incremental_checkpoint (or is_incremental_checkpoint): tables track their
        changes for rec_sdk.saver.save_tables(..., delta=True).
      bind_cpu, use_hot, use_lccl, use_shm_swap, use_mpi: the SDK's performance switches,
        checked (bool) and without effect on CPU.
      rank_id, rank_size: optional; this process's rank is its place among the training
        tasks (chief, then workers) of its cluster (TF_CONFIG, or rec_sdk.distribute's
        start_server), 0 of 1 without one; given values must agree.
      Other options of the SDK that rec_sdk does not have are errors (timed checkpoints) or
      are logged and ignored (unknown ones, as the SDK does).
    The environment variable APPLY_GRADIENTS_STRATEGY is checked here.
    """
    global _atexit_registered
    steps = {}
    for name, value in (
        ("max_steps", max_steps),
        ("train_steps", train_steps),
        ("eval_steps", eval_steps),
        ("save_steps", save_steps),
    ):
        steps[name] = _checked_step(name, value)
    if steps["max_steps"] == 0 and steps["train_steps"] == 0 and steps["eval_steps"] == 0:
        raise ValueError("max_steps, train_steps and eval_steps may not all be 0")
    check_bool("use_dynamic", use_dynamic)
    check_bool("use_dynamic_expansion", use_dynamic_expansion)
    options = dict(kwargs)
    ranks = _ranks(options)  # takes rank_id and rank_size out of the options
    options = _check_options(options)
    with _lock:
        if ConfigInitializer._single_instance is not None:
            raise RuntimeError(
                "rec_sdk is already initialised: init() may be called once; "
                "call terminate_config_initializer() before calling it again"
            )
        hccl_ops.set_rank_info(*ranks)
        ConfigInitializer._single_instance = ConfigInitializer(
            use_dynamic=use_dynamic,
            use_dynamic_expansion=use_dynamic_expansion,
            options=options,
            **steps,
        )
        if not _atexit_registered:
            atexit.register(terminate_config_initializer)
            _atexit_registered = True


def terminate_config_initializer():
    """Releases rec_sdk's configuration; init() may then be called again."""
    with _lock:
        ConfigInitializer._single_instance = None
        hccl_ops.set_rank_info(0, 1)


def is_initialized():
    return ConfigInitializer._single_instance is not None


def get_config():
    """The active configuration (the ConfigInitializer); RuntimeError if init() was not
    called."""
    return ConfigInitializer.get_instance()


def get_use_dynamic():
    return get_config().use_dynamic


def get_use_static():
    return get_config().use_static


def get_use_dynamic_expansion():
    return get_config().use_dynamic_expansion


def get_use_hot():
    return get_config().use_hot


# The rank functions of earlier SDK versions; hccl_ops holds the values.
get_rank_id = hccl_ops.get_rank_id
get_rank_size = hccl_ops.get_rank_size
get_local_rank_size = hccl_ops.get_local_rank_size
get_device_id = hccl_ops.get_device_id


def get_max_steps():
    return get_config().max_steps


def get_train_steps():
    return get_config().train_steps


def get_eval_steps():
    return get_config().eval_steps


def get_save_steps():
    return get_config().save_steps


def set_train_steps(steps):
    get_config().train_steps = steps


def set_eval_steps(steps):
    get_config().eval_steps = steps


def set_save_steps(steps):
    get_config().save_steps = steps


def set_if_load(if_load):
    """Records whether the script restores a checkpoint (see init's if_load)."""
    get_config().if_load = if_load


def get_if_load():
    return get_config().if_load


def get_host_pipeline_ops():
    """The SDK's host pipeline ops: rec_sdk.util.ops.HostPipelineOps."""
    return get_config().host_pipeline_ops


def clear_channel(is_train_channel=False):
    """The SDK's reset of a data channel before (re)running a mode; rec_sdk's input is the
    tf.data iterator, so this is a no-op op (see rec_sdk.util.ops)."""
    check_bool("is_train_channel", is_train_channel)
    config = get_config()
    channel = config.train_params_config.get_training_mode_channel_id(is_train_channel)
    return config.host_pipeline_ops.clear_channel(channel)


def _modified(is_training, what):
    if not isinstance(is_training, bool):
        raise TypeError("%s: is_training must be a bool, got %r" % (what, is_training))
    found = graph_state.modified_iterators(is_training=is_training)
    if not found:
        raise ValueError(
            "%s(%r): no %s iterator was modified in the default graph; call "
            "rec_sdk.graph.modifier.modify_graph_and_start_emb_cache() after "
            "building the model with sparse_lookup(..., modify_graph=True)"
            % (what, is_training, "training" if is_training else "evaluation")
        )
    return found


def get_initializer(is_training):
    """The initializer of the training (True) or evaluation (False) iterator built by graph
    modification; run it where the script ran `iterator.initializer` (running the old
    initializer also works: it now initialises the new iterator too). A one-shot iterator
    needs none: a no-op is returned."""
    found = _modified(is_training, "get_initializer")
    initializers = [m.initializer for m in found if m.initializer is not None]
    if len(initializers) == 1:
        return initializers[0]
    name = "rec_sdk_%s_initializer_%d" % ("train" if is_training else "eval", len(found))
    graph = tf.compat.v1.get_default_graph()
    try:  # built once per graph and set of iterators
        return graph.get_operation_by_name(name)
    except KeyError:
        return tf.group(*initializers, name=name)


def get_target_batch(is_training):
    """The batch of the training (True) or evaluation (False) iterator built by graph
    modification: the structure passed as batch= to its lookups (or the get_next outputs as
    a tuple), holding the new iterator's tensors."""
    found = _modified(is_training, "get_target_batch")
    if len(found) > 1:
        raise ValueError(
            "get_target_batch(%r): %d iterators were modified for this mode; "
            "use rec_sdk.graph.modifier.modified_iterators()" % (is_training, len(found))
        )
    return found[0].batch()
