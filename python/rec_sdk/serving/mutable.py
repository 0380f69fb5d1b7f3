"""Served tables in stock TensorFlow mutable hash tables, updated in place.

A served table is a few `tf.lookup.experimental.DenseHashTable`s (key -> row; a key not
stored reads the table's default row), the keys spread over them by a hash of the key: one
table of power-of-two buckets would hold 1.25x to 2.5x its payload, several of sizes chosen
for the row count hold at most about 1.5x (memory_layout). They are filled at load from
files in the SavedModel's assets and changed only by updates (update_files.py), which the
model applies itself (apply_update_op): every file is read and checked before anything
changes, then each sub-table takes its removals and rows as one batch under its own lock,
so a request sees each row all-old or all-new.

The three smallest int64 keys are reserved: the hash tables' empty and deleted keys, and a
key never stored that lookups read in their place. They cannot be served: they read the
default, and exports and pushes leave them out with a warning.
"""
import numpy as np
import tensorflow as tf

from rec_sdk.serving import update_files
from rec_sdk.util.log import logger

EMPTY_KEY = np.iinfo(np.int64).min
DELETED_KEY = EMPTY_KEY + 1
ABSENT_KEY = EMPTY_KEY + 2  # never stored: the reserved keys are looked up as this one
MAX_LOAD = 0.8           # DenseHashTable's own max_load_factor
MIN_BUCKETS = 1024
SPLIT_ROWS = 1 << 16     # from this many rows a table is split (memory_layout)


def _pow2_at_least(n):
    return 1 << max(0, int(np.ceil(np.log2(max(n, 1)))))


def memory_layout(rows):
    """(sub-tables, buckets each) for a table of `rows` rows: the fewest buckets in total
    that keep every sub-table under MAX_LOAD, over 1 or 4..8 sub-tables."""
    if rows < SPLIT_ROWS:
        return 1, max(MIN_BUCKETS, _pow2_at_least(rows / MAX_LOAD))
    best = None
    for parts in range(4, 9):
        buckets = _pow2_at_least(np.ceil(rows / parts / MAX_LOAD))
        if best is None or parts * buckets < best[0] * best[1]:
            best = (parts, buckets)
    return best


def without_reserved_keys(name, keys, *columns):
    """Drops the rows of the hash tables' reserved keys (with a warning)."""
    keys = np.asarray(keys, np.int64)
    bad = keys <= ABSENT_KEY
    if not bad.any():
        return (keys,) + columns
    logger.warning("table '%s': key(s) %s are reserved by the served hash table and are not "
                   "served (they read the default)", name, sorted(set(keys[bad].tolist())))
    return (keys[~bad],) + tuple(np.asarray(c)[~bad] for c in columns)


def part_of(keys, parts):
    """The sub-table of each key (NumPy; the same as ServedTable._part_of in the graph)."""
    keys = np.asarray(keys, np.int64)
    return np.mod(keys ^ (keys >> 29), parts).astype(np.int32)


class _AssetFilledTable(tf.lookup.experimental.DenseHashTable):
    """A DenseHashTable that a TF2 SavedModel fills at load from its asset files (its
    _initialize runs in the model's init op, as a StaticHashTable's initializer does)."""

    def __init__(self, keys_file, values_file, dim, rows, **kwargs):
        self._dim = dim
        self._rows = rows
        super().__init__(**kwargs)
        # Tracked explicitly (a resource does not track its attributes): saving maps the
        # paths the initializer captures to the files copied into the SavedModel's assets.
        self._keys_file = self._track_trackable(tf.saved_model.Asset(keys_file), "_keys_file")
        self._values_file = self._track_trackable(tf.saved_model.Asset(values_file),
                                                  "_values_file")

    def _initialize(self):
        return stream_rows(tf.convert_to_tensor(self._keys_file),
                           tf.convert_to_tensor(self._values_file), self._dim, self._rows,
                           self.insert)


LOAD_BATCH = 1 << 16


