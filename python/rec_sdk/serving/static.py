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

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from rec_sdk.dynamic_embedding.keras import layers as de_layers
from rec_sdk.ops import table_ops
from rec_sdk.serving.mutable import asset_path
from rec_sdk.serving.quantize import StoredRows, check_row_dtype
from rec_sdk.serving.rank_parts import is_over_ranks, write_rows_over_ranks
from rec_sdk.tables.table import tables_of_graph

_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")

_SERVING_DEFAULT = "serving_default_value"  # a tensor lookup's record key


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


def _default_value(sess, table, value):
    """A lookup's serving_default_value as a NumPy value (a tensor: its value now, computed
    in sess when the graph does not fix it)."""
    if not isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    constant = tf.get_static_value(value)
    if constant is not None:
        return constant
    try:
        return sess.run(value)
    except tf.errors.OpError as e:
        raise ValueError(
            "serving export: table %r has a lookup whose serving_default_value "
            "is a tensor the export cannot compute (%s); give a number or a "
            "[dim] vector" % (table.table_name, e.message)
        ) from None


class ServingGraph:
    """A new tf.Graph computing `outputs` from placeholders of `inputs` with stock ops: the
    frozen training graph's subgraph from the inputs to the outputs, each rec_sdk id-tensor
    lookup on the way replaced by what make_lookup(table, defaults) builds in the new graph,
    once per table: a function (ids, serving_default_value) -> embeddings; defaults: the
    serving_default_value of each of the table's lookups. A lookup recorded with a numeric
    max_norm (de lookups) clips each served embedding to it. With keep_variables, the dense
    variables the outputs read become variables of the new graph (initialised from the
    session by `variable_feeds`) instead of constants, so they can be updated in place.
    reads_in: a function f(read) that builds read() (every lookup and variable read of a
    request) and returns its tensors, e.g. consistently with updates (apply.ModelLock.read).

    Attributes: graph, placeholders {input name: tensor}, served {output name: tensor},
    tables (the rec_sdk tables looked up), variables [(training variable name, new
    variable)], variable_feeds {initial value placeholder: value}."""

    def __init__(
        self, sess, inputs, outputs, tables, make_lookup, keep_variables=False, reads_in=None
    ):
        graph = sess.graph
        tables = tables_of_graph(graph) if tables is None else list(tables)
        input_names = {_op_name(t) for t in inputs.values()}
        output_names = [_op_name(t) for t in outputs.values()]
        raw = graph.as_graph_def()
        needed = _reachable(raw, output_names, input_names)
        lookups = [
            (t, dict(ln, serving_default_value=_default_value(sess, t, ln[_SERVING_DEFAULT])))
            for t in tables
            for ln in t.lookups.tensor
            if _op_name(ln["embeddings"]) in needed
        ]
        cut = {_op_name(ln["embeddings"]) for _, ln in lookups}
        id_names = [_op_name(ln["ids"]) for _, ln in lookups]
        # Only the variables the served graph reads are frozen (not those behind the cut
        # lookups, e.g. a de lookup's trainable, which need not hold a value).
        kept = _reachable(raw, output_names + id_names, input_names | cut)
        frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
            sess,
            raw,
            output_names + id_names,
            variable_names_whitelist=sorted(
                n.name for n in raw.node if n.name in kept and n.op in _VARIABLE_OPS
            ),
        )
        graph_nodes = _reachable(frozen, output_names, input_names | cut)
        missing = [
            n.name
            for n in frozen.node
            if n.name in graph_nodes and n.op.startswith(table_ops.OP_NAMESPACE + ">")
        ]
        if missing:
            raise ValueError(
                "serving export: outputs depend on rec_sdk ops other than "
                "id-tensor lookups (%s); build the serving graph with "
                "sparse_lookup(table, ids_tensor, is_train=False)" % missing[:5]
            )
        self.graph = tf.Graph()
        self.tables, self.variables, self.variable_feeds = [], [], {}
        with self.graph.as_default():
            self.placeholders = {}
            for _name, tensor in inputs.items():
                self.placeholders[tensor.name] = tf.compat.v1.placeholder(
                    tensor.dtype, tensor.shape, name=_op_name(tensor)
                )
            feed_map = dict(self.placeholders)
            # The ids of each lookup, computed from the inputs by the frozen graph.
            id_names = sorted({_op_name(ln["ids"]) for _, ln in lookups} - input_names)
            id_nodes = _reachable(frozen, id_names, input_names)
            computed_ids = {}
            if id_nodes:
                ids_graph = _subgraph(frozen, id_nodes)
                wanted = sorted({ln["ids"].name for _, ln in lookups} - set(self.placeholders))
                returned = tf.compat.v1.import_graph_def(
                    ids_graph,
                    input_map=_used_inputs(ids_graph, feed_map),
                    return_elements=wanted,
                    name="rec_sdk_ids",
                )
                computed_ids = dict(zip(wanted, returned))

            def ids_tensor(t):
                return (
                    self.placeholders[t.name]
                    if t.name in self.placeholders
                    else computed_ids[t.name]
                )

            made = {}
            for table, _lookup in lookups:
                if table.table_name not in made:
                    self.tables.append(table)
                    made[table.table_name] = make_lookup(
                        table, [ln["serving_default_value"] for t, ln in lookups if t is table]
                    )
            if keep_variables:
                self._live_variables(sess, frozen, graph_nodes - input_names)

            def read():
                rows = [
                    made[table.table_name](
                        tf.cast(ids_tensor(lookup["ids"]), tf.int64),
                        lookup["serving_default_value"],
                    )
                    for table, lookup in lookups
                ]
                return rows, [var.read_value() for _, var in self.variables]

            rows, dense = read() if reads_in is None else reads_in(read)
            replacements = {}
            for (_table, lookup), served in zip(lookups, rows):
                if lookup.get("max_norm") is not None:
                    served = tf.clip_by_norm(served, lookup["max_norm"], axes=[-1])
                replacements[lookup["embeddings"].name] = served
            feed_map.update(replacements)
            feed_map.update(
                {
                    ln["ids"].name: ids_tensor(ln["ids"])
                    for _, ln in lookups
                    if ln["ids"].name not in self.placeholders
                }
            )
            feed_map.update({name + ":0": value for (name, _), value in zip(self.variables, dense)})
            # Outputs that are lookups' embeddings (e.g. a tower's output) are served directly.
            self.served = {
                name: replacements[t.name] for name, t in outputs.items() if t.name in replacements
            }
            rest = [(name, t) for name, t in outputs.items() if t.name not in replacements]
            if rest:
                model_graph = _subgraph(frozen, graph_nodes - input_names)
                returned = tf.compat.v1.import_graph_def(
                    model_graph,
                    input_map=_used_inputs(model_graph, feed_map),
                    return_elements=[t.name for _, t in rest],
                    name="rec_sdk_model",
                )
                self.served.update({name: tensor for (name, _), tensor in zip(rest, returned)})

    def _live_variables(self, sess, frozen, nodes):
        """Makes a new variable (in self.variables, its value in self.variable_feeds) of each
        of the training graph's variables among `nodes` (convert_variables_to_constants
        keeps their names)."""
        variables = {
            v.op.name: v for v in sess.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        }
        names = sorted(
            n.name
            for n in frozen.node
            if n.name in nodes and n.op == "Const" and n.name in variables
        )
        for name in names:
            value = sess.run(variables[name])
            with tf.name_scope("rec_sdk_dense"):
                init = tf.compat.v1.placeholder(value.dtype, value.shape)
                var = tf.compat.v1.Variable(
                    init, use_resource=True, trainable=False, name=name.replace("/", "_")
                )
            self.variables.append((name, var))
            self.variable_feeds[init] = value

    def signature(self, inputs):
        return tf.compat.v1.saved_model.predict_signature_def(
            inputs={k: self.placeholders[t.name] for k, t in inputs.items()}, outputs=self.served
        )


