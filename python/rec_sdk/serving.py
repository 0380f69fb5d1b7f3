"""Export a model for serving without the rec_sdk plugin.

export_saved_model(sess, export_dir, inputs, outputs) writes a TensorFlow 1 SavedModel whose
graph holds only stock TensorFlow ops: each rec_sdk lookup on the way from `inputs` to
`outputs` becomes a `tf.lookup.StaticHashTable` from key to row number plus a `tf.gather` from
a variable holding the table's embeddings (keys without a row read zeros, or the lookup's
serving_default_value, as in the training graph's evaluation). Dense variables are frozen
into constants. TensorFlow Serving, `tf.saved_model.load` or
`tf.compat.v1.saved_model.loader.load` run it as is.

Lookups must take id tensors (`sparse_lookup(table, ids_tensor, is_train=False)`); FeatureSpec
lookups read keys preprocessed by the input pipeline, so build the serving graph with tensor
ids (as a serving_input_fn does).

export_keras_model(model, export_dir) does the same for a TF2 Keras model with
de.keras.layers embeddings: each layer's table becomes a StaticHashTable and a variable of its
rows, and the model is traced with its layers reading through them.
"""
import numpy as np
import tensorflow as tf

from rec_sdk.core.table import tables_of_graph
from rec_sdk.dynamic_embedding.keras import layers as de_layers
from rec_sdk.ops import table_ops


def _op_name(tensor):
    return tensor.op.name


def _reachable(graph_def, roots, stops):
    """Names of the nodes of graph_def needed for `roots` (node names), not going past
    `stops` (node names, themselves excluded)."""
    nodes = {n.name: n for n in graph_def.node}
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in stops:
            continue
        seen.add(name)
        for inp in nodes[name].input:
            todo.append(inp.lstrip("^").split(":")[0])
    return seen


def _used_inputs(graph_def, input_map):
    """The entries of input_map that nodes of graph_def read (import_graph_def rejects
    others)."""
    used = set()
    for node in graph_def.node:
        for inp in node.input:
            if inp.startswith("^"):
                continue
            used.add(inp if ":" in inp else inp + ":0")
    return {k: v for k, v in input_map.items() if k in used}


def _subgraph(graph_def, names):
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    out.node.extend(n for n in graph_def.node if n.name in names)
    return out


def export_saved_model(sess, export_dir, inputs, outputs, tables=None):
    """Writes a SavedModel for serving (signature "serving_default") with only stock ops.

    Args:
      sess: the session holding the trained tables and variables.
      export_dir: the SavedModel directory (must not exist).
      inputs: {name: tensor} of the graph's inputs (placeholders of ids and features).
      outputs: {name: tensor} to serve (e.g. probabilities), computed from `inputs` through
        evaluation lookups (`is_train=False`) with id tensors.
      tables: the tables to consider (default: all of the graph).
    Returns the number of table rows exported.
    """
    graph = sess.graph
    tables = tables_of_graph(graph) if tables is None else list(tables)
    input_names = {_op_name(t) for t in inputs.values()}
    output_names = [_op_name(t) for t in outputs.values()]
    frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
        sess, graph.as_graph_def(), output_names + [
            _op_name(l["ids"]) for t in tables for l in t.lookups.tensor])
    needed = _reachable(frozen, output_names, input_names)
    lookups = [(t, l) for t in tables for l in t.lookups.tensor
               if _op_name(l["embeddings"]) in needed]
    cut = {_op_name(l["embeddings"]) for _, l in lookups}
    graph_nodes = _reachable(frozen, output_names, input_names | cut)
    missing = [n.name for n in frozen.node
               if n.name in graph_nodes and n.op.startswith(table_ops.OP_NAMESPACE + ">")]
    if missing:
        raise ValueError("export_saved_model: outputs depend on rec_sdk ops other than id-tensor "
                         "lookups (%s); build the serving graph with "
                         "sparse_lookup(table, ids_tensor, is_train=False)" % missing[:5])
    exported_rows = 0
    export_graph = tf.Graph()
    with export_graph.as_default():
        placeholders = {}
        for name, tensor in inputs.items():
            placeholders[tensor.name] = tf.compat.v1.placeholder(
                tensor.dtype, tensor.shape, name=_op_name(tensor))
        feed_map = dict(placeholders)
        # The ids of each lookup, computed from the inputs by the frozen graph.
        id_names = sorted({_op_name(l["ids"]) for _, l in lookups} - input_names)
        id_nodes = _reachable(frozen, id_names, input_names)
        computed_ids = {}
        if id_nodes:
            ids_graph = _subgraph(frozen, id_nodes)
            wanted = sorted({l["ids"].name for _, l in lookups} - set(placeholders))
            returned = tf.compat.v1.import_graph_def(
                ids_graph, input_map=_used_inputs(ids_graph, feed_map), return_elements=wanted,
                name="rec_sdk_ids")
            computed_ids = dict(zip(wanted, returned))

        def ids_tensor(t):
            return placeholders[t.name] if t.name in placeholders else computed_ids[t.name]

        # One stock lookup per table: key -> row number, rows in a variable.
        loaded = {}
        table_values = {}
        for table, _ in lookups:
            if table.table_name in loaded:
                continue
            keys, values, _ = sess.run(table.export())
            exported_rows += len(keys)
            with tf.name_scope("rec_sdk_serving/" + table.table_name):
                # Initialised by feeding the exported rows (not stored as graph constants, so
                # large tables fit); the SavedModel keeps them as variables.
                keys_in = tf.compat.v1.placeholder(tf.int64, [None], name="keys_in")
                values_in = tf.compat.v1.placeholder(tf.float32, [None, table.dim],
                                                     name="values_in")
                keys_var = tf.compat.v1.Variable(keys_in, validate_shape=False,
                                                 use_resource=True, name="keys")
                values_var = tf.compat.v1.Variable(values_in, validate_shape=False,
                                                   use_resource=True, name="values")
            feeds_of_table = {keys_in: keys.astype(np.int64), values_in: values}
            hash_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    keys_var.read_value(), tf.range(tf.size(keys_var.read_value(),
                                                            out_type=tf.int64))),
                default_value=-1, name="rec_sdk_serving_%s_index" % table.table_name)
            loaded[table.table_name] = (hash_table, values_var, keys_var)
            table_values[table.table_name] = feeds_of_table
        replacements = {}
        for table, lookup in lookups:
            hash_table, values_var, _ = loaded[table.table_name]
            ids = tf.cast(ids_tensor(lookup["ids"]), tf.int64)
            rows = hash_table.lookup(ids)
            default = lookup["serving_default_value"]
            default_row = tf.broadcast_to(tf.cast(0.0 if default is None else default,
                                                  tf.float32), [1, table.dim])
            padded = tf.concat([tf.reshape(values_var.read_value(), [-1, table.dim]),
                                default_row], 0)
            default_index = tf.shape(padded, out_type=tf.int64)[0] - 1
            index = tf.where(rows < 0, tf.fill(tf.shape(rows), default_index), rows)
            replacements[lookup["embeddings"].name] = tf.gather(padded, index)
        feed_map.update(replacements)
        feed_map.update({l["ids"].name: ids_tensor(l["ids"]) for _, l in lookups
                         if l["ids"].name not in placeholders})
        # Outputs that are lookups' embeddings (e.g. a tower's output) are served directly.
        served = {name: replacements[t.name] for name, t in outputs.items()
                  if t.name in replacements}
        rest = [(name, t) for name, t in outputs.items() if t.name not in replacements]
        if rest:
            model_graph = _subgraph(frozen, graph_nodes - input_names)
            returned = tf.compat.v1.import_graph_def(
                model_graph, input_map=_used_inputs(model_graph, feed_map),
                return_elements=[t.name for _, t in rest], name="rec_sdk_model")
            served.update({name: tensor for (name, _), tensor in zip(rest, returned)})
        with tf.compat.v1.Session(graph=export_graph) as export_sess:
            for name, (_, values_var, keys_var) in loaded.items():
                export_sess.run([keys_var.initializer, values_var.initializer],
                                table_values[name])
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def(
                inputs={k: placeholders[t.name] for k, t in inputs.items()}, outputs=served)
            builder.add_meta_graph_and_variables(
                export_sess, [tf.saved_model.SERVING], signature_def_map={"serving_default": signature},
                main_op=tf.compat.v1.tables_initializer(), strip_default_attrs=True)
            builder.save()
    return exported_rows


