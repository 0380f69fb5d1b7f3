"""Served tables kept in rec_sdk tables: the plugin mode of export_serving_model.

For tables larger than a serving machine's memory: the SavedModel keeps each table in a
rec_sdk table (read-only: lookups never insert), optionally with an SSD tier (the least
recently used rows on disk), so the server must load the op library (tf.load_op_library of
rec_sdk's _rec_sdk_ops.so; docs/SERVING.md says how to build it into TensorFlow Serving).
The table fills itself at load by streaming its asset files through tf.data (a batch of rows
at a time: the files never sit in memory whole), and takes updates as one change under the
table's exclusive lock (TableApplyRows), so a lookup sees each row all-old or all-new.
"""

import tensorflow as tf

from rec_sdk.ops import serving_ops, table_ops
from rec_sdk.serving.mutable import asset_path, stream_rows, write_rows
from rec_sdk.tables import tier
from rec_sdk.tables.initializer_spec import describe_initializer
from rec_sdk.tables.table_spec import TableSpec


class PluginTable:
    """The served table of plugin mode (same interface as mutable.ServedTable, graph mode).

    memory_rows: rows kept in memory when ssd_path is given (the rest on the SSD tier);
    without ssd_path the table is all in memory and grows as needed.
    """

    def __init__(
        self,
        name,
        dim,
        keys,
        values,
        staging,
        index,
        chain,
        default=None,
        memory_rows=None,
        ssd_path=None,
    ):
        self.name, self.dim, self.rows, self.parts = name, dim, len(keys), 1
        self.ranks = 1  # one process writes its update files
        self.default = default
        self.variables = []  # none besides the table: a rec_sdk table removes keys exactly
        stem = "%s/table%d." % (staging, index)
        write_rows(stem, keys, values, dim)
        self.files = [(stem + "keys", stem + "values")]
        tiered = ssd_path is not None
        if tiered and not memory_rows:
            raise ValueError(
                "plugin serving of table %r on the SSD tier needs memory_rows "
                "(the rows kept in memory), got %r" % (name, memory_rows)
            )
        # A table that grows as needed (on SSD without bound when tiered). Serving only finds
        # keys: the compact index is smaller and finds faster (a tier needs the full one).
        spec = TableSpec(
            "served_" + name.replace("/", "_"),
            tf.int64,
            dim,
            describe_initializer(0.0, name),
            tier=tier.make(memory_rows, None, (ssd_path,), names=("memory_rows", ""))
            if tiered
            else None,
            index_layout="full" if tiered else "compact",
        )
        self.handle = table_ops.create_table(
            shared_name="rec_sdk_served_%s_%s" % (name.replace("/", "_"), chain), **spec.op_attrs()
        )

    def load_op(self):
        paths = [asset_path(path) for path in self.files[0]]
        return stream_rows(
            paths[0],
            paths[1],
            self.dim,
            self.rows,
            lambda keys, values, _: table_ops.upsert(self.handle, keys, values),
        )

    def lookup(self, ids):
        values, exists = table_ops.lookup(self.handle, ids, dim=self.dim)
        fill = tf.broadcast_to(
            tf.cast(0.0 if self.default is None else self.default, tf.float32), [self.dim]
        )
        return tf.where(tf.expand_dims(exists, -1), values, tf.broadcast_to(fill, tf.shape(values)))

    def plan(self, keys, values, removed, replace):
        return keys, values, removed, replace

    def write(self, plan):
        return serving_ops.apply_rows(self.handle, *plan)

    def size(self):
        return table_ops.size(self.handle)
