"""A de.Variable's operations on its rows (rec_sdk.dynamic_embedding.variable.Variable is a
VariableOps): reading rows by key over its shards, lookup, upsert, remove, accum, export,
clear and size, each checking its keys and values through the variable."""

import numbers

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.dynamic_embedding import value_codec
from rec_sdk.dynamic_embedding.shadow_ops import shaped
from rec_sdk.dynamic_embedding.slots_and_policies import by_key, joined
from rec_sdk.dynamic_embedding.tfra_table import accum_rows, export_rows
from rec_sdk.ops import table_ops


class VariableOps:
    """The row operations of a de.Variable (a mixin of Variable)."""

    @property
    def row_dtype(self):
        """The dtype training sees the rows in: float32 for float32 and half-precision
        variables (whose rows the optimizers train in float32), else value_dtype."""
        return tf.float32 if value_codec.native(self.value_dtype) else self.value_dtype

    def read_rows(self, flat, name="lookup", as_rows=False, **lookup_args):
        """Values [n, dim] (missing keys: initial values) and exists [n] of flat keys;
        lookup_args go to table_ops.lookup (e.g. a slot, which is float32). as_rows: in
        row_dtype (what lookups train), not value_dtype."""
        _, keys, positions = self.split_keys(flat)
        values, exists = [], []
        for table, k in zip(self._shards, keys):
            v, e = table_ops.lookup(
                table.handle, k, self.stored_dim, init_missing=True, name=name, **lookup_args
            )
            values.append(v)
            exists.append(e)
        if positions is None:
            values, exists = values[0], exists[0]
        else:
            values = tf.dynamic_stitch(positions, values)
            exists = tf.dynamic_stitch(positions, exists)
        if "slot" in lookup_args or (as_rows and self.row_dtype == tf.float32):
            return values, exists
        values = value_codec.decode(values, self.value_dtype, self.dim)
        if self.default_rows is not None:
            values = tf.where(exists[:, None], values, self.default_rows(tf.size(flat)))
        return values, exists

    def lookup_rows(self, keys, return_exists, **lookup_args):
        """lookup() of checked keys, reading each distinct key once (batches repeat popular
        keys)."""
        unique, inverse = table_ops.unique_keys(tf.reshape(keys, [-1]))
        values, exists = self.read_rows(unique, **lookup_args)
        values = shaped(table_ops.gather_rows(values, inverse), keys, self.dim)
        if not return_exists:
            return values
        exists = tf.reshape(tf.gather(exists, inverse), tf.shape(keys))
        exists.set_shape(keys.shape)
        return values, exists

    # --- TFRA methods ---
    def lookup(self, keys, return_exists=False, name=None):
        """Values of keys (any shape) -> keys.shape + [dim]; missing keys get the initializer's
        values and are not inserted. With return_exists, also a bool tensor of keys.shape."""
        keys = self.checked_keys(keys)
        with tf.name_scope(name or "%s_lookup" % self.name.split("/")[-1]):
            return self.lookup_rows(keys, return_exists)

    def upsert(self, keys, values, name=None):
        """Inserts or overwrites keys (any shape) with values (keys.shape + [dim])."""
        keys = self.checked_keys(keys, record=True)
        values = self.checked_values(values, keys)
        self.note_writes()
        with tf.name_scope(name or "%s_upsert" % self.name.split("/")[-1]):
            flat = tf.reshape(keys, [-1])
            rows = value_codec.encode(
                tf.reshape(values, [-1, self.dim]), self.value_dtype, self.dim
            )
            parts, shard_keys, _ = self.split_keys(flat)
            return tf.group(
                [
                    table_ops.upsert(t.handle, k, v)
                    for t, k, v in zip(self._shards, shard_keys, self.by_shard(parts, rows))
                ]
            )

    def remove(self, keys, name=None):
        """Removes keys (absent keys are ignored), with their slots and statistics."""
        keys = self.checked_keys(keys)
        self.note_writes()
        with tf.name_scope(name or "%s_remove" % self.name.split("/")[-1]):
            flat = tf.reshape(keys, [-1])
            _, shard_keys, _ = self.split_keys(flat)
            removed = [table_ops.remove(t.handle, k) for t, k in zip(self._shards, shard_keys)]
            return tf.group(removed + self.forget_strings(flat, removed))

    def forget_strings(self, flat, removed):
        """[op] dropping from the string-key dictionary the keys of `flat` (table keys) that
        no shard holds once `removed` ran ([] for other keys): a key inserted into another
        shard through its table keeps its string while that copy lives."""
        if self.key_strings is None:
            return []
        with tf.control_dependencies(removed):
            held = tf.reduce_any(
                tf.stack(
                    [table_ops.lookup(t.handle, flat, self.stored_dim)[1] for t in self._shards]
                ),
                0,
            )
        return [self.key_strings.remove(tf.boolean_mask(flat, tf.logical_not(held)))]

    def accum(self, keys, old_values, new_values, exists, name=None):
        """Per key: if exists and the key is stored, adds new_values - old_values to it; if not
        exists and the key is absent, inserts new_values; otherwise leaves it alone."""
        keys = self.checked_keys(keys, record=True)
        old_values = self.checked_values(old_values, keys, "old_values")
        new_values = self.checked_values(new_values, keys, "new_values")
        exists = self.checked_exists(exists, keys)
        self.note_writes()
        with tf.name_scope(name or "%s_accum" % self.name.split("/")[-1]):
            flat = tf.reshape(keys, [-1])
            rows = tf.reshape(new_values - old_values, [-1, self.dim])
            new_rows = tf.reshape(new_values, [-1, self.dim])
            flags = tf.reshape(exists, [-1])
            parts, shard_keys, _ = self.split_keys(flat)
            return tf.group(
                [
                    accum_rows(self, t.handle, k, delta, new, flag)
                    for t, k, delta, new, flag in zip(
                        self._shards,
                        shard_keys,
                        self.by_shard(parts, rows),
                        self.by_shard(parts, new_rows),
                        self.by_shard(parts, flags),
                    )
                ]
            )

    def export(self, name=None):
        """(keys [n], values [n, dim]) of every stored key, shard after shard, each shard's
        in ascending key order (the same order for the slots' and the status' exports)."""
        with tf.name_scope(name or "%s_export" % self.name.split("/")[-1]):
            return joined([export_rows(self, t.handle) for t in self._shards])

    def clear(self, name=None):
        """Removes every key of every shard."""
        self.note_writes()
        with tf.name_scope(name or "%s_clear" % self.name.split("/")[-1]):
            return tf.group(
                [table_ops.clear(t.handle) for t in self._shards]
                + ([self.key_strings.clear()] if self.key_strings else [])
            )

    def size(self, index=None, name=None):
        """Keys stored in shard `index`, or in all shards (int64 scalar). Once the graph is
        finalized (e.g. by MonitoredTrainingSession), the last size op built at its top level
        (no control dependency, no control flow) is returned, as TFRA's scripts expect."""
        graph = tf.compat.v1.get_default_graph()
        key = (graph, index)
        if graph.finalized and key in self._size_ops:
            return self._size_ops[key]
        size = self._build_size(index, name)
        top_level = tf_patches.at_graph_top_level(graph)
        if top_level and not tf.executing_eagerly():
            self._size_ops[key] = size
        return size

    def _build_size(self, index, name):
        with tf.name_scope(name or "%s_size" % self.name.split("/")[-1]):
            if index is not None:
                if (
                    isinstance(index, bool)
                    or not isinstance(index, numbers.Integral)
                    or not 0 <= index < self.shard_num
                ):
                    raise ValueError(
                        "index must be a shard number in [0, %d), got %r" % (self.shard_num, index)
                    )
                return self._shard_size(index)
            return tf.add_n([self._shard_size(i) for i in range(self.shard_num)])

    def _shard_size(self, index):
        return table_ops.size(self._shards[index].handle)

    def export_keys_and_scores(self, split_size=None, name=None):
        """(keys [n], scores [n] int64) of every stored key, shard after shard: the score is
        the key's last-seen clock (the statistic TFRA's HKV tables score keys by)."""
        del split_size
        with tf.name_scope(name or "%s_export_keys_and_scores" % self.name.split("/")[-1]):
            return joined(
                [
                    (self.public_keys(k), seen)
                    for k, seen, _ in (
                        by_key(*table_ops.export_access(t.handle)) for t in self._shards
                    )
                ]
            )
