"""Embedding tables kept in plain tf.Variables: which variables a model reads only through
gathers (and so could live in a hash table); drop_variable_updates.DropVariableUpdates stops a
train op from running the dense updates of chosen variables.

find_embedding_variables(graph_def) is a pure analysis. A candidate is a resource variable
(VarHandleOp) of shape [rows, dim] read by `ResourceGather(handle, ids)` (what
tf.nn.embedding_lookup emits for a resource variable) or `GatherV2(ReadVariableOp(handle), ids,
axis=0)`. For each gather it records the ids, and the keys: with the hashing trick,
`ids = FloorMod(x, Const n)` (or Mod / TruncateMod, possibly through Identity or an integer
Cast) with 0 < n <= rows, the keys are x (the raw ids before hashing); otherwise the ids. It
finds the gather's gradient, the op `<gradients scope>/<gather>_grad/Reshape` that TensorFlow's
gradient of ResourceGather and GatherV2 builds, whose input 0 is dL/d(gather output); the name
is confirmed by its structure (its sibling `Reshape_1` and `Size` read the gather's ids). And
the variable's update ops: ops writing the handle (AssignVariableOp, AssignSub/AddVariableOp,
ResourceScatter*, ResourceApply*, ResourceSparseApply*, ...) other than its initializer
(`<var>/Assign...`) and Saver restores (values from RestoreV2).

A variable that is read any other way (its value feeding a matmul, a regularizer, a summary;
its handle used by another op) is skipped with the reason, as are reference variables
(VariableV2), variables that are not 2-D or not float32. Reads that do not use the values
(Shape, Size), Saver reads (SaveV2) and reads nothing consumes are harmless.
"""

import collections
import re

import numpy as np
from tensorflow.python.framework import dtypes, tensor_util

_NAME = "find_embedding_variables"

GATHER_OPS = ("ResourceGather", "GatherV2")
MOD_OPS = ("FloorMod", "Mod", "TruncateMod")
# Ops writing the variable whose handle (or ref) is their input 0.
_WRITE_OPS = frozenset(
    [
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "ResourceScatterAdd",
        "ResourceScatterSub",
        "ResourceScatterMul",
        "ResourceScatterDiv",
        "ResourceScatterMin",
        "ResourceScatterMax",
        "ResourceScatterUpdate",
        "ResourceScatterNdAdd",
        "ResourceScatterNdSub",
        "ResourceScatterNdUpdate",
        "ResourceScatterNdMin",
        "ResourceScatterNdMax",
        "ResourceStridedSliceAssign",
        "Assign",
        "AssignAdd",
        "AssignSub",
        "ScatterAdd",
        "ScatterSub",
        "ScatterMul",
        "ScatterDiv",
        "ScatterMin",
        "ScatterMax",
        "ScatterUpdate",
        "ScatterNdAdd",
        "ScatterNdSub",
        "ScatterNdUpdate",
        "StridedSliceAssign",
    ]
)
_WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "Apply", "SparseApply")
# Consumers of a variable's value that do not read the values, or only checkpoint them.
_SHAPE_OPS = ("Shape", "ShapeN", "Size", "Rank")
_SAVE_OPS = ("SaveV2", "Save", "SaveSlices")
_HANDLE_INFO_OPS = ("VarIsInitializedOp", "VariableShape")
REF_VARIABLE_OPS = ("VariableV2", "Variable")
_RESTORE_OPS = ("RestoreV2", "Restore", "RestoreSlice")
_GRAD_PATTERN = r"^(?:.*/)?gradients(?:_\d+)?/%s_grad/Reshape$"


def is_variable_write(node):
    """Whether a NodeDef writes a variable (assign, scatter, or an optimizer's apply op)."""
    return node.op in _WRITE_OPS or node.op.startswith(_WRITE_PREFIXES)


def node_name(name):
    """'^a' / 'a:1' / 'a' -> 'a'."""
    return name.lstrip("^").split(":")[0]


