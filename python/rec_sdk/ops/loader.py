"""The one place that knows where rec_sdk's op library is and how to load it.

The library is loaded once, on first use, so importing rec_sdk works before the library is
built. A library built for another TensorFlow version does not load (its absl and TF
symbols differ), so the error names both versions and the rebuild command. A process of a
cluster that runs rec_sdk's ops without the library (a bare tf.distribute.Server) fails the
session's run with an error that says to load rec_sdk there (explain_missing_library).
"""

import ctypes
import functools
import logging
import os
import re
import threading

import tensorflow as tf

from rec_sdk.base import release, tf_patches

LIBRARY_FILE = "_rec_sdk_ops.so"
VERSION_FILE = "_rec_sdk_ops.tf_version"
LIBRARY_ENV = "REC_SDK_OPS_LIBRARY"


def _rebuild_command():
    """The Makefile's build command for the installed TensorFlow: 2.15 is the default, other
    versions are the TF= of their requirements-tf<version>.txt."""
    major_minor = release.minor(tf.__version__)
    return "make build" if major_minor == release.OLDEST else "make build TF=%s" % major_minor


REBUILD_COMMAND = _rebuild_command()
OP_NAMESPACE = "RecSdk"  # rec_sdk's op names are RecSdk><Name> (a SavedModel op namespace)

_lock = threading.Lock()
_library = None


class OpLibraryError(RuntimeError):
    """The op library is missing or cannot be loaded into this TensorFlow."""


def library_path():
    """Path of the op library: $REC_SDK_OPS_LIBRARY, else the copy `make build` installs here."""
    return os.environ.get(LIBRARY_ENV) or os.path.join(os.path.dirname(__file__), LIBRARY_FILE)


def _built_tf_version(path):
    version_file = os.path.join(os.path.dirname(path), VERSION_FILE)
    try:
        with open(version_file) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _in_checkout(path):
    """Whether the library sits in a rec_sdk source checkout (python/rec_sdk/ops beside
    tf_ops/), rather than in an installed wheel."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path)))))
    return os.path.isdir(os.path.join(root, "tf_ops"))


def _remedy(path, built):
    """What to do about a library built for TensorFlow `built`: rebuild it in a checkout, or
    match TensorFlow to the installed wheel, or install the wheel for this TensorFlow."""
    if _in_checkout(path) or built is None:
        return "Rebuild it with `%s` in the rec_sdk checkout." % REBUILD_COMMAND
    if built == tf.__version__:
        return "Reinstall the rec_sdk wheel (`pip install --force-reinstall` it)."
    fix = "This rec_sdk wheel (%s %s) needs TensorFlow %s: `%s`" % (
        release.distribution(built),
        release.VERSION,
        built,
        release.install_tensorflow_command(built, installed=tf.__version__),
    )
    if release.minor(built) == release.minor(tf.__version__):
        return fix + "."
    if release.release(tf.__version__) is None:
        return "%s. rec_sdk has wheels for TensorFlow %s; %s is not one of them." % (
            fix,
            release.supported(),
            tf.__version__,
        )
    return (
        "%s; or install the rec_sdk wheel for TensorFlow %s: `%s` (`make wheel TF=%s` in "
        "a rec_sdk checkout builds it into dist/%s/)."
        % (
            fix,
            release.minor(tf.__version__),
            release.install_wheel_command(tf.__version__, replacing=built),
            release.minor(tf.__version__),
            release.minor(tf.__version__),
        )
    )


def check_built_version():
    """Raises OpLibraryError when the op library was built for another TensorFlow than the
    installed one (called by `import rec_sdk`; a missing library is reported on first use)."""
    path = library_path()
    built = _built_tf_version(path)
    _warn_if_several_wheels(path)
    if os.path.exists(path) and built is not None and built != tf.__version__:
        raise OpLibraryError(
            "rec_sdk's op library %s was built for TensorFlow %s but TensorFlow %s is "
            "installed. %s" % (path, built, tf.__version__, _remedy(path, built))
        )


def _installed_wheels(path):
    """The rec_sdk distributions (rec-sdk-tf2-15, ...) whose metadata sits beside the package
    that holds the library `path` (site-packages/rec_sdk_tf2_15-0.1.0.dist-info, ...)."""
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    try:
        names = os.listdir(site)
    except OSError:
        return []
    return sorted(
        name.split("-")[0].replace("_", "-")
        for name in names
        if name.startswith("rec_sdk_tf") and name.endswith(".dist-info")
    )


def _warn_if_several_wheels(path):
    """Warns when rec_sdk's wheels for two TensorFlows are installed together: they own the
    same files, so uninstalling either deletes what the other needs."""
    wheels = _installed_wheels(path)
    if len(wheels) < 2:
        return
    keep = release.distribution(tf.__version__)
    logging.getLogger("rec_sdk").warning(
        "rec_sdk's wheels %s are all installed; they share rec_sdk's files, so uninstalling one "
        "deletes the others'. Keep the one for TensorFlow %s: `pip uninstall -y %s && pip "
        "install %s`",
        ", ".join(wheels),
        tf.__version__,
        " ".join(sorted(set(wheels) | {keep})),
        keep,
    )


_loaded_path = None  # the absolute path of the library _load loaded


def _load():
    global _loaded_path
    path = library_path()
    if not os.path.exists(path):
        raise OpLibraryError(
            "rec_sdk's op library is missing (%s). Build it for the installed TensorFlow %s "
            "with `%s` in the rec_sdk checkout." % (path, tf.__version__, REBUILD_COMMAND)
        )
    check_built_version()
    built = _built_tf_version(path)
    try:
        library = tf.load_op_library(path)
        _loaded_path = os.path.abspath(path)
        return library
    except (tf.errors.NotFoundError, OSError) as e:
        raise OpLibraryError(
            "cannot load rec_sdk's op library %s (built for TensorFlow %s) into TensorFlow %s: "
            "%s. %s" % (path, built or "unknown", tf.__version__, e, _remedy(path, built))
        ) from e


def load_ops_if_built():
    """Loads the op library now if it can be loaded (a process that imports
    rec_sdk.dynamic_embedding then serves rec_sdk's ops from a bare tf.distribute.Server, as
    with TFRA); returns None, and leaves the error to load_ops, if it cannot."""
    try:
        return load_ops()
    except OpLibraryError:
        return None


def load_ops():
    """Returns the loaded op library module, loading it on the first call."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = _load()
    return _library


