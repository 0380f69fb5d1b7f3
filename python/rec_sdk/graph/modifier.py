"""Automatic graph modification (mirrors mx_rec.graph.modifier).

A model written with plain tf.data + iterator input and `sparse_lookup(table, ids_tensor,
modify_graph=True)` works as it is: each lookup deduplicates its ids and maps them to rows
inside the training step. `modify_graph_and_start_emb_cache()` moves that work into the input
pipeline, as FeatureSpec mode does, without the user writing FeatureSpecs:

1. each recorded lookup's ids (and its timestamps, for eviction) are traced back through the
   preprocessing ops to an IteratorGetNext (graph_rewrite.trace_to_iterator);
2. per iterator, the dataset behind it is rebuilt as
   `source.map(replayed preprocessing + get_asc_insert_func).prefetch(...)`, with a new
   iterator of the same kind (initializable or one-shot);
3. per table and iterator, one find_or_insert + gather on the pipeline's unique keys replaces
   the lookups' own (so a table's lookups on one batch share one dedup, as in FeatureSpec mode);
4. graph_rewrite passes reroute every consumer of the old get_next outputs (labels and dense
   features too) to the new iterator, and the lookups' rows, addresses and inverse indices to
   the shared ones; the old iterator's initializer also initialises the new one. The result is
   applied to the live graph (rec_sdk.base.live_graph.update_live_graph), so the user's train op,
   tensors and hooks keep working;
5. the pipeline is checked (start_asc_pipeline).

`get_initializer(is_training)` / `get_target_batch(is_training)` (rec_sdk.util.initialize)
return the new iterators' initializer and batch; `GraphModifierHook` does all of it for
tf.estimator.
"""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.data.util import structure as data_structure
from tensorflow.python.framework import function
from tensorflow.python.ops import gen_dataset_ops, gen_functional_ops

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.base import graph_state, live_graph, tf_patches
from rec_sdk.base.dump import next_dump_path
from rec_sdk.base.log import logger
from rec_sdk.base.validation import INT32_MAX, check_bool
from rec_sdk.constants.constants import ASCEND_CUTTING_POINT_INITIALIZER, LOOKUP_COLLECTIONS
from rec_sdk.core import anchors as anchor_registry
from rec_sdk.core import embedding, lookup_rows
from rec_sdk.core.asc import helper
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.manager import start_asc_pipeline
from rec_sdk.distribute import ranks
from rec_sdk.ops import table_ops
from rec_sdk.util import initialize

PREFETCH = 10
_MAX_POSITIONS = 256  # FeatureSpec index_key positions


class ModifiedIterator:
    """The iterator that replaced one IteratorGetNext: what get_initializer and
    get_target_batch return."""

    def __init__(self, is_training, kind, initializer, old_get_next, new_flat, batches):
        self.is_training = is_training
        self.kind = kind
        self.initializer = initializer  # None for one-shot iterators
        self.old_get_next = old_get_next
        self.new_flat = new_flat  # the new get_next's tensors for the old outputs
        self.batches = batches  # the batch= structures passed to the lookups

    def batch(self):
        """The new batch: the structure given as batch= to the lookups (or the get_next
        outputs as a tuple), holding the new iterator's tensors."""

        def swap(tensor):
            if isinstance(tensor, tf.Tensor) and tensor.op is self.old_get_next:
                return self.new_flat[tensor.value_index]
            return tensor

        if self.batches:
            return tf.nest.map_structure(swap, self.batches[0])
        return tuple(self.new_flat)


def modified_iterators(graph=None, is_training=None):
    """The ModifiedIterators of `graph` (default: the default graph), optionally only the
    training (True) or evaluation (False) ones."""
    return graph_state.modified_iterators(graph, is_training)


def flat_structure(source):
    """The TensorSpecs of an iterator's flat get_next outputs (graph_rewrite.IteratorSource);
    RewriteError for sparse or ragged components."""
    specs = []
    for dtype, shape in zip(source.output_types, source.output_shapes):
        dtype = tf.as_dtype(dtype)
        if dtype == tf.variant:
            raise graph_rewrite.RewriteError(
                "modify_graph",
                [source.get_next],
                "the iterator yields a sparse or ragged "
                "component (a variant tensor); graph modification supports datasets of dense "
                "tensors",
            )
        specs.append(tf.TensorSpec(tf.TensorShape(shape), dtype))
    return tuple(specs)


def _dump_dir(dump_graph):
    return next_dump_path("modify_graph") if dump_graph else None


class _Group:
    """The recorded lookups whose ids come from one IteratorGetNext."""

    def __init__(self, get_next):
        self.get_next = get_next
        self.anchors = []
        self.traces = []  # per anchor: ids Trace
        self.time_traces = {}  # table name -> timestamps Trace


