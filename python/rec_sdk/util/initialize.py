"""Framework configuration: `init` once per process, `terminate_config_initializer` at the end.

Mirrors mx_rec.util.initialize. rec_sdk runs as one process (rank 0 of 1); tables shard by
`key % rank_size` once multi-process training exists.
"""
import atexit
import logging
import threading

from rec_sdk.util.validation import INT32_MAX, check_bool, check_int

_lock = threading.Lock()
_config = None
_atexit_registered = False

# Keyword arguments of the SDK's init that have no effect on a single CPU process.
_ACCEPTED_EXTRA = ("if_load", "bind_cpu", "use_lccl", "enable_incremental_checkpoint",
                   "save_delta_steps", "save_delta_model", "use_mpi")


class _Config:
    def __init__(self, max_steps, train_steps, eval_steps, save_steps, use_dynamic,
                 use_dynamic_expansion, extra):
        self.max_steps = max_steps
        self.train_steps = train_steps
        self.eval_steps = eval_steps
        self.save_steps = save_steps
        self.use_dynamic = use_dynamic
        self.use_dynamic_expansion = use_dynamic_expansion
        self.extra = extra
        self.rank_id = 0
        self.rank_size = 1


def init(max_steps=-1, train_steps=-1, eval_steps=-1, save_steps=-1, use_dynamic=True,
         use_dynamic_expansion=False, **kwargs):
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
      **kwargs: other SDK options (e.g. if_load, bind_cpu) are accepted and ignored.
    """
    global _config, _atexit_registered
    steps = {}
    for name, value in (("max_steps", max_steps), ("train_steps", train_steps),
                        ("eval_steps", eval_steps), ("save_steps", save_steps)):
        steps[name] = check_int(name, value, -1, INT32_MAX)
    if steps["max_steps"] == 0 and steps["train_steps"] == 0 and steps["eval_steps"] == 0:
        raise ValueError("max_steps, train_steps and eval_steps may not all be 0")
    check_bool("use_dynamic", use_dynamic)
    check_bool("use_dynamic_expansion", use_dynamic_expansion)
    for key in kwargs:
        if key not in _ACCEPTED_EXTRA:
            logging.info("rec_sdk.init: ignoring unknown option %s=%r", key, kwargs[key])
    with _lock:
        if _config is not None:
            raise RuntimeError("rec_sdk is already initialised: init() may be called once; "
                               "call terminate_config_initializer() before calling it again")
        _config = _Config(use_dynamic=use_dynamic, use_dynamic_expansion=use_dynamic_expansion,
                          extra=dict(kwargs), **steps)
        if not _atexit_registered:
            atexit.register(terminate_config_initializer)
            _atexit_registered = True


def terminate_config_initializer():
    """Releases rec_sdk's configuration; init() may then be called again."""
    global _config
    with _lock:
        _config = None


def is_initialized():
    return _config is not None


def get_config():
    """The active configuration; raises if init() was not called."""
    config = _config
    if config is None:
        raise RuntimeError("rec_sdk is not initialised: call "
                           "rec_sdk.util.initialize.init(...) first")
    return config


def get_use_dynamic():
    return get_config().use_dynamic


def get_use_dynamic_expansion():
    return get_config().use_dynamic_expansion


def get_rank_id():
    return get_config().rank_id


def get_rank_size():
    return get_config().rank_size


def get_max_steps():
    return get_config().max_steps


def get_train_steps():
    return get_config().train_steps


def get_eval_steps():
    return get_config().eval_steps


def get_save_steps():
    return get_config().save_steps


def _modified(is_training, what):
    # Imported here: the modifier imports the table code, which imports this module.
    from rec_sdk.graph import modifier  # pylint: disable=import-outside-toplevel
    if not isinstance(is_training, bool):
        raise TypeError("%s: is_training must be a bool, got %r" % (what, is_training))
    found = modifier.modified_iterators(is_training=is_training)
    if not found:
        raise ValueError("%s(%r): no %s iterator was modified in the default graph; call "
                         "rec_sdk.graph.modifier.modify_graph_and_start_emb_cache() after "
                         "building the model with sparse_lookup(..., modify_graph=True)"
                         % (what, is_training, "training" if is_training else "evaluation"))
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
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
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
        raise ValueError("get_target_batch(%r): %d iterators were modified for this mode; "
                         "use rec_sdk.graph.modifier.modified_iterators()" % (is_training,
                                                                               len(found)))
    return found[0].batch()
