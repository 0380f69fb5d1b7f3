"""Plain tf.Variable embedding tables turned into rec_sdk hash tables by one hook.

A TF1-style model written without rec_sdk that reads its embeddings with
`tf.nn.embedding_lookup(var, ids % rows)` (the hashing trick) or
`tf.nn.embedding_lookup(var, ids)` gets rec_sdk tables keyed by the raw ids (no collisions, no
bound on the keys) by adding `DynamicEmbeddingHook()` to the hooks of
MonitoredTrainingSession or of tf.estimator's train / evaluate / predict. In begin(), for every
variable graph_rewrite.find_embedding_variables accepts (read only through gathers):

1. a rec_sdk table is created (int64 keys, the variable's dim; the variable's initializer when
   it is a random uniform / normal / truncated normal or constant one, else `emb_initializer`);
2. each gather gets a sparse_lookup on its keys (x of `ids = x % rows`, else the ids), a
   training lookup when an optimizer applies the gather's gradient;
3. the gradient TensorFlow already built for the gather, dL/d(gather output), is summed onto
   the lookup's unique rows (by its inverse indices) and applied by a rec_sdk sparse optimizer
   at the lookup's row addresses (default LazyAdam, learning rate 0.001);
4. graph_rewrite passes, applied to the live graph (base.live_graph.update_live_graph), reroute
   the gathers' consumers to the lookups (RerouteInputs), stop the train op from running the
   variables' dense updates (DropVariableUpdates) and make it run the sparse update instead
   (AddControlInputs): the train op is `train_op`, else the ops in the TRAIN_OP collection
   (tf.compat.v1 optimizers and tf.estimator put theirs there), else the ops that ran the
   dense updates.

The process is initialised with `init(use_dynamic_expansion=True)` unless it already was: the
tables then grow without bound, and the *_by_addr optimizers apply. A process initialised
with use_dynamic_expansion=False gets fixed-capacity tables of `capacity_factor` x rows rows
(a full table is an error naming it) and the plain optimizers. The tables are saved and
restored with the graph's variables by tf.compat.v1.train.Saver (so by MonitoredTrainingSession
and tf.estimator checkpoints); the old variables stay in the graph (initialised and saved, no
longer read or updated by the train op).
"""

import copy
import re

import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.base import live_graph
from rec_sdk.base.dump import next_dump_path
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_bool, check_float
from rec_sdk.constants.constants import MAX_VOCABULARY_SIZE
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import lazy_adam, lazy_adam_by_addr
from rec_sdk.optimizers.base import SparseOptimizer
from rec_sdk.tables.table import tables_of_graph
from rec_sdk.util import initialize
from rec_sdk_graph_rewrite.embedding_variables import find_embedding_variables

DEFAULT_LEARNING_RATE = 0.001
DEFAULT_CAPACITY_FACTOR = 4.0
_PASS_NAME = "convert_variables"


class ConvertedVariable:
    """A variable whose gathers now read a rec_sdk table.

    name: the variable's op name; table: the SparseEmbedding; lookups: {gather op name:
    embeddings tensor}; keys: {gather op name: keys tensor name}; hashed: {gather op name:
    the modulus of the hashing trick, or None}; trained: whether the train op updates the
    table."""

    def __init__(self, name, table, lookups, keys, hashed, trained):
        self.name = name
        self.table = table
        self.lookups = lookups
        self.keys = keys
        self.hashed = hashed
        self.trained = trained

    def __repr__(self):
        return "<converted variable %r -> table %r (%s)>" % (
            self.name,
            self.table.table_name,
            "trained" if self.trained else "lookups only",
        )


class Conversion:
    """What convert_embedding_variables did: converted ([ConvertedVariable]), skipped
    ([graph_rewrite SkippedVariable(name, reason)]), update (the sparse update op, or None),
    train_ops (names of the ops now running it)."""

    def __init__(self, converted, skipped, update, train_ops):
        self.converted = converted
        self.skipped = skipped
        self.update = update
        self.train_ops = train_ops


def converted_variables(graph=None):
    """{variable name: ConvertedVariable} of `graph` (default: the default graph)."""
    state = state_of(graph or tf.compat.v1.get_default_graph())
    with state.lock:
        return dict(state.converted)


