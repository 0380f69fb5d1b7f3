"""Served tables in stock TensorFlow mutable hash tables, updated in place.

A served table is a few `tf.lookup.experimental.DenseHashTable`s (key -> row; a key not
stored reads the table's default row), the keys spread over them by a hash of the key: one
table of power-of-two buckets would hold 1.25x to 2.5x its payload, several of sizes chosen
for the row count hold at most about 1.5x (memory_layout). They are filled at load from
files in the SavedModel's assets and changed only by updates (update_files.py), which the
model applies itself (apply.py) in a critical section that requests' reads share, so a
request reads every row and dense variable of one version.

No key is ever removed with DenseHashTable.remove: that op leaves a deleted marker in the
key's probe chain, and an insert stops at the first deleted marker it meets, so a key
written again after a neighbour's removal is stored twice and removing it later uncovers the
older copy (TensorFlow's MutableDenseHashTable, lookup_table_op.cc: DoInsert and DoRemove;
docs/SERVING.md). A removed key is instead written with the default row (a tombstone: it
reads exactly as a key not stored), and a sub-table whose tombstones pass TOMBSTONE_SHARE of
its live rows is rebuilt: its live rows are copied out and inserted into a fresh bucket
array (LookupTableImportV2 of empty buckets). Without removals the tables never hold a
deleted marker, and an insert then finds either the key or an empty bucket.

The three smallest int64 keys are reserved: the hash tables' empty and deleted keys, and a
key never stored that lookups read in their place. They cannot be served: they read the
default, and exports and pushes leave them out with a warning.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_lookup_ops  # LookupTableImportV2: no public wrapper

from rec_sdk.base import tf_patches
from rec_sdk.base.log import logger

EMPTY_KEY = np.iinfo(np.int64).min
DELETED_KEY = EMPTY_KEY + 1
ABSENT_KEY = EMPTY_KEY + 2  # never stored: the reserved keys are looked up as this one
MAX_LOAD = 0.8  # DenseHashTable's own max_load_factor
MIN_BUCKETS = 1024
SPLIT_ROWS = 1 << 16  # from this many rows a table is split (memory_layout)
# A sub-table is rebuilt when its tombstones pass both of these: a share of its live rows
# (a quarter: tombstones hold buckets that new keys and probe chains would use) and a floor
# (small tables are not rebuilt for a few removals).
TOMBSTONE_SHARE = 4
MIN_TOMBSTONES = 256


def pow2_at_least(n):
    return 1 << max(0, int(np.ceil(np.log2(max(n, 1)))))


def memory_layout(rows):
    """(sub-tables, buckets each) for a table of `rows` rows: the fewest buckets in total
    that keep every sub-table under MAX_LOAD, over 1 or 4..8 sub-tables."""
    if rows < SPLIT_ROWS:
        return 1, max(MIN_BUCKETS, pow2_at_least(rows / MAX_LOAD))
    best = None
    for parts in range(4, 9):
        buckets = pow2_at_least(np.ceil(rows / parts / MAX_LOAD))
        if best is None or parts * buckets < best[0] * best[1]:
            best = (parts, buckets)
    return best


def without_reserved_keys(name, keys, *columns):
    """Drops the rows of the hash tables' reserved keys (with a warning)."""
    keys = np.asarray(keys, np.int64)
    bad = keys <= ABSENT_KEY
    if not bad.any():
        return (keys,) + columns
    logger.warning(
        "table '%s': key(s) %s are reserved by the served hash table and are not "
        "served (they read the default)",
        name,
        sorted(set(keys[bad].tolist())),
    )
    return (keys[~bad],) + tuple(np.asarray(c)[~bad] for c in columns)


def without_default_rows(keys, values, default, dim):
    """(keys, values [n, dim]) of a table's rows (NumPy) other than those equal to the default:
    they read as keys not stored, so the served tables leave them out."""
    values = np.asarray(values, np.float32).reshape(len(keys), dim)
    stored = ~np.all(values == default, axis=1)
    return np.asarray(keys)[stored], values[stored]


def track_asset_files(resource, keys_file, values_file):
    """Tracks a TF2 resource's asset files (a resource does not track its attributes): saving
    maps the paths its initializer captures to the files copied into the SavedModel's
    assets. Returns the two Assets."""
    return (
        tf_patches.track_trackable(resource, tf.saved_model.Asset(keys_file), "_keys_file"),
        tf_patches.track_trackable(resource, tf.saved_model.Asset(values_file), "_values_file"),
    )