def _group_anchors(graph_def, todo):
    groups = {}
    for anchor in todo:
        what = "ids of sparse_lookup %r (modify_graph=True)" % anchor.name
        trace = graph_rewrite.trace_to_iterator(graph_def, anchor.ids.name, what)
        group = groups.setdefault(trace.get_next, _Group(trace.get_next))
        group.anchors.append(anchor)
        group.traces.append(trace)
        if anchor.timestamps is not None:
            what = "timestamps of sparse_lookup %r" % anchor.name
            ts_trace = graph_rewrite.trace_to_iterator(graph_def, anchor.timestamps.name, what)
            if ts_trace.get_next != trace.get_next:
                raise graph_rewrite.RewriteError(
                    "modify_graph",
                    [trace.get_next, ts_trace.get_next],
                    "%s come from another iterator than its ids" % what,
                )
            table = anchor.table.table_name
            known = group.time_traces.get(table)
            if known is not None and known.target != ts_trace.target:
                raise graph_rewrite.RewriteError(
                    "modify_graph",
                    [known.target, ts_trace.target],
                    "the lookups of table "
                    "%r on one batch use different timestamp tensors; a table has one" % table,
                )
            group.time_traces[table] = ts_trace
    for group in groups.values():
        modes = {a.is_train for a in group.anchors}
        if len(modes) > 1:
            raise graph_rewrite.RewriteError(
                "modify_graph",
                [group.get_next] + [a.name for a in group.anchors],
                "one iterator feeds both training lookups %s and evaluation lookups %s; use one "
                "iterator per mode"
                % (
                    [a.name for a in group.anchors if a.is_train],
                    [a.name for a in group.anchors if not a.is_train],
                ),
            )
    return list(groups.values())


def _feature_specs(group, n_flat):
    """FeatureSpecs of the insert function: lookup j's replayed ids sit at position
    n_flat + j of the mapped tuple, then one timestamp tensor per table."""
    specs, targets = [], []
    for j, (anchor, trace) in enumerate(zip(group.anchors, group.traces)):
        table = anchor.table
        access = evict = None  # evaluation pipelines neither count nor timestamp keys
        if anchor.is_train and table.admission:
            access = table.access_threshold
        if anchor.is_train and table.clock == "timestamp":
            evict = table.eviction_threshold
            access = table.access_threshold
        specs.append(
            FeatureSpec(
                "lookup%d" % j,
                table_name=table.table_name,
                index_key=n_flat + j,
                access_threshold=access,
                eviction_threshold=evict,
                faae_coefficient=anchor.coefficient,
            )
        )
        targets.append(trace)
    for table, trace in sorted(group.time_traces.items()):
        specs.append(
            FeatureSpec(
                "timestamps_%s" % table,
                table_name=table,
                index_key=n_flat + len(targets),
                is_timestamp=True,
            )
        )
        targets.append(trace)
    if n_flat + len(targets) > _MAX_POSITIONS:
        raise graph_rewrite.RewriteError(
            "modify_graph",
            [group.get_next],
            "the iterator has %d outputs and %d lookups; at "
            "most %d fit in one input pipeline" % (n_flat, len(targets), _MAX_POSITIONS),
        )
    return specs, targets


def replay_fn(graph_def, get_next, targets):
    """A function of the flat values of IteratorGetNext `get_next` returning the traced
    tensors (graph_rewrite.Trace targets), recomputed from a copy of the ops between."""
    nodes = sorted({n for t in targets for n in t.nodes})
    subgraph = graph_rewrite.extract_subgraph(graph_def, nodes) if nodes else None
    used = sorted({o for t in targets if t.nodes for o in t.outputs})
    computed = [t.target for t in targets if t.nodes]

    def replay(flat):
        values = {}
        if computed:
            input_map = {"%s:%d" % (get_next, i): flat[i] for i in used}
            found = tf.compat.v1.import_graph_def(
                subgraph, input_map=input_map, return_elements=computed, name="replay"
            )
            values = dict(zip(computed, found))
        return [values[t.target] if t.nodes else flat[t.outputs[0]] for t in targets]

    return replay


def _one_shot_iterator(source, make_dataset):
    """A new one-shot iterator whose dataset is make_dataset(original dataset): the factory
    calls the original one (statefully, so that it is not constant-folded) and maps it."""
    holder = {}

    @function.Defun()
    def factory():
        original = gen_functional_ops.stateful_partitioned_call(
            args=[], Tout=[tf.variant], f=attr_value_pb2.NameAttrList(name=source.factory)
        )[0]
        dataset = make_dataset(original)
        holder["spec"] = dataset.element_spec
        return tf_patches.dataset_variant(dataset)

    factory.add_to_graph(tf.compat.v1.get_default_graph())
    spec = holder["spec"]
    types = data_structure.get_flat_tensor_types(spec)
    shapes = data_structure.get_flat_tensor_shapes(spec)
    resource = gen_dataset_ops.one_shot_iterator(
        dataset_factory=factory, output_types=types, output_shapes=shapes, name="iterator"
    )
    flat = gen_dataset_ops.iterator_get_next(
        resource, output_types=types, output_shapes=shapes, name="get_next"
    )
    return tf.nest.pack_sequence_as(spec, flat, expand_composites=True)