def write_rows(stem, keys, values, dim):
    """Writes a table's rows for stream_rows: stem + "keys" (int64) and stem + "values"
    (float32 [n, dim]), padded to whole batches of LOAD_BATCH rows. Returns n."""
    n = len(keys)
    padded = -(-n // LOAD_BATCH) * LOAD_BATCH
    keys_out = np.zeros([padded], "<i8")
    keys_out[:n] = keys
    values_out = np.zeros([padded, dim], "<f4")
    values_out[:n] = np.asarray(values, np.float32).reshape(n, dim)
    keys_out.tofile(stem + "keys")
    values_out.tofile(stem + "values")
    return n


def stream_rows(keys_path, values_path, dim, rows, write):
    """The op streaming the first `rows` rows of write_rows files into a table, a batch of
    LOAD_BATCH rows at a time (the files never sit in memory whole): write(keys, values) is
    the op adding one batch. Returns the rows added."""
    batches = tf.data.Dataset.zip((
        tf.data.FixedLengthRecordDataset(keys_path, 8 * LOAD_BATCH),
        tf.data.FixedLengthRecordDataset(values_path, 4 * dim * LOAD_BATCH)))

    def add(total, batch):
        valid = tf.minimum(np.int64(LOAD_BATCH), rows - total)
        keys = tf.io.decode_raw(batch[0], tf.int64, little_endian=True)[:valid]
        values = tf.reshape(tf.io.decode_raw(batch[1], tf.float32, little_endian=True),
                            [-1, dim])[:valid]
        with tf.control_dependencies([write(keys, values)]):
            return total + valid
    return batches.reduce(np.int64(0), add)


class ServedTable:
    """One table of a served model: sub-tables of DenseHashTable, lookups, and changes.

    Made from the table's rows (keys, values: NumPy) at export: each sub-table's rows are
    written into `staging` (table<index>.part<p>.keys/.values) for the SavedModel's assets.
    In TF2 (eager) the sub-tables fill themselves at load (_AssetFilledTable); in a
    tf.compat.v1 graph load_op() is the op that fills them, for the SavedModel's main op.
    default: the row keys not stored read (zeros when None).
    """

    def __init__(self, name, dim, keys, values, staging, index, default=None):
        self.name, self.dim, self.rows = name, dim, len(keys)
        self.parts, buckets = memory_layout(len(keys))
        default = np.broadcast_to(np.asarray(0.0 if default is None else default, np.float32),
                                  [dim]).copy()
        where = part_of(keys, self.parts)
        self.files, self.part_rows = [], []
        for p in range(self.parts):
            stem = "%s/table%d.part%d." % (staging, index, p)
            self.part_rows.append(write_rows(stem, keys[where == p], values[where == p], dim))
            self.files.append((stem + "keys", stem + "values"))
        self._eager = tf.executing_eagerly()
        self.tables = []
        for p, (keys_file, values_file) in enumerate(self.files):
            kwargs = dict(key_dtype=tf.int64, value_dtype=tf.float32, default_value=default,
                          empty_key=EMPTY_KEY, deleted_key=DELETED_KEY,
                          initial_num_buckets=buckets, checkpoint=False,
                          name="rec_sdk_served_%s_%d" % (name.replace("/", "_"), p))
            if self._eager:
                table = _AssetFilledTable(keys_file, values_file, dim, self.part_rows[p],
                                          **kwargs)
            else:
                table = tf.lookup.experimental.DenseHashTable(**kwargs)
            self.tables.append(table)

    def load_op(self):
        """(tf.compat.v1 graphs) The op filling the sub-tables from their asset files (the
        file paths are registered as the graph's assets)."""
        done = tf.no_op()
        for table, files, rows in zip(self.tables, self.files, self.part_rows):
            paths = []
            for path in files:
                asset = tf.constant(path, name="asset_" + path.rsplit("/", 1)[-1])
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS, asset)
                paths.append(asset)
            with tf.control_dependencies([done]):
                done = stream_rows(paths[0], paths[1], self.dim, rows, table.insert)
        return done

    def _part_of(self, keys):
        mixed = tf.bitwise.bitwise_xor(keys, tf.bitwise.right_shift(keys, 29))
        return tf.cast(tf.math.floormod(mixed, self.parts), tf.int32)

    def _split(self, keys, *columns):
        """[(keys, columns...) of each sub-table]."""
        if self.parts == 1:
            return [(keys,) + columns]
        part = self._part_of(keys)
        split = [tf.dynamic_partition(x, part, self.parts) for x in (keys,) + columns]
        return list(zip(*split))

    def lookup(self, ids):
        """Rows of int64 ids (any shape): [..., dim]; keys not stored (and the reserved
        ones, looked up as ABSENT_KEY) read the table's default."""
        flat = tf.maximum(tf.reshape(ids, [-1]), ABSENT_KEY)
        if self.parts == 1:
            rows = self.tables[0].lookup(flat)
        else:
            part = self._part_of(flat)
            positions = tf.dynamic_partition(tf.range(tf.size(flat)), part, self.parts)
            keys = tf.dynamic_partition(flat, part, self.parts)
            rows = tf.dynamic_stitch(positions, [t.lookup(k) for t, k in zip(self.tables, keys)])
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def insert(self, keys, values):
        """Op writing rows [n, dim] of keys [n]."""
        return tf.group(*[t.insert(k, v) for t, (k, v) in
                          zip(self.tables, self._split(keys, values))])

    def remove(self, keys):
        return tf.group(*[t.remove(k) for t, (k,) in zip(self.tables, self._split(keys))])

    def apply(self, keys, values, removed, replace):
        """Op applying an update's rows (replace: they are the whole table): removals, then
        the rows, each sub-table's as one batch under its lock."""
        removal = tf.cond(replace, tf.no_op, lambda: self.remove(removed))
        with tf.control_dependencies([removal]):
            written = self.insert(keys, values)
        with tf.control_dependencies([written]):
            return tf.cond(replace, lambda: self.remove_others(keys), tf.no_op)

    def remove_others(self, keys):
        """Op removing every stored key not among `keys` (a replacing update, run after its
        rows are written)."""
        ops = []
        wanted = tf.sort(keys)
        for table in self.tables:
            stored, _ = table.export()
            stored = tf.reshape(stored, [-1])
            stored = tf.boolean_mask(stored, stored > DELETED_KEY)
            at = tf.minimum(tf.searchsorted(wanted, stored),
                            tf.maximum(tf.size(wanted) - 1, 0))
            kept = tf.logical_and(tf.size(wanted) > 0,
                                  tf.equal(tf.gather(tf.concat([wanted, [0]], 0), at), stored))
            ops.append(table.remove(tf.boolean_mask(stored, tf.logical_not(kept))))
        return tf.group(*ops)

    def size(self):
        return tf.add_n([t.size() for t in self.tables])


