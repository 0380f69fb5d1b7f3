"""Moving the key preprocessing of lookups into the input pipeline (the work of the SDK's
LookupSubgraphSlicerHook and OrphanLookupKeySlicerHook, rec_sdk.graph.hooks).

A tensor lookup's ids are often computed in the training step from the batch (string ids
parsed by StringToNumber, hashing, arithmetic), or from no batch at all (an "orphan" lookup:
ids made from constants). Slicing moves such ops into tf.data: the iterator's dataset is
rebuilt as `source.map(lambda *batch: batch + replayed ops).prefetch(...)`, a new iterator of
the same kind reads it, and every consumer of the old get_next outputs and of the moved
tensors is rerouted (graph_rewrite passes, applied to the live graph as graph modification
does). The step then starts from ready keys, and the work overlaps with training; orphan ids
become part of a batch, so graph modification can trace them to an iterator.

Which tensors move:
* slice_lookup_subgraphs(op_types): every op of a type in `op_types` on the path from an
  iterator's get_next to a tensor lookup's ids, with everything it depends on; the moved
  tensors are its outputs consumed outside the moved ops.
* slice_orphan_lookup_keys(): the ids of tensor lookups computed without any iterator; they
  join the iterator of the other lookups of the same mode (training or evaluation), or the
  graph's only iterator.
Ops that cannot run inside tf.data (stateful ops, placeholders, variables) are not moved: a
warning names them. The old iterator's initializer also initialises the new one.
"""

import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.base import live_graph
from rec_sdk.base.log import logger
from rec_sdk.constants.constants import ASCEND_SPARSE_LOOKUP_ENTRANCE, ASCEND_TIMESTAMP
from rec_sdk.core import anchors as anchor_registry
from rec_sdk.graph import modifier
from rec_sdk.ops import table_ops
from rec_sdk.tables.table import tables_of_graph


def _tensor_lookups(graph):
    """[(table, record)] of the graph's tensor lookups (see SparseEmbedding.lookups.tensor)."""
    return [(table, record) for table in tables_of_graph(graph) for record in table.lookups.tensor]


def _consumers(graph_def):
    """tensor name ("op:i") -> names of the ops reading it through a data input."""
    found = {}
    for node in graph_def.node:
        for name in node.input:
            if name.startswith("^"):
                continue
            tensor = name if ":" in name else name + ":0"
            found.setdefault(tensor, set()).add(node.name)
    return found


def _try_trace(graph_def, tensor, what, hook):
    try:
        return graph_rewrite.replayable_upstream(graph_def, tensor, what)
    except graph_rewrite.RewriteError as error:
        logger.warning("%s: %s stays in the training step: %s", hook, what, error)
        return None


def slice_lookup_subgraphs(graph, op_types, name_marker=None, hook="LookupSubgraphSlicerHook"):
    """Moves the ops of `op_types` (or whose name contains `name_marker`) feeding tensor
    lookups' ids into the input pipeline (see the module doc); returns the number of tensors
    moved."""
    graph_def = graph.as_graph_def()
    nodes = {n.name: n for n in graph_def.node}
    consumers = _consumers(graph_def)
    moved = {}  # get_next -> {target tensor: Trace}
    for _, record in _tensor_lookups(graph):
        above, _ = graph_rewrite.upstream_ops(graph_def, record["ids"].name)
        chosen = sorted(
            n for n in above if nodes[n].op in op_types or (name_marker and name_marker in n)
        )
        traces = []
        for op in chosen:
            what = "op %r (%s) of lookup %r" % (op, nodes[op].op, record["name"])
            trace = _try_trace(graph_def, op + ":0", what, hook)
            if trace is None:
                continue
            if trace.get_next is None:  # constants: they stay (OrphanLookupKeySlicerHook
                logger.debug("%s: %s is computed from constants only", hook, what)  # moves ids)
                continue
            traces.append(trace)
        inside = {n for t in traces for n in t.nodes}
        for trace in traces:
            op = trace.target.split(":")[0]
            for index in range(len(graph.get_operation_by_name(op).outputs)):
                tensor = "%s:%d" % (op, index)
                if consumers.get(tensor, set()) - inside:
                    target = _try_trace(
                        graph_def, tensor, "tensor %r of lookup %r" % (tensor, record["name"]), hook
                    )
                    if target is not None:
                        moved.setdefault(target.get_next, {})[tensor] = target
    return _move(graph, graph_def, moved, hook)


def _orphan_get_next(graph_def, is_train, sources_by_mode, lookup):
    """The get_next an orphan lookup of mode is_train joins: the one iterator of the other
    lookups of its mode, else the graph's only iterator."""
    candidates = sources_by_mode.get(is_train, set())
    if len(candidates) != 1:
        candidates = {
            n.name for n in graph_def.node if n.op in graph_rewrite.iterator_sources.GET_NEXT_OPS
        }
    if len(candidates) != 1:
        raise graph_rewrite.RewriteError(
            "OrphanLookupKeySlicerHook",
            sorted(candidates) or [lookup],
            "cannot tell which input pipeline the ids of %s lookup %r (computed without an "
            "iterator) belong to: the graph has %d iterators and its other %s lookups read "
            "%d; give the lookup ids from its batch"
            % (
                "training" if is_train else "evaluation",
                lookup,
                len(candidates),
                "training" if is_train else "evaluation",
                len(sources_by_mode.get(is_train, ())),
            ),
        )
    return next(iter(candidates))


