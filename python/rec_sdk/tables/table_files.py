"""Tables saved to and loaded from a file system as key and value files (TFRA's
`save_to_file_system` / `load_from_file_system`), on any file system tf.io.gfile knows (local
paths, file://, gs://, hdfs://, s3:// where TensorFlow has the plugin).

A table saved under `name` in `dirpath` is two files: `<name>-keys` (its keys [n]) and
`<name>-values` (its rows [n, dim], the stored float32 words), each a serialized TensorProto.
Each is written to a temporary name and renamed over the old file, so a reader sees the old
or the new file, never a half-written one. Loading upserts the keys (keys the table holds and
the files do not are kept). Optimizer slots and access statistics are not in these files:
checkpoints (Saver, tf.train.Checkpoint) keep those.
"""

import os
import uuid

import numpy as np
import tensorflow as tf

KEYS_SUFFIX = "-keys"
VALUES_SUFFIX = "-values"
DIRPATH_ENV = "TFRA_SAVED_KV"


def directory(dirpath, dirpath_env=DIRPATH_ENV):
    """The directory to use: the environment variable `dirpath_env` when set, else dirpath."""
    env = os.environ.get(dirpath_env) if dirpath_env else None
    path = env or dirpath
    if not isinstance(path, str) or not path:
        raise ValueError("dirpath must be a non-empty path, got %r" % (dirpath,))
    return path


def _write_atomically(path, data):
    tmp = "%s.tmp-%s" % (path, uuid.uuid4().hex)
    try:
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(data)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise


def _serialized(array):
    return tf.io.serialize_tensor(tf.constant(array)).numpy()


def _parsed(data, dtype):
    return tf.io.parse_tensor(data, dtype).numpy()


def write(dirpath, name, keys, rows, append=False):
    """Writes (or, with append, extends) the key and value files of `name` in dirpath."""
    tf.io.gfile.makedirs(dirpath)
    base = dirpath.rstrip("/") + "/" + name
    keys, rows = np.asarray(keys), np.asarray(rows, np.float32)
    if append and tf.io.gfile.exists(base + KEYS_SUFFIX):
        old_keys, old_rows = read_pair(base, keys.dtype, rows.shape[1])
        keys, rows = np.concatenate([old_keys, keys]), np.concatenate([old_rows, rows])
    # Values first: a reader that finds the new keys file finds the matching values.
    _write_atomically(base + VALUES_SUFFIX, _serialized(rows))
    _write_atomically(base + KEYS_SUFFIX, _serialized(keys))
    return len(keys)


def read_pair(base, key_dtype, dim):
    """(keys, rows) of the files `base`-keys / `base`-values, checked against each other."""
    with tf.io.gfile.GFile(base + KEYS_SUFFIX, "rb") as f:
        keys = _parsed(f.read(), tf.as_dtype(key_dtype))
    with tf.io.gfile.GFile(base + VALUES_SUFFIX, "rb") as f:
        rows = _parsed(f.read(), tf.float32)
    if rows.ndim != 2 or rows.shape[1] != dim or rows.shape[0] != keys.shape[0]:
        raise ValueError(
            "%s%s holds rows of shape %s for %d keys; the table wants [%d, %d]"
            % (base, VALUES_SUFFIX, rows.shape, keys.shape[0], keys.shape[0], dim)
        )
    return keys, rows


def saved_bases(dirpath, prefix=""):
    """The paths (without suffix) of the tables saved in dirpath whose names start with
    prefix."""
    root = dirpath.rstrip("/") + "/"
    return sorted(
        p[: -len(KEYS_SUFFIX)] for p in tf.io.gfile.glob(root + prefix + "*" + KEYS_SUFFIX)
    )


def read(dirpath, name, key_dtype, dim, entire_dir=False, prefix=""):
    """(keys, rows) saved under `name` in dirpath, or with entire_dir of every table saved
    there (whose name starts with prefix)."""
    root = dirpath.rstrip("/") + "/"
    if entire_dir:
        bases = saved_bases(dirpath, prefix)
    else:
        bases = [root + name]
    if not bases or not all(tf.io.gfile.exists(b + KEYS_SUFFIX) for b in bases):
        raise tf.errors.NotFoundError(
            None,
            None,
            "no saved table %r in %s (files <name>%s and "
            "<name>%s)" % (name, dirpath, KEYS_SUFFIX, VALUES_SUFFIX),
        )
    pairs = [read_pair(b, key_dtype, dim) for b in bases]
    keys = np.concatenate([k for k, _ in pairs]).astype(tf.as_dtype(key_dtype).as_numpy_dtype)
    rows = np.concatenate([r for _, r in pairs]).reshape(-1, dim)
    return keys, rows


def save_op(export, dirpath, name, append=False, op_name=None):
    """Op writing the (keys, rows) tensors of `export` under `name` in dirpath; returns the
    number of keys written (int64)."""
    keys, rows = export

    def run(k, r):
        return np.int64(write(dirpath, name, k.numpy(), r.numpy(), append))

    return tf.py_function(run, [keys, rows], tf.int64, name=op_name)


def load_tensors(dirpath, name, key_dtype, dim, entire_dir=False, op_name=None, prefix=""):
    """(keys, rows) tensors read from the files of `name` (or of the whole directory, the
    tables whose names start with prefix)."""

    def run():
        return read(dirpath, name, key_dtype, dim, entire_dir, prefix)

    keys, rows = tf.py_function(run, [], [key_dtype, tf.float32], name=op_name)
    keys.set_shape([None])
    rows.set_shape([None, dim])
    return keys, rows