def tensor_name(name):
    """A NodeDef input ('a' / 'a:1') as a tensor name ('a:0' / 'a:1')."""
    return name if ":" in name else name + ":0"


Edge = collections.namedtuple("Edge", ["consumer", "position", "control", "output"])


class GraphIndex:
    """Nodes by name, consumers per node (data and control edges), ancestor and descendant
    walks, over one GraphDef (read only)."""

    def __init__(self, graph_def):
        self.nodes = collections.OrderedDict((n.name, n) for n in graph_def.node)
        self.consumers = collections.defaultdict(list)
        self._grad_reshapes = None
        for node in graph_def.node:
            for i, inp in enumerate(node.input):
                control = inp.startswith("^")
                output = 0 if control or ":" not in inp else int(inp.split(":")[1])
                self.consumers[node_name(inp)].append(Edge(node.name, i, control, output))

    def node(self, name):
        return self.nodes.get(node_name(name))

    def gradient_reshapes(self):
        """Names of the Reshape ops named like the values of a gather's gradient."""
        if self._grad_reshapes is None:
            self._grad_reshapes = [
                n
                for n, node in self.nodes.items()
                if node.op == "Reshape" and n.endswith("_grad/Reshape")
            ]
        return self._grad_reshapes

    def data_consumers(self, name, output=None):
        return [
            e
            for e in self.consumers.get(name, ())
            if not e.control and (output is None or e.output == output)
        ]

    def ancestors(self, names):
        """`names` and every op they depend on (data and control inputs)."""
        seen = set(names)
        stack = list(seen)
        while stack:
            for inp in self.nodes[stack.pop()].input:
                parent = node_name(inp)
                if parent not in seen and parent in self.nodes:
                    seen.add(parent)
                    stack.append(parent)
        return seen

    def descendants(self, names):
        """`names` and every op depending on them (data and control edges)."""
        seen = set(names)
        stack = list(seen)
        while stack:
            for edge in self.consumers.get(stack.pop(), ()):
                if edge.consumer not in seen:
                    seen.add(edge.consumer)
                    stack.append(edge.consumer)
        return seen

    def const_value(self, tensor):
        """The value of a Const tensor (through Identity ops) as a NumPy array, or None."""
        node = self.node(tensor)
        while node is not None and node.op == "Identity":
            node = self.node(node.input[0])
        if node is None or node.op != "Const":
            return None
        return tensor_util.MakeNdarray(node.attr["value"].tensor)


GatherRead = collections.namedtuple(
    "GatherRead",
    ["op", "kind", "read_op", "ids", "keys", "modulus", "gradient_op", "gradient", "trains"],
)
GatherRead.__doc__ = """One gather reading an embedding variable.

op: the gather op name (its output 0 is the embeddings); kind: "ResourceGather" or
"GatherV2"; read_op: the ReadVariableOp a GatherV2 reads (None for ResourceGather);
ids: the gather's indices tensor; keys: the tensor of raw ids (x of ids = x % n) or the ids;
modulus: n of the hashing trick, or None; gradient_op: the `..._grad/Reshape` op (None: no
gradient); gradient: its input 0, dL/d(gather output), as a tensor name (or None); trains: the
gradient reaches an update op of the variable (an optimizer applies it)."""

SkippedVariable = collections.namedtuple("SkippedVariable", ["name", "reason"])


class EmbeddingVariable(
    collections.namedtuple(
        "EmbeddingVariable",
        ["name", "rows", "dim", "dtype", "gathers", "updates", "initializer", "initial_value"],
    )
):
    """A variable read only through gathers.

    name: the VarHandleOp name; rows, dim: its shape; dtype: a tf.DType name ("float32");
    gathers: [GatherRead]; updates: names of the ops writing it outside its initializer and
    Saver restores (an optimizer's apply ops); initializer: the op assigning its initial value
    (or None); initial_value: a description of the initial value's distribution ({"kind":
    "random_uniform", "minval", "maxval"} / {"kind": "random_normal" or "truncated_normal",
    "mean", "stddev"} / {"kind": "constant", "value"}), or None when not recognised.
    """

    @property
    def trained(self):
        """Whether an optimizer applies the gradient of one of its gathers."""
        return any(g.trains for g in self.gathers)