def _static_lookup(layer):
    """-> (ids -> embeddings through stock ops, the StaticHashTable, the rows variable, rows)
    of a de Keras layer: keys without a row read the initializer's value when it is a
    constant, else zeros (a random initializer cannot be replayed without the plugin)."""
    params = layer.params
    keys, values = params.export()
    n = int(tf.size(keys))
    default = np.zeros([params.dim], params.value_dtype.as_numpy_dtype)
    init = params.initializer
    if isinstance(init, (int, float, list, tuple, np.ndarray)) and not isinstance(init, bool):
        default[:] = np.asarray(init, default.dtype).reshape(-1)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(n, dtype=tf.int64)), -1)
    rows = tf.Variable(tf.concat([values, tf.constant(default[None, :])], 0), trainable=False,
                       name=layer.name + "_rows")

    def lookup(ids):
        index = table.lookup(ids)
        return tf.gather(rows, tf.where(index < 0, tf.constant(n, tf.int64), index))
    return lookup, table, rows, n


def export_keras_model(model, export_dir, input_signature=None):
    """Writes a SavedModel of a TF2 Keras model (signature "serving_default") with only stock
    ops: its de.keras.layers embeddings read a StaticHashTable from key to row and a variable
    of their rows (see _static_lookup), every other layer is the model's own.

    input_signature: the model's inputs as tf.TensorSpecs (default: model.inputs, which
    functional and Sequential models built on Input have). Returns the rows exported.
    """
    if not tf.executing_eagerly():
        raise ValueError("export_keras_model runs eagerly (TF2); for tf.compat.v1 graphs use "
                         "export_saved_model")
    if input_signature is None:
        if not getattr(model, "inputs", None):
            raise ValueError("export_keras_model: give input_signature (the model has no "
                             "Input layers to take it from)")
        input_signature = [tf.TensorSpec(t.shape, t.dtype, t.name.split(":")[0])
                           for t in model.inputs]
    emb_layers = [m for m in model.submodules if isinstance(m, de_layers.Embedding)]
    own = {id(v) for layer in emb_layers for v in (layer.shadow, layer.shadow.ids)}
    module = tf.Module()
    module.dense = [v for v in model.variables if id(v) not in own]
    lookups, module.tables, module.rows, total = {}, [], [], 0
    for layer in emb_layers:
        lookups[layer], table, rows, n = _static_lookup(layer)
        module.tables.append(table)
        module.rows.append(rows)
        total += n

    @tf.function(input_signature=input_signature)
    def serve(*inputs):
        return model(list(inputs) if len(inputs) > 1 else inputs[0], training=False)

    with de_layers.serving_lookups(lookups):
        concrete = serve.get_concrete_function()
    # An empty namespace whitelist: saving fails if any rec_sdk op were left in the graph.
    tf.saved_model.save(module, export_dir, signatures={"serving_default": concrete},
                        options=tf.saved_model.SaveOptions(namespace_whitelist=[]))
    return total
