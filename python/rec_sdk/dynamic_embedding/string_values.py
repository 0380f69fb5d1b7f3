"""de.Variables of string values (TFRA's [int64, string]): `dim` strings per key, e.g. a
feature's tokens or an id's labels, stored, read and checkpointed, never trained.

A rec_sdk table row holds fixed-width words, which strings are not: each shard of such a
variable is TensorFlow's own MutableHashTable of int64 keys -> [dim] strings (int32 keys are
widened to int64; TensorFlow has no string-valued table of string keys, nor has TFRA). Keys
are routed to shards by the variable's partitioner as for any de.Variable. `tables` are those
TensorFlow tables (size(), lookup, insert, remove, export: TFRA's table interface), whose
saveables a tf.compat.v1.train.Saver saves and restores as `<table op>-keys` / `-values`, as
TFRA's are; tf.train.Checkpoint saves the variable's keys and values together.
"""

import copy
import numbers

import numpy as np
import tensorflow as tf

from rec_sdk.base.validation import check_bool
from rec_sdk.dynamic_embedding import variable as variable_module
from rec_sdk.dynamic_embedding.shadow_ops import shaped
from rec_sdk.dynamic_embedding.shards import default_partition_fn, table_names
from rec_sdk.dynamic_embedding.slots_and_policies import joined
from rec_sdk.dynamic_embedding.tfra_table import TableSaveable

# A lookup's default for keys not stored: no stored row equals it (it tells exists apart).
_ABSENT = "\x00rec_sdk:absent\x00"


