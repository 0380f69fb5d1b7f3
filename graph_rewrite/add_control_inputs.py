"""AddControlInputs: make ops run other ops first.

Pattern: the ops named in `additions` ({op name: [op names to run before it]}).
Rewrite: each gets control inputs on the listed ops (those it already has are skipped).
Graph modification uses it so that running an old iterator's initializer (a user's
`sess.run(iterator.initializer)`, or tf.estimator's dataset initializer hook) also
initialises the iterator that replaced it. Checks: every named op exists and no cycle appears.
"""

from rec_sdk_graph_rewrite.core import GraphPass, RewriteError


class AddControlInputs(GraphPass):
    name = "add_control_inputs"
    pattern = "the ops to give control inputs"

    def __init__(self, additions):
        self.additions = {op: list(before) for op, before in additions.items()}

    def check(self, graph_def, stage):
        if stage != "before":
            return
        names = {n.name for n in graph_def.node}
        missing = sorted(
            {op for op, before in self.additions.items() for op in [op] + before if op not in names}
        )
        if missing:
            raise RewriteError(self.name, missing, "ops to connect do not exist")

    def match(self, graph_def):
        matches = []
        for node in graph_def.node:
            for before in self.additions.get(node.name, ()):
                if "^" + before not in node.input:
                    matches.append((node.name, before))
        return matches

    def rewrite(self, graph_def, matches):
        by_name = {n.name: n for n in graph_def.node}
        for node_name, before in matches:
            by_name[node_name].input.append("^" + before)
