"""How a served model takes an update, and the lock that gives each request one version.

apply_update_op builds the "apply_update" signature's op: it reads and checks an update
directory (update_files.py) with stock ops before it changes anything; then, one update at
a time, checks that it applies onto the model's version and works out what changes in each
table (reading only), and holding the model's lock writes every table's rows and removals,
assigns the dense variables the update carries and moves the version.
Requests read their rows and dense variables without the lock but keep them only when no
update wrote meanwhile, else read again holding it (ModelLock.read, a seqlock), so every
output of a request is computed from one published version. The lock is a stock MutexV2:
TensorFlow Serving and the stock loaders run it.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops  # MutexV2: no public wrapper

from rec_sdk.serving import update_files


class ModelLock(tf.saved_model.experimental.TrackableResource):
    """The lock of a served model's updates (a MutexV2 resource; a TrackableResource so that
    TF2 SavedModels recreate it) and a sequence number that makes requests' reads consistent
    without taking it (a seqlock): write(fn) runs an update's writes holding the lock, the
    sequence number odd meanwhile; read(fn) reads without the lock and keeps the result when
    the sequence number was the same even number before and after, else reads again holding
    the lock. name: unique per export (its chain id), so models loaded in one process never
    share a lock. sequence=False: a lock without the sequence number (run() only: the lock
    that orders updates)."""

    def __init__(self, name, sequence=True):
        self._lock_name = name
        super().__init__()
        if not sequence:
            self.sequence = None
            _ = self.resource_handle
        elif tf.executing_eagerly():
            # Tracked explicitly (a resource does not track its attributes), so that TF2
            # SavedModels save it.
            self.sequence = self._track_trackable(
                tf.Variable(np.int64(0), trainable=False, name=name + "_sequence"), "sequence"
            )
        else:
            self.sequence = tf.compat.v1.Variable(
                np.int64(0), trainable=False, use_resource=True, name=name + "_sequence"
            )
            # Created now, in the model's graph (on first use it could be created inside a
            # cond's branch function, where other ops cannot reach it).
            _ = self.resource_handle

    def _create_resource(self):
        return gen_resource_variable_ops.mutex_v2(
            shared_name=self._lock_name, name="rec_sdk_serving_lock"
        )

    def run(self, fn):
        """Runs the ops fn() builds while holding the lock and returns fn()'s tensors (a
        structure). Every op fn must run has to feed a returned tensor (use control
        dependencies for writes): the lock is released once they are computed."""
        held = gen_resource_variable_ops.mutex_lock(self.resource_handle)
        with tf.control_dependencies([held]):
            out = fn()
        flat = tf.nest.flatten(out)
        with tf.control_dependencies(flat):
            released = gen_resource_variable_ops.consume_mutex_lock(held)
        with tf.control_dependencies([released]):
            return tf.nest.pack_sequence_as(out, [tf.identity(t) for t in flat])

    def write(self, fn):
        """run(fn) for an update's writes: the sequence number is odd while they run. It is
        made odd, not incremented: a run that failed after making it odd (its writes may be
        partly done) left it odd, and requests then read holding the lock until a write
        completes (an increment would make it even for the next write)."""

        def locked():
            started = self.sequence.assign(
                tf.bitwise.bitwise_or(self.sequence.read_value(), np.int64(1))
            )
            with tf.control_dependencies([started]):
                out = fn()
            with tf.control_dependencies(tf.nest.flatten(out)):
                done = self.sequence.assign_add(1)
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(tf.identity, out)

        return self.run(locked)

    def read(self, fn):
        """The tensors of fn() (reads only) as of one moment between updates: read without
        the lock, kept when no update's writes ran meanwhile (the sequence number was the
        same even number before and after; every read and write takes its table's or
        variable's mutex, which orders them), else read again holding the lock."""
        before = self.sequence.read_value()
        with tf.control_dependencies([before]):
            out = fn()
        with tf.control_dependencies(tf.nest.flatten(out)):
            after = self.sequence.read_value()
        quiet = tf.logical_and(tf.equal(before, after), tf.equal(before % 2, 0))
        return tf.cond(quiet, lambda: tf.nest.map_structure(tf.identity, out), lambda: self.run(fn))


