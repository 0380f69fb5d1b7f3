"""Where the ids of a lookup come from: the IteratorGetNext, the preprocessing between it and
the ids, and the dataset behind the iterator. Pure analyses of a GraphDef (nothing is
rewritten); graph modification uses them to rebuild the input pipeline.

trace_to_iterator(graph_def, tensor) walks the data inputs of `tensor` back to an
IteratorGetNext (replayable_upstream also accepts tensors computed from constants only;
upstream_ops lists every op a tensor depends on, checking nothing). Every op on the way must be
stateless and replayable inside tf.data (casts, reshapes, slicing, string hashing, arithmetic with
constants); a placeholder, a variable, a stateful op, or a second iterator is a RewriteError naming
the ops.

iterator_source(graph_def, get_next) describes the iterator: initializable (one MakeIterator
feeds it: the dataset tensor) or one-shot (the dataset factory function); other kinds (feedable
string handles, reinitializable iterators over several datasets, multi-device iterators) are
RewriteErrors.

extract_subgraph(graph_def, nodes) copies those nodes (without control inputs or devices)
into a GraphDef that tf.import_graph_def can replay inside a dataset map function.
"""

import collections

from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

from rec_sdk_graph_rewrite.core import RewriteError

Trace = collections.namedtuple("Trace", ["target", "get_next", "nodes", "outputs"])
Trace.__doc__ = """target: the traced tensor name; get_next: the IteratorGetNext node name;
nodes: names of the ops between them (sorted); outputs: the get_next output indices used."""

IteratorSource = collections.namedtuple(
    "IteratorSource",
    [
        "get_next",
        "kind",
        "iterator",
        "initializer",
        "dataset",
        "factory",
        "output_types",
        "output_shapes",
    ],
)
IteratorSource.__doc__ = """kind: "initializable" or "one_shot"; iterator: the resource op;
initializer: the MakeIterator op (initializable); dataset: the dataset variant tensor fed to
it (initializable); factory: the dataset factory function name (one-shot); output_types /
output_shapes: the get_next outputs' DataType enums and TensorShapeProtos."""

GET_NEXT_OPS = ("IteratorGetNext",)
_PLACEHOLDERS = ("Placeholder", "PlaceholderV2", "PlaceholderWithDefault")
_NAME = "trace_to_iterator"


def _node(name):
    return name.lstrip("^").split(":")[0]


def _output(name):
    parts = name.split(":")
    return int(parts[1]) if len(parts) > 1 else 0


def upstream_ops(graph_def, tensor):
    """(ops `tensor` is computed from, IteratorGetNext ops among them): every op reached
    through data inputs, stopping at get_next ops (included in both sets). Nothing is
    checked; see replayable_upstream for ops that can move into an input pipeline."""
    nodes = {n.name: n for n in graph_def.node}
    found, get_nexts, stack = set(), set(), [_node(tensor)]
    while stack:
        name = stack.pop()
        if name in found or name not in nodes:
            continue
        found.add(name)
        if nodes[name].op in GET_NEXT_OPS:
            get_nexts.add(name)
            continue
        stack.extend(_node(i) for i in nodes[name].input if not i.startswith("^"))
    return found, get_nexts


def trace_to_iterator(graph_def, tensor, what="tensor"):
    """Trace of `tensor` ("op:i") back to one IteratorGetNext (see the module doc). `what`
    names the tensor in errors (e.g. "ids of sparse_lookup 'user'")."""
    trace = replayable_upstream(graph_def, tensor, what)
    if trace.get_next is None:
        raise RewriteError(
            _NAME,
            trace.nodes or [_node(tensor)],
            "%s is not computed from an "
            "iterator's get_next(); graph modification needs lookups whose ids "
            "come from a tf.data iterator" % what,
        )
    return trace