def export_saved_model(sess, export_dir, inputs, outputs, tables=None, row_dtype="float32"):
    """Writes a SavedModel for serving (signature "serving_default") with only stock ops.

    Args:
      sess: the session holding the trained tables and variables.
      export_dir: the SavedModel directory (must not exist).
      inputs: {name: tensor} of the graph's inputs (placeholders of ids and features).
      outputs: {name: tensor} to serve (e.g. probabilities), computed from `inputs` through
        evaluation lookups (`is_train=False`) with id tensors.
      tables: the tables to consider (default: all of the graph).
      row_dtype: how the served rows are stored: "float32" (as trained), "float16" (half
        the bytes) or "int8" (row-wise quantized with a float32 scale and bias per row,
        rec_sdk.serving.quantize: at most (max - min) / 510 of its row off); the largest
        error over all rows is logged.
    Returns the number of table rows exported.
    """
    row_dtype = check_row_dtype(row_dtype)
    loaded = {}

    def make_lookup(table, defaults):
        del defaults  # each lookup applies its own
        if is_over_ranks(table):
            return _lookup_over_ranks(sess, table, row_dtype, staging(), loaded)
        keys, values, _ = sess.run(table.export())
        # The rows end with a spare row of zeros that keys without a row index (no copy per
        # request).
        stored = StoredRows(
            np.concatenate([values, np.zeros([1, table.dim], np.float32)]),
            row_dtype,
            "table %r" % table.table_name,
        )
        with tf.name_scope("rec_sdk_serving/" + table.table_name):
            # Initialised by feeding the exported rows (not stored as graph constants, so
            # large tables fit); the SavedModel keeps them as variables.
            keys_in = tf.compat.v1.placeholder(tf.int64, [None], name="keys_in")
            keys_var = tf.compat.v1.Variable(
                keys_in, validate_shape=False, use_resource=True, name="keys"
            )
            feeds = {keys_in: keys.astype(np.int64)}
            row_vars = []
            for i, array in enumerate(stored.arrays):
                array_in = tf.compat.v1.placeholder(
                    array.dtype, [None, array.shape[1]], name="values_in" if i == 0 else "scales_in"
                )
                row_vars.append(
                    tf.compat.v1.Variable(
                        array_in,
                        validate_shape=False,
                        use_resource=True,
                        name="values" if i == 0 else "scales",
                    )
                )
                feeds[array_in] = array
        hash_table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                keys_var.read_value(), tf.range(tf.size(keys_var.read_value(), out_type=tf.int64))
            ),
            default_value=-1,
            name="rec_sdk_serving_%s_index" % table.table_name,
        )
        loaded[table.table_name] = ([keys_var] + row_vars, feeds, len(keys))
        widths = [array.shape[1] for array in stored.arrays]

        def lookup(ids, default):
            rows = hash_table.lookup(ids)
            missing = rows < 0
            index = tf.where(missing, tf.fill(tf.shape(rows), np.int64(len(keys))), rows)
            found = stored.rows(
                [
                    tf.gather(tf.reshape(v.read_value(), [-1, width]), index)
                    for v, width in zip(row_vars, widths)
                ]
            )
            if default is None:
                return found  # the spare row is zeros
            fill = tf.broadcast_to(tf.cast(default, tf.float32), tf.shape(found))
            return tf.where(tf.expand_dims(missing, -1), fill, found)

        return lookup

    staged = []

    def staging():
        # Next to the export: the ranks of tables over ranks write their rows into it.
        if not staged:
            parent = os.path.dirname(os.path.abspath(export_dir))
            os.makedirs(parent, exist_ok=True)
            staged.append(tempfile.mkdtemp(prefix=".rec_sdk_export_", dir=parent))
        return staged[0]

    try:
        served = ServingGraph(sess, inputs, outputs, tables, make_lookup)
        with served.graph.as_default():
            with tf.compat.v1.Session(graph=served.graph) as export_sess:
                for variables, feeds, _ in loaded.values():
                    export_sess.run([v.initializer for v in variables], feeds)
                builder = tf.compat.v1.saved_model.Builder(export_dir)
                builder.add_meta_graph_and_variables(
                    export_sess,
                    [tf.saved_model.SERVING],
                    signature_def_map={"serving_default": served.signature(inputs)},
                    main_op=tf.group(
                        tf.compat.v1.tables_initializer(),
                        tf.compat.v1.local_variables_initializer(),
                    ),
                    assets_collection=tf.compat.v1.get_collection(
                        tf.compat.v1.GraphKeys.ASSET_FILEPATHS
                    ),
                    strip_default_attrs=True,
                )
                builder.save()
    finally:
        for path in staged:
            shutil.rmtree(path, ignore_errors=True)
    return sum(rows for _, _, rows in loaded.values())