def new_iterator(graph, source, make_dataset):
    """A new iterator of the kind of `source` (an IteratorSource) over
    make_dataset(variant of the original dataset), built in the current name scope:
    -> (its initializer, or None for a one-shot iterator; its get_next structure)."""
    if source.kind == "initializable":
        dataset = make_dataset(graph.get_tensor_by_name(graph_rewrite.tensor_name(source.dataset)))
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        return iterator.initializer, iterator.get_next()
    return None, _one_shot_iterator(source, make_dataset)


def _rebuild(graph, graph_def, group, dump_graph):
    """Builds group's new input pipeline, iterator and shared lookups; returns
    (ModifiedIterator, tensor mapping, control mapping, initializer additions)."""
    source = graph_rewrite.iterator_source(graph_def, group.get_next)
    structure = flat_structure(source)
    n_flat = len(structure)
    is_training = group.anchors[0].is_train
    specs, targets = _feature_specs(group, n_flat)
    replay = replay_fn(graph_def, group.get_next, targets)
    with graph.as_default():
        insert = helper.get_asc_insert_func(
            tgt_key_specs=specs, is_training=is_training, dump_graph=dump_graph
        )

    def pipeline(*flat):
        mapped = insert(*(tuple(flat) + tuple(replay(flat))))
        return tuple(flat) + (mapped[-1],)

    def make_dataset(variant):
        dataset = tf.data.experimental.from_variant(variant, structure)
        return dataset.map(pipeline).prefetch(PREFETCH)

    old_get_next = graph.get_operation_by_name(group.get_next)
    scope = table_ops.op_scope_name("rec_sdk_modified_" + group.get_next)
    with graph.as_default(), tf.name_scope(scope):
        initializer, batch = new_iterator(graph, source, make_dataset)
        if initializer is not None:
            graph.add_to_collection(ASCEND_CUTTING_POINT_INITIALIZER, initializer)
        new_flat = list(batch[:n_flat])
        entries = batch[n_flat]
        mapping = {"%s:%d" % (group.get_next, i): t.name for i, t in enumerate(new_flat)}
        shared = {}
        replaced = []
        for j, anchor in enumerate(group.anchors):
            table = anchor.table
            rows = shared.get(table.table_name)
            if rows is None:
                send_counts = [a.send_count for a in group.anchors if a.table is table]
                send_count = None
                if all(s is not None for s in send_counts):
                    send_count = min(sum(send_counts), INT32_MAX)
                with tf.name_scope(table_ops.op_scope_name(table.table_name)):
                    rows = lookup_rows.pipeline_rows(
                        table, entries, is_training, send_count, anchor.name
                    )
                shared[table.table_name] = rows
            mapping[anchor.addresses.name] = rows["addresses"].name
            mapping[anchor.trained_addresses.name] = rows["trained"].name
            replaced.append((anchor.trained_addresses, rows["trained"]))
            mapping[anchor.local_emb.name] = rows["emb"].name
            _replace_in_collections(graph, anchor, rows)
            mapping[anchor.inverse.name] = entries[helper.inverse_key(specs[j].name)].name
        mapping.update(ranks.replace_lookups(replaced))
    control = {group.get_next: new_flat[0].op.name}
    additions = {}
    if initializer is not None:
        additions[source.initializer] = [initializer.name]
    anchors_batches = [a.batch for a in group.anchors if a.batch is not None]
    modified = ModifiedIterator(
        is_training, source.kind, initializer, old_get_next, new_flat, anchors_batches
    )
    return modified, mapping, control, additions


def _replace_in_collections(graph, anchor, rows):
    """The by-address collections name the shared rows instead of the anchor's own (once per
    table and batch, as FeatureSpec lookups register them), for optimizers built after the
    modification."""
    for collection, old, new in zip(
        LOOKUP_COLLECTIONS,
        (anchor.local_emb, anchor.trained_addresses, anchor.trained_addresses),
        (rows["emb"], rows["trained"], rows["trained"]),
    ):
        entries = graph.get_collection_ref(collection)
        for i, entry in enumerate(entries):
            if entry is old:
                if any(e is new for e in entries):
                    del entries[i]
                else:
                    entries[i] = new
                break