def replayable_upstream(graph_def, tensor, what="tensor"):
    """Trace of `tensor` back to at most one IteratorGetNext, every op on the way replayable
    inside tf.data (see the module doc); get_next is None when the tensor is computed from
    constants only."""
    nodes = {n.name: n for n in graph_def.node}
    target = _node(tensor)
    if target not in nodes:
        raise RewriteError(_NAME, [target], "%s: no such op" % what)
    get_nexts, outputs, between = set(), set(), set()
    stack, seen = [tensor], set()
    while stack:
        name = stack.pop()
        op_name = _node(name)
        node = nodes[op_name]
        if node.op in GET_NEXT_OPS:
            get_nexts.add(op_name)
            outputs.add(_output(name))
            continue
        if op_name in seen:
            continue
        seen.add(op_name)
        if node.op.startswith("IteratorGetNext") or node.op == "OptionalGetValue":
            raise RewriteError(
                _NAME,
                [op_name],
                "%s comes from a %s; graph modification "
                "supports iterator.get_next() (IteratorGetNext)" % (what, node.op),
            )
        if node.op in _PLACEHOLDERS:
            raise RewriteError(
                _NAME,
                [op_name],
                "%s is fed by placeholder %r, not by a tf.data "
                "iterator; graph modification rebuilds tf.data input pipelines "
                "only (feed_dict input is not supported: use a dataset and "
                "iterator.get_next(), or FeatureSpec lookups)" % (what, op_name),
            )
        op_def = op_def_registry.get(node.op)
        if op_def is None:
            raise RewriteError(
                _NAME,
                [op_name],
                "%s is computed by op type %s, which this process does not know" % (what, node.op),
            )
        if op_def.is_stateful:
            raise RewriteError(
                _NAME,
                [op_name],
                "%s is computed by the stateful op %r (%s); "
                "only stateless ops between get_next() and the ids can be "
                "replayed in the input pipeline" % (what, op_name, node.op),
            )
        between.add(op_name)
        stack.extend(i for i in node.input if not i.startswith("^"))
    if len(get_nexts) > 1:
        raise RewriteError(
            _NAME,
            sorted(get_nexts),
            "%s mixes the outputs of several "
            "iterators; one lookup's ids must come from one iterator" % what,
        )
    return Trace(tensor, get_nexts.pop() if get_nexts else None, sorted(between), sorted(outputs))


def iterator_source(graph_def, get_next):
    """IteratorSource of the IteratorGetNext node `get_next` (see the module doc)."""
    nodes = {n.name: n for n in graph_def.node}
    node = nodes[get_next]
    iterator = _node(node.input[0])
    kind_op = nodes[iterator].op
    types = list(node.attr["output_types"].list.type)
    shapes = list(node.attr["output_shapes"].list.shape)
    name = "iterator_source"
    if kind_op == "OneShotIterator":
        factory = nodes[iterator].attr["dataset_factory"].func.name
        return IteratorSource(get_next, "one_shot", iterator, None, None, factory, types, shapes)
    if kind_op in ("IteratorV2", "Iterator"):
        makers = [
            n for n in graph_def.node if n.op == "MakeIterator" and _node(n.input[1]) == iterator
        ]
        if not makers:
            raise RewriteError(
                name,
                [iterator],
                "iterator %r has no MakeIterator "
                "(initializer); graph modification needs an initializable or "
                "one-shot iterator" % iterator,
            )
        if len(makers) > 1:
            raise RewriteError(
                name,
                [iterator] + [m.name for m in makers],
                "iterator %r is "
                "reinitializable over %d datasets; graph modification needs one "
                "iterator per dataset (make_initializable_iterator or "
                "make_one_shot_iterator)" % (iterator, len(makers)),
            )
        maker = makers[0]
        return IteratorSource(
            get_next, "initializable", iterator, maker.name, maker.input[0], None, types, shapes
        )
    raise RewriteError(
        name,
        [iterator],
        "the ids come from a %s iterator (%r); graph "
        "modification supports initializable and one-shot iterators" % (kind_op, iterator),
    )


def extract_subgraph(graph_def, node_names):
    """A GraphDef of the named nodes (control inputs, devices and colocation attributes
    dropped) plus graph_def's function library, for tf.import_graph_def with an input_map."""
    wanted = set(node_names)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name not in wanted:
            continue
        copy = out.node.add()
        copy.CopyFrom(node)
        copy.device = ""
        copy.attr.pop("_class", None)
        kept = [i for i in copy.input if not i.startswith("^")]
        del copy.input[:]
        copy.input.extend(kept)
    return out
