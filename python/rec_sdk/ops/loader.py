"""The one place that knows where rec_sdk's op library is and how to load it.

The library is loaded once, on first use, so importing rec_sdk works before the library is
built. A library built for another TensorFlow version does not load (its absl and TF
symbols differ), so the error names both versions and the rebuild command.
"""
import os
import threading

import tensorflow as tf

LIBRARY_FILE = "_rec_sdk_ops.so"
VERSION_FILE = "_rec_sdk_ops.tf_version"
LIBRARY_ENV = "REC_SDK_OPS_LIBRARY"
REBUILD_COMMAND = "make build"

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


def _load():
    path = library_path()
    if not os.path.exists(path):
        raise OpLibraryError(
            "rec_sdk's op library is missing (%s). Build it for the installed TensorFlow %s "
            "with `%s` in the rec_sdk checkout." % (path, tf.__version__, REBUILD_COMMAND))
    built = _built_tf_version(path)
    if built is not None and built != tf.__version__:
        raise OpLibraryError(
            "rec_sdk's op library %s was built for TensorFlow %s but TensorFlow %s is "
            "installed. Rebuild it with `%s` in the rec_sdk checkout."
            % (path, built, tf.__version__, REBUILD_COMMAND))
    try:
        return tf.load_op_library(path)
    except (tf.errors.NotFoundError, OSError) as e:
        raise OpLibraryError(
            "cannot load rec_sdk's op library %s (built for TensorFlow %s) into TensorFlow %s: "
            "%s. Rebuild it with `%s` in the rec_sdk checkout."
            % (path, built or "unknown", tf.__version__, e, REBUILD_COMMAND)) from e


def load_ops():
    """Returns the loaded op library module, loading it on the first call."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = _load()
    return _library