def part_of(keys, parts):
    """The sub-table of each key (NumPy; part_of_op in a graph)."""
    keys = np.asarray(keys, np.int64)
    return np.mod(keys ^ (keys >> 29), parts).astype(np.int32)


def part_of_op(keys, parts):
    """The sub-table of each int64 key (as part_of)."""
    mixed = tf.bitwise.bitwise_xor(keys, tf.bitwise.right_shift(keys, 29))
    return tf.cast(tf.math.floormod(mixed, parts), tf.int32)


def default_of(default, dim):
    """A served table's default row [dim] (zeros when None)."""
    return np.broadcast_to(
        np.asarray(0.0 if default is None else default, np.float32), [dim]
    ).copy()


class _AssetFilledTable(tf.lookup.experimental.DenseHashTable):
    """A DenseHashTable that a TF2 SavedModel fills at load from its asset files (its
    _initialize runs in the model's init op, as a StaticHashTable's initializer does)."""

    def __init__(self, keys_file, values_file, dim, rows, **kwargs):
        self._dim = dim
        self._rows = rows
        super().__init__(**kwargs)
        self._keys_file, self._values_file = track_asset_files(self, keys_file, values_file)

    def _initialize(self):
        return stream_rows(
            tf.convert_to_tensor(self._keys_file),
            tf.convert_to_tensor(self._values_file),
            self._dim,
            self._rows,
            lambda keys, values, _: self.insert(keys, values),
        )


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


def stream_rows(keys_path, values_path, dim, rows, write, first=0):
    """The op streaming the first `rows` rows of write_rows files into a table, a batch of
    LOAD_BATCH rows at a time (the files never sit in memory whole): write(keys, values,
    position) is the op adding one batch, position the number of its first row counted from
    `first`. Returns the rows added."""
    batches = tf.data.Dataset.zip(
        (
            tf.data.FixedLengthRecordDataset(keys_path, 8 * LOAD_BATCH),
            tf.data.FixedLengthRecordDataset(values_path, 4 * dim * LOAD_BATCH),
        )
    )
    end = tf.cast(first, tf.int64) + rows

    def add(total, batch):
        valid = tf.minimum(np.int64(LOAD_BATCH), end - total)
        keys = tf.io.decode_raw(batch[0], tf.int64, little_endian=True)[:valid]
        values = tf.reshape(tf.io.decode_raw(batch[1], tf.float32, little_endian=True), [-1, dim])[
            :valid
        ]
        with tf.control_dependencies([write(keys, values, total)]):
            return total + valid

    return batches.reduce(tf.cast(first, tf.int64), add) - tf.cast(first, tf.int64)


def asset_path(path):
    """(tf.compat.v1 graphs) A constant of a file's path, registered as the graph's asset (the
    SavedModel copies it into its assets and the loader feeds its new path)."""
    asset = tf.constant(path, name="asset_" + path.rsplit("/", 1)[-1])
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS, asset)
    return asset