def _lookup_over_ranks(sess, table, row_dtype, staging, loaded):
    """export_saved_model's lookup of a table over ranks: each rank writes its rows
    (rank_parts.write_rows_over_ranks) as asset files of the SavedModel, which its main op
    reads into a StaticHashTable and a local variable of the rows (no row passes through
    this process)."""
    if row_dtype != "float32":
        raise ValueError(
            "table %r is sharded over ranks: its frozen export stores rows as "
            "float32 (row_dtype=%r is for tables of one process)" % (table.table_name, row_dtype)
        )
    files = write_rows_over_ranks(sess, table, staging, len(loaded))
    with tf.name_scope("rec_sdk_serving/" + table.table_name):
        keys, values = [], []
        for keys_file, values_file, _ in files:
            for path, out, dtype in (
                (keys_file, keys, tf.int64),
                (values_file, values, tf.float32),
            ):
                out.append(
                    tf.io.decode_raw(tf.io.read_file(asset_path(path)), dtype, little_endian=True)
                )
        keys = tf.concat(keys, 0)
        # The rows, then a spare row of zeros that keys without a row index.
        rows = tf.compat.v1.Variable(
            tf.concat(
                [tf.reshape(tf.concat(values, 0), [-1, table.dim]), tf.zeros([1, table.dim])], 0
            ),
            trainable=False,
            validate_shape=False,
            use_resource=True,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            name="rows",
        )
    hash_table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(tf.size(keys, out_type=tf.int64))),
        default_value=-1,
        name="rec_sdk_serving_%s_index" % table.table_name,
    )
    loaded[table.table_name] = ([], {}, sum(n for _, _, n in files))

    def lookup(ids, default):
        index = hash_table.lookup(ids)
        missing = index < 0
        spare = tf.shape(rows.read_value(), out_type=tf.int64)[0] - 1
        found = tf.gather(
            tf.reshape(rows.read_value(), [-1, table.dim]),
            tf.where(missing, tf.fill(tf.shape(index), spare), index),
        )
        if default is None:
            return found
        fill = tf.broadcast_to(tf.cast(default, tf.float32), tf.shape(found))
        return tf.where(tf.expand_dims(missing, -1), fill, found)

    return lookup