class StringValues(variable_module.Variable):
    """A de.Variable whose value_dtype is tf.string (see the module docstring); created by
    de.Variable / de.get_variable when value_dtype is tf.string."""

    def __init__(
        self,
        key_dtype=tf.int64,
        value_dtype=tf.string,
        dim=1,
        devices=None,
        partitioner=default_partition_fn,
        shared_name=None,
        name="DynamicEmbedding_Variable",
        initializer=None,
        trainable=True,
        checkpoint=True,
        init_size=0,
        kv_creator=None,
        restrict_policy=None,
        bp_v2=False,
        servable=False,
    ):
        # pylint: disable=super-init-not-called  (no rec_sdk table: TensorFlow's tables)
        del trainable, init_size, kv_creator, bp_v2
        key_dtype = tf.as_dtype(key_dtype)
        if key_dtype not in (tf.int64, tf.int32):
            raise TypeError(
                "key-value dtype (%s-string) is not supported: string values take "
                "tf.int64 or tf.int32 keys" % key_dtype.name
            )
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
            raise ValueError("dim must be an integer >= 1, got %r" % (dim,))
        for what, value in (("restrict_policy", restrict_policy), ("servable", servable)):
            if value:
                raise ValueError(
                    "%s: de.Variable %r holds string values, which are not "
                    "trained or served; got %r" % (what, name, value)
                )
        check_bool("checkpoint", checkpoint)
        self.key_dtype, self.table_key_dtype = key_dtype, tf.int64
        self.value_dtype, self.dim = tf.string, int(dim)
        self.devices = variable_module.checked_devices(devices)
        self.shard_num = len(self.devices)
        self.partition_fn, self.shared_name, self.name = partitioner, shared_name, name
        self.trainable, self.checkpoint, self.initializer = False, checkpoint, initializer
        self.init_size, self.kv_creator, self.bp_v2, self.servable = 0, None, False, False
        self.default_value = _default_row(initializer, self.dim, name)
        self._shards, self.key_strings, self._restrict_policy = [], None, None
        self._trainable_store, self._size_ops, self._access_ops = {}, {}, []
        self.graph = tf.compat.v1.get_default_graph()
        self._tables_of_values, self._string_tables = [], []
        with tf.init_scope(), tf.name_scope(name.split("/")[-1]) as scope:
            self.eager = tf.executing_eagerly()
            for device, table_name in zip(self.devices, table_names(name, self.shard_num)):
                with tf.device(device):
                    table = tf.lookup.experimental.MutableHashTable(
                        tf.int64, tf.string, self.default_value, name=table_name, checkpoint=False
                    )
                self._tables_of_values.append(table)
                # Saved and restored by Savers under TFRA's name: <scope>/<table name>.
                shard = StringTable(self, table, table_name, scope + table_name)
                self._string_tables.append(shard)
                if checkpoint and not self.eager:
                    tf.compat.v1.add_to_collection(
                        tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, shard.saveable
                    )

    # --- TFRA's API ---
    @property
    def tables(self):
        """The shards with TFRA's table interface (StringTable over TensorFlow's
        MutableHashTable)."""
        return list(self._string_tables)

    def checked_value_keys(self, keys):
        keys = self._converted(keys, self.key_dtype, integer=True)
        if keys.dtype != self.key_dtype:
            raise variable_module.DtypeError(
                "keys of %r must be %s (the key_dtype), got %s"
                % (self.name, self.key_dtype.name, keys.dtype.name)
            )
        return tf.cast(keys, tf.int64)

    def checked_values(self, values, keys, what="values"):
        if not isinstance(values, (tf.Tensor, tf.Variable)) and np.asarray(
            values
        ).dtype.kind not in ("U", "S", "O"):
            raise variable_module.DtypeError(
                "%s of %r must be strings (the value_dtype), got %s"
                % (what, self.name, np.asarray(values).dtype)
            )
        return super().checked_values(values, keys, what)

    def lookup(self, keys, return_exists=False, name=None):
        """Values of keys (any shape) -> keys.shape + [dim] strings; keys not stored get the
        initializer's strings (not inserted)."""
        keys = self.checked_value_keys(keys)
        with tf.name_scope(name or "%s_lookup" % self.name.split("/")[-1]):
            flat = tf.reshape(keys, [-1])
            _, shard_keys, positions = self.split_keys(flat)
            found = [_find(t, k, self.dim) for t, k in zip(self._tables_of_values, shard_keys)]
            if positions is None:
                values, exists = found[0]
            else:
                values = tf.dynamic_stitch(positions, [v for v, _ in found])
                exists = tf.dynamic_stitch(positions, [e for _, e in found])
            values = shaped(
                tf.where(
                    exists[:, None], values, tf.broadcast_to(self.default_value, tf.shape(values))
                ),
                keys,
                self.dim,
            )
            return (values, tf.reshape(exists, tf.shape(keys))) if return_exists else values

    def upsert(self, keys, values, name=None):
        """Inserts or overwrites keys (any shape) with values (keys.shape + [dim] strings)."""
        keys = self.checked_value_keys(keys)
        values = self.checked_values(values, keys)
        with tf.name_scope(name or "%s_upsert" % self.name.split("/")[-1]):
            parts, shard_keys, _ = self.split_keys(tf.reshape(keys, [-1]))
            rows = self.by_shard(parts, tf.reshape(values, [-1, self.dim]))
            return tf.group(
                [t.insert(k, v) for t, k, v in zip(self._tables_of_values, shard_keys, rows)]
            )

    def remove(self, keys, name=None):
        """Removes keys (absent keys are ignored)."""
        keys = self.checked_value_keys(keys)
        with tf.name_scope(name or "%s_remove" % self.name.split("/")[-1]):
            _, shard_keys, _ = self.split_keys(tf.reshape(keys, [-1]))
            return tf.group([t.remove(k) for t, k in zip(self._tables_of_values, shard_keys)])

    def accum(self, keys, old_values, new_values, exists, name=None):
        raise TypeError(
            "accum: de.Variable %r holds string values, which cannot be added" % self.name
        )

    def export(self, name=None):
        """(keys [n], values [n, dim]) of every stored key, shard after shard."""
        with tf.name_scope(name or "%s_export" % self.name.split("/")[-1]):
            exports = [t.export() for t in self._tables_of_values]
            return joined(
                [(tf.cast(k, self.key_dtype), tf.reshape(v, [-1, self.dim])) for k, v in exports]
            )

    def clear(self, name=None):
        """Removes every key of every shard."""
        with tf.name_scope(name or "%s_clear" % self.name.split("/")[-1]):
            # The MutableHashTables themselves (a SavedModel's copy of the variable maps
            # them, not its StringTables).
            return tf.group([_clear(t) for t in self._tables_of_values])

    def _shard_size(self, index):
        return self._tables_of_values[index].size()

    def read_rows(self, flat, name="lookup", as_rows=False, **lookup_args):
        raise TypeError(
            "de.Variable %r holds string values: they are looked up with "
            "lookup(), not embedded or trained" % self.name
        )

    def note_writes(self):
        pass

    def save_to_file_system(self, dirpath, *args, **kwargs):
        raise TypeError(
            "save_to_file_system: de.Variable %r holds string values, which the "
            "key and value files cannot hold; use a Saver, tf.train.Checkpoint or "
            "export()" % self.name
        )

    def load_from_file_system(self, dirpath, *args, **kwargs):
        raise TypeError(
            "load_from_file_system: de.Variable %r holds string values, which the "
            "key and value files cannot hold" % self.name
        )

    load_from_file_system_with_restore_function = load_from_file_system

    def get_slot_variables(self, optimizer):
        return []

    # --- tf.train.Checkpoint / SavedModel ---
    def _serialize_to_tensors(self):
        keys, values = self.export()
        return {"keys": keys, "values": values}

    def _restore_from_tensors(self, restored_tensors):
        keys = tf.reshape(restored_tensors["keys"], [-1])
        values = tf.reshape(restored_tensors["values"], [-1, self.dim])
        cleared = self.clear()
        with tf.control_dependencies([cleared]):
            return self.upsert(tf.cast(keys, self.key_dtype), values)

    def _resources(self):
        return {"table_%d" % i: t for i, t in enumerate(self._tables_of_values)}

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        del tensor_map, options, kwargs
        exported = copy.copy(self)
        exported._tables_of_values = [object_map.get(t, t) for t in self._tables_of_values]
        object_map[self] = exported
        return []