class ServedTable:
    """One table of a served model: sub-tables of DenseHashTable, lookups, and changes.

    Made from the table's rows (keys, values: NumPy) at export: each sub-table's rows are
    written into `staging` (table<index>.part<p>.keys/.values) for the SavedModel's assets.
    In TF2 (eager) the sub-tables fill themselves at load (_AssetFilledTable); in a
    tf.compat.v1 graph load_op() is the op that fills them, for the SavedModel's main op.
    default: the row keys not stored read (zeros when None).
    """

    def __init__(self, name, dim, keys, values, staging, index, default=None):
        default = default_of(default, dim)
        parts, buckets = memory_layout(len(keys))
        # Every stored default row is then a tombstone (counted in self.tombstones).
        keys, values = without_default_rows(keys, values, default, dim)
        where = part_of(keys, parts)
        files = []
        for p in range(parts):
            stem = "%s/table%d.part%d." % (staging, index, p)
            rows = write_rows(stem, keys[where == p], values[where == p], dim)
            files.append([(stem + "keys", stem + "values", rows)])
        self._make(name, dim, default, parts, buckets, files, 1)

    @classmethod
    def from_files(cls, name, dim, default, parts, buckets, files, ranks):
        """A served table whose sub-table p is filled from files[p], [(keys file, values
        file, rows)] written as write_rows does (by the ranks of a table over `ranks` ranks:
        rank_parts.py); tf.compat.v1 graphs only."""
        table = cls.__new__(cls)
        table._make(name, dim, default_of(default, dim), parts, buckets, files, ranks)
        return table

    def _make(self, name, dim, default, parts, buckets, files, ranks):
        self.name, self.dim, self.default, self.parts = name, dim, default, parts
        self.files, self.ranks = files, ranks  # ranks: how many write the update files
        self.rows = sum(rows for part in files for _, _, rows in part)
        self._eager = tf.executing_eagerly()
        if self._eager and any(len(part) != 1 for part in files):
            raise ValueError(
                "served table %r: sub-tables filled from several files are for "
                "tf.compat.v1 graphs" % name
            )
        self.tables, self.tombstones = [], []
        for p, part in enumerate(files):
            label = "rec_sdk_served_%s_%d" % (name.replace("/", "_"), p)
            kwargs = dict(
                key_dtype=tf.int64,
                value_dtype=tf.float32,
                default_value=default,
                empty_key=EMPTY_KEY,
                deleted_key=DELETED_KEY,
                initial_num_buckets=buckets,
                checkpoint=False,
                name=label,
            )
            if self._eager:
                keys_file, values_file, rows = part[0]
                table = _AssetFilledTable(keys_file, values_file, dim, rows, **kwargs)
                tombstones = tf.Variable(np.int64(0), trainable=False, name=label + "_tombstones")
            else:
                table = tf.lookup.experimental.DenseHashTable(**kwargs)
                tombstones = tf.compat.v1.Variable(
                    np.int64(0), trainable=False, use_resource=True, name=label + "_tombstones"
                )
            self.tables.append(table)
            self.tombstones.append(tombstones)
        self.variables = self.tombstones  # the table's variables (export initialises them)

    def load_op(self):
        """(tf.compat.v1 graphs) The op filling the sub-tables from their asset files (the
        file paths are registered as the graph's assets)."""
        done = tf.no_op()
        for table, part in zip(self.tables, self.files):
            for keys_file, values_file, rows in part:
                with tf.control_dependencies([done]):
                    done = stream_rows(
                        asset_path(keys_file),
                        asset_path(values_file),
                        self.dim,
                        rows,
                        lambda keys, values, _, t=table: t.insert(keys, values),
                    )
        return done

    def _part_of(self, keys):
        return part_of_op(keys, self.parts)

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
            # One find after the other: the executor runs each in the request's own thread
            # instead of handing parallel finds to its thread pool, which under concurrent
            # requests cost 7-9% of the throughput (benchmarks/RESULTS.md).
            found = []
            for table, part_keys in zip(self.tables, keys):
                with tf.control_dependencies(found[-1:]):
                    found.append(table.lookup(part_keys))
            rows = tf.dynamic_stitch(positions, found)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def default_rows(self, n):
        return tf.broadcast_to(tf.constant(self.default), tf.stack([n, self.dim]))

    def plan(self, keys, values, removed, replace):
        """What an update's rows [n, dim] of keys [n] and removed keys (replace: the rows are
        the whole table) change in each sub-table: a structure of tensors for write(). It
        only reads the sub-tables, so it runs before the model's lock is taken (updates are
        applied one at a time, apply.py), and requests go on meanwhile."""
        parts = self._split(keys, values)
        gone = self._split(removed)
        return [
            self._plan_part(p, k, v, r, replace)
            for p, ((k, v), (r,)) in enumerate(zip(parts, gone))
        ]

    def write(self, plans):
        """Op carrying out plan()'s changes (holding the model's lock): each sub-table takes
        its rows and tombstones, or is rebuilt (the update's rows are the whole table, its
        tombstones pass TOMBSTONE_SHARE of its live rows, or an insert would grow it)."""
        done = []
        for p, plan in enumerate(plans):

            def rebuild(p=p, plan=plan):
                rows = (plan["keys"], plan["values"])
                return tf.cond(
                    plan["whole"],
                    lambda: self._rebuild(p, *rows),
                    lambda: self._rebuild(p, pending=rows),
                )

            done.append(
                tf.cond(plan["rebuild"], rebuild, lambda p=p, plan=plan: self._write_part(p, plan))
            )
        return tf.group(*done)

    def _is_default(self, rows):
        return is_default(rows, self.default, self.dim)

    def _plan_part(self, p, keys, values, removed, whole):
        """Sub-table p's part of plan(). Rows the sub-table holds already are skipped (a
        cumulative update repeats rows a follower has), keys that may be new are apart from
        the rows of stored keys and the tombstones of removed ones. TensorFlow grows a
        DenseHashTable when its entries plus an insert's batch pass MAX_LOAD (it counts every
        key of the batch as new, and tombstones are entries): so a sub-table is rebuilt
        instead when an insert would grow it, or when its tombstones pass TOMBSTONE_SHARE of
        its live rows (it then grows only when its live rows need it)."""
        table = self.tables[p]
        values = all_values = tf.reshape(values, [-1, self.dim])
        all_keys = keys
        current = tf.reshape(table.lookup(keys), [-1, self.dim])
        changed = tf.reduce_any(tf.not_equal(current, values), axis=1)
        keys, values = tf.boolean_mask(keys, changed), tf.boolean_mask(values, changed)
        maybe_new = self._is_default(tf.boolean_mask(current, changed))  # or a tombstone
        # A removed key that still reads a row gets the default row: a tombstone.
        buried = tf.boolean_mask(removed, tf.logical_not(self._is_default(table.lookup(removed))))
        stored = tf.logical_not(maybe_new)
        new_keys = tf.boolean_mask(keys, maybe_new)
        old_keys = tf.concat([tf.boolean_mask(keys, stored), buried], 0)
        entries = table.size()
        buckets = tf.shape(table.export()[0], out_type=tf.int64)[0]  # no copy: aliased
        tombstones = self.tombstones[p].read_value()
        limit = MAX_LOAD * tf.cast(buckets, tf.float64)
        # The second insert (old_keys) counts the first one's new entries too.
        would_grow = (
            tf.cast(
                entries
                + tf.size(new_keys, out_type=tf.int64)
                + tf.size(old_keys, out_type=tf.int64),
                tf.float64,
            )
            > limit
        )
        crowded = tombstones + tf.size(buried, out_type=tf.int64) > tf.maximum(
            np.int64(MIN_TOMBSTONES), (entries - tombstones) // TOMBSTONE_SHARE
        )
        # Tombstones are the entries whose row is the default. Of the keys that read the
        # default, those that were stored were tombstones and are rows now; keys written
        # with the default row and buried keys are tombstones now.
        new_rows = tf.boolean_mask(values, maybe_new)
        old_rows = tf.concat(
            [tf.boolean_mask(values, stored), self.default_rows(tf.size(buried))], 0
        )
        return {
            "whole": whole,
            "rebuild": tf.reduce_any([whole, crowded, would_grow]),
            "new_keys": new_keys,
            "new_rows": new_rows,
            "old_keys": old_keys,
            "old_rows": old_rows,
            # What a rebuild writes: the whole table's rows, or those over its own.
            "keys": tf.cond(whole, lambda: all_keys, lambda: tf.concat([new_keys, old_keys], 0)),
            "values": tf.cond(
                whole, lambda: all_values, lambda: tf.concat([new_rows, old_rows], 0)
            ),
            "tombstones": (
                tf.size(buried, out_type=tf.int64)
                + _count(self._is_default(values))
                - _count(maybe_new)
            ),
        }

    def _write_part(self, p, plan):
        table = self.tables[p]
        before = table.size()
        with tf.control_dependencies([before]):
            added = table.insert(plan["new_keys"], plan["new_rows"])
        with tf.control_dependencies([added]):
            after = table.size()
            overwritten = table.insert(plan["old_keys"], plan["old_rows"])
        with tf.control_dependencies([overwritten]):
            # The keys that read the default and were not stored: after - before.
            counted = self.tombstones[p].assign_add(plan["tombstones"] + after - before)
        with tf.control_dependencies([counted]):
            return table.size()

    def _rebuild(self, p, keys=None, values=None, pending=None):
        """Op refilling sub-table p with `keys` and `values` (default: its own entries other
        than tombstones, with the rows `pending` (keys, rows) written over them) in a fresh
        bucket array sized for them, so that no key is ever stored twice (see the module's
        doc). Returns the entries."""
        table = self.tables[p]
        if keys is None:
            stored_keys, stored_rows = table.export()
            stored_keys = tf.reshape(stored_keys, [-1])
            stored_rows = tf.reshape(stored_rows, [-1, self.dim])
            kept = tf.logical_and(
                stored_keys > DELETED_KEY, tf.logical_not(self._is_default(stored_rows))
            )
            pending_keys, pending_rows = pending
            kept = tf.logical_and(kept, tf.logical_not(isin(stored_keys, pending_keys)))
            written = tf.logical_not(self._is_default(pending_rows))
            # The export aliases the table's buffers: the kept rows are copied out (gather)
            # before the import below replaces them.
            keys = tf.concat(
                [tf.boolean_mask(stored_keys, kept), tf.boolean_mask(pending_keys, written)], 0
            )
            values = tf.concat(
                [tf.boolean_mask(stored_rows, kept), tf.boolean_mask(pending_rows, written)], 0
            )
        else:  # the rows of a whole table: those equal to the default read as not stored
            values = tf.reshape(values, [-1, self.dim])
            written = tf.logical_not(self._is_default(values))
            keys, values = tf.boolean_mask(keys, written), tf.boolean_mask(values, written)
        with tf.control_dependencies([keys, values]):
            emptied = empty_buckets(table, tf.size(keys, out_type=tf.int64), self.dim, tf.float32)
        with tf.control_dependencies([emptied]):
            filled = table.insert(keys, values)
        with tf.control_dependencies([filled]):
            reset = self.tombstones[p].assign(0)
        with tf.control_dependencies([reset]):
            return table.size()

    def size(self):
        """Op: the keys served (tombstones not counted)."""
        return tf.add_n([t.size() - c for t, c in zip(self.tables, self.tombstones)])


