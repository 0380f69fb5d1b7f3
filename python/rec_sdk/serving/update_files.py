"""The files of serving updates: what a push writes and a served model reads.

A push directory holds a chain of numbered updates, each a directory published by an atomic
rename (written into a hidden temporary directory, every file fsync'ed, then renamed):

    <push_dir>/BASE              the manifest of version 0 (written by the export)
    <push_dir>/0000000001/       update 1: MANIFEST, table<i>.keys/.values/.removed,
    <push_dir>/0000000002/       dense<j>.value (the dense variables it carries)
    ...

Updates are cumulative: a whole update (every table whole, every dense variable) applies
onto any version, and each other update holds every change since the newest whole update
before it (its `base`; 0: the export), so it applies onto any model version from its base to
its own version - 1. A replica that is behind applies at most two updates: the newest whole
one, if it is behind that, and the newest one (see follow.py; the pusher decides when to
write a whole update, push.py). Old updates are deleted under a retention window
(retire_old_updates).

MANIFEST is an 8-byte farmhash64 fingerprint (tf.fingerprint) of what follows, then a
serialized tf.train.Example with the fields of MANIFEST_FEATURES: the update's version, its
base, whether it is whole, the chain id (the export's), per table its name, rows, removed
keys, whether it replaces the table, its shards (the rec_sdk tables it is served from) and
the push ids their changes end at (flattened); per file its name, size and fingerprint; per
dense variable its name and whether it is in the update; step_parent: version - 1 when the
update also holds, in table<i>.step.* files, the changes since version - 1 alone (what a
model at version - 1, a replica that follows every update, applies instead), else -1.
table_ranks: per table, how many ranks wrote its files: 1, table<i>.keys/.values/.removed;
R > 1 (a table sharded over R ranks, each rank writing the rows it owns), table<i>.rank<r>.*
for r < R, the table's rows being all of them together. Tables' files: keys int64, values
float32 [rows, dim], removed int64, little-endian. A served model checks all of this with
stock ops before it changes anything (serving/apply.py), so a truncated, corrupt or partial
update is refused by the name of its file.
"""

import collections
import os
import shutil
import threading
import time

import numpy as np
import tensorflow as tf

from rec_sdk.base import atomic_dir

BASE = "BASE"
MANIFEST = "MANIFEST"
VERSION_DIGITS = 10
FINGERPRINT_BYTES = 8

# The Example's features: name -> (dtype, fixed length or None for a list).
MANIFEST_FEATURES = {
    "version": tf.int64,
    "base": tf.int64,
    "whole": tf.int64,
    "step_parent": tf.int64,
    "chain": tf.string,
    "table_names": tf.string,
    "table_rows": tf.int64,
    "table_removed": tf.int64,
    "table_replace": tf.int64,
    "table_shards": tf.int64,
    "table_push_ids": tf.int64,
    "files": tf.string,
    "file_sizes": tf.int64,
    "file_fingerprints": tf.int64,
    "dense_names": tf.string,
    "dense_present": tf.int64,
    "table_ranks": tf.int64,
}
_SCALARS = ("version", "base", "whole", "step_parent", "chain")


# A dense variable's part of an update: its name and its value (an array, or None when the
# update does not carry it).
DenseUpdate = collections.namedtuple("DenseUpdate", "name value")

# One table's part of an update: rows [n] and values [n, dim], removed keys, whether the rows
# are the whole table, and the push id each of its shards' changes end at.
TableUpdate = collections.namedtuple("TableUpdate", "name keys values removed replace push_ids")


class UpdateError(ValueError):
    """An update that cannot be read or applied: the message names the file and why."""


def update_dir(push_dir, version):
    return os.path.join(push_dir, "%0*d" % (VERSION_DIGITS, version))


# What the manifest says of a table: its name, rows, removed keys, whether the rows are the
# whole table, the push id of each shard and how many ranks wrote its files.
TableSummary = collections.namedtuple("TableSummary", "name rows removed replace push_ids ranks")


def summary(table):
    """The TableSummary of a TableUpdate (written by this process: one rank)."""
    return TableSummary(
        table.name,
        len(table.keys),
        len(table.removed),
        bool(table.replace),
        list(table.push_ids),
        1,
    )