_c_library = None


def _c_entry_points():
    """The library's C entry points, through ctypes (the library loaded by load_ops, same
    handle): rec_sdk_table_size and rec_sdk_index_layout_error."""
    global _c_library
    load_ops()
    if _c_library is None:
        with _lock:
            if _c_library is None:
                # The library load_ops loaded (the same handle), whatever the environment or the
                # working directory says now.
                lib = ctypes.CDLL(_loaded_path)
                for symbol in ("rec_sdk_table_size", "rec_sdk_index_layout_error"):
                    if not hasattr(lib, symbol):
                        raise OpLibraryError(
                            "the op library %s has no %s: it was built from older sources. "
                            "Rebuild it with `%s` in the rec_sdk checkout."
                            % (_loaded_path, symbol, REBUILD_COMMAND)
                        )
                lib.rec_sdk_table_size.restype = ctypes.c_int
                lib.rec_sdk_table_size.argtypes = [
                    ctypes.c_char_p,
                    ctypes.POINTER(ctypes.c_int64),
                    ctypes.POINTER(ctypes.c_int64),
                ]
                lib.rec_sdk_index_layout_error.restype = ctypes.c_int
                lib.rec_sdk_index_layout_error.argtypes = [
                    ctypes.c_char_p,
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_int,
                ]
                _c_library = lib
    return _c_library


def index_layout_error(layout, tiered):
    """Why the core refuses index layout `layout` (a name) for a table with (`tiered`) or
    without an SSD tier, or None when it takes it: the core's rule, asked in C (the library's
    rec_sdk_index_layout_error), so Python refuses a table when it is configured."""
    message = ctypes.create_string_buffer(512)
    if _c_entry_points().rec_sdk_index_layout_error(
        layout.encode("utf-8"), int(bool(tiered)), message, len(message)
    ):
        return message.value.decode("utf-8", "replace")
    return None