def is_default(rows, default, dim):
    """[n] bool: which of rows [n, dim] are the `default` row."""
    rows = tf.reshape(rows, [-1, dim])
    return tf.reshape(tf.reduce_all(tf.equal(rows, default), axis=1), [-1])


def _count(mask):
    return tf.reduce_sum(tf.cast(mask, tf.int64))


def isin(keys, among):
    """[n] bool: which of keys [n] are in `among` [m]."""
    sorted_among = tf.sort(among)
    at = tf.searchsorted(sorted_among, keys, out_type=tf.int64)
    size = tf.size(among, out_type=tf.int64)
    probe = tf.gather(tf.concat([sorted_among, [EMPTY_KEY]], 0), tf.minimum(at, size))
    return tf.logical_and(at < size, tf.equal(probe, keys))


def empty_buckets(table, n, width, dtype):
    """Op replacing a DenseHashTable's buckets (values [width] of dtype) with empty ones,
    as many as n entries need (buckets_for)."""
    buckets = buckets_for(n)
    # Fill's output is a new buffer each run (its shape is computed at run time), and the
    # import makes it the table's: it must not be a constant that the table would write.
    empty_keys = tf.compat.v1.placeholder_with_default(
        tf.fill(tf.stack([buckets, 1]), EMPTY_KEY), None
    )
    return gen_lookup_ops.lookup_table_import_v2(
        table.resource_handle, empty_keys, tf.zeros(tf.stack([buckets, np.int64(width)]), dtype)
    )


def buckets_for(n):
    """Op: the power-of-two bucket count (at least MIN_BUCKETS) holding n entries under
    MAX_LOAD (so that inserting them does not grow the table)."""
    want = tf.cast(tf.math.ceil(tf.cast(n, tf.float64) / MAX_LOAD), tf.float64)
    buckets = tf.cast(
        tf.pow(np.float64(2), tf.math.ceil(tf.math.log(tf.maximum(want, 1.0)) / np.log(2.0))),
        tf.int64,
    )
    # Rounding in log: make sure the count is enough.
    buckets = tf.where(
        tf.cast(buckets, tf.float64) * MAX_LOAD < tf.cast(n, tf.float64), buckets * 2, buckets
    )
    return tf.maximum(buckets, np.int64(MIN_BUCKETS))
