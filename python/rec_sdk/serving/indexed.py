"""Served tables as an index and a variable of rows: the layout export_serving_model gives
every table whose memory allows it (choose_layout), the others being split over hash tables
of rows (mutable.ServedTable).

The index is one DenseHashTable from key to the row's position (its slot) in a resource
variable of rows [capacity, dim]; slot 0 holds the default row, which keys not stored map to,
removed ones too. A request reads its rows with two ops, a find and a gather, as the frozen
export does (one hash table of rows would need a power-of-two bucket array, 1.25x to 2.5x the
payload; tables split over several cost a request's rows a partition and a stitch:
benchmarks/RESULTS.md).

Changes (from updates, apply.py): a changed row is written in place at its slot, a new key
takes the next unused slot, a removed key is written into the index with slot 0 (its old
slot is left unused: `stale` counts those). When an update would need more slots than the
variable has, or the stale slots pass mutable.TOMBSTONE_SHARE of the live rows, or the update
is a whole table, the table is rebuilt: its live rows are copied into a fresh variable value and
the index is refilled from empty buckets (LookupTableImportV2), so that, as in the split
layout, DenseHashTable.remove is never used and no key is ever stored twice. The variable
never shrinks: a request that read a slot before a rebuild still gathers inside it (and the
model's seqlock then discards what it read, apply.ModelLock.read).
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops  # ResourceScatterUpdate, shape

from rec_sdk.serving import mutable
from rec_sdk.serving.mutable import (
    ABSENT_KEY,
    DELETED_KEY,
    EMPTY_KEY,
    MAX_LOAD,
    MIN_BUCKETS,
    ServedTable,
    default_of,
    empty_buckets,
    is_default,
    isin,
    pow2_at_least,
    stream_rows,
    track_asset_files,
    without_default_rows,
    write_rows,
)

MIN_SPARE = 64  # unused slots a table has at least: new keys fill them before a rebuild
SPARE_SHARE = 16  # and a 16th of its rows
LAYOUT = None  # "indexed" or "split" for every table (tests); None: choose_layout
SLOT_BYTES = 12  # a bucket of the index: an int64 key and an int32 slot
MAX_MEMORY = 1.5  # of the payload: an indexed table's most


def capacity_for(rows, maximum=max):
    """Slots of a table of `rows` rows: the default row's, the rows' and spare ones
    (maximum=tf.maximum for a tensor of rows)."""
    return rows + 1 + maximum(np.int64(MIN_SPARE), rows // SPARE_SHARE)


def index_buckets(rows):
    return max(MIN_BUCKETS, pow2_at_least(rows / MAX_LOAD))


def choose_layout(rows, dim):
    """ "indexed" or "split": the index when its memory (buckets and slots) stays within
    MAX_MEMORY of the payload (an 8-byte key and the row) or below the split layout's."""
    if LAYOUT is not None:
        return LAYOUT
    payload = rows * (8 + 4 * dim)
    indexed = index_buckets(rows) * SLOT_BYTES + capacity_for(rows) * 4 * dim
    parts, buckets = mutable.memory_layout(rows)
    return (
        "indexed"
        if indexed <= max(MAX_MEMORY * payload, parts * buckets * (8 + 4 * dim))
        else "split"
    )


def served_table(name, dim, keys, values, staging, index, default=None):
    """The served table of rows (keys, values: NumPy) in the layout choose_layout picks."""
    if choose_layout(len(keys), dim) == "indexed":
        return IndexedTable(name, dim, keys, values, staging, index, default)
    return ServedTable(name, dim, keys, values, staging, index, default)


def _dynamic(shape):
    """A shape the graph's constant folding cannot see: the tensors made of it are new
    buffers of each run (a folded constant would be kept in the graph besides the table)."""
    return tf.compat.v1.placeholder_with_default(tf.constant(shape, tf.int64), [len(shape)])


class _AssetFilledIndex(tf.lookup.experimental.DenseHashTable):
    """The index of a TF2 SavedModel's IndexedTable: its _initialize (run at load, after the
    variables are restored) fills the index and the rows from the asset files."""

    def __init__(self, owner, keys_file, values_file, **kwargs):
        self._owner = owner
        super().__init__(**kwargs)
        self._keys_file, self._values_file = track_asset_files(self, keys_file, values_file)

    def _initialize(self):
        return self._owner.fill(
            self,
            [
                (
                    tf.convert_to_tensor(self._keys_file),
                    tf.convert_to_tensor(self._values_file),
                    self._owner.rows,
                )
            ],
        )


