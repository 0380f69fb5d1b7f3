"""DropVariableUpdates: a pass that stops a train op from running the dense updates of chosen
variables (whose rows a hash table trains instead); see embedding_variables for how a
variable's update ops are found."""

import collections

from rec_sdk_graph_rewrite.core import GraphPass, RewriteError
from rec_sdk_graph_rewrite.embedding_variables import (
    REF_VARIABLE_OPS,
    GraphIndex,
    is_variable_write,
    node_name,
    variable_writes,
)


def _topological(index, names):
    """`names` in an order where every op follows its inputs among them."""
    pending = {n: sum(1 for i in index.nodes[n].input if node_name(i) in names) for n in names}
    ready = sorted(n for n, count in pending.items() if count == 0)
    order = []
    while ready:
        name = ready.pop()
        order.append(name)
        for edge in index.consumers.get(name, ()):
            if edge.consumer in pending:
                pending[edge.consumer] -= 1
                if pending[edge.consumer] == 0:
                    ready.append(edge.consumer)
    return order


class DropVariableUpdates(GraphPass):
    """Stops the dense updates of some variables from running.

    Pattern: for each named variable, its update ops U (writes other than its initializer and
    Saver restores; with `train_ops`, only those the train ops run) and the ops serving only
    them: U, and ops downstream of U that depend on no other variable write than those feeding
    U (the optimizer's per-variable group NoOp `.../update_<var>/group_deps`), and not the
    train ops themselves. Their control edges into the rest of the graph (a group NoOp of all
    updates, Adam's beta-power updates, the train op; with `train_ops`, only those the train
    ops depend on) are what runs them.
    Rewrite: those control edges are removed, so the train op no longer runs the updates (nor
    the slot updates and gradient aggregation feeding only them); the ops stay in the graph.
    Checks: the variables exist and are variables; the train ops exist and are not updates of
    the variables; the edges to cut are control edges (a data edge from an update into the
    rest of the graph is an error naming both ops); after the rewrite no train op (or no op
    that ran the updates) depends on an update any more.

    Matches: (variable, dedicated op, consumer op) per control edge removed.
    """

    name = "drop_variable_updates"
    pattern = (
        "control edges from a variable's update ops (and ops serving only them) into "
        "the ops that run them"
    )

    def __init__(self, variable_names, train_ops=None):
        """variable_names: variable op names ("emb" or "emb:0"); train_ops: op names (or None:
        every op that runs an update)."""
        if isinstance(variable_names, str):
            variable_names = [variable_names]
        self.variable_names = [node_name(v) for v in variable_names]
        self.train_ops = None if train_ops is None else [node_name(t) for t in train_ops]
        self._freed = {}

    def check(self, graph_def, stage):
        index = GraphIndex(graph_def)
        if stage == "before":
            missing = sorted(v for v in self.variable_names if v not in index.nodes)
            if missing:
                raise RewriteError(
                    self.name, missing, "variables to drop the updates of do not exist"
                )
            wrong = sorted(
                "%s (%s)" % (v, index.nodes[v].op)
                for v in self.variable_names
                if index.nodes[v].op not in ("VarHandleOp",) + REF_VARIABLE_OPS
            )
            if wrong:
                raise RewriteError(self.name, wrong, "these ops are not variables")
            if self.train_ops is not None:
                missing = sorted(t for t in self.train_ops if t not in index.nodes)
                if missing:
                    raise RewriteError(self.name, missing, "train ops do not exist")
            return
        # After: nothing that ran an update (the train ops) depends on one any more.
        for var in self.variable_names:
            updates = set(variable_writes(index, var)[2])
            holders = set(self._freed.get(var, ()))
            if self.train_ops is not None:
                holders |= set(self.train_ops)
            still = sorted(
                h for h in holders if h in index.nodes and index.ancestors([h]) & updates
            )
            if still:
                raise RewriteError(
                    self.name,
                    still,
                    "these ops still run updates of variable %r after the rewrite" % var,
                )

    def _updates(self, index, var, train_ancestors):
        updates = variable_writes(index, var)[2]
        if train_ancestors is not None:
            updates = [u for u in updates if u in train_ancestors]
        return updates

    def match(self, graph_def):
        index = GraphIndex(graph_def)
        train_ancestors = None if self.train_ops is None else index.ancestors(self.train_ops)
        matches, data_edges = [], []
        self._freed = {}
        for var in self.variable_names:
            updates = self._updates(index, var, train_ancestors)
            if not updates:
                continue
            bad = sorted(set(updates) & set(self.train_ops or ()))
            if bad:
                raise RewriteError(
                    self.name,
                    bad,
                    "a train op is itself an update of variable "
                    "%r; its update cannot be dropped from it" % var,
                )
            feeding = index.ancestors(updates)
            other_writes = [
                n for n, node in index.nodes.items() if is_variable_write(node) and n not in feeding
            ]
            tainted = index.descendants(other_writes)
            downstream = index.descendants(updates)
            if self.train_ops is None:
                # Without train ops, the ops nothing consumes are what a session fetches.
                boundary = {n for n in downstream if not index.consumers.get(n)}
            else:
                boundary = set(self.train_ops)
            dedicated = set(updates)
            for name in _topological(index, downstream):
                if name in dedicated or name in boundary or name in tainted:
                    continue
                inputs = {node_name(i) for i in index.nodes[name].input}
                if all(i in dedicated for i in inputs & downstream):
                    dedicated.add(name)
            # An op the rest of the graph reads by data (a Const made under the updates'
            # control dependencies) keeps running: its control inputs are cut instead.
            changed = True
            while changed:
                changed = False
                for name in sorted(dedicated - set(updates)):
                    if any(
                        not e.control
                        and e.consumer not in dedicated
                        and (train_ancestors is None or e.consumer in train_ancestors)
                        for e in index.consumers.get(name, ())
                    ):
                        dedicated.discard(name)
                        changed = True
            for name in sorted(dedicated):
                for edge in index.consumers.get(name, ()):
                    if edge.consumer in dedicated:
                        continue
                    if train_ancestors is not None and edge.consumer not in train_ancestors:
                        continue
                    if not edge.control:
                        data_edges.append("%s -> %s" % (name, edge.consumer))
                        continue
                    matches.append((var, name, edge.consumer))
                    self._freed.setdefault(var, set()).add(edge.consumer)
            if data_edges:
                raise RewriteError(
                    self.name,
                    data_edges,
                    "the updates of variable %r feed "
                    "these ops by data edges; only control edges can be "
                    "dropped" % var,
                )
        return matches

    def rewrite(self, graph_def, matches):
        drop = collections.defaultdict(set)
        for _, name, consumer in matches:
            drop[consumer].add("^" + name)
        for node in graph_def.node:
            if node.name in drop:
                kept = [i for i in node.input if i not in drop[node.name]]
                del node.input[:]
                node.input.extend(kept)
