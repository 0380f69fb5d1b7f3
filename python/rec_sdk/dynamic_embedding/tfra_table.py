"""de.Variable.tables: TFRA's table interface (its CuckooHashTable's) over each shard.

A TFRA script reaches a variable's shards through `var.tables[i]` and uses them as TFRA's
tables: `size()` is an int64 tensor placed with the table (a ps recipe runs
`sess.run([t.size() for t in emb.tables])`), `export()` gives (keys, values), `lookup` takes
dynamic_default_values and return_exists, `insert`/`remove`/`clear`/`accum` are ops on that
shard alone (no partitioner), and `saveable` holds the specs `<table op>-keys` / `-values`
whose `restore` imports the rows (TFRA's warm-start recipes read them). Keys and values are
the variable's (string keys, half-precision values), converted as the variable converts them.
rec_sdk's own code uses the shards themselves (de.Variable.shards: rec_sdk tables, whose
SDK-style methods differ, e.g. size() is a Python int); any attribute this class does not
define is the shard's.
"""

import weakref

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # TFRA's saveable's base

from rec_sdk.dynamic_embedding import value_codec
from rec_sdk.dynamic_embedding.shadow_ops import shaped
from rec_sdk.dynamic_embedding.slots_and_policies import by_key
from rec_sdk.ops import table_ops


class TfraTable:
    """Shard `index` of a de.Variable with TFRA's table methods (see the module docstring)."""

    def __init__(self, variable, index):
        self._variable = variable
        self._shard = variable.shards[index]

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_variable", "_shard"):
            raise AttributeError(name)
        return getattr(self._shard, name)

    def __eq__(self, other):
        return isinstance(other, TfraTable) and other._shard is self._shard  # pylint: disable=protected-access

    def __hash__(self):
        return hash(id(self._shard))

    def __repr__(self):
        return "<de table %r of %r>" % (self.name, self._variable.name)

    @property
    def shard(self):
        """The rec_sdk table (SparseEmbedding) this is the TFRA interface of."""
        return self._shard

    # --- TFRA's properties ---
    @property
    def name(self):
        """The table's name, <variable>_mht_<i>of<n> (TFRA: the table op's last component)."""
        return self._shard.table_name

    @property
    def resource_handle(self):
        return self._shard.handle

    @property
    def key_dtype(self):
        return self._variable.key_dtype

    @property
    def value_dtype(self):
        return self._variable.value_dtype

    @property
    def saveable(self):
        """TFRA's saveable of the table: specs `<table op name>-keys` and `-values` (the
        table's export), restore() importing (replacing the table's rows). In a graph, one
        object per table (as TFRA's attribute), which Savers also write (rec_sdk.saver.patches)."""
        if tf.executing_eagerly():
            return TableSaveable(self, self.name)
        found = _saveables.get(self._shard)
        if found is None:
            # TFRA's table op: <the variable's name scope>/<table name>.
            scope = self.resource_handle.op.name.rpartition("/")[0]
            found = _saveables[self._shard] = TableSaveable(
                self, scope + "/" + self.name if scope else self.name
            )
        return found

    def __getitem__(self, keys):
        return self.lookup(keys)

    # --- TFRA's methods: ops on this shard alone ---
    def _scope(self, name, what):
        return tf.name_scope(name or "%s_%s" % (self.name, what))

    def _colocated(self):
        return tf.compat.v1.colocate_with(self.resource_handle, ignore_existing=True)

    def _rows(self, values, keys, what="values"):
        """Checked values of keys as the shard stores them ([n, stored words])."""
        variable = self._variable
        values = variable.checked_values(values, keys, what)
        return value_codec.encode(
            tf.reshape(values, [-1, variable.dim]), variable.value_dtype, variable.dim
        )

    def size(self, name=None):
        """Scalar int64 tensor: the keys this shard holds, computed where it lives."""
        with self._scope(name, "Size"), self._colocated():
            return table_ops.size(self.resource_handle)

    def lookup(self, keys, dynamic_default_values=None, return_exists=False, name=None):
        """Values of keys (any shape) -> keys.shape + [dim]: stored rows, else
        dynamic_default_values (keys.shape + [dim]) when given, else the initializer's values
        (not inserted). With return_exists also (values, exists)."""
        variable = self._variable
        keys = variable.checked_keys(keys)
        with self._scope(name, "lookup"), self._colocated():
            flat = tf.reshape(keys, [-1])
            rows, exists = table_ops.lookup(
                self.resource_handle,
                flat,
                variable.stored_dim,
                init_missing=True,
            )
            values = value_codec.decode(rows, variable.value_dtype, variable.dim)
            defaults = variable.default_rows
            if dynamic_default_values is not None:
                given = tf.reshape(
                    tf.cast(dynamic_default_values, values.dtype), [-1, variable.dim]
                )
                values = tf.where(exists[:, None], values, given)
            elif defaults is not None:
                values = tf.where(exists[:, None], values, defaults(tf.size(flat)))
            values = shaped(values, keys, variable.dim)
            return (values, tf.reshape(exists, tf.shape(keys))) if return_exists else values

    def insert(self, keys, values, name=None):
        """Op inserting or overwriting keys with values (keys.shape + [dim]) in this shard."""
        variable = self._variable
        keys = variable.checked_keys(keys, record=True)
        rows = self._rows(values, keys)
        variable.note_writes()
        with self._scope(name, "insert"), self._colocated():
            return table_ops.upsert(self.resource_handle, tf.reshape(keys, [-1]), rows)

    def remove(self, keys, name=None):
        """Op removing keys from this shard (absent keys are ignored). keys must be a tensor
        of the key_dtype (TFRA's rule: TypeError otherwise)."""
        if not isinstance(keys, (tf.Tensor, tf.Variable)) or keys.dtype != self.key_dtype:
            raise TypeError(
                "keys of table %r must be a tensor of %s (the key_dtype), got %r"
                % (self.name, self.key_dtype.name, keys)
            )
        variable = self._variable
        variable.note_writes()
        with self._scope(name, "remove"):
            flat = tf.reshape(variable.table_keys(keys), [-1])
            removed = [table_ops.remove(self.resource_handle, flat)]
            return tf.group(removed + variable.forget_strings(flat, removed))

    def clear(self, name=None):
        """Op removing every key of this shard."""
        self._variable.note_writes()
        with self._scope(name, "clear"):
            return tf.group(table_ops.clear(self.resource_handle))

    def accum(self, keys, values_or_deltas, exists, name=None):
        """Op: per key, if exists and the key is stored, adds values_or_deltas to its row; if
        not exists and the key is absent, inserts values_or_deltas; else leaves it."""
        variable = self._variable
        keys = variable.checked_keys(keys, record=True)
        given = tf.reshape(
            variable.checked_values(values_or_deltas, keys),
            [-1, variable.dim],
        )
        exists = variable.checked_exists(exists, keys)
        variable.note_writes()
        with self._scope(name, "accum"), self._colocated():
            return accum_rows(
                variable,
                self.resource_handle,
                tf.reshape(keys, [-1]),
                given,
                given,
                tf.reshape(exists, [-1]),
            )

    def export(self, name=None):
        """(keys [n], values [n, dim]) of this shard, in ascending key order."""
        with self._scope(name, "export"), self._colocated():
            return export_rows(self._variable, self.resource_handle)

    def import_values(self, keys, values, name=None):
        """Op replacing this shard's rows with keys and values (TFRA's table import)."""
        variable = self._variable
        keys = variable.checked_keys(keys, record=True)
        rows = self._rows(values, keys)
        variable.note_writes()
        with self._scope(name, "import"), self._colocated():
            cleared = table_ops.clear(self.resource_handle)
            with tf.control_dependencies([cleared]):
                return table_ops.upsert(self.resource_handle, tf.reshape(keys, [-1]), rows)