def _dump_dir(dump_graph):
    return next_dump_path("convert_variables") if dump_graph else None


def _variable_names(variables):
    if variables is None:
        return None
    if isinstance(variables, (str, tf.Variable)):
        variables = [variables]
    names = []
    for var in variables:
        if isinstance(var, tf.Variable):
            names.append(var.op.name)
        elif isinstance(var, str) and var:
            names.append(var.split(":")[0])
        else:
            raise TypeError("variables must be variable names or tf.Variables, got %r" % (var,))
    return names


def _train_ops(graph, train_op):
    """Names of the ops to run the sparse update: train_op, else the TRAIN_OP collection."""
    if train_op is not None:
        given = train_op if isinstance(train_op, (list, tuple)) else [train_op]
        ops = []
        for item in given:
            if isinstance(item, str):
                try:
                    item = graph.as_graph_element(item)
                except (KeyError, ValueError) as e:
                    raise ValueError("train_op %r is not in the graph: %s" % (item, e)) from e
            if isinstance(item, tf.Tensor):
                item = item.op
            if not isinstance(item, tf.Operation):
                raise TypeError(
                    "train_op must be a tf.Operation, tf.Tensor or op name, got %r" % (item,)
                )
            if item.graph is not graph:
                raise ValueError(
                    "train_op %r belongs to another graph; pass its name for "
                    "models that build several graphs (tf.estimator)" % item.name
                )
            ops.append(item.name)
        return ops
    names = []
    for item in graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP):
        item = item.op if isinstance(item, tf.Tensor) else item
        if isinstance(item, tf.Operation) and item.name not in names:
            names.append(item.name)
    return names


def _make_optimizer(spec, graph):
    """The sparse optimizer for `graph`: the default LazyAdam, a copy of an optimizer object,
    or what a callable returns."""
    expansion = initialize.get_use_dynamic_expansion()
    if spec is None:
        if expansion:
            return lazy_adam_by_addr.create_hash_optimizer_by_address(DEFAULT_LEARNING_RATE)
        return lazy_adam.create_hash_optimizer(DEFAULT_LEARNING_RATE)
    if isinstance(spec, SparseOptimizer):
        for value in vars(spec).values():
            if isinstance(value, (tf.Variable, tf.Tensor)) and value.graph is not graph:
                raise ValueError(
                    "optimizer %r already trains tables of another graph; for models that "
                    "build several graphs (tf.estimator) pass a callable returning a new "
                    "optimizer, e.g. optimizer=lambda: create_hash_optimizer(0.01)" % spec.name
                )
        optimizer = copy.copy(spec)  # the hook's template stays unused across graphs
    else:
        optimizer = spec()
        if not isinstance(optimizer, SparseOptimizer):
            raise TypeError(
                "optimizer() must return a rec_sdk sparse optimizer "
                "(rec_sdk.optimizers.*), got %r" % (optimizer,)
            )
    if optimizer.by_address != expansion:
        raise ValueError(
            "optimizer %r is for %s tables, but rec_sdk is initialised with "
            "use_dynamic_expansion=%s; use %s"
            % (
                optimizer.name,
                "dynamic-expansion" if optimizer.by_address else "fixed-capacity",
                expansion,
                "a *_by_addr optimizer (create_hash_optimizer_by_address)"
                if expansion
                else "create_hash_optimizer",
            )
        )
    return optimizer


_FALLBACK_INITIALIZER = (-0.05, 0.05)