class EmbeddingVariables(list):
    """The list of EmbeddingVariable matches, with `skipped`: [SkippedVariable(name, reason)]
    for the variables read through gathers that cannot be converted."""

    def __init__(self, matches=(), skipped=()):
        super().__init__(matches)
        self.skipped = list(skipped)

    def by_name(self):
        return {m.name: m for m in self}


# --- the variable's handle, reads and writes --------------------------------------------------


def _handle_aliases(index, var):
    """The variable op and the Identity ops forwarding its handle."""
    aliases, stack = {var}, [var]
    while stack:
        for edge in index.data_consumers(stack.pop()):
            if index.nodes[edge.consumer].op == "Identity" and edge.consumer not in aliases:
                aliases.add(edge.consumer)
                stack.append(edge.consumer)
    return aliases


def _is_restore(index, node):
    """A write whose value comes (through Identity ops) from a Saver's RestoreV2."""
    if len(node.input) < 2:
        return False
    value = index.node(node.input[1])
    while value is not None and value.op == "Identity":
        value = index.node(value.input[0])
    return value is not None and value.op in _RESTORE_OPS


def _is_initializer(var, node):
    return node.op in ("AssignVariableOp", "Assign") and node.name.startswith(var + "/")


def variable_writes(index, var):
    """(initializers, restores, updates): names of the ops writing variable `var` (its handle
    or ref as input 0, possibly through Identity ops)."""
    init, restore, update = [], [], []
    for alias in sorted(_handle_aliases(index, var)):
        for edge in index.data_consumers(alias):
            node = index.nodes[edge.consumer]
            if edge.position != 0 or not is_variable_write(node):
                continue
            if _is_initializer(var, node):
                init.append(node.name)
            elif _is_restore(index, node):
                restore.append(node.name)
            else:
                update.append(node.name)
    return sorted(init), sorted(restore), sorted(update)


def _value_reads(index, read, gathers, problems):
    """Classifies the consumers of a ReadVariableOp (and of Identity / StopGradient ops of
    it): GatherV2 on axis 0 -> gathers; shape ops, Saver writes, nothing -> harmless; anything
    else -> problems."""
    stack, seen = [read], {read}
    while stack:
        name = stack.pop()
        for edge in index.data_consumers(name):
            node = index.nodes[edge.consumer]
            if node.op in ("Identity", "StopGradient"):
                if node.name not in seen:
                    seen.add(node.name)
                    stack.append(node.name)
            elif node.op in _SHAPE_OPS or node.op in _SAVE_OPS:
                continue
            elif node.op == "GatherV2" and edge.position == 0:
                axis = index.const_value(node.input[2])
                if axis is None or np.ndim(axis) != 0 or int(axis) != 0:
                    problems.append("gathered on an axis other than 0 by op %r" % node.name)
                elif node.attr["batch_dims"].i != 0:
                    problems.append(
                        "gathered with batch_dims=%d by op %r"
                        % (node.attr["batch_dims"].i, node.name)
                    )
                else:
                    gathers.append((node.name, "GatherV2", read))
            else:
                problems.append("read densely by op %r (%s)" % (node.name, node.op))


def _keys_of(index, ids, rows):
    """(keys tensor, modulus) of a gather's ids: the hashing trick x % n (n a Const in
    [1, rows]) gives x; anything else gives the ids themselves."""
    node = index.node(ids)
    while node is not None and (
        node.op == "Identity"
        or (
            node.op == "Cast"
            and _is_int(node.attr["SrcT"].type)
            and _is_int(node.attr["DstT"].type)
        )
    ):
        node = index.node(node.input[0])
    if node is not None and node.op in MOD_OPS:
        divisor = index.const_value(node.input[1])
        if (
            divisor is not None
            and np.ndim(divisor) == 0
            and np.issubdtype(np.asarray(divisor).dtype, np.integer)
            and 0 < int(divisor) <= rows
        ):
            return tensor_name(node.input[0]), int(divisor)
    return tensor_name(ids), None


