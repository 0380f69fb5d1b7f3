"""Checkpoints of rec_sdk tables, beside TensorFlow's (mirrors the SDK's Saver integration).

`tf.compat.v1.train.Saver.save` and `.restore` (and so `MonitoredTrainingSession` and
tf.estimator, which use them) save and restore every table with `is_save=True` of the
session's graph, with no extra user code (rec_sdk.saver.patches): `saver.save(sess,
"ckpt/model", global_step=100)` writes the TensorFlow checkpoint `ckpt/model-100` and the
tables under `ckpt/sparse-model-100/`, one directory per table (files described in
tf_ops/core/checkpoint.h: keys, embeddings, optimizer slots, admission counts, last-seen
clocks, pending keys, checksummed metadata).

Crash safety: the tables are written into a temporary directory, fsync'ed, and renamed into
place before TensorFlow writes its checkpoint and, last, the `checkpoint` index file. A save
killed at any point leaves the previous checkpoint, and the index pointing at it, intact.
Checkpoints that the Saver deletes (`max_to_keep`) lose their table directories too.

Also here: save_tables / restore_tables for explicit use (and restoring the directories of
several ranks into a different number of ranks), export_npz / import_npz for NumPy files.
"""

import os
import re
import shutil
import uuid

import numpy as np
import tensorflow as tf

from rec_sdk.base import atomic_dir
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_bool, check_int
from rec_sdk.distribute import ranks
from rec_sdk.tables import shard_names
from rec_sdk.tables.table import SparseEmbedding, tables_of_graph

SPARSE_PREFIX = "sparse-"
_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
# The file every table directory of a checkpoint ends with (written last; the format is
# tf_ops/core/checkpoint.h's): what tells a rec_sdk checkpoint from any other directory.
TABLE_META_FILE = "meta.txt"


def sparse_dir(checkpoint_path):
    """The table directory of a TensorFlow checkpoint prefix: <dir>/sparse-<name>."""
    head, tail = os.path.split(checkpoint_path)
    return os.path.join(head, SPARSE_PREFIX + tail)


def tables_of_session(sess, tables):
    """The tables to save or restore: `tables` (default: every table of sess.graph with
    is_save), less those this process does not manage (shards of other ranks' tables: rank
    0 saves them)."""
    if tables is None:
        return [t for t in tables_of_graph(sess.graph) if t.is_save and ranks.managed_shards(t)]
    if isinstance(tables, SparseEmbedding):
        tables = [tables]
    if not isinstance(tables, (list, tuple)) or not all(
        isinstance(t, SparseEmbedding) for t in tables
    ):
        raise TypeError("tables must be a list of tables from create_table, got %r" % (tables,))
    return [t for t in tables if ranks.managed_shards(t)]


def _refuse_sharded(tables, what):
    for table in tables:
        if table.ranks is not None:
            raise ValueError(
                "%s: table %r is sharded over %d ranks; %s works on tables of one process. "
                "Use Saver.save / restore (or save_tables / restore_tables), which handle "
                "every rank's shard" % (what, table.table_name, table.ranks.size, what)
            )


def save_tables(sess, directory, tables=None, delta=False):
    """Writes `tables` (default: every table of sess.graph with is_save=True) into
    `directory` atomically: a temporary directory, renamed into place once complete (its
    parent directory is created if missing).
    With delta=True only what changed since the table's last committed save (full or delta)
    is written (tables of a process initialised with init(enable_incremental_checkpoint=True));
    restore with restore_tables(full_directory, deltas=[...]), in order. A save is committed
    (starts the next change set) only once it is durable, so a failed save loses no change.
    An existing `directory` is replaced only if it is a rec_sdk checkpoint (every entry a
    table directory) or empty; anything else is a ValueError, never deleted.
    Returns {table_name: rows written}."""
    tables = tables_of_session(sess, tables)
    if not tables:
        return {}  # e.g. rank 1 of a cluster: rank 0 saves its shards; the directory is not ours
    if delta:
        _refuse_sharded(tables, "save_tables(delta=True)")
    rows, save_ids = write_tables(sess, directory, tables, delta)
    commit_tables(sess, tables, save_ids)
    return rows


def commit_tables(sess, tables, save_ids):
    """Marks the saves durable: later deltas follow them."""
    for table in tables:
        for unit, shard, _, _ in ranks.managed_shards(table):
            ops = shard.checkpoint_ops
            sess.run(ops["commit"], {ops["commit_id"]: save_ids[unit]})