def _initializer_for(var, emb_initializer):
    """(initializer, description) for the table of `var`."""
    if emb_initializer is not None:
        return emb_initializer, "emb_initializer"
    desc = var.initial_value
    if desc is not None:
        kind = desc["kind"]
        if kind == "random_uniform":
            return (
                tf.compat.v1.random_uniform_initializer(desc["minval"], desc["maxval"]),
                "the variable's random_uniform(%g, %g)" % (desc["minval"], desc["maxval"]),
            )
        if kind == "random_normal":
            return (
                tf.compat.v1.random_normal_initializer(desc["mean"], desc["stddev"]),
                "the variable's random_normal(%g, %g)" % (desc["mean"], desc["stddev"]),
            )
        if kind == "truncated_normal":
            return (
                tf.compat.v1.truncated_normal_initializer(desc["mean"], desc["stddev"]),
                "the variable's truncated_normal(%g, %g)" % (desc["mean"], desc["stddev"]),
            )
        if kind == "constant":
            return desc["value"], "the variable's constant %g" % desc["value"]
    low, high = _FALLBACK_INITIALIZER
    return (
        tf.compat.v1.random_uniform_initializer(low, high),
        "random_uniform(%g, %g) (the variable's initializer was not recognised)" % (low, high),
    )


def _table_name(var_name, taken):
    base = re.sub(r"[^A-Za-z0-9_.]", "_", var_name)[:100] or "table"
    name, n = base, 1
    while name in taken:
        suffix = "_%d" % n
        name = base[: 100 - len(suffix)] + suffix
        n += 1
    return name


def _lookup_parts(table, embeddings):
    """(inverse indices, row addresses) of the tensor sparse_lookup of `table` that returned
    `embeddings` (as the table records them)."""
    for record in table.lookups.tensor:
        if record["embeddings"] is embeddings:
            return record["inverse"], record["addresses"]
    raise RuntimeError(
        "table %r has no record of the lookup returning %s" % (table.table_name, embeddings.name)
    )


def _keys_tensor(graph, name, var):
    keys = graph.get_tensor_by_name(name)
    if not keys.dtype.is_integer:
        raise graph_rewrite.RewriteError(
            _PASS_NAME,
            [keys.op.name],
            "the keys of variable %r are %s, not integers" % (var, keys.dtype.name),
        )
    if keys.dtype not in (tf.int32, tf.int64):
        keys = tf.cast(keys, tf.int64)
    return keys


def _send_count(keys, var):
    if initialize.get_use_dynamic():
        return None
    count = keys.shape.num_elements()
    if count is None:
        raise graph_rewrite.RewriteError(
            _PASS_NAME,
            [keys.op.name],
            "rec_sdk is initialised with use_dynamic=False (static "
            "shapes), which needs a send_count per lookup, but the keys of variable %r have "
            "the unknown shape %s" % (var, keys.shape),
        )
    return max(int(count), 1)


def _select(analysis, names, done):
    """(variables to convert, skipped) given the names asked for."""
    skipped = list(analysis.skipped)
    found = analysis.by_name()
    if names is None:
        return [m for m in analysis if m.name not in done], skipped
    reasons = {s.name: s.reason for s in skipped}
    problems = []
    for name in names:
        if name in reasons:
            problems.append("%s: %s" % (name, reasons[name]))
        elif name not in found and name not in done:
            problems.append("%s: not a resource variable read through gathers" % name)
    if problems:
        raise graph_rewrite.RewriteError(
            _PASS_NAME, problems, "these variables cannot be converted to rec_sdk tables"
        )
    return [found[n] for n in names if n in found and n not in done], skipped