def _checked_file(update_dir, name, manifest, dtype):
    """(decoded contents, check op) of a file of an update: its size and fingerprint must
    be the manifest's; the error names the file."""
    path = tf.strings.join([update_dir, "/", name])
    data = tf.io.read_file(path)
    files = manifest["files"]
    at = tf.where(tf.equal(files, name))[:, 0]
    listed = tf.debugging.Assert(tf.equal(tf.size(at), 1), [
        "update file missing from its MANIFEST:", path], summarize=1)
    with tf.control_dependencies([listed]):
        index = at[0]
    size_ok = tf.equal(tf.cast(tf.strings.length(data), tf.int64),
                       tf.gather(manifest["file_sizes"], index))
    sized = tf.debugging.Assert(size_ok, [
        "update file is truncated or has the wrong size:", path], summarize=1)
    with tf.control_dependencies([sized]):
        print_ok = tf.equal(update_files.fingerprint_op(data),
                            tf.gather(manifest["file_fingerprints"], index))
    checked = tf.debugging.Assert(print_ok, [
        "update file is corrupt (its fingerprint does not match its MANIFEST):", path],
        summarize=1)
    with tf.control_dependencies([checked]):
        return tf.io.decode_raw(data, dtype, little_endian=True), checked


def read_manifest_op(update_dir):
    """(manifest {feature: tensor}, check op) of an update directory's MANIFEST."""
    path = tf.strings.join([update_dir, "/", update_files.MANIFEST])
    data = tf.io.read_file(path)
    length = tf.strings.length(data)
    long_enough = tf.debugging.Assert(length > update_files.FINGERPRINT_BYTES, [
        "update MANIFEST is truncated:", path], summarize=1)
    with tf.control_dependencies([long_enough]):
        body = tf.strings.substr(data, update_files.FINGERPRINT_BYTES,
                                 length - update_files.FINGERPRINT_BYTES)
        head = tf.io.decode_raw(tf.strings.substr(data, 0, update_files.FINGERPRINT_BYTES),
                                tf.int64, little_endian=True)[0]
    intact = tf.debugging.Assert(tf.equal(head, update_files.fingerprint_op(body)), [
        "update MANIFEST is corrupt (its fingerprint does not match its contents):", path],
        summarize=1)
    features = {}
    for name, dtype in update_files.MANIFEST_FEATURES.items():
        features[name] = tf.io.VarLenFeature(dtype)
    with tf.control_dependencies([intact]):
        parsed = tf.io.parse_single_example(body, features)
    return {name: value.values for name, value in parsed.items()}, intact