def write_tables(sess, directory, tables, delta=False):
    """save_tables without the commit: -> ({table_name: rows}, {table_name: save id})."""
    check_bool("delta", delta)
    directory = _checked_directory(directory)
    parent = os.path.dirname(directory)
    # Saver.save into a directory that does not exist yet creates it, as TensorFlow's own
    # checkpoint writer does.
    os.makedirs(parent, exist_ok=True)
    remove_leftovers(parent)
    nonce = "%d-%s" % (os.getpid(), uuid.uuid4().hex[:8])
    tmp = directory + _TMP_MARK + nonce
    os.mkdir(tmp)
    try:
        # Every shard holds the same step: wait for the ranks still applying their updates.
        fences = {ranks.fence(table) for table in tables} - {None}
        if fences:
            sess.run(list(fences))
        # One run saves every table and shard: each shard's save op runs on its own rank's
        # task, so the ranks write their shards at once (as TensorFlow's sharded Saver has
        # each device write its own part).
        fetches, feed = {}, {}
        for table in tables:
            for unit, shard, _, _ in ranks.managed_shards(table):
                ops = shard.checkpoint_ops
                fetches[(table.table_name, unit)] = (ops["save"], ops["save_id"])
                feed[ops["save_dir"]] = os.path.join(tmp, unit)
                feed[ops["delta"]] = delta
        rows, save_ids = {t.table_name: 0 for t in tables}, {}
        for (name, unit), (count, save_id) in sess.run(fetches, feed).items():
            rows[name] += int(count)
            save_ids[unit] = int(save_id)
        old = directory + _OLD_MARK + nonce
        atomic_dir.publish_dir(tmp, directory, aside=old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)  # the copy moved aside, if there was one
    return rows, save_ids