def table_file(i, kind, step=False, rank=None):
    """The name of table i's file of `kind` (keys, values or removed); step: of the changes
    since the previous version alone; rank: the part rank `rank` wrote (tables over ranks)."""
    return "table%d.%s%s%s" % (
        i,
        "step." if step else "",
        "" if rank is None else "rank%d." % rank,
        kind,
    )


def table_files(i, kind, ranks, step=False):
    """Names of table i's files of `kind` written by `ranks` ranks (table_ranks)."""
    if ranks <= 1:
        return [table_file(i, kind, step)]
    return [table_file(i, kind, step, r) for r in range(ranks)]


def dense_file(j):
    return "dense%d.value" % j


class _Fingerprinter:
    """farmhash64 fingerprints of byte strings, through tf.fingerprint in a private graph (so
    they are computed alike in eager and in graph-mode programs, and match what a served
    model computes)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._data = tf.compat.v1.placeholder(tf.string, [])
            self._out = fingerprint_op(self._data)
        self._sess = None

    def __call__(self, data):
        with self._lock:
            if self._sess is None:
                self._sess = tf.compat.v1.Session(graph=self._graph)
            return int(self._sess.run(self._out, {self._data: data}))


def fingerprint_op(data):
    """The int64 fingerprint of a scalar string tensor (stock ops)."""
    raw = tf.fingerprint(tf.reshape(data, [1]), method="farmhash64")
    return tf.reshape(tf.bitcast(raw, tf.int64), [])


_FINGERPRINT = None
_FINGERPRINT_LOCK = threading.Lock()


def fingerprint(data):
    global _FINGERPRINT
    with _FINGERPRINT_LOCK:
        if _FINGERPRINT is None:
            _FINGERPRINT = _Fingerprinter()
    return _FINGERPRINT(bytes(data))


def _example(manifest):
    feature = {}
    for name, dtype in MANIFEST_FEATURES.items():
        values = manifest[name]
        if name in _SCALARS:
            values = [values]
        if dtype == tf.string:
            feature[name] = tf.train.Feature(
                bytes_list=tf.train.BytesList(
                    value=[v.encode() if isinstance(v, str) else bytes(v) for v in values]
                )
            )
        else:
            feature[name] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(v) for v in values])
            )
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def encode_manifest(manifest):
    body = _example(manifest)
    return np.int64(fingerprint(body)).tobytes() + body


def decode_manifest(data, path):
    """The manifest dict of MANIFEST bytes; UpdateError naming `path` when they are not one."""
    if len(data) <= FINGERPRINT_BYTES:
        raise UpdateError("%s is truncated (%d bytes)" % (path, len(data)))
    body = data[FINGERPRINT_BYTES:]
    if np.frombuffer(data[:FINGERPRINT_BYTES], np.int64)[0] != np.int64(fingerprint(body)):
        raise UpdateError("%s is corrupt: its fingerprint does not match its contents" % path)
    example = tf.train.Example.FromString(body)
    out = {}
    for name, dtype in MANIFEST_FEATURES.items():
        feature = example.features.feature[name]
        if dtype == tf.string:
            values = [v.decode() for v in feature.bytes_list.value]
        else:
            values = list(feature.int64_list.value)
        out[name] = values[0] if name in _SCALARS else values
    if not out["table_ranks"]:
        out["table_ranks"] = [1] * len(out["table_names"])
    return out


class StagedUpdate:
    """An update being written into a hidden temporary directory of push_dir (`path`), then
    published by publish() (an atomic rename). Files are written by put() or, by other
    processes (the ranks of a table sharded over ranks), directly into `path` and then
    listed with add()."""

    def __init__(self, push_dir, version):
        self.push_dir, self.version = push_dir, version
        self.final = update_dir(push_dir, version)
        if os.path.exists(self.final):
            raise UpdateError(
                "%s already exists: update %d was published before" % (self.final, version)
            )
        remove_stale_temporaries(push_dir)
        self.path = os.path.join(push_dir, ".tmp-%d-%d" % (version, os.getpid()))
        if os.path.exists(self.path):
            for name in os.listdir(self.path):
                os.remove(os.path.join(self.path, name))
        else:
            os.makedirs(self.path)
        self.files, self.sizes, self.prints = [], [], []

    def put(self, name, array):
        data = np.ascontiguousarray(array).tobytes()
        atomic_dir.write_file(os.path.join(self.path, name), data)
        self.add(name, len(data), fingerprint(data))

    def add(self, name, size, print_):
        self.files.append(name)
        self.sizes.append(int(size))
        self.prints.append(int(print_))

    def put_tables(self, tables, step=False):
        """Writes the files of [TableUpdate] (one rank each)."""
        for i, table in enumerate(tables):
            self.put(table_file(i, "keys", step), np.asarray(table.keys, "<i8"))
            self.put(table_file(i, "values", step), np.asarray(table.values, "<f4"))
            self.put(table_file(i, "removed", step), np.asarray(table.removed, "<i8"))

    def publish(self, base, chain, tables, dense, steps):
        """Writes the MANIFEST and publishes the update. tables: [TableSummary]; dense:
        [DenseUpdate] (the arrays are written here); steps: whether the update
        holds the changes since version - 1 alone. Returns its directory."""
        for j, d in enumerate(dense):
            if d.value is not None:
                self.put(dense_file(j), np.asarray(d.value))
        manifest = {
            "version": self.version,
            "base": base,
            "chain": chain,
            "step_parent": self.version - 1 if steps else -1,
            "whole": int(
                all(t.replace for t in tables) and all(d.value is not None for d in dense)
            ),
            "table_names": [t.name for t in tables],
            "table_rows": [t.rows for t in tables],
            "table_removed": [t.removed for t in tables],
            "table_replace": [int(bool(t.replace)) for t in tables],
            "table_shards": [len(t.push_ids) for t in tables],
            "table_push_ids": [int(i) for t in tables for i in t.push_ids],
            "table_ranks": [int(t.ranks) for t in tables],
            "files": self.files,
            "file_sizes": self.sizes,
            "file_fingerprints": self.prints,
            "dense_names": [d.name for d in dense],
            "dense_present": [int(d.value is not None) for d in dense],
        }
        atomic_dir.write_file(os.path.join(self.path, MANIFEST), encode_manifest(manifest))
        atomic_dir.publish_dir(self.path, self.final)
        return self.final

    def discard(self):
        shutil.rmtree(self.path, ignore_errors=True)


def write_update(push_dir, version, base, chain, tables, dense, steps=None):
    """Publishes update `version` atomically; returns its directory.

    base: the oldest model version it applies onto (0 for a whole update). tables:
    [TableUpdate] in the served model's order; dense: [DenseUpdate] (value None: not in
    this update). steps: [TableUpdate] of the changes since version - 1 alone (a model at
    version - 1 applies those instead of `tables`), or None when they are not known.
    """
    staged = StagedUpdate(push_dir, version)
    staged.put_tables(tables)
    staged.put_tables(steps or [], step=True)
    return staged.publish(base, chain, [summary(t) for t in tables], dense, steps is not None)


def read_update(push_dir, manifest, dims, dense_dtypes):
    """([TableUpdate], [(name, array or None)]) of a published update whose manifest is
    `manifest`, every file checked against it (UpdateError naming the file otherwise).
    dims: each table's row width; dense_dtypes: each dense variable's NumPy dtype."""
    where = update_dir(push_dir, manifest["version"])
    listed = dict(
        zip(manifest["files"], zip(manifest["file_sizes"], manifest["file_fingerprints"]))
    )

    def load(name, dtype):
        path = os.path.join(where, name)
        if name not in listed:
            raise UpdateError("%s is missing from its MANIFEST" % path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise UpdateError("%s cannot be read: %s" % (path, e)) from None
        size, print_ = listed[name]
        if len(data) != size or fingerprint(data) != print_:
            raise UpdateError("update file is corrupt or truncated: %s" % path)
        return np.frombuffer(data, dtype)

    def load_all(i, kind, dtype):
        ranks = manifest["table_ranks"][i]
        return np.concatenate([load(name, dtype) for name in table_files(i, kind, ranks)])

    tables = []
    for i, name in enumerate(manifest["table_names"]):
        tables.append(
            TableUpdate(
                name,
                load_all(i, "keys", "<i8"),
                load_all(i, "values", "<f4").reshape(-1, dims[i]),
                load_all(i, "removed", "<i8"),
                bool(manifest["table_replace"][i]),
                shard_push_ids(manifest)[i],
            )
        )
    dense = [
        DenseUpdate(name, load(dense_file(j), dtype) if manifest["dense_present"][j] else None)
        for j, (name, dtype) in enumerate(zip(manifest["dense_names"], dense_dtypes))
    ]
    return tables, dense


def retire_old_updates(push_dir, keep_secs, now=None):
    """Deletes the updates no replica needs any more: all but the newest update and its base
    (together they bring any version up to date), once older than keep_secs seconds (so a
    replica that is still reading one, having listed the directory up to keep_secs ago,
    finds it). Each is renamed away first, so no reader sees a partly deleted update.
    Returns the versions deleted."""
    head = chain_head(push_dir)
    if head is None or head["version"] == 0:
        return []
    needed = {head["version"], head["base"]}
    now = time.time() if now is None else now
    retired = []
    for version in published_versions(push_dir):
        if version >= head["version"] or version in needed:
            continue
        path = update_dir(push_dir, version)
        try:
            if now - os.stat(path).st_mtime < keep_secs:
                continue
            gone = os.path.join(push_dir, ".retired-%d-%d" % (version, os.getpid()))
            os.rename(path, gone)
        except OSError:
            continue  # another pusher retired it
        shutil.rmtree(gone, ignore_errors=True)
        retired.append(version)
    return retired


def remove_stale_temporaries(push_dir):
    """Deletes the temporary directories of pushers that are gone (killed mid-write)."""

    def writer_of(name):
        parts = name.split("-")
        if name.startswith((".tmp-", ".retired-")) and len(parts) == 3 and parts[2].isdigit():
            return int(parts[2])
        return None

    atomic_dir.remove_dead_writers(push_dir, writer_of)


def write_base(push_dir, chain, table_names, push_ids, dense_names, table_rows, table_ranks=None):
    """Version 0 of a chain: the export's state (atomically replaced). push_ids: per table,
    the push id of each of its shards; table_rows: the rows each table exported;
    table_ranks: how many ranks write each table's files (default 1 each)."""
    os.makedirs(push_dir, exist_ok=True)
    manifest = {
        "version": 0,
        "base": 0,
        "whole": 1,
        "step_parent": -1,
        "chain": chain,
        "table_names": list(table_names),
        "table_rows": [int(n) for n in table_rows],
        "table_removed": [0] * len(table_names),
        "table_replace": [1] * len(table_names),
        "table_shards": [len(ids) for ids in push_ids],
        "table_push_ids": [int(i) for ids in push_ids for i in ids],
        "files": [],
        "file_sizes": [],
        "file_fingerprints": [],
        "dense_names": list(dense_names),
        "dense_present": [0] * len(dense_names),
        "table_ranks": [int(r) for r in (table_ranks or [1] * len(table_names))],
    }
    atomic_dir.replace_file(os.path.join(push_dir, BASE), encode_manifest(manifest))


