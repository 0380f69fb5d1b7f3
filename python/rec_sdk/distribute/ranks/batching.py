"""Batching lookups into one exchange (a graph pass over the lookups' tokens): the lookups an
optimizer trains, and the graph's other lookups when the graph is finalized."""

import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.base import live_graph
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.distribute.ranks.exchange import batch_gradients, exchange_batch


def lookup_of(token):
    """The lookup of tables sharded over ranks whose token `token` is (the addresses its
    gradients go to), or None."""
    if not isinstance(token, tf.Tensor):
        return None
    return state_of(token.graph).rank_lookups.get(token.name)


def replace_lookups(pairs):
    """Graph modification replaces lookups by the input pipeline's: [(old token, new token)]
    -> {old tensor name: new tensor name} taking what read the old lookups over to the new
    ones, for lookups of tables sharded over ranks (empty for others). Where the old lookups
    were batched (an optimizer built on them), their batch is rebuilt from the new lookups
    (several old ones may share one new one): its forward outputs, and its gradients' (the
    gradients the optimizer sends for the old lookups now go, summed per new lookup, through
    the new batch)."""
    mapping = {}
    replaced = {}
    for old_token, new_token in pairs:
        old, new = lookup_of(old_token), lookup_of(new_token)
        if old is not None and new is not None and old.batch is not None:
            replaced[old] = new
    batches = []
    for old in replaced:
        if old.batch not in batches:
            batches.append(old.batch)
    for old_batch in batches:
        targets, where = [], []
        for lookup in old_batch.lookups:
            target = replaced.get(lookup, lookup)
            if target.batch is not None and target.batch is not old_batch:
                raise ValueError(
                    "graph modification: lookup of table %r is in two batches "
                    "of lookups over ranks" % target.table.table_name
                )
            if target not in targets:
                targets.append(target)
            where.append(targets.index(target))
        for target in targets:
            target.batch = None
        ranks = old_batch.ranks
        graph = old_batch.cap.graph
        with (
            graph.as_default(),
            graph.control_dependencies(None),
            tf.device(ranks.device),
            tf.name_scope("rank_batch"),
        ):
            batch = exchange_batch(targets)
            for i, j in enumerate(where):
                for field in ("emb", "addresses", "trained"):
                    mapping[old_batch.outputs[i][field].name] = batch.outputs[j][field].name
                mapping[old_batch.trained[i].name] = batch.trained[j].name
            if old_batch.gradients is not None:
                grads_in, grads_out = old_batch.gradients
                by_segment = {}
                for i, grad in grads_in.items():
                    j = where[i]
                    by_segment[j] = grad if j not in by_segment else by_segment[j] + grad
                new_out = dict(batch_gradients(batch, by_segment, pairs_out=False))
                first = set()
                for i, out in grads_out.items():
                    j = where[i]
                    if j in first:  # the new lookup's gradients are applied once
                        mapping[out.name] = tf.zeros_like(new_out[j]).name
                    else:
                        mapping[out.name] = new_out[j].name
                        first.add(j)
        _register(batch, graph)
    return mapping


def _register(batch, graph):
    """Marks the lookups of `batch` batched, under their batch tokens too."""
    state = state_of(graph)
    for i, lookup in enumerate(batch.lookups):
        lookup.batch, lookup.segment = batch, i
        token = batch.outputs[i]["trained"]
        with state.lock:
            state.rank_lookups[token.name] = lookup
        lookup.table.lookups.trained_address_names.add(token.name)


def batch_lookups(tokens, graph=None):
    """Moves the lookups whose tokens these are (of tables sharded over ranks, not yet run)
    into one exchange: one needs gather, one keys all-to-all and one rows all-to-all
    for all of them, their bookkeeping done once for the batch rather than once per lookup
    (tables of any dims; each keeps its own settings). Each collective costs a round of
    messages and its CPU whatever its size, and each op its scheduling, so a model with many
    tables steps as fast as one with one table of the same keys. The lookups' consumers are
    rewired to the batch (their own exchanges stay in the graph, unused). A step then runs
    all of them together: fetching one of these lookups runs the others' (and their inputs)
    too.
    Returns the number of lookups batched."""
    lookups = []
    for token in tokens:
        lookup = lookup_of(token)
        if lookup is not None and lookup.batch is None and lookup not in lookups:
            lookups.append(lookup)
    if not lookups:
        return 0
    ranks = lookups[0].table.ranks
    graph = graph or lookups[0].columns.graph
    # Outside any control dependencies of the caller (e.g. minimize() under UPDATE_OPS): the
    # lookups' forward pass must not wait for ops that depend on it.
    with (
        graph.as_default(),
        graph.control_dependencies(None),
        tf.device(ranks.device),
        tf.name_scope("rank_batch"),
    ):
        batch = exchange_batch(lookups)
    mapping = {}
    for i, lookup in enumerate(lookups):
        for field in ("emb", "addresses", "trained"):
            mapping[lookup.outputs[field].name] = batch.outputs[i][field].name
    _register(batch, graph)
    final, _ = graph_rewrite.run_passes(
        graph.as_graph_def(), [graph_rewrite.RerouteInputs(mapping, {})]
    )
    live_graph.update_live_graph(graph, final, "batch_lookups")
    logger.info(
        "rec_sdk: %d lookups over %d ranks batched into one exchange", len(lookups), ranks.size
    )
    return len(lookups)


def pending_train_tokens(tokens):
    """The tokens of the training lookups over ranks of the graph of `tokens` that are not
    batched yet (in build order)."""
    if not tokens:
        return []
    state = state_of(tokens[0].graph)
    with state.lock:
        return [
            lookup.outputs["trained"]
            for name, lookup in state.rank_lookups.items()
            if lookup.batch is None and lookup.is_train and lookup.outputs["trained"].name == name
        ]


def batch_pending_lookups(graph):
    """Batches the lookups over ranks of `graph` that no optimizer batched (evaluation
    lookups, and training lookups nothing trains): one batch of each kind. Called when
    MonitoredTrainingSession or Estimator finalizes the graph. Returns the number batched."""
    state = state_of(graph)
    with state.lock:
        pending = [
            (name, lookup)
            for name, lookup in state.rank_lookups.items()
            if lookup.batch is None and lookup.outputs["trained"].name == name
        ]
    done = 0
    for is_train in (False, True):
        tokens = [lookup.outputs["trained"] for _, lookup in pending if lookup.is_train == is_train]
        done += batch_lookups(tokens, graph) if tokens else 0
    return done