def slice_orphan_lookup_keys(graph):
    """Moves the ids of tensor lookups computed without an iterator into the input pipeline
    of their mode (see the module doc); returns the number of lookups moved."""
    hook = "OrphanLookupKeySlicerHook"
    graph_def = graph.as_graph_def()
    sources, orphans = {}, []
    for table, record in _tensor_lookups(graph):
        _, get_nexts = graph_rewrite.upstream_ops(graph_def, record["ids"].name)
        if get_nexts:
            sources.setdefault(record["is_train"], set()).update(get_nexts)
        else:
            orphans.append((table, record))
    moved = {}
    for table, record in orphans:
        what = "the ids of lookup %r (table %r)" % (record["name"], table.table_name)
        trace = _try_trace(graph_def, record["ids"].name, what, hook)
        if trace is None:
            continue
        get_next = _orphan_get_next(graph_def, record["is_train"], sources, record["name"])
        moved.setdefault(get_next, {})[trace.target] = graph_rewrite.Trace(
            trace.target, get_next, trace.nodes, []
        )
    return _move(graph, graph_def, moved, hook)


def _move(graph, graph_def, moved, hook):
    """Rebuilds each iterator of `moved` (get_next -> {tensor: Trace}) so that its batch also
    carries the traced tensors, and reroutes their consumers (see the module doc)."""
    if not moved:
        return 0
    if graph.finalized:
        raise graph_rewrite.RewriteError(
            hook, [], "the graph is finalized; run the hook's begin() before the session is created"
        )
    done = [m.old_get_next.name for m in modifier.modified_iterators(graph)]
    if done:
        raise graph_rewrite.RewriteError(
            hook,
            done,
            "graph modification already rebuilt these iterators; the slicer hooks "
            "must run first: list them before GraphModifierHook (or call them before "
            "modify_graph_and_start_emb_cache)",
        )
    mapping, control, additions = {}, {}, {}
    for get_next, by_target in sorted(moved.items()):
        traces = [by_target[t] for t in sorted(by_target)]
        source = graph_rewrite.iterator_source(graph_def, get_next)
        structure = modifier.flat_structure(source)
        replay = modifier.replay_fn(graph_def, get_next, traces)

        def make_dataset(variant, structure=structure, replay=replay):
            dataset = tf.data.experimental.from_variant(variant, structure)
            return dataset.map(lambda *flat: tuple(flat) + tuple(replay(flat))).prefetch(
                modifier.PREFETCH
            )

        with (
            graph.as_default(),
            tf.name_scope(table_ops.op_scope_name("rec_sdk_sliced_" + get_next)),
        ):
            initializer, batch = modifier.new_iterator(graph, source, make_dataset)
        n_flat = len(structure)
        for i in range(n_flat):
            mapping["%s:%d" % (get_next, i)] = batch[i].name
        for j, trace in enumerate(traces):
            mapping[trace.target] = batch[n_flat + j].name
        control[get_next] = batch[0].op.name
        if initializer is not None:
            additions[source.initializer] = [initializer.name]
        logger.info(
            "%s: %d tensor(s) now come from the input pipeline of %s: %s",
            hook,
            len(traces),
            get_next,
            ", ".join(t.target for t in traces),
        )
    passes = [graph_rewrite.RerouteInputs(mapping, control)]
    if additions:
        passes.append(graph_rewrite.AddControlInputs(additions))
    final, _ = graph_rewrite.run_passes(graph.as_graph_def(), passes)
    live_graph.update_live_graph(graph, final)
    _remap_recorded(graph, mapping)
    return sum(len(v) for v in moved.values())


def _remap_recorded(graph, mapping):
    """Tensors that rec_sdk recorded for later passes (lookup ids, timestamps, batches)
    name the new ones."""

    def swap(value):
        if isinstance(value, tf.Tensor) and value.name in mapping:
            return graph.get_tensor_by_name(mapping[value.name])
        return value

    for _, record in _tensor_lookups(graph):
        record["ids"] = swap(record["ids"])
    for anchor in anchor_registry.of_graph(graph):
        anchor.ids = swap(anchor.ids)
        anchor.timestamps = swap(anchor.timestamps)
        if anchor.batch is not None:
            anchor.batch = tf.nest.map_structure(swap, anchor.batch)
    for collection in (ASCEND_SPARSE_LOOKUP_ENTRANCE, ASCEND_TIMESTAMP):
        entries = graph.get_collection_ref(collection)
        entries[:] = [swap(t) for t in entries]