def keras_input_signature(model, input_signature, what, graph_alternative):
    """The input signature of a Keras model's export (given, or from model.inputs); the
    export runs eagerly."""
    if not tf.executing_eagerly():
        raise ValueError(
            "%s runs eagerly (TF2); for tf.compat.v1 graphs use %s" % (what, graph_alternative)
        )
    if input_signature is not None:
        return input_signature
    if not getattr(model, "inputs", None):
        raise ValueError(
            "%s: give input_signature (the model has no Input layers to take it from)" % what
        )
    return [tf.TensorSpec(t.shape, t.dtype, t.name.split(":")[0]) for t in model.inputs]


def default_row(params):
    """The row a de.Variable's missing keys read when served: the initializer's value when it
    is a constant, else zeros (a random initializer cannot be replayed without the plugin)."""
    default = np.zeros([params.dim], np.float32)
    value = constant_value(params.initializer)
    if value is not None:
        default[:] = np.broadcast_to(np.asarray(value, np.float32).reshape(-1), [params.dim])
    return default


def constant_value(init):
    """The value of a constant initializer (a number, a list or array, or a
    tf.keras.initializers.Constant / tf.constant_initializer), else None."""
    if isinstance(init, (int, float, list, tuple, np.ndarray)) and not isinstance(init, bool):
        return init
    if type(init).__name__ in ("Constant", "ConstantV2", "constant_initializer"):
        value = getattr(init, "value", None)
        if value is not None and not isinstance(value, (tf.Tensor, tf.Variable)):
            return value
    return None


