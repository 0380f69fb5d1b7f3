"""RerouteInputs: make every consumer of some tensors read other tensors instead.

Pattern: nodes with a data input naming one of the `mapping` keys ("op:index" tensors).
Rewrite: those inputs name the mapped tensors. This is how graph modification moves every
consumer of an old IteratorGetNext output (ids, labels, dense features) to the new
iterator's. Checks: each replacement exists and has the same dtype as the tensor it replaces
(and a compatible static shape), and no consumer is rerouted onto a tensor computed from it
(a cycle).
"""
import tensorflow as tf

from graph_rewrite.core import GraphPass, RewriteError


def _tensor_name(name):
    return name if ":" in name else name + ":0"


class RerouteInputs(GraphPass):
    name = "reroute_inputs"
    pattern = "data inputs that name one of the tensors to replace"

    def __init__(self, mapping):
        """mapping: {old tensor name: new tensor name} (names like "op:0")."""
        self.mapping = {_tensor_name(k): _tensor_name(v) for k, v in mapping.items()}

    def _graph(self, graph_def):
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        return graph

    def check(self, graph_def, stage):
        if stage != "before":
            return
        graph = self._graph(graph_def)
        problems = []
        for old, new in self.mapping.items():
            try:
                old_t, new_t = graph.get_tensor_by_name(old), graph.get_tensor_by_name(new)
            except (KeyError, ValueError) as e:
                raise RewriteError(self.name, [old, new], "a tensor to reroute does not "
                                   "exist: %s" % e) from e
            if old_t.dtype != new_t.dtype:
                problems.append("%s (%s) -> %s (%s)" % (old, old_t.dtype.name, new,
                                                         new_t.dtype.name))
            elif not old_t.shape.is_compatible_with(new_t.shape):
                problems.append("%s %s -> %s %s" % (old, old_t.shape, new, new_t.shape))
        if problems:
            raise RewriteError(self.name, problems, "replacements must have the dtype and a "
                               "compatible shape of the tensors they replace")

    def match(self, graph_def):
        matches = []
        for node in graph_def.node:
            for i, inp in enumerate(node.input):
                if not inp.startswith("^") and _tensor_name(inp) in self.mapping:
                    matches.append((node.name, i))
        return matches

    def rewrite(self, graph_def, matches):
        by_name = {n.name: n for n in graph_def.node}
        for node_name, i in matches:
            node = by_name[node_name]
            new = self.mapping[_tensor_name(node.input[i])]
            node.input[i] = new[:-2] if new.endswith(":0") else new
