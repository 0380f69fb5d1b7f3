"""String keys of a de.Variable (key_dtype=tf.string).

rec_sdk's tables index int64 keys. A string key is stored under its 63-bit fingerprint
(FarmHash Fingerprint64 modulo 2**63 - 1, `tf.strings.to_hash_bucket_fast`), so lookups,
training, slots, restrict policies and checkpoints of the rows run on the int64 path
unchanged, and int64 variables pay nothing for strings. A dictionary (TensorFlow's
MutableHashTable, fingerprint -> string) remembers the string of each fingerprint that an
upsert, an accum or a training lookup wrote, so exports give the strings back. Two strings
with one fingerprint would share a row: with n keys the chance that any two do is about
n**2 / 2**64 (1e-4 for 10^8 keys).
"""

import contextlib

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # the base of TF's saveables

FINGERPRINT_BUCKETS = 2**63 - 1


def table_dtype(key_dtype):
    """The key dtype of the tables of a variable whose keys are `key_dtype`."""
    return tf.int64 if key_dtype == tf.string else key_dtype


def fingerprints(keys):
    """int64 fingerprints (>= 0) of string keys, same shape."""
    return tf.strings.to_hash_bucket_fast(keys, FINGERPRINT_BUCKETS)


class KeyStrings:
    """The fingerprint -> string dictionary of a variable with string keys. In graph mode it
    is a SAVEABLE_OBJECTS entry (when checkpoint), so the Saver's TensorFlow checkpoint keeps
    it; in TF2 the variable saves the strings of its keys with its rows."""

    def __init__(self, name, checkpoint):
        with tf.init_scope():
            self.table = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.string, default_value="", name=name, checkpoint=checkpoint
            )
            if checkpoint and not tf.executing_eagerly():
                _name_saveable_by_its_op(self.table)

    def record(self, keys, hashed):
        """Op remembering the strings `keys` of the fingerprints `hashed`."""
        return self.table.insert(tf.reshape(hashed, [-1]), tf.reshape(keys, [-1]))

    def strings(self, hashed):
        """The strings of fingerprints (same shape; "" for one never recorded)."""
        # The raw op with a default built here (in the keys' graph, which need not be the
        # default one): the table's own default is an eager tensor, which a SavedModel's
        # save graph cannot capture.
        in_graph = (
            hashed.graph.as_default()
            if not tf.executing_eagerly() and hasattr(hashed, "graph")
            else contextlib.nullcontext()
        )
        with in_graph:
            return tf.raw_ops.LookupTableFindV2(
                table_handle=self.table.resource_handle, keys=hashed, default_value=tf.constant("")
            )

    def remove(self, hashed):
        return self.table.remove(tf.reshape(hashed, [-1]))

    def clear(self):
        return self.table.remove(self.table.export()[0])


def _name_saveable_by_its_op(table):
    """Replaces the graph's SAVEABLE_OBJECTS entry of `table` with one named by the table's
    op, which a scope or a second table of the name makes differ from the name it was given:
    a MetaGraph stores the entry as that name, and importing it (a SavedModel's loaders)
    looks the name up as an op. The checkpoint keys (the specs' names) stay as they were."""
    saveables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    for i, saveable in enumerate(saveables):
        if getattr(saveable, "op", None) is table:
            saveables[i] = _NamedByOp(saveable, table.resource_handle.op.name)


class _NamedByOp(saveable_object.SaveableObject):
    """A saveable under another name (its specs unchanged)."""

    def __init__(self, saveable, name):
        super().__init__(saveable.op, saveable.specs, name)
        self._saveable = saveable

    def restore(self, restored_tensors, restored_shapes):
        return self._saveable.restore(restored_tensors, restored_shapes)