def export_rows(variable, handle):
    """(keys [n], values [n, dim]) of the variable's shard `handle`, in ascending key order,
    as the variable's keys and values (the shards' part of de.Variable.export)."""
    keys, rows = by_key(
        *table_ops.export(handle, variable.table_key_dtype, variable.stored_dim)[:2]
    )
    return (
        variable.public_keys(keys),
        value_codec.decode(rows, variable.value_dtype, variable.dim),
    )


def accum_rows(variable, handle, keys, deltas, new_rows, exists):
    """Op on the variable's shard `handle` (flat table keys, [n, dim] values, [n] flags):
    where exists and the key is stored its row gets deltas added; where not exists and it is
    absent it is inserted with new_rows; other keys are left (TFRA's accum)."""
    current, present = table_ops.lookup(handle, keys, variable.stored_dim)
    current = value_codec.decode(current, variable.value_dtype, variable.dim)
    add = tf.logical_and(exists, present)
    insert = tf.logical_and(tf.logical_not(exists), tf.logical_not(present))
    target = value_codec.encode(
        tf.where(add[:, None], current + deltas, new_rows), variable.value_dtype, variable.dim
    )
    keep = tf.logical_or(add, insert)
    return table_ops.upsert(handle, tf.boolean_mask(keys, keep), tf.boolean_mask(target, keep))


# {shard: its TfraTable's saveable} (graph mode).
_saveables = weakref.WeakKeyDictionary()


class TableSaveable(saveable_object.SaveableObject):
    """TFRA's table saveable: the table's keys and values as two checkpoint tensors,
    `<name>-keys` and `<name>-values`; restore imports them into the table. `op` is the
    table (TFRA's)."""

    def __init__(self, table, name):
        keys, values = table.export()
        specs = [
            saveable_object.SaveSpec(keys, "", name + "-keys"),
            saveable_object.SaveSpec(values, "", name + "-values"),
        ]
        super().__init__(table, specs, name)

    def restore(self, restored_tensors, restored_shapes, name=None):
        del restored_shapes
        keys, values = restored_tensors[:2]
        return self.op.import_values(keys, values, name=name)