def _clear(table):
    """Op removing every key of a MutableHashTable."""
    return table.remove(table.export()[0])


def _find(table, keys, dim):
    """(values [n, dim], exists [n]) of flat int64 keys in a MutableHashTable of strings."""
    found = table.lookup(keys, dynamic_default_values=tf.fill([tf.size(keys), dim], _ABSENT))
    return found, tf.reduce_any(tf.not_equal(found, _ABSENT), axis=1)


class StringTable:
    """A shard of a string-valued de.Variable with TFRA's table interface: ops on that shard
    alone, over TensorFlow's MutableHashTable (`table`)."""

    def __init__(self, variable, table, name, saveable_name):
        self._variable, self.table, self.name = variable, table, name
        self._saveable_name, self._saveable = saveable_name, None

    resource_handle = property(lambda self: self.table.resource_handle)
    key_dtype = property(lambda self: self._variable.key_dtype)
    value_dtype = property(lambda self: tf.string)

    @property
    def saveable(self):
        """TFRA's saveable: specs `<table op>-keys` / `-values`; restore replaces the rows."""
        if self._saveable is None or tf.executing_eagerly():
            self._saveable = TableSaveable(self, self._saveable_name)
        return self._saveable

    def size(self, name=None):
        return self.table.size(name=name)

    def lookup(self, keys, dynamic_default_values=None, return_exists=False, name=None):
        """[dim] strings of each key (any shape): stored ones, else dynamic_default_values
        (keys.shape + [dim]) when given, else the variable's default."""
        keys = self._variable.checked_value_keys(keys)
        dim = self._variable.dim
        with tf.name_scope(name or "%s_lookup" % self.name):
            flat = tf.reshape(keys, [-1])
            values, exists = _find(self.table, flat, dim)
            default = (
                tf.reshape(dynamic_default_values, [-1, dim])
                if dynamic_default_values is not None
                else tf.broadcast_to(self._variable.default_value, tf.shape(values))
            )
            values = shaped(tf.where(exists[:, None], values, default), keys, dim)
            return (values, tf.reshape(exists, tf.shape(keys))) if return_exists else values

    def __getitem__(self, keys):
        return self.lookup(keys)

    def insert(self, keys, values, name=None):
        keys = self._variable.checked_value_keys(keys)
        values = self._variable.checked_values(values, keys)
        return self.table.insert(
            tf.reshape(keys, [-1]), tf.reshape(values, [-1, self._variable.dim]), name=name
        )

    def remove(self, keys, name=None):
        keys = self._variable.checked_value_keys(keys)
        return self.table.remove(tf.reshape(keys, [-1]), name=name)

    def clear(self, name=None):
        with tf.name_scope(name or "%s_clear" % self.name):
            return _clear(self.table)

    def import_values(self, keys, values, name=None):
        """Op replacing this shard's rows with keys and values (TFRA's table import)."""
        with tf.control_dependencies([self.clear()]):
            return self.insert(keys, values, name=name)

    def export(self, name=None):
        keys, values = self.table.export(name=name)
        return tf.cast(keys, self.key_dtype), values

    def accum(self, *args, **kwargs):
        raise TypeError("accum: table %r holds string values, which cannot be added" % self.name)


def _default_row(initializer, dim, name):
    """The [dim] strings of keys not stored: "" (no initializer), one string or an array of 1
    or dim strings."""
    if initializer is None:
        return tf.constant([""] * dim)
    if callable(initializer):
        raise TypeError(
            "initializer of de.Variable %r (string values) must be a string or an "
            "array of strings, got %r" % (name, initializer)
        )
    row = np.asarray(initializer).reshape([-1])
    if row.size not in (1, dim) or row.dtype.kind not in ("U", "S", "O"):
        raise ValueError(
            "initializer of de.Variable %r must be a string or 1 or %d (dim) "
            "strings, got %r" % (name, dim, initializer)
        )
    return tf.constant(np.broadcast_to(row, [dim]).tolist(), tf.string)


variable_module.VALUE_DTYPE_CLASSES[tf.string] = StringValues
