"""export_serving_model: a SavedModel of stock ops whose tables are updated in place.

The model's tables are served tables (mutable.py) filled at load from files in its assets;
its dense variables stay variables. Besides "serving_default" it has the signatures
"apply_update" (input update_dir: the directory of one published update; output version:
the model's version after it) and "version" (input request: any int64, since TensorFlow
Serving's Predict refuses a signature without inputs; outputs version and chain). Requests
read rows and dense variables consistently with the updates' writes (apply.ModelLock).
The export starts a chain in push_dir (update_files.BASE, version 0) that Pushers (push.py)
continue.
"""

import os
import shutil
import tempfile
import types
import uuid

import numpy as np
import tensorflow as tf

from rec_sdk.base.graph_state import state_of
from rec_sdk.serving import update_files
from rec_sdk.serving.apply import ModelLock, apply_update_op
from rec_sdk.serving.indexed import served_table
from rec_sdk.serving.plugin import PluginTable
from rec_sdk.serving.push import merge_shards
from rec_sdk.serving.rank_parts import is_over_ranks, served_table_over_ranks
from rec_sdk.serving.static import ServingGraph, default_row
from rec_sdk.tables.table import tables_of_graph

APPLY_SIGNATURE = "apply_update"
VERSION_SIGNATURE = "version"
VERSION_INPUT = "request"  # the version signature's input: any int64 scalar, not used


class TableSource:
    """A rec_sdk table as the source of a served table (its one shard)."""

    def __init__(self, table):
        self.table_name, self.dim, self.lookups = table.table_name, table.dim, table.lookups
        self.shards = [table]


class DeSource:
    """A de.Variable looked up in graph mode as the source of a served table: its shards'
    rows merged; missing keys read default_row(variable)."""

    def __init__(self, variable, records):
        if variable.value_dtype != tf.float32 or variable.key_dtype not in (tf.int32, tf.int64):
            raise ValueError(
                "de.Variable %r has %s keys and %s values: served tables take "
                "int32 or int64 keys and float32 values"
                % (variable.name, variable.key_dtype.name, variable.value_dtype.name)
            )
        self.table_name, self.dim, self.shards = variable.name, variable.dim, variable.shards
        default = default_row(variable)
        for r in records:
            if isinstance(r["max_norm"], (tf.Tensor, tf.Variable)):
                raise ValueError(
                    "de.Variable %r: a lookup with a tensor max_norm cannot be "
                    "served; give a number" % variable.name
                )
        self.lookups = types.SimpleNamespace(
            tensor=[
                {
                    "ids": r["ids"],
                    "embeddings": r["embeddings"],
                    "max_norm": r["max_norm"],
                    "serving_default_value": default,
                }
                for r in records
            ]
        )


def de_sources(graph):
    """DeSources of the de.Variables a graph's lookups read."""
    by_variable = {}
    for record in state_of(graph).de_lookups:
        by_variable.setdefault(id(record["variable"]), []).append(record)
    return [
        DeSource(records[0]["variable"], records)
        for records in by_variable.values()
        if records[0]["variable"].servable
    ]


def one_default(name, dim, defaults):
    """The row a served table's missing keys read: its lookups' serving_default_value (one
    per table; None: zeros)."""
    rows = {
        tuple(np.broadcast_to(np.asarray(0.0 if d is None else d, np.float32), [dim]))
        for d in defaults
    }
    if len(rows) > 1:
        raise ValueError(
            "served tables take one serving_default_value per table: the "
            "lookups of table %r use %s" % (name, sorted(set(map(str, defaults))))
        )
    return np.asarray(rows.pop(), np.float32)


def check_new_chain_dir(push_dir):
    if not isinstance(push_dir, (str, os.PathLike)):
        raise TypeError("push_dir must be a directory path, got %r" % (push_dir,))
    head = update_files.chain_head(push_dir) if os.path.isdir(push_dir) else None
    if head is not None or update_files.published_versions(push_dir):
        raise ValueError(
            "push_dir %r already holds the update chain of an export; give each "
            "export a new push_dir" % push_dir
        )
    if os.path.isdir(push_dir) and os.listdir(push_dir):
        raise ValueError(
            "push_dir %r must be a new or empty directory; it holds %s"
            % (push_dir, sorted(os.listdir(push_dir))[:5])
        )