def live_table_size(name):
    """(size, capacity) of the table named `name` that a session of this process created last
    and still holds, or None when none does: read in C (the library's rec_sdk_table_size,
    through ctypes) without a session or an op."""
    size, capacity = ctypes.c_int64(0), ctypes.c_int64(0)
    if not _c_entry_points().rec_sdk_table_size(
        name.encode("utf-8"), ctypes.byref(size), ctypes.byref(capacity)
    ):
        return None
    return size.value, capacity.value


_UNREGISTERED = re.compile(r"Op type not registered '(%s>[^']*)'" % OP_NAMESPACE)
_REMOTE = re.compile(r"from remote target (\S+)")


def explain_missing_library(error):
    """For a session error that a process without rec_sdk's library gave (TensorFlow's "Op
    type not registered 'RecSdk>...'"), the same error type saying which task lacks it and
    how to start it; None for any other error."""
    message = getattr(error, "message", str(error))
    found = _UNREGISTERED.search(message)
    if found is None:
        return None
    where = _REMOTE.search(message)
    return type(error)(
        getattr(error, "node_def", None),
        getattr(error, "op", None),
        "rec_sdk's op library is not loaded in %s, which runs rec_sdk's op %s: start every ps "
        "and worker task of the cluster with `python -m rec_sdk.distribute.server` or "
        "rec_sdk.distribute.start_server() (they load it), not a bare tf.distribute.Server. "
        "TensorFlow said: %s"
        % (
            "task " + where.group(1).rstrip(":") if where else "a process of the cluster",
            found.group(1),
            message,
        ),
    )


class RankLostError(tf.errors.FailedPreconditionError):
    """A collective (rec_sdk.distribute's all_reduce / all_gather, the SDK API's ranks) failed
    because a training task of the cluster is gone: synchronous training cannot go on."""


# RecvBuf is the RPC that carries a collective's buffers between tasks: a peer that finished
# its part of a step and died before this rank fetched it fails there ("failed to connect to
# all addresses") without a word about collectives. A training task of the cluster named as
# the remote target is a rank too.
_COLLECTIVE_FAILURE = re.compile(
    r"Collective ops is aborted|Ring(Gather|Reducer)|collective|RecvBuf|"
    r"from remote target /job:worker/|just restarted",
    re.IGNORECASE,
)
_REASON = re.compile(r"aborted by|connect|socket|unavailable", re.IGNORECASE)
# A peer's step that failed while this rank's collective waited for it ("Delete called on
# non-empty BufRendezvous"): TensorFlow reports an InternalError.
_ABORTED = re.compile(r"Collective ops is aborted")


def explain_lost_rank(error, graph):
    """For an UnavailableError, AbortedError or CancelledError of a collective of `graph` (a
    task of the cluster stopped), or an InternalError of an aborted collective (a peer's
    step failed while this rank's collective waited for it), a RankLostError saying so and
    what to do; None for any other error.
    MonitoredTrainingSession retries those two error types forever (it recreates its session
    and waits for the task), while TensorFlow's collectives in this process cannot be reset:
    the error it raises instead ends the training clearly."""
    message = getattr(error, "message", str(error))
    lost_types = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)
    if (
        not (
            isinstance(error, lost_types)
            or (isinstance(error, tf.errors.InternalError) and _ABORTED.search(message))
        )
        or not _COLLECTIVE_FAILURE.search(message)
        or not any(op.type.startswith("Collective") for op in graph.get_operations())
    ):
        return None
    return lost_rank(error)


def lost_rank(error):
    """The RankLostError of `error`, a failure of a run of a synchronous cluster whose task
    is gone (explain_lost_rank says when; rec_sdk.distribute.ranks also for its runs of ops
    on other ranks' tasks, such as rank 0's saves, which fail without a collective)."""
    message = getattr(error, "message", str(error))
    where = _REMOTE.search(message)
    lines = [line for line in message.splitlines() if line.strip()]
    reason = next((line for line in lines if _REASON.search(line)), lines[0] if lines else "")
    return RankLostError(
        getattr(error, "node_def", None),
        getattr(error, "op", None),
        "a training task of this synchronous cluster stopped or failed (%s): the ranks train "
        "in lockstep and cannot go on without it, and TensorFlow's collectives cannot be "
        "reset in a running process. Stop every training task and start them all again: "
        "they restore the last checkpoint (rank 0 restores every rank's table shard). "
        "TensorFlow said: %s"
        % ("task " + where.group(1).rstrip(":") if where else "a peer task", reason.strip()),
    )