def convert_embedding_variables(
    graph=None,
    optimizer=None,
    emb_initializer=None,
    variables=None,
    train_op=None,
    dump_graph=False,
    capacity_factor=DEFAULT_CAPACITY_FACTOR,
):
    """Converts the embedding variables of `graph` (default: the default graph) into rec_sdk
    tables (see the module doc). Returns a Conversion. Call it after the model, optimizer and
    train op are built and before the graph is finalized or run; DynamicEmbeddingHook calls it
    in begin(). Variables already converted in `graph` are left alone.

    Args:
      optimizer: a rec_sdk sparse optimizer (copied per graph), or a callable returning one
        (called after init(); needed when the optimizer is built before rec_sdk is
        initialised). Default: LazyAdam with learning rate 0.001.
      emb_initializer: initializer of new rows for every table; default: each variable's own
        initializer when it is random uniform / normal / truncated normal or constant, else
        random_uniform(-0.05, 0.05).
      variables: names (or tf.Variables) of the variables to convert; default: all that
        qualify. A named variable that cannot be converted is an error giving the reason.
      train_op: the op (or op name, or list) that should run the sparse update; default: the
        TRAIN_OP collection, else the ops that ran the variables' dense updates.
      dump_graph: write the graph before and after each pass under
        ./rec_sdk_dump/convert_variables_<n>/.
      capacity_factor: tables of a process initialised with use_dynamic_expansion=False hold
        capacity_factor x rows keys.
    """
    check_bool("dump_graph", dump_graph)
    capacity_factor = check_float("capacity_factor", capacity_factor, 1.0, 1e6)
    graph = graph or tf.compat.v1.get_default_graph()
    if not isinstance(graph, tf.Graph):
        raise TypeError("graph must be a tf.Graph or None, got %r" % (graph,))
    if graph.finalized:
        raise graph_rewrite.RewriteError(
            _PASS_NAME,
            [],
            "the graph is finalized; convert the variables before a "
            "MonitoredSession or Estimator finalizes it (DynamicEmbeddingHook does it in "
            "begin())",
        )
    if optimizer is not None and not (
        isinstance(optimizer, SparseOptimizer) or callable(optimizer)
    ):
        raise TypeError(
            "optimizer must be a rec_sdk sparse optimizer or a callable returning "
            "one, got %r" % (optimizer,)
        )
    names = _variable_names(variables)
    if not initialize.is_initialized():
        initialize.init(use_dynamic_expansion=True)
        logger.info(
            "rec_sdk: initialised with use_dynamic_expansion=True for converted "
            "embedding variables (tables grow without bound)"
        )
    expansion = initialize.get_use_dynamic_expansion()
    done = converted_variables(graph)
    analysis = find_embedding_variables(graph.as_graph_def())
    todo, skipped = _select(analysis, names, done)
    for item in skipped:
        logger.warning(
            "rec_sdk: embedding variable %r is not converted: %s", item.name, item.reason
        )
    if not todo:
        logger.info("rec_sdk: no embedding variable to convert")
        return Conversion([], skipped, None, [])
    train_ops = _train_ops(graph, train_op)

    converted, mapping, control_mapping, pairs = [], {}, {}, []
    with graph.as_default():
        sparse_optimizer = (
            _make_optimizer(optimizer, graph) if any(v.trained for v in todo) else None
        )
        taken = {t.table_name for t in tables_of_graph(graph)}
        for var in todo:
            initializer, described = _initializer_for(var, emb_initializer)
            table_name = _table_name(var.name, taken)
            taken.add(table_name)
            rows = (
                var.rows
                if expansion
                else int(min(MAX_VOCABULARY_SIZE, round(var.rows * capacity_factor)))
            )
            table = create_table(
                tf.int64,
                var.dim,
                table_name,
                initializer,
                device_vocabulary_size=min(rows, MAX_VOCABULARY_SIZE),
            )
            lookups, keys_of, hashed = {}, {}, {}
            with tf.name_scope(table_ops.op_scope_name("rec_sdk_convert_" + table_name)):
                for i, gather in enumerate(var.gathers):
                    keys = _keys_tensor(graph, gather.keys, var.name)
                    name = table_name + ("_lookup" if len(var.gathers) == 1 else "_lookup%d" % i)
                    emb = sparse_lookup(
                        table,
                        keys,
                        send_count=_send_count(keys, var.name),
                        is_train=var.trained,
                        name=name,
                    )
                    lookups[gather.op] = emb
                    keys_of[gather.op] = gather.keys
                    hashed[gather.op] = gather.modulus
                    mapping[gather.op + ":0"] = emb.name
                    control_mapping[gather.op] = emb.op.name
                    if not gather.trains:
                        continue
                    inverse, addresses = _lookup_parts(table, emb)
                    grad = graph.get_tensor_by_name(gather.gradient)
                    # The rows are read before the update writes them.
                    with tf.control_dependencies([emb]):
                        rows_grad = table_ops.sum_rows(
                            tf.reshape(grad, [-1, var.dim]),
                            tf.reshape(inverse, [-1]),
                            tf.size(addresses),
                            name="gradient_rows",
                        )
                    pairs.append((rows_grad, addresses))
            converted.append(
                ConvertedVariable(var.name, table, lookups, keys_of, hashed, var.trained)
            )
            logger.info(
                "rec_sdk: embedding variable %r [%d, %d] -> table %r (%s; %d "
                "gather(s), keys %s; initializer %s)",
                var.name,
                var.rows,
                var.dim,
                table_name,
                "trained" if var.trained else "lookups only",
                len(var.gathers),
                ", ".join(
                    "%s%s"
                    % (g.keys, " (hashing trick %% %d undone)" % g.modulus if g.modulus else "")
                    for g in var.gathers
                ),
                described,
            )
        update = None
        if pairs:
            with tf.name_scope("rec_sdk_convert_update"):
                update = sparse_optimizer.apply_gradients(pairs)
            update = update if isinstance(update, tf.Operation) else update.op

    dump_dir = _dump_dir(dump_graph)
    with_updates = [v.name for v in todo if v.updates]
    passes = [graph_rewrite.RerouteInputs(mapping, control_mapping)]
    if with_updates:
        passes.append(graph_rewrite.DropVariableUpdates(with_updates, train_ops or None))
    graph_def, results = graph_rewrite.run_passes(graph.as_graph_def(), passes, dump_dir)
    targets = []
    if update is not None:
        freed = sorted({m[2] for m in results[1].matches}) if with_updates else []
        targets = train_ops or freed
        if not targets:
            raise graph_rewrite.RewriteError(
                _PASS_NAME,
                [v.name for v in todo if v.trained],
                "no train op found to run the "
                "tables' sparse update: the TRAIN_OP collection is empty and no op runs the "
                "variables' updates; pass train_op=",
            )
        add = graph_rewrite.AddControlInputs({t: [update.name] for t in targets})
        graph_def, more = graph_rewrite.run_passes(graph_def, [add], dump_dir)
        passes.append(add)
        results.extend(more)
    edited = live_graph.update_live_graph(graph, graph_def)
    for var in todo:
        if var.trained and with_updates and not any(m[0] == var.name for m in results[1].matches):
            logger.warning(
                "rec_sdk: no train op runs the dense updates of variable %r; nothing was dropped",
                var.name,
            )
    state = state_of(graph)
    with state.lock:
        for item in converted:
            state.converted[item.name] = item
    logger.info(
        "rec_sdk: converted %d embedding variable(s) to rec_sdk tables, skipped %d "
        "(%d ops rewired; passes: %s)",
        len(converted),
        len(skipped),
        edited,
        ", ".join("%s %d" % (p.name, len(r.matches)) for p, r in zip(passes, results)),
    )
    return Conversion(converted, skipped, update, targets)