def check_signature_dicts(inputs, outputs, what):
    for name, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, dict) or not value:
            raise TypeError(
                "%s: %s must be a non-empty dict {name: tensor}, got %r" % (what, name, value)
            )


def export_serving_model(
    sess,
    export_dir,
    inputs,
    outputs,
    push_dir,
    tables=None,
    plugin=False,
    memory_rows=None,
    ssd_path=None,
):
    """Writes a SavedModel (stock ops only) that serves `outputs` and applies updates.

    Args:
      sess: the session holding the trained tables (created with track_changes) and
        variables.
      export_dir: the SavedModel directory (must not exist).
      inputs, outputs: {name: tensor}, as for export_saved_model (evaluation lookups with id
        tensors between them).
      push_dir: where the update chain starts (a new or empty directory); Pushers of these
        tables publish into it.
      tables: the tables to consider (default: all of the graph).
      plugin: keep the tables in rec_sdk tables (plugin.py) instead of stock hash tables:
        for tables larger than memory; the server must load rec_sdk's op library.
        memory_rows and ssd_path: each table's rows in memory and the directory of its SSD
        tier on the serving machine (without ssd_path: all in memory).
    Returns {"rows": rows exported, "chain": the chain id}.
    """
    check_signature_dicts(inputs, outputs, "export_serving_model")
    if not plugin and (memory_rows is not None or ssd_path is not None):
        raise ValueError("memory_rows and ssd_path are options of plugin=True serving")
    check_new_chain_dir(push_dir)
    chain = uuid.uuid4().hex
    # Next to the export: the ranks of tables over ranks write their rows into it.
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staged = tempfile.mkdtemp(prefix=".rec_sdk_export_", dir=parent)
    served_tables, push_ids, table_rows, rows = [], [], [], 0
    try:

        def make_lookup(table, defaults):
            nonlocal rows
            default = one_default(table.table_name, table.dim, defaults)
            if isinstance(table, TableSource) and is_over_ranks(table.shards[0]):
                if plugin:
                    raise ValueError(
                        "table %r is sharded over ranks: its served model takes "
                        "stock hash tables (plugin=False)" % table.table_name
                    )
                served, ids, n = served_table_over_ranks(
                    sess, table.shards[0], len(served_tables), staged, default
                )
                served_tables.append(served)
                push_ids.append(ids)
                table_rows.append(n)
                rows += n
                return lambda ids, _: served.lookup(ids)
            with sess.graph.as_default():
                takes = [shard.take_changes(full=True) for shard in table.shards]
            whole = merge_shards(table.table_name, sess.run(takes))
            keys, values, ids = whole.keys, whole.values, whole.push_ids
            if plugin:
                served = PluginTable(
                    table.table_name,
                    table.dim,
                    keys,
                    values,
                    staged,
                    len(served_tables),
                    chain,
                    default,
                    memory_rows,
                    ssd_path,
                )
            else:
                served = served_table(
                    table.table_name, table.dim, keys, values, staged, len(served_tables), default
                )
            served_tables.append(served)
            push_ids.append(ids)
            table_rows.append(len(keys))
            rows += len(keys)
            return lambda ids, _: served.lookup(ids)

        if tables is None:
            tables = [TableSource(t) for t in tables_of_graph(sess.graph)] + de_sources(sess.graph)
        else:
            tables = [
                t if isinstance(t, (TableSource, DeSource)) else TableSource(t) for t in tables
            ]
        locks = []

        def reads_in(read):
            # In the serving graph: the lock its requests' reads and the updates share.
            locks.append(ModelLock("rec_sdk_serving_" + chain))
            return locks[0].read(read)

        graph = ServingGraph(
            sess, inputs, outputs, tables, make_lookup, keep_variables=True, reads_in=reads_in
        )
        with graph.graph.as_default():
            version = tf.compat.v1.Variable(
                np.int64(0), trainable=False, use_resource=True, name="rec_sdk_serving_version"
            )
            chain_t = tf.constant(chain, name="rec_sdk_serving_chain")
            # Built before the session runs (a graph's ops must not change after a run).
            main_op = tf.group(
                *[served.load_op() for served in served_tables], name="rec_sdk_serving_load"
            )
            update_dir = tf.compat.v1.placeholder(tf.string, [], name="update_dir")
            locks.append(ModelLock("rec_sdk_serving_updates_" + chain, sequence=False))
            applied = apply_update_op(
                update_dir,
                served_tables,
                [(name, var) for name, var in graph.variables],
                version,
                chain_t,
                *locks,
            )
            request = tf.compat.v1.placeholder_with_default(np.int64(0), [], name=VERSION_INPUT)
            signatures = {
                "serving_default": graph.signature(inputs),
                APPLY_SIGNATURE: tf.compat.v1.saved_model.predict_signature_def(
                    inputs={"update_dir": update_dir}, outputs={"version": applied}
                ),
                VERSION_SIGNATURE: tf.compat.v1.saved_model.build_signature_def(
                    inputs={VERSION_INPUT: tf.compat.v1.saved_model.build_tensor_info(request)},
                    outputs={
                        "version": tf.compat.v1.saved_model.build_tensor_info(version.read_value()),
                        "chain": tf.compat.v1.saved_model.build_tensor_info(chain_t),
                    },
                    method_name=tf.compat.v1.saved_model.PREDICT_METHOD_NAME,
                ),
            }
            with tf.compat.v1.Session(graph=graph.graph) as export_sess:
                export_sess.run([v.initializer for _, v in graph.variables], graph.variable_feeds)
                export_sess.run(
                    [version.initializer]
                    + [c.initializer for served in served_tables for c in served.variables]
                    + [locks[0].sequence.initializer]
                )
                builder = tf.compat.v1.saved_model.Builder(export_dir)
                builder.add_meta_graph_and_variables(
                    export_sess,
                    [tf.saved_model.SERVING],
                    signature_def_map=signatures,
                    main_op=main_op,
                    assets_collection=tf.compat.v1.get_collection(
                        tf.compat.v1.GraphKeys.ASSET_FILEPATHS
                    ),
                    strip_default_attrs=True,
                )
                builder.save()
        update_files.write_base(
            push_dir,
            chain,
            [t.name for t in served_tables],
            push_ids,
            [name for name, _ in graph.variables],
            table_rows,
            [t.ranks for t in served_tables],
        )
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return {"rows": rows, "chain": chain}


def export_estimator_serving_model(
    estimator, serving_input_receiver_fn, export_dir, push_dir, checkpoint_path=None
):
    """export_serving_model of a tf.estimator.Estimator: its model_fn in PREDICT mode on the
    features of serving_input_receiver_fn, with the tables and variables of its latest
    checkpoint (or checkpoint_path); serves the EstimatorSpec's predictions (a dict, or one
    tensor as "output"). Then estimator.train(..., hooks=[PushHook(push_dir)]) pushes."""
    checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
    if checkpoint_path is None:
        raise ValueError(
            "export_estimator_serving_model: %s holds no checkpoint; train first"
            % estimator.model_dir
        )
    with tf.Graph().as_default() as graph:
        receiver = serving_input_receiver_fn()
        spec = estimator.model_fn(
            receiver.features, None, tf.estimator.ModeKeys.PREDICT, estimator.config
        )
        predictions = (
            spec.predictions if isinstance(spec.predictions, dict) else {"output": spec.predictions}
        )
        with tf.compat.v1.Session(graph=graph) as sess:
            tf.compat.v1.train.Saver().restore(sess, checkpoint_path)
            return export_serving_model(
                sess, export_dir, dict(receiver.receiver_tensors), predictions, push_dir
            )