class IndexedTable:
    """One table of a served model: an index (key -> slot) and a variable of rows.

    Made from the table's rows (keys, values: NumPy) at export: they are written into
    `staging` (table<index>.keys/.values) for the SavedModel's assets. In TF2 (eager) the
    table fills itself at load; in a tf.compat.v1 graph load_op() is the op that fills it,
    for the SavedModel's main op. default: the row keys not stored read (zeros when None).
    """

    parts = 1

    def __init__(self, name, dim, keys, values, staging, index, default=None):
        default = default_of(default, dim)
        stem = "%s/table%d." % (staging, index)
        rows = write_rows(stem, *without_default_rows(keys, values, default, dim), dim)
        self._make(name, dim, default, [(stem + "keys", stem + "values", rows)], 1)

    @classmethod
    def from_files(cls, name, dim, default, files, ranks):
        """A served table filled from files [(keys file, values file, rows)] written as
        write_rows does (by the ranks of a table over `ranks` ranks: rank_parts.py);
        tf.compat.v1 graphs only."""
        table = cls.__new__(cls)
        table._make(name, dim, default_of(default, dim), files, ranks)
        return table

    def _make(self, name, dim, default, files, ranks):
        self.name, self.dim, self.default = name, dim, default
        self.files, self.ranks = [files], ranks  # ranks: how many write the update files
        self.rows = sum(rows for _, _, rows in files)
        self.capacity = capacity_for(self.rows)
        label = "rec_sdk_served_%s" % name.replace("/", "_")
        kwargs = dict(
            key_dtype=tf.int64,
            value_dtype=tf.int32,
            default_value=0,
            empty_key=EMPTY_KEY,
            deleted_key=DELETED_KEY,
            initial_num_buckets=index_buckets(self.rows),
            checkpoint=False,
            name=label + "_index",
        )
        eager = tf.executing_eagerly()
        if eager and len(files) != 1:
            raise ValueError(
                "served table %r: a table filled from several files is for "
                "tf.compat.v1 graphs" % name
            )

        def variable(value, suffix, shape=None):
            # Saved with the model: the slots' counts as of the export, the default row
            # alone for the rows (filled from the assets at load).
            if eager:
                return tf.Variable(value, trainable=False, shape=shape, name=label + suffix)
            return tf.compat.v1.Variable(
                value, trainable=False, use_resource=True, shape=shape, name=label + suffix
            )

        self.values = variable(default[None], "_rows", tf.TensorShape([None, dim]))
        self.used = variable(np.int64(self.rows + 1), "_used")  # slots taken, slot 0's too
        self.stale = variable(np.int64(0), "_stale")  # taken slots no key maps to
        if eager:
            keys_file, values_file, _ = files[0]
            self.index = _AssetFilledIndex(self, keys_file, values_file, **kwargs)
        else:
            self.index = tf.lookup.experimental.DenseHashTable(**kwargs)
        self.tables = [self.index]
        self.variables = [self.values, self.used, self.stale]

    def fill(self, index, files):
        """Op filling the rows and the index from files [(keys path, values path, rows)]."""
        # Zeros, then the default row into slot 0 in place (a concatenation would hold the
        # rows twice while it runs).
        done = self.values.assign(
            tf.zeros(_dynamic([self.capacity, self.dim]), tf.float32), read_value=False
        )
        with tf.control_dependencies([done]):
            done = gen_resource_variable_ops.resource_scatter_update(
                self.values.handle, tf.constant([0], tf.int64), self.default[None]
            )
        first = 1
        for keys_path, values_path, rows in files:

            def write(keys, values, at):
                slots = at + tf.range(tf.size(keys, out_type=tf.int64))
                written = gen_resource_variable_ops.resource_scatter_update(
                    self.values.handle, slots, values
                )
                with tf.control_dependencies([written]):
                    return index.insert(keys, tf.cast(slots, tf.int32))

            with tf.control_dependencies([done]):
                done = stream_rows(keys_path, values_path, self.dim, rows, write, first)
            first += rows
        return done

    def load_op(self):
        """(tf.compat.v1 graphs) The op filling the table from its asset files (the file
        paths are registered as the graph's assets)."""
        return self.fill(
            self.index,
            [(mutable.asset_path(k), mutable.asset_path(v), rows) for k, v, rows in self.files[0]],
        )

    def lookup(self, ids):
        """Rows of int64 ids (any shape): [..., dim]; keys not stored (and the reserved
        ones, looked up as ABSENT_KEY) read the table's default."""
        slots = self.index.lookup(tf.maximum(tf.reshape(ids, [-1]), ABSENT_KEY))
        rows = tf.gather(self.values, slots)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def plan(self, keys, values, removed, replace):
        """What an update's rows [n, dim] of keys [n] and removed keys (replace: the rows are
        the whole table) change: a structure of tensors for write(). It only reads, so it
        runs before the model's lock is taken (apply.py). Rows the table holds already are
        skipped (a cumulative update repeats rows a follower has)."""
        values = all_values = tf.reshape(values, [-1, self.dim])
        all_keys = keys = tf.reshape(keys, [-1])
        slots = tf.reshape(self.index.lookup(keys), [-1])  # (TF2 leaves the shape unknown)
        changed = tf.reduce_any(tf.not_equal(tf.gather(self.values, slots), values), axis=1)
        keys, values = tf.boolean_mask(keys, changed), tf.boolean_mask(values, changed)
        slots = tf.boolean_mask(slots, changed)
        fresh = tf.equal(slots, 0)  # not stored (or removed): a new slot
        stored = tf.logical_not(fresh)
        removed = tf.reshape(removed, [-1])
        buried = tf.boolean_mask(removed, tf.reshape(self.index.lookup(removed), [-1]) > 0)
        new_keys = tf.boolean_mask(keys, fresh)
        used, stale = self.used.read_value(), self.stale.read_value()
        capacity = gen_resource_variable_ops.variable_shape(self.values.handle, tf.int64)[0]
        full = used + tf.size(new_keys, out_type=tf.int64) > capacity
        crowded = stale + tf.size(buried, out_type=tf.int64) > tf.maximum(
            np.int64(mutable.MIN_TOMBSTONES), (used - 1 - stale) // mutable.TOMBSTONE_SHARE
        )
        return {
            "whole": replace,
            "rebuild": tf.reduce_any([replace, full, crowded]),
            "new_keys": new_keys,
            "new_rows": tf.boolean_mask(values, fresh),
            "old_slots": tf.boolean_mask(slots, stored),
            "old_rows": tf.boolean_mask(values, stored),
            "buried": buried,
            "keys": keys,
            "values": values,
            "removed": removed,
            "all_keys": all_keys,
            "all_values": all_values,
        }

    def write(self, plan):
        """Op carrying out plan()'s changes (holding the model's lock): rows in place and new
        slots, or a rebuild."""
        return tf.cond(plan["rebuild"], lambda: self._rebuild(plan), lambda: self._write(plan))

    def _write(self, plan):
        new_slots = self.used.read_value() + tf.range(tf.size(plan["new_keys"], out_type=tf.int64))
        written = [
            gen_resource_variable_ops.resource_scatter_update(
                self.values.handle, plan["old_slots"], plan["old_rows"]
            ),
            gen_resource_variable_ops.resource_scatter_update(
                self.values.handle, new_slots, plan["new_rows"]
            ),
        ]
        with tf.control_dependencies(written):
            indexed = [
                self.index.insert(plan["new_keys"], tf.cast(new_slots, tf.int32)),
                self.index.insert(plan["buried"], tf.zeros_like(plan["buried"], tf.int32)),
            ]
        with tf.control_dependencies(indexed):
            counted = [
                self.used.assign_add(tf.size(new_slots, out_type=tf.int64)),
                self.stale.assign_add(tf.size(plan["buried"], out_type=tf.int64)),
            ]
        with tf.control_dependencies(counted):
            return self.used.read_value()

    def _rebuild(self, plan):
        """Refills the table with its live rows and the update's (or the update's alone,
        when it is the whole table): the rows into a fresh value of the variable (never
        fewer slots than it has), the index from empty buckets."""

        def kept_rows():
            keys, slots = self.index.export()
            keys, slots = tf.reshape(keys, [-1]), tf.reshape(slots, [-1])
            kept = tf.logical_and(
                tf.logical_and(keys > DELETED_KEY, slots > 0),
                tf.logical_not(isin(keys, tf.concat([plan["keys"], plan["removed"]], 0))),
            )
            return tf.boolean_mask(keys, kept), tf.gather(self.values, tf.boolean_mask(slots, kept))

        def whole():  # the update's rows are the whole table (all of them, changed or not)
            return (
                tf.zeros([0], tf.int64),
                tf.zeros([0, self.dim], tf.float32),
                plan["all_keys"],
                plan["all_values"],
            )

        old_keys, old_rows, new_keys, new_rows = tf.cond(
            plan["whole"], whole, lambda: kept_rows() + (plan["keys"], plan["values"])
        )
        written = tf.logical_not(is_default(new_rows, self.default, self.dim))
        keys = tf.concat([old_keys, tf.boolean_mask(new_keys, written)], 0)
        rows = tf.concat([old_rows, tf.boolean_mask(new_rows, written)], 0)
        n = tf.size(keys, out_type=tf.int64)
        capacity = tf.maximum(
            capacity_for(n, tf.maximum),
            gen_resource_variable_ops.variable_shape(self.values.handle, tf.int64)[0],
        )
        with tf.control_dependencies([keys, rows]):  # copied out before anything changes
            assigned = self.values.assign(
                tf.concat(
                    [
                        self.default[None],
                        rows,
                        tf.zeros(tf.stack([capacity - 1 - n, np.int64(self.dim)]), tf.float32),
                    ],
                    0,
                ),
                read_value=False,
            )
            emptied = empty_buckets(self.index, n, 1, tf.int32)
        with tf.control_dependencies([assigned, emptied]):
            filled = self.index.insert(keys, tf.cast(1 + tf.range(n), tf.int32))
        with tf.control_dependencies([filled]):
            counted = [self.used.assign(n + 1), self.stale.assign(0)]
        with tf.control_dependencies(counted):
            return self.used.read_value()

    def size(self):
        """Op: the keys served."""
        return self.used.read_value() - 1 - self.stale.read_value()