_RESTARTED = re.compile(r"ABORTED: .*Session handle is not found|just restarted")


def explain_restarted_task(error):
    """For a CancelledError whose run also saw a task of the cluster restart (TensorFlow
    reports the step's first error, often "RecvFromRemoteAsync is cancelled", with an
    ABORTED "Session handle is not found ... just restarted" beside it), the AbortedError it
    stands for; None for any other error. MonitoredTrainingSession recovers from
    AbortedError (a new session, restored from the last checkpoint) and not from
    CancelledError, so a restarted ps task would otherwise end the training."""
    message = getattr(error, "message", str(error))
    if not isinstance(error, tf.errors.CancelledError) or not _RESTARTED.search(message):
        return None
    return tf.errors.AbortedError(
        getattr(error, "node_def", None), getattr(error, "op", None), message
    )


_PS_TARGET = re.compile(r"(/job:ps/replica:\d+/task:\d+)")


def warn_unreachable_ps(error):
    """Logs, for an UnavailableError or AbortedError from a ps task, what happens next:
    MonitoredTrainingSession recreates its session, which waits for the task and then
    restores the last checkpoint. Returns the task's name, or None (nothing logged)."""
    message = getattr(error, "message", str(error))
    found = _PS_TARGET.search(message)
    if found is None:
        return None
    # rec_sdk's logger (rec_sdk.base.log.LOGGER_NAME; importing that module here would make
    # an import cycle).
    logging.getLogger("rec_sdk").warning(
        "rec_sdk: ps task %s stopped or restarted (%s). Restart it with the same TF_CONFIG "
        "(python -m rec_sdk.distribute.server): MonitoredTrainingSession waits for it, then "
        "restores the last checkpoint and trains on; a plain Session fails here.",
        found.group(1),
        type(error).__name__,
    )
    return found.group(1)


_run_wrappers = []


def wrap_session_runs(wrapper):
    """Makes every tf.compat.v1.Session.run go through wrapper(run, session, fetches,
    feed_dict, options, run_metadata), which calls run(session, fetches, feed_dict, options,
    run_metadata) (once per process per wrapper; wrappers added later run inside earlier
    ones, and all inside the error explanations below). Layers above the op library use it
    (rec_sdk.distribute.ranks.headers feeds a step's plan)."""
    if wrapper not in _run_wrappers:
        _run_wrappers.append(wrapper)


def _wrapped_run(run, session, fetches, feed_dict=None, options=None, run_metadata=None):
    call = run
    for wrapper in reversed(_run_wrappers):
        call = functools.partial(wrapper, call)
    return call(session, fetches, feed_dict, options, run_metadata)


def _explained_run(run, self, *args, **kwargs):
    """tf.compat.v1.Session.run re-raises a missing-library error as explain_missing_library
    words it, a collective's failure when a task is gone as explain_lost_rank does, and a
    cancelled step of a restarted task as explain_restarted_task does (other errors and
    results pass through untouched)."""
    try:
        return _wrapped_run(run, self, *args, **kwargs)
    except tf.errors.NotFoundError as e:
        clear = explain_missing_library(e)
        if clear is None:
            raise
        raise clear from e
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.InternalError) as e:
        clear = explain_lost_rank(e, self.graph)
        if clear is None:
            if not isinstance(e, tf.errors.InternalError):
                warn_unreachable_ps(e)
            raise
        raise clear from e
    except tf.errors.CancelledError as e:
        # In a graph with collectives a restarted task is a lost rank (the collectives
        # cannot be reset); elsewhere it is an aborted step MonitoredTrainingSession redoes.
        clear = explain_lost_rank(e, self.graph) or explain_restarted_task(e)
        if clear is None:
            raise
        if not isinstance(clear, RankLostError):
            warn_unreachable_ps(clear)
        raise clear from e


tf_patches.install("Session.run", _explained_run)