def _checked_directory(directory):
    """The absolute path of a save's `directory`, which must be a non-empty path and, if it
    exists, a rec_sdk checkpoint or an empty directory (a save replaces it whole)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError("save_tables: directory must be a path (str), got %r" % (directory,))
    path = os.fspath(directory)
    if not path or "\0" in path:
        raise ValueError(
            "save_tables: directory must be a non-empty path without NUL bytes, got %r" % (path,)
        )
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        return path
    if not os.path.isdir(path) or os.path.islink(path):
        raise ValueError(
            "save_tables: directory %r exists and is not a directory; a save "
            "writes a new directory or replaces an earlier checkpoint" % path
        )
    for entry in os.listdir(path):
        if not os.path.isfile(os.path.join(path, entry, TABLE_META_FILE)):
            raise ValueError(
                "save_tables: directory %r exists and is not a rec_sdk checkpoint (%r is not a "
                "table directory); a save replaces only an earlier checkpoint or an empty "
                "directory: choose another directory" % (path, entry)
            )
    return path


_LEFTOVER = re.compile(
    r"^(?P<name>.+)(?P<mark>%s(?P<pid>\d+)-[0-9a-f]{8}|%s[0-9]+-[0-9a-f]{8})$"
    % (re.escape(_TMP_MARK), re.escape(_OLD_MARK))
)


def remove_leftovers(parent):
    """Deletes what killed saves left in checkpoint directory `parent`, whatever checkpoint
    they were writing: temporary directories whose writer process is gone (never those of a
    live writer), and copies moved aside once the directory they were copies of exists.
    Called by every save and restore, so a crash loop cannot fill the disk."""

    def writer_of(entry):
        match = _LEFTOVER.match(entry)
        if (
            match is None
            or match.group("pid") is None
            or not os.path.isdir(os.path.join(parent, entry))
        ):
            return None
        return int(match.group("pid"))

    atomic_dir.remove_dead_writers(parent, writer_of)
    if not os.path.isdir(parent):
        return
    for entry in os.listdir(parent):
        match = _LEFTOVER.match(entry)
        if (
            match is not None
            and match.group("pid") is None
            and os.path.isdir(os.path.join(parent, entry))
            and os.path.isdir(os.path.join(parent, match.group("name")))
        ):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def existing_save(directory):
    """`directory`, or the copy a save moved aside just before it was killed."""
    if os.path.isdir(directory):
        return directory
    parent, name = os.path.split(directory)
    if os.path.isdir(parent):
        aside = [
            os.path.join(parent, e) for e in os.listdir(parent) if e.startswith(name + _OLD_MARK)
        ]
        if aside:
            return max(aside, key=os.path.getmtime)  # the newest copy moved aside
    return None


def restore_tables(sess, directories, tables=None, rank_id=None, rank_size=None, deltas=()):
    """Restores `tables` (default: every table of sess.graph with is_save=True) from one
    checkpoint table directory, or from a list of them (the directories written by several
    processes), then applies the delta directories `deltas` (from save_tables(delta=True),
    one process) in order. A checkpoint of any number of ranks restores into any other: a
    table sharded over ranks keeps in each shard the keys with abs(key % ranks) == rank;
    a table in one process keeps every key (or, with rank_id and rank_size given, those
    with abs(key % rank_size) == rank_id). Returns {table_name: rows}.
    Raises tf.errors.NotFoundError naming a missing directory, DataLossError naming a
    corrupted file (the table is then left empty)."""
    if isinstance(directories, (str, bytes, os.PathLike)):
        directories = [directories]
    if (
        not isinstance(directories, (list, tuple))
        or not directories
        or not all(isinstance(d, (str, bytes, os.PathLike)) for d in directories)
    ):
        raise TypeError(
            "restore_tables: directories must be a checkpoint directory or a "
            "non-empty list of them, got %r" % (directories,)
        )
    if rank_size is not None or rank_id is not None:
        rank_size = check_int("rank_size", 1 if rank_size is None else rank_size, 1, 2**31 - 1)
        rank_id = check_int("rank_id", 0 if rank_id is None else rank_id, 0, rank_size - 1)
    if deltas and (rank_size not in (None, 1) or len(directories) != 1):
        raise ValueError(
            "restore_tables: deltas apply to one full checkpoint restored whole "
            "(rank_size=1, one directory), got rank_size=%r and %d directories"
            % (rank_size, len(directories))
        )
    tables = tables_of_session(sess, tables)
    if not tables:
        return {}
    if deltas:
        _refuse_sharded(tables, "restore_tables(deltas=...)")
    found = []
    for directory in directories:
        existing = existing_save(os.path.abspath(directory))
        if existing is None:
            raise tf.errors.NotFoundError(
                None,
                None,
                "rec_sdk checkpoint directory %r does not exist (was the checkpoint "
                "saved by a graph with these tables? tables created with is_save=False are not "
                "saved)" % directory,
            )
        found.append(existing)
    for parent in {os.path.dirname(d) for d in found}:
        remove_leftovers(parent)
    rows = {t.table_name: 0 for t in tables}
    restores = []  # (table, shard, its directories, rank, ranks): restored in one run
    for table in tables:
        for _, shard, shard_rank, shard_count in ranks.managed_shards(table):
            if table.ranks is None and rank_size is not None:
                shard_rank, shard_count = rank_id, rank_size
            table_dirs = _saved_dirs(found, table.table_name)
            if table_dirs is not None:
                restores.append((table, shard, table_dirs, shard_rank, shard_count))
                continue
            other_shards = _other_shard_dirs(found, table, shard_count, deltas)
            if other_shards is None:
                raise tf.errors.NotFoundError(
                    None,
                    None,
                    "table %r is not in the rec_sdk checkpoint %s"
                    % (table.table_name, ", ".join(map(repr, found))),
                )
            rows[table.table_name] += _restore_resharded(sess, table, other_shards)
    for table, count in _restore_shards(sess, restores):
        rows[table.table_name] += count
    for table in tables:
        for delta in deltas:
            path = os.path.join(os.path.abspath(delta), table.table_name)
            if not os.path.isdir(path):
                raise tf.errors.NotFoundError(
                    None,
                    None,
                    "table %r is not in the delta checkpoint %r" % (table.table_name, delta),
                )
            rows[table.table_name] += int(
                sess.run(
                    table.checkpoint_ops["apply_delta"], {table.checkpoint_ops["save_dir"]: path}
                )
            )
    return rows


def _restore_shards(sess, restores):
    """Runs the restore ops of [(table, shard, directories, rank, ranks)] in one run (each
    shard's on its own rank's task, so the ranks read their shards at once), each keeping the
    keys of `rank` of `ranks`; logs the ops' notes. -> [(table, rows restored)]."""
    if not restores:
        return []
    fetches, feed = [], {}
    for _, shard, table_dirs, rank, count in restores:
        ops = shard.checkpoint_ops
        fetches.append((ops["restore"], ops["restore_note"]))
        feed.update(
            {ops["restore_dirs"]: table_dirs, ops["rank_id"]: rank, ops["rank_size"]: count}
        )
    out = []
    for (table, shard, _, _, _), (count, note) in zip(restores, sess.run(fetches, feed)):
        note = note.decode() if isinstance(note, bytes) else note
        if note:
            logger.info("rec_sdk: table %r: %s", shard.table_name, note)
            if "dropped" in note:
                logger.warning("rec_sdk: table %r: %s", shard.table_name, note)
        out.append((table, int(count)))
    return out