def _is_int(dtype_enum):
    try:
        return dtypes.as_dtype(dtype_enum).is_integer
    except TypeError:
        return False


def _gradient_of(index, gather, ids, updates_ancestors):
    """(gradient op, its input 0, whether it reaches the updates) of a gather, or (None, None,
    False). Raises ValueError when several candidates remain."""
    pattern = re.compile(_GRAD_PATTERN % re.escape(gather))
    candidates = []
    for name in index.gradient_reshapes():
        if not pattern.match(name):
            continue
        scope = name[: -len("Reshape")]
        # Reshape_1 flattens the ids into the gradient's indices; Size counts them (a Const
        # when the ids' shape is static).
        sibling, size = index.nodes.get(scope + "Reshape_1"), index.nodes.get(scope + "Size")
        if (
            sibling is None
            or size is None
            or not sibling.input
            or tensor_name(sibling.input[0]) != ids
            or not (size.op == "Const" or (size.input and tensor_name(size.input[0]) == ids))
        ):
            continue
        candidates.append(name)
    if not candidates:
        return None, None, False
    reaching = [c for c in candidates if c in updates_ancestors]
    if len(reaching) > 1 or (not reaching and len(candidates) > 1):
        raise ValueError(
            "gather %r has several gradients (%s); the one the optimizer applies "
            "cannot be told apart" % (gather, ", ".join(reaching or candidates))
        )
    chosen = (reaching or candidates)[0]
    return chosen, tensor_name(index.nodes[chosen].input[0]), bool(reaching)


def describe_initial_value(index, initializer):
    """The distribution of a variable's initial value from the ops its initializer assigns:
    random uniform (RandomUniform * (max - min) + min), random normal or truncated normal
    (R * stddev + mean; stateful or stateless random ops), or a constant (a Const of one value,
    or Fill). None when not recognised."""
    if initializer is None:
        return None
    node = index.node(index.nodes[initializer].input[1])
    while node is not None and node.op == "Identity":
        node = index.node(node.input[0])
    if node is None:
        return None
    if node.op == "Const":
        value = tensor_util.MakeNdarray(node.attr["value"].tensor)
        flat = np.ravel(value)
        if flat.size and np.all(flat == flat[0]):
            return {"kind": "constant", "value": float(flat[0])}
        return None
    if node.op == "Fill":
        value = index.const_value(node.input[1])
        return None if value is None else {"kind": "constant", "value": float(value)}
    if node.op not in ("Add", "AddV2") or len(node.input) != 2:
        return None
    mul, offset = index.node(node.input[0]), index.const_value(node.input[1])
    if mul is None or mul.op != "Mul" or offset is None or np.ndim(offset) != 0:
        return None
    rand = index.node(mul.input[0])
    if rand is None:
        return None
    kind = rand.op.replace("Stateless", "").replace("V2", "")
    if kind == "RandomUniform":
        span = index.node(mul.input[1])
        if span is None or span.op != "Sub":
            return None
        high, low = index.const_value(span.input[0]), index.const_value(span.input[1])
        if high is None or low is None:
            return None
        return {"kind": "random_uniform", "minval": float(low), "maxval": float(high)}
    scale = index.const_value(mul.input[1])
    if scale is None or np.ndim(scale) != 0:
        return None
    names = {
        "RandomStandardNormal": "random_normal",
        "RandomNormal": "random_normal",
        "TruncatedNormal": "truncated_normal",
    }
    if kind not in names:
        return None
    return {"kind": names[kind], "mean": float(offset), "stddev": float(scale)}


def _shape_of(node):
    shape = node.attr["shape"].shape
    if shape.unknown_rank:
        return None
    return [d.size for d in shape.dim]


def _dtype_name(node):
    return dtypes.as_dtype(node.attr["dtype"].type).name