def _checked_file(update_dir, name, manifest, dtype):
    """(decoded contents, check op) of a file of an update: its size and fingerprint must
    be the manifest's; the error names the file."""
    path = tf.strings.join([update_dir, "/", name])
    data = tf.io.read_file(path)
    files = manifest["files"]
    at = tf.where(tf.equal(files, name))[:, 0]
    listed = tf.debugging.Assert(
        tf.equal(tf.size(at), 1), ["update file missing from its MANIFEST:", path], summarize=1
    )
    with tf.control_dependencies([listed]):
        index = at[0]
    return checked_contents(
        path,
        data,
        tf.gather(manifest["file_sizes"], index),
        tf.gather(manifest["file_fingerprints"], index),
        dtype,
    )


def checked_contents(path, data, size, print_, dtype):
    """(decoded contents, check op) of the bytes `data` of a file of an update, which must
    have the manifest's `size` and fingerprint `print_`; the error names the file."""
    size_ok = tf.equal(tf.cast(tf.strings.length(data), tf.int64), size)
    sized = tf.debugging.Assert(
        size_ok, ["update file is truncated or has the wrong size:", path], summarize=1
    )
    with tf.control_dependencies([sized]):
        print_ok = tf.equal(update_files.fingerprint_op(data), print_)
    checked = tf.debugging.Assert(
        print_ok,
        ["update file is corrupt (its fingerprint does not match its MANIFEST):", path],
        summarize=1,
    )
    with tf.control_dependencies([checked]):
        return tf.io.decode_raw(data, dtype, little_endian=True), checked


def read_manifest_op(update_dir):
    """(manifest {feature: tensor}, check op) of an update directory's MANIFEST."""
    path = tf.strings.join([update_dir, "/", update_files.MANIFEST])
    data = tf.io.read_file(path)
    length = tf.strings.length(data)
    long_enough = tf.debugging.Assert(
        length > update_files.FINGERPRINT_BYTES,
        ["update MANIFEST is truncated:", path],
        summarize=1,
    )
    with tf.control_dependencies([long_enough]):
        body = tf.strings.substr(
            data, update_files.FINGERPRINT_BYTES, length - update_files.FINGERPRINT_BYTES
        )
        head = tf.io.decode_raw(
            tf.strings.substr(data, 0, update_files.FINGERPRINT_BYTES), tf.int64, little_endian=True
        )[0]
    intact = tf.debugging.Assert(
        tf.equal(head, update_files.fingerprint_op(body)),
        ["update MANIFEST is corrupt (its fingerprint does not match its contents):", path],
        summarize=1,
    )
    features = {}
    for name, dtype in update_files.MANIFEST_FEATURES.items():
        features[name] = tf.io.VarLenFeature(dtype)
    with tf.control_dependencies([intact]):
        parsed = tf.io.parse_single_example(body, features)
    return {name: value.values for name, value in parsed.items()}, intact