def serving_layers(model):
    """The de.keras embedding layers of a Keras model, in model order."""
    return [m for m in model.submodules if isinstance(m, de_layers.Embedding)]


def dense_variables(model, layers):
    """The model's variables other than its embedding layers' own (their shadows)."""
    own = {id(v) for layer in layers for v in (layer.shadow, layer.shadow.ids)}
    return [v for v in model.variables if id(v) not in own]


def _static_lookup(layer, row_dtype="float32"):
    """-> (ids -> embeddings through stock ops, the StaticHashTable, the rows' variables,
    rows) of a de Keras layer: keys without a row read the initializer's value when it is a
    constant, else zeros (a random initializer cannot be replayed without the plugin). The
    rows are stored in row_dtype (StoredRows)."""
    params = layer.params
    keys, values = params.export()
    n = int(tf.size(keys))
    default = default_row(params).astype(params.value_dtype.as_numpy_dtype)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(n, dtype=tf.int64)), -1
    )
    stored = StoredRows(
        np.concatenate([np.asarray(values, np.float32), default[None, :].astype(np.float32)]),
        row_dtype,
        "layer %r" % layer.name,
    )
    rows = [
        tf.Variable(array, trainable=False, name=layer.name + ("_rows" if i == 0 else "_scales"))
        for i, array in enumerate(stored.arrays)
    ]

    def lookup(ids):
        index = table.lookup(ids)
        index = tf.where(index < 0, tf.constant(n, tf.int64), index)
        found = stored.rows([tf.gather(v, index) for v in rows])
        return tf.cast(found, params.value_dtype)

    return lookup, table, rows, n


def export_keras_model(model, export_dir, input_signature=None, row_dtype="float32"):
    """Writes a SavedModel of a TF2 Keras model (signature "serving_default") with only stock
    ops: its de.keras.layers embeddings read a StaticHashTable from key to row and a variable
    of their rows (see _static_lookup), every other layer is the model's own.

    input_signature: the model's inputs as tf.TensorSpecs (default: model.inputs, which
    functional and Sequential models built on Input have). row_dtype: as export_saved_model's
    ("float32", "float16" or "int8"). Returns the rows exported.
    """
    row_dtype = check_row_dtype(row_dtype)
    input_signature = keras_input_signature(
        model, input_signature, "export_keras_model", "export_saved_model"
    )
    emb_layers = serving_layers(model)
    module = tf.Module()
    module.dense = dense_variables(model, emb_layers)
    lookups, module.tables, module.rows, total = {}, [], [], 0
    for layer in emb_layers:
        lookups[layer], table, rows, n = _static_lookup(layer, row_dtype)
        module.tables.append(table)
        module.rows.extend(rows)
        total += n

    @tf.function(input_signature=input_signature)
    def serve(*inputs):
        return model(list(inputs) if len(inputs) > 1 else inputs[0], training=False)

    with de_layers.serving_lookups(lookups):
        concrete = serve.get_concrete_function()
    # An empty namespace whitelist: saving fails if any rec_sdk op were left in the graph.
    tf.saved_model.save(
        module,
        export_dir,
        signatures={"serving_default": concrete},
        options=tf.saved_model.SaveOptions(namespace_whitelist=[]),
    )
    return total