def apply_update_op(update_dir, tables, dense, version, chain):
    """The op applying the update in directory `update_dir` (a string tensor) to a served
    model at `version` (an int64 variable) of chain `chain`: checks everything first (the
    manifest, the chain, that the update follows the model's version, the table and dense
    names, every file's size and fingerprint), then applies removals and rows table by table,
    assigns the dense variables the update carries, and moves `version`. Returns the new
    version. tables: [ServedTable or plugin.PluginTable]; dense: [(name, variable)]."""
    manifest, intact = read_manifest_op(update_dir)
    checks = [intact]

    def check(condition, *message):
        checks.append(tf.debugging.Assert(condition, list(message), summarize=8))

    with tf.control_dependencies([intact]):
        current = version.read_value()
        check(tf.equal(manifest["chain"][0], chain), "update", update_dir,
              "belongs to chain", manifest["chain"][0], "; the model serves chain", chain)
        check(tf.equal(manifest["parent"][0], current), "update", update_dir,
              "applies onto version", manifest["parent"][0], "but the model is at version",
              current, "(a gap: apply the updates between first)")
        names = tf.strings.reduce_join(manifest["table_names"], separator=",")
        check(tf.equal(names, ",".join(t.name for t in tables)), "update", update_dir,
              "is of tables", names, "; the model serves", ",".join(t.name for t in tables))
        dense_names = tf.strings.reduce_join(manifest["dense_names"], separator=",")
        check(tf.equal(dense_names, ",".join(n for n, _ in dense)), "update", update_dir,
              "is of dense variables", dense_names)
    with tf.control_dependencies(checks):
        contents = []
        for i, table in enumerate(tables):
            keys, c1 = _checked_file(update_dir, update_files.table_file(i, "keys"),
                                     manifest, tf.int64)
            values, c2 = _checked_file(update_dir, update_files.table_file(i, "values"),
                                       manifest, tf.float32)
            removed, c3 = _checked_file(update_dir, update_files.table_file(i, "removed"),
                                        manifest, tf.int64)
            values = tf.reshape(values, [-1, table.dim])
            check(tf.equal(tf.shape(values, out_type=tf.int64)[0], tf.size(keys, tf.int64)),
                  "update", update_dir, "table", table.name, ": keys and values differ in rows")
            checks.extend([c1, c2, c3])
            contents.append((keys, values, removed, manifest["table_replace"][i] > 0))
        new_dense = []
        for j, (name, var) in enumerate(dense):
            present = manifest["dense_present"][j] > 0

            def read(j=j, var=var):
                value, c = _checked_file(update_dir, update_files.dense_file(j), manifest,
                                         var.dtype.base_dtype)
                with tf.control_dependencies([c]):
                    return tf.reshape(value, tf.shape(var))
            new_dense.append(tf.cond(present, read, var.read_value))
    with tf.control_dependencies(checks + [c[0] for c in contents] + new_dense):
        applied = [table.apply(*content) for table, content in zip(tables, contents)]
        for (_, var), value in zip(dense, new_dense):
            applied.append(var.assign(value))
    with tf.control_dependencies(applied):
        return tf.identity(version.assign(manifest["version"][0]))