def apply_update_op(update_dir, tables, dense, version, chain, lock, updates_lock):
    """The op applying the update in directory `update_dir` (a string tensor) to a served
    model at `version` (an int64 variable) of chain `chain`. Without the lock it reads the
    update and checks the manifest, the chain, the table and dense names and every file's
    size and fingerprint. Holding `updates_lock` (a ModelLock only updates take: one update
    at a time) it checks that the update applies onto the model's version (base <= version <
    the update's) and plans each table's changes (reads only); holding `lock` as well (the
    lock requests take) it writes them, assigns the dense variables the update carries and
    moves `version`. Returns the new version. tables: [ServedTable or plugin.PluginTable];
    dense: [(name, variable)]."""
    manifest, intact = read_manifest_op(update_dir)
    checks = [intact]

    def check(condition, *message):
        checks.append(tf.debugging.Assert(condition, list(message), summarize=8))

    with tf.control_dependencies([intact]):
        check(
            tf.equal(manifest["chain"][0], chain),
            "update",
            update_dir,
            "belongs to chain",
            manifest["chain"][0],
            "; the model serves chain",
            chain,
        )
        names = tf.strings.reduce_join(manifest["table_names"], separator=",")
        check(
            tf.equal(names, ",".join(t.name for t in tables)),
            "update",
            update_dir,
            "is of tables",
            names,
            "; the model serves",
            ",".join(t.name for t in tables),
        )
        ranks = tf.strings.reduce_join(tf.strings.as_string(manifest["table_ranks"]), separator=",")
        check(
            tf.equal(ranks, ",".join(str(t.ranks) for t in tables)),
            "update",
            update_dir,
            "has its tables' files from",
            ranks,
            "ranks; the model's tables are from",
            ",".join(str(t.ranks) for t in tables),
        )
        dense_names = tf.strings.reduce_join(manifest["dense_names"], separator=",")
        check(
            tf.equal(dense_names, ",".join(n for n, _ in dense)),
            "update",
            update_dir,
            "is of dense variables",
            dense_names,
        )

    def table_files(step):
        """Each table's (keys, values, removed), read from its files (step: the changes since
        the previous version alone) and checked."""
        out, read_checks = [], []
        for i, table in enumerate(tables):

            def read(kind, dtype, i=i, table=table):
                # A table over ranks: each rank's file, together.
                parts = []
                for name in update_files.table_files(i, kind, table.ranks, step):
                    contents, c = _checked_file(update_dir, name, manifest, dtype)
                    parts.append(contents)
                    read_checks.append(c)
                return parts[0] if len(parts) == 1 else tf.concat(parts, 0)

            keys, values = read("keys", tf.int64), read("values", tf.float32)
            removed = read("removed", tf.int64)
            values = tf.reshape(values, [-1, table.dim])
            rows = tf.debugging.Assert(
                tf.equal(tf.shape(values, out_type=tf.int64)[0], tf.size(keys, tf.int64)),
                ["update", update_dir, "table", table.name, ": keys and values differ in rows"],
            )
            read_checks.append(rows)
            out.append((keys, values, removed))
        with tf.control_dependencies(read_checks):
            return [tuple(tf.identity(t) for t in parts) for parts in out]

    with tf.control_dependencies(checks):
        new_dense = []
        for j, (_name, var) in enumerate(dense):
            present = manifest["dense_present"][j] > 0

            def read(j=j, var=var):
                value, c = _checked_file(
                    update_dir, update_files.dense_file(j), manifest, var.dtype.base_dtype
                )
                with tf.control_dependencies([c]):
                    return tf.reshape(value, tf.shape(var))

            # Dense variables the update leaves out keep their value (read under the lock).
            new_dense.append(
                (
                    present,
                    tf.cond(present, read, lambda var=var: tf.zeros(tf.shape(var), var.dtype)),
                )
            )
    ready = checks + [v for _, v in new_dense]

    def one_at_a_time():
        current = version.read_value()
        base, target = manifest["base"][0], manifest["version"][0]
        follows = tf.debugging.Assert(
            tf.logical_and(base <= current, current < target),
            [
                "update",
                update_dir,
                "(version",
                target,
                ") applies onto model versions",
                base,
                "to",
                target - 1,
                "but the model is at version",
                current,
                "(apply the update it follows first)",
            ],
            summarize=8,
        )
        # A model at the previous version takes the changes since it alone.
        step_parent = manifest["step_parent"][0]
        step = tf.logical_and(step_parent >= 0, tf.equal(current, step_parent))
        with tf.control_dependencies([follows]):
            contents = tf.cond(step, lambda: table_files(True), lambda: table_files(False))
            # Reads only: requests go on meanwhile.
            plans = [
                table.plan(
                    keys,
                    values,
                    removed,
                    tf.logical_and(tf.logical_not(step), manifest["table_replace"][i] > 0),
                )
                for i, (table, (keys, values, removed)) in enumerate(zip(tables, contents))
            ]

        # Nothing is written before every file is read and checked and every table planned.
        planned = tf.nest.flatten(contents) + tf.nest.flatten(plans)

        def locked():
            applied = [table.write(plan) for table, plan in zip(tables, plans)]
            for (_, var), (present, value) in zip(dense, new_dense):
                applied.append(var.assign(tf.where(present, value, var.read_value())))
            with tf.control_dependencies(applied):
                return version.assign(target)

        # The lock is taken (and the sequence number made odd) only once every check has
        # passed: a refused update changes nothing.
        with tf.control_dependencies(planned):
            return lock.write(locked)

    with tf.control_dependencies(ready):
        return updates_lock.run(one_at_a_time)