class DynamicEmbeddingHook(tf.compat.v1.train.SessionRunHook):
    """Converts a model's tf.Variable embedding tables into rec_sdk hash tables in begin()
    (see the module doc and convert_embedding_variables for the arguments). Add it to
    MonitoredTrainingSession's hooks, or to tf.estimator's train, evaluate and predict hooks
    (every graph that reads the tables needs it). After begin(), `conversion` holds what was
    converted and skipped."""

    def __init__(
        self,
        optimizer=None,
        emb_initializer=None,
        variables=None,
        dump_graph=False,
        train_op=None,
        capacity_factor=DEFAULT_CAPACITY_FACTOR,
    ):
        self._dump_graph = check_bool("dump_graph", dump_graph)
        self._capacity_factor = check_float("capacity_factor", capacity_factor, 1.0, 1e6)
        if optimizer is not None and not (
            isinstance(optimizer, SparseOptimizer) or callable(optimizer)
        ):
            raise TypeError(
                "optimizer must be a rec_sdk sparse optimizer or a callable "
                "returning one, got %r" % (optimizer,)
            )
        self._optimizer = optimizer
        self._emb_initializer = emb_initializer
        self._variables = _variable_names(variables)
        self._train_op = train_op
        self.conversion = None

    def begin(self):
        self.conversion = convert_embedding_variables(
            tf.compat.v1.get_default_graph(),
            optimizer=self._optimizer,
            emb_initializer=self._emb_initializer,
            variables=self._variables,
            train_op=self._train_op,
            dump_graph=self._dump_graph,
            capacity_factor=self._capacity_factor,
        )