def _saved_dirs(found, table_name):
    """The directories holding table `table_name` in the checkpoint directories `found`: its
    own (saved in one process), or those of every rank's shard (<name>@<rank>of<ranks>, all
    of them); None if some checkpoint directory has neither."""
    dirs = []
    for directory in found:
        own = os.path.join(directory, table_name)
        if os.path.isdir(own):
            dirs.append(own)
            continue
        counts = {
            parsed[2]
            for parsed in map(shard_names.parse_rank_shard, os.listdir(directory))
            if parsed is not None and parsed[0] == table_name
        }
        for count in sorted(counts):
            shards = [
                os.path.join(directory, shard_names.rank_shard(table_name, rank, count))
                for rank in range(count)
            ]
            if all(os.path.isdir(d) for d in shards):
                dirs.extend(shards)
                break
        else:
            return None
    return dirs


def _other_shard_dirs(found, table, rank_size, deltas):
    """The directories of the shards of the same de.Variable saved with another number of
    shards (<name>_mht_<j>of<m>, all m of them in every checkpoint directory), or None."""
    if table.shard_keys_filter is None or rank_size != 1 or deltas:
        return None
    parsed = shard_names.parse_variable_shard(table.table_name)
    if parsed is None:
        return None
    base = parsed[0]
    for directory in found:
        counts = {
            p[2]
            for p in map(shard_names.parse_variable_shard, os.listdir(directory))
            if p is not None and p[0] == base
        }
        for count in sorted(counts):
            dirs = [
                os.path.join(d, name)
                for d in found
                for name in shard_names.variable_shards(base, count)
            ]
            if all(os.path.isdir(d) for d in dirs):
                return dirs
    return None


def _restore_resharded(sess, table, dirs):
    """Restores a shard from every shard of a checkpoint with another shard count (keys,
    rows, slots), then removes the keys that the variable's partitioner sends to its other
    shards. Returns the rows kept."""
    ops = table.checkpoint_ops
    sess.run(ops["restore"], {ops["restore_dirs"]: dirs, ops["rank_id"]: 0, ops["rank_size"]: 1})
    keys = sess.run(ops["keys"]).astype(table.key_dtype.as_numpy_dtype)
    keep = table.shard_keys_filter(keys)
    sess.run(ops["remove"], {ops["remove_keys"]: keys[~keep]})
    logger.info(
        "rec_sdk: table %r restored from %d shards of another shard count (%d of %d "
        "keys are this shard's)",
        table.table_name,
        len(dirs),
        int(keep.sum()),
        len(keys),
    )
    return int(keep.sum())


def export_npz(sess, path, tables=None):
    """Writes every table's keys and embeddings (and optimizer slots) to a NumPy .npz file:
    arrays <table>/keys, <table>/values, <table>/slots. Returns {table_name: rows}."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError("export_npz: path must be a file path (str), got %r" % (path,))
    path = os.fspath(path)
    arrays, rows = {}, {}
    tables = tables_of_session(sess, tables)
    _refuse_sharded(tables, "export_npz")
    for table in tables:
        keys, values, slots = sess.run(table.export())
        arrays[table.table_name + "/keys"] = keys
        arrays[table.table_name + "/values"] = values
        arrays[table.table_name + "/slots"] = slots
        rows[table.table_name] = len(keys)
    tmp = path + _TMP_MARK + uuid.uuid4().hex[:8]
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return rows


def import_npz(sess, path, tables=None, slots=True):
    """Loads tables from a file written by export_npz (replacing their contents); with
    slots=False only keys and embeddings. Returns {table_name: rows}."""
    rows = {}
    tables = tables_of_session(sess, tables)
    _refuse_sharded(tables, "import_npz")
    with np.load(path) as data:
        for table in tables:
            name = table.table_name
            if name + "/keys" not in data:
                raise KeyError(
                    "table %r is not in %r; it holds %s"
                    % (name, path, sorted({k.split("/")[0] for k in data.files}))
                )
            keys, values = data[name + "/keys"], data[name + "/values"]
            table_slots = data[name + "/slots"] if slots else None
            if table_slots is not None and table_slots.shape[0] == 0:
                table_slots = None
            # Built on demand: NumPy import is not meant for finalized graphs.
            sess.run(table.import_rows(keys, values, table_slots))
            rows[name] = len(keys)
    return rows
