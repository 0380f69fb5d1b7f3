"""RerouteInputs: make every consumer of some tensors read other tensors instead.

Pattern: nodes with a data input naming one of the `mapping` keys ("op:index" tensors), and
with `control_mapping`, nodes with a control input on one of its keys (op names).
Rewrite: those inputs name the mapped tensors (ops). This is how graph modification moves
every consumer of an old IteratorGetNext output (ids, labels, dense features) to the new
iterator's, and a lookup's per-step dedup to the pipeline's. Checks: each replacement exists
and has the same dtype as the tensor it replaces (and a compatible static shape), and no
consumer is rerouted onto a tensor computed from it (a cycle).
"""

from rec_sdk_graph_rewrite.core import GraphPass, RewriteError, import_graph


def tensor_name(name):
    """'op' -> 'op:0'; 'op:1' stays."""
    return name if ":" in name else name + ":0"


def input_name(tensor):
    """'op:0' -> 'op' (how a NodeDef input names output 0)."""
    return tensor[:-2] if tensor.endswith(":0") else tensor


class RerouteInputs(GraphPass):
    name = "reroute_inputs"
    pattern = (
        "data inputs naming one of the tensors to replace; control inputs on the ops to replace"
    )

    def __init__(self, mapping, control_mapping=None):
        """mapping: {old tensor name: new tensor name} (names like "op:0");
        control_mapping: {old op name: new op name} for control inputs."""
        self.mapping = {tensor_name(k): tensor_name(v) for k, v in mapping.items()}
        self.control_mapping = dict(control_mapping or {})

    def check(self, graph_def, stage):
        if stage != "before":
            return
        graph = import_graph(graph_def)
        problems = []
        for old, new in self.mapping.items():
            try:
                old_t, new_t = graph.get_tensor_by_name(old), graph.get_tensor_by_name(new)
            except (KeyError, ValueError) as e:
                raise RewriteError(
                    self.name, [old, new], "a tensor to reroute does not exist: %s" % e
                ) from e
            if old_t.dtype != new_t.dtype:
                problems.append(
                    "%s (%s) -> %s (%s)" % (old, old_t.dtype.name, new, new_t.dtype.name)
                )
            elif not old_t.shape.is_compatible_with(new_t.shape):
                problems.append("%s %s -> %s %s" % (old, old_t.shape, new, new_t.shape))
        if problems:
            raise RewriteError(
                self.name,
                problems,
                "replacements must have the dtype and a "
                "compatible shape of the tensors they replace",
            )
        names = {n.name for n in graph_def.node}
        missing = sorted(o for pair in self.control_mapping.items() for o in pair if o not in names)
        if missing:
            raise RewriteError(self.name, missing, "ops named in control_mapping do not exist")

    def match(self, graph_def):
        matches = []
        for node in graph_def.node:
            for i, inp in enumerate(node.input):
                if inp.startswith("^"):
                    if inp[1:] in self.control_mapping:
                        matches.append((node.name, i))
                elif tensor_name(inp) in self.mapping:
                    matches.append((node.name, i))
        return matches

    def rewrite(self, graph_def, matches):
        by_name = {n.name: n for n in graph_def.node}
        for node_name, i in matches:
            node = by_name[node_name]
            inp = node.input[i]
            if inp.startswith("^"):
                node.input[i] = "^" + self.control_mapping[inp[1:]]
            else:
                node.input[i] = input_name(self.mapping[tensor_name(inp)])
        # A control input that now repeats another control input of its node is dropped.
        for node_name in {m[0] for m in matches}:
            node = by_name[node_name]
            kept = []
            for inp in node.input:
                if not (inp.startswith("^") and inp in kept):
                    kept.append(inp)
            if len(kept) != len(node.input):
                del node.input[:]
                node.input.extend(kept)