def manifest_path(push_dir, version):
    """The path of version `version`'s manifest (the BASE for 0)."""
    if version == 0:
        return os.path.join(push_dir, BASE)
    return os.path.join(update_dir(push_dir, version), MANIFEST)


def read_manifest(path):
    with open(path, "rb") as f:
        return decode_manifest(f.read(), path)


def shard_push_ids(manifest):
    """[[push id of each shard] of each table] of a manifest."""
    out, at = [], 0
    for n in manifest["table_shards"]:
        out.append(manifest["table_push_ids"][at : at + n])
        at += n
    return out


def published_versions(push_dir):
    """The versions of the update directories in push_dir, ascending (published ones only:
    temporary directories are hidden)."""
    out = []
    for name in os.listdir(push_dir) if os.path.isdir(push_dir) else []:
        if len(name) == VERSION_DIGITS and name.isdigit():
            out.append(int(name))
    return sorted(out)


def chain_head(push_dir):
    """The newest readable manifest of the chain in push_dir (the BASE when no update is
    published), or None when the directory holds no chain. Updates whose manifest is
    missing or corrupt (a push killed before its rename cannot leave one) are skipped."""
    for version in reversed(published_versions(push_dir)):
        path = os.path.join(update_dir(push_dir, version), MANIFEST)
        try:
            manifest = read_manifest(path)
        except (OSError, UpdateError):
            continue
        if manifest["version"] == version:
            return manifest
    base = os.path.join(push_dir, BASE)
    return read_manifest(base) if os.path.exists(base) else None