def _analyse(index, var):
    """-> EmbeddingVariable, SkippedVariable, or None (not read through gathers)."""
    node = index.nodes[var]
    gathers, problems = [], []
    aliases = _handle_aliases(index, var)
    for alias in sorted(aliases):
        for edge in index.consumers.get(alias, ()):
            if edge.control:
                continue
            consumer = index.nodes[edge.consumer]
            if consumer.name in aliases:
                continue
            if consumer.op in _HANDLE_INFO_OPS:
                continue
            if consumer.op == "ReadVariableOp":
                _value_reads(index, consumer.name, gathers, problems)
            elif consumer.op == "ResourceGather" and edge.position == 0:
                if consumer.attr["batch_dims"].i != 0:
                    problems.append(
                        "gathered with batch_dims=%d by op %r"
                        % (consumer.attr["batch_dims"].i, consumer.name)
                    )
                else:
                    gathers.append((consumer.name, "ResourceGather", None))
            elif edge.position == 0 and is_variable_write(consumer):
                continue
            else:
                problems.append("its handle is used by op %r (%s)" % (consumer.name, consumer.op))
    if not gathers:
        return None
    if problems:
        return SkippedVariable(var, "; ".join(sorted(set(problems))))
    shape = _shape_of(node)
    if shape is None or len(shape) != 2 or min(shape) < 1:
        return SkippedVariable(
            var, "its shape %s is not a known [rows, dim]" % ("unknown" if shape is None else shape)
        )
    dtype = _dtype_name(node)
    if dtype != "float32":
        return SkippedVariable(var, "its dtype is %s; rec_sdk tables hold float32" % dtype)
    rows, dim = shape
    init, _, updates = variable_writes(index, var)
    updates_ancestors = index.ancestors(updates) if updates else set()
    reads = []
    for gather, kind, read in sorted(gathers):
        ids = tensor_name(index.nodes[gather].input[1])
        keys, modulus = _keys_of(index, ids, rows)
        try:
            grad_op, grad, trains = _gradient_of(index, gather, ids, updates_ancestors)
        except ValueError as e:
            return SkippedVariable(var, str(e))
        reads.append(GatherRead(gather, kind, read, ids, keys, modulus, grad_op, grad, trains))
    if updates and not any(r.trains for r in reads):
        return SkippedVariable(
            var,
            "it is updated (%s) but the gradient of none of its gathers "
            "(%s) reaches the update" % (", ".join(updates), ", ".join(r.op for r in reads)),
        )
    initializer = init[0] if init else None
    return EmbeddingVariable(
        var,
        rows,
        dim,
        dtype,
        reads,
        updates,
        initializer,
        describe_initial_value(index, initializer),
    )


def _ref_variable_gathered(index, var):
    """Whether a reference variable's value (through Identity ops) is gathered."""
    stack, seen = [var], {var}
    while stack:
        for edge in index.data_consumers(stack.pop()):
            node = index.nodes[edge.consumer]
            if node.op in ("Gather", "GatherV2", "ResourceGather") and edge.position == 0:
                return True
            if node.op == "Identity" and node.name not in seen:
                seen.add(node.name)
                stack.append(node.name)
    return False


def find_embedding_variables(graph_def):
    """The embedding variables of graph_def (see the module doc): an EmbeddingVariables list
    of EmbeddingVariable, with `.skipped` naming the variables read through gathers that
    cannot be converted, and why. Variables never gathered are in neither list."""
    index = GraphIndex(graph_def)
    matches, skipped = [], []
    for name, node in index.nodes.items():
        if node.op in REF_VARIABLE_OPS:
            if _ref_variable_gathered(index, name):
                skipped.append(
                    SkippedVariable(
                        name,
                        "a reference variable (%s); only resource "
                        "variables (use_resource=True, the TF2 default) "
                        "are converted" % node.op,
                    )
                )
            continue
        if node.op != "VarHandleOp":
            continue
        found = _analyse(index, name)
        if isinstance(found, SkippedVariable):
            skipped.append(found)
        elif found is not None:
            matches.append(found)
    return EmbeddingVariables(matches, skipped)
