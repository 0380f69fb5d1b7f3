"""The pass framework: GraphPass, its result, invariant checks and graph dumps."""

import collections
import os

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

PassResult = collections.namedtuple("PassResult", ["graph_def", "modified", "matches"])


class RewriteError(ValueError):
    """A pattern matched only partly, or a graph breaks an invariant: names the ops and why."""

    def __init__(self, pass_name, ops, reason):
        self.pass_name = pass_name
        self.ops = list(ops)
        super().__init__("%s: %s (ops: %s)" % (pass_name, reason, ", ".join(self.ops) or "-"))


def _node_of(input_name):
    """'^a' / 'a:1' / 'a' -> 'a'."""
    return input_name.lstrip("^").split(":")[0]


def check_graph(graph_def, pass_name="check_graph"):
    """The invariants every pass keeps: unique node names, every input names an existing node
    (and an existing output of it), no cycles among data and control edges outside loops, and
    the GraphDef imports into a fresh tf.Graph (op definitions, attributes and shapes agree).
    Raises RewriteError naming the offending ops."""
    nodes = {}
    for node in graph_def.node:
        if node.name in nodes:
            raise RewriteError(pass_name, [node.name], "two nodes share this name")
        nodes[node.name] = node
    dangling = sorted(
        {
            "%s <- %s" % (n.name, i)
            for n in graph_def.node
            for i in n.input
            if _node_of(i) not in nodes
        }
    )
    if dangling:
        raise RewriteError(pass_name, dangling, "inputs name nodes that do not exist")
    # Cycles (ignoring NextIteration back edges of while loops).
    state = {}
    for start in nodes:
        if start in state:
            continue
        stack = [(start, iter(nodes[start].input))]
        state[start] = 1
        while stack:
            name, inputs = stack[-1]
            advanced = False
            for inp in inputs:
                child = _node_of(inp)
                if nodes[child].op in ("NextIteration", "RefNextIteration"):
                    continue
                if state.get(child) == 1:
                    raise RewriteError(pass_name, [name, child], "the graph has a cycle")
                if child not in state:
                    state[child] = 1
                    stack.append((child, iter(nodes[child].input)))
                    advanced = True
                    break
            if not advanced:
                state[name] = 2
                stack.pop()
    try:
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, tf.errors.OpError) as e:
        raise RewriteError(pass_name, [], "the graph does not import: %s" % e) from e


class GraphPass:
    """A graph rewrite pass. Subclasses set `name` and `pattern` (what the pass looks for,
    in words) and implement match() and rewrite().

    Calling the pass on a GraphDef returns a PassResult(graph_def, modified, matches): the
    input is copied, never mutated; invariants are checked before and after (check_graph plus
    check()); with dump_dir the graph before and after is written as <name>_before.pbtxt /
    <name>_after.pbtxt for inspection.
    """

    name = "graph_pass"
    pattern = ""

    def match(self, graph_def):
        """The places to rewrite (a list; empty: nothing to do). Raises RewriteError for a
        partial or unsupported match, naming the ops and why."""
        raise NotImplementedError

    def rewrite(self, graph_def, matches):
        """Rewrites graph_def (a copy the pass owns) in place for the matches."""
        raise NotImplementedError

    def check(self, graph_def, stage):
        """Pass-specific invariants; stage is "before" or "after"."""

    def __call__(self, graph_def, dump_dir=None):
        work = graph_pb2.GraphDef()
        work.CopyFrom(graph_def)
        check_graph(work, self.name)
        self.check(work, "before")
        matches = self.match(work)
        if dump_dir:
            _dump(work, dump_dir, self.name + "_before")
        if not matches:
            if dump_dir:
                _dump(work, dump_dir, self.name + "_after")
            return PassResult(work, False, [])
        self.rewrite(work, matches)
        check_graph(work, self.name)
        self.check(work, "after")
        if dump_dir:
            _dump(work, dump_dir, self.name + "_after")
        return PassResult(work, True, matches)


def _dump(graph_def, dump_dir, name):
    os.makedirs(dump_dir, exist_ok=True)
    tf.io.write_graph(graph_def, dump_dir, name + ".pbtxt", as_text=True)


def run_passes(graph_def, passes, dump_dir=None):
    """Runs passes in order; returns (final GraphDef, [PassResult])."""
    results = []
    for graph_pass in passes:
        result = graph_pass(graph_def, dump_dir=dump_dir)
        results.append(result)
        graph_def = result.graph_def
    return graph_def, results


def import_graph(graph_def):
    """A fresh tf.Graph holding graph_def (for shape and dtype checks)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return graph