def modify_graph_and_start_emb_cache(full_graph=None, dump_graph=False):
    """Rewrites the graph so that the lookups made with modify_graph=True get their keys
    from the input pipeline (see the module doc), then starts the pipeline.

    Call it after the model is built (the optimizer and train op may come before or after)
    and before the first session.run of the graph (a session that already ran the graph keeps
    running the old edges); then run `get_initializer(True/False)` (or the old iterators'
    initializers, which now also initialise the new iterators). Calling it again only handles
    lookups added since. Errors (ids fed by a placeholder, stateful preprocessing, unsupported
    iterators) are graph_rewrite.RewriteError (a ValueError) naming the ops.

    Args:
      full_graph: the tf.Graph to modify (default: the default graph).
      dump_graph: write the graph before and after each pass, and the insert functions, as
        .pbtxt under ./rec_sdk_dump/.
    """
    check_bool("dump_graph", dump_graph)
    graph = full_graph or tf.compat.v1.get_default_graph()
    if not isinstance(graph, tf.Graph):
        raise TypeError("full_graph must be a tf.Graph or None, got %r" % (full_graph,))
    todo = [a for a in anchor_registry.of_graph(graph) if not a.modified]
    if todo:
        if graph.finalized:
            raise graph_rewrite.RewriteError(
                "modify_graph",
                [],
                "the graph is finalized; call "
                "modify_graph_and_start_emb_cache before creating a MonitoredSession, or use "
                "GraphModifierHook in tf.estimator",
            )
        graph_def = graph.as_graph_def()
        groups = _group_anchors(graph_def, todo)
        done_before = {m.old_get_next.name for m in modified_iterators(graph)}
        for group in groups:
            if group.get_next in done_before:
                raise graph_rewrite.RewriteError(
                    "modify_graph",
                    [group.get_next] + [a.name for a in group.anchors],
                    "the iterator of these lookups was already modified by an earlier call; "
                    "a second pipeline over its dataset would feed them other samples than "
                    "the first: build every lookup of an iterator before calling "
                    "modify_graph_and_start_emb_cache",
                )
        mapping, control, additions, done = {}, {}, {}, []
        for group in groups:
            modified, group_mapping, group_control, group_additions = _rebuild(
                graph, graph_def, group, dump_graph
            )
            mapping.update(group_mapping)
            control.update(group_control)
            additions.update(group_additions)
            done.append(modified)
        passes = [graph_rewrite.RerouteInputs(mapping, control)]
        if additions:
            passes.append(graph_rewrite.AddControlInputs(additions))
        final, results = graph_rewrite.run_passes(
            graph.as_graph_def(), passes, dump_dir=_dump_dir(dump_graph)
        )
        edited = live_graph.update_live_graph(graph, final)
        for anchor in todo:
            anchor.modified = True
        state = graph_state.state_of(graph)
        with state.lock:
            state.modified_iterators.extend(done)
        logger.info(
            "rec_sdk: graph modified: %d lookup(s) on %d iterator(s) now take their "
            "keys from the input pipeline (%d ops rewired; passes: %s)",
            len(todo),
            len(groups),
            edited,
            ", ".join("%s %d" % (p.name, len(r.matches)) for p, r in zip(passes, results)),
        )
    start_asc_pipeline(graph)


def share_tables(graph=None):
    """Lets the tables of `graph` share storage with other sessions of this process through
    checkpoints: restoring a checkpoint that a table of the process already holds in memory
    (unchanged since it was saved or restored) uses that table instead of reading files and
    building a copy. A graph that trains a table shares only a table no other live session
    uses; an evaluation or prediction graph may read the training session's table (tf.estimator
    evaluates while its training session waits). A table that still equals its checkpoint
    when its last session closes is kept (one per table name) for the next Estimator mode."""
    graph = graph or tf.compat.v1.get_default_graph()
    for table in embedding.tables_of_graph(graph):
        table_ops.set_share_attr(table.handle, "trainer" if table.lookups.training else "reader")


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """For tf.estimator (train, evaluate, predict, train_and_evaluate) and
    MonitoredTrainingSession: begin() modifies the graph (modify_graph=True) or only starts
    the FeatureSpec pipeline (modify_graph=False), and lets the tables share storage across
    the Estimator's sessions (share_tables); after the session is created it runs the new
    iterators' initializers."""

    def __init__(self, dump_graph=False, modify_graph=True):
        self._dump_graph = check_bool("dump_graph", dump_graph)
        self._modify_graph = check_bool("modify_graph", modify_graph)
        self._initializers = []
        if initialize.is_initialized():  # as the SDK records it
            initialize.get_config().train_params_config.is_graph_modify_hook_running = True

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        if self._modify_graph:
            modify_graph_and_start_emb_cache(graph, dump_graph=self._dump_graph)
        else:
            start_asc_pipeline(graph)
        share_tables(graph)
        self._initializers = [
            m.initializer for m in modified_iterators(graph) if m.initializer is not None
        ]

    def after_create_session(self, session, coord):
        del coord
        if self._initializers:
            session.run(self._initializers)
