"""The end of a rank's input, known before its step's header (has_data).

A rank whose tf.data input ended must not fail its step on its own: its peers' collectives
may already be asking it for the step's header, and a collective that fails cannot be reused
in its process. So the IteratorGetNext ops upstream of a batch of lookups over ranks are
rewired (once per op) to read the iterator as an optional: with an element, the same
tensors; at the end of input, empty (or zero) tensors of the element's shapes and
`has_data` false, which the batch's header carries, so that every rank's step fails
together with OutOfRangeError after the header (MonitoredTrainingSession and tf.estimator
then end the training as at the end of input in one process). The ops that read the old
tensors are rewired to the new ones; a session run that fetches or feeds an old tensor gets
the new one (fetches_and_feeds), so the iterator is read once per step as before.
"""

import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from rec_sdk.base import live_graph
from rec_sdk.base.graph_state import state_of

_GET_NEXT = "IteratorGetNext"


def has_data(tensors):
    """A bool scalar: whether every iterator the `tensors` are read from had an element. Its
    value is wired when the graph is complete (prepare): until then it is True."""
    graph = tensors[0].graph
    with graph.as_default(), graph.control_dependencies(None):
        stub = tf.identity(tf.constant(True), name="has_data")
    state = state_of(graph)
    with state.lock:
        state.rank_input_stubs.append((stub, list(tensors)))
    return stub


def prepare(graph, every_read=False):
    """Wires the has_data tensors of `graph` made since the last call: the IteratorGetNext
    ops upstream of their batches' keys read as optionals (see the module doc), and (with
    every_read) the readers of every read rewired before that were built since. Called when
    the graph is complete: when MonitoredTrainingSession or Estimator finalizes it, or before
    its first session run."""
    state = state_of(graph)
    with state.lock:
        stubs, state.rank_input_stubs = state.rank_input_stubs, []
        known = list({v[0].name: v[0] for v in state.rank_read_of.values()}.values())
        known = known if every_read else []
    if not (stubs or known) or graph.finalized:
        return
    mapping, control, wired = {}, {}, []
    for get_next in known:
        _present(get_next, mapping, control)
    for stub, tensors in stubs:
        present = [_present(op, mapping, control) for op in _reads(tensors)]
        if present:
            wired.append((stub, present))
    if not (wired or mapping):
        return
    with graph.as_default(), graph.control_dependencies(None):
        for stub, present in wired:
            unique = list({t.name: t for t in present}.values())
            value = unique[0] if len(unique) == 1 else tf.reduce_all(tf.stack(unique))
            mapping[stub.op.inputs[0].name] = value.name
    # One pass: the readers of the old reads to the new ones, the stubs to their values (a
    # stub's input is its own constant, so the mapping of it is the stub's alone).
    final, _ = graph_rewrite.run_passes(
        graph.as_graph_def(), [graph_rewrite.RerouteInputs(mapping, control)]
    )
    live_graph.update_live_graph(graph, final, "read_input_as_optional")


def _reads(tensors):
    """The IteratorGetNext ops `tensors` are computed from (a read rewired before counts as
    its old op)."""
    state = state_of(tensors[0].graph)
    found, seen = [], set()
    todo = [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        with state.lock:
            old = state.rank_read_of.get(op.name)
        if old is not None or op.type == _GET_NEXT:
            found.append(old[0] if old else op)
            continue
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return found


def _present(get_next, mapping, control):
    """The has-value tensor of the optional read standing for IteratorGetNext `get_next`
    (made on first use), adding its readers' rewiring to `mapping` and `control`."""
    state = state_of(get_next.graph)
    with state.lock:
        known = state.rank_input_ends.get(get_next.name)
    if known is None:
        known = _read_as_optional(get_next)
        with state.lock:
            state.rank_input_ends[get_next.name] = known
    present, merged, read = known
    for old, new in zip(get_next.outputs, merged):
        mapping[old.name] = new.name
    control[get_next.name] = read.name
    return present


def _empty(dtype, shape):
    """A tensor of `shape` (unknown dimensions 0; of unknown rank: [0]) of zeros (empty
    strings)."""
    shape = tf.TensorShape(shape)
    dims = [0] if shape.rank is None else [0 if d is None else d for d in shape.as_list()]
    if dtype == tf.string:
        return tf.fill(dims, "")
    return tf.zeros(dims, dtype)


def _read_as_optional(get_next):
    """An optional read of the iterator of IteratorGetNext op `get_next`: -> (its has-value
    tensor, the element's tensors (empty ones at the end of input), an op reading it)."""
    graph = get_next.graph
    types = get_next.get_attr("output_types")
    shapes = get_next.get_attr("output_shapes")
    with (
        graph.as_default(),
        graph.control_dependencies(None),
        tf.device(get_next.device),
        tf.name_scope(get_next.name + "_or_end"),
    ):
        optional = tf.raw_ops.IteratorGetNextAsOptional(
            iterator=get_next.inputs[0], output_types=types, output_shapes=shapes
        )
        present = tf.raw_ops.OptionalHasValue(optional=optional)
        # Only one side runs: the element's (present) or the empty one (at the end); a
        # Switch's untaken output is dead, and so is what it feeds (not through control
        # edges: the empty tensors take it as data).
        with_value = tf.raw_ops.Switch(data=optional, pred=present)[1]
        values = tf.raw_ops.OptionalGetValue(
            optional=with_value, output_types=types, output_shapes=shapes
        )
        merged = []
        for value, dtype, shape in zip(values, types, shapes):
            empty = tf.raw_ops.Switch(data=_empty(dtype, shape), pred=present)[0]
            out = tf.raw_ops.Merge(inputs=[value, empty]).output
            out.set_shape(tf.TensorShape(shape))
            merged.append(out)
        read = tf.group(merged, name="read")
    state = state_of(graph)
    with state.lock:
        for old, new in zip(get_next.outputs, merged):
            state.rank_read_of[new.op.name] = (get_next, present, new)
            state.rank_rewired[old.name] = new
    return present, merged, read


def fetches_and_feeds(graph, fetches, feed_dict):
    """(fetches, feed_dict) with the tensors has_data rewired replaced by their new ones
    (the same objects when none is named)."""
    state = state_of(graph)
    with state.lock:
        rewired = dict(state.rank_rewired)
    if not rewired:
        return fetches, feed_dict
    if feed_dict:
        feed_dict = {_swap(k, rewired): v for k, v in feed_dict.items()}
    return _swapped(fetches, rewired), feed_dict


def _swap(x, rewired):
    name = x if isinstance(x, str) else getattr(x, "name", None)
    new = rewired.get(name) if isinstance(name, str) else None
    if new is None:
        return x
    return new.name if isinstance(x, str) else new


def _swapped(fetches, rewired):
    if isinstance(fetches, dict):
        return type(fetches)((k, _swapped(v, rewired)) for k, v in fetches.items())
    if isinstance(fetches, tuple) and hasattr(fetches, "_fields"):
        return type(fetches)(*(_swapped(v, rewired) for v in fetches))
    if isinstance(fetches, (list, tuple)):
        return type(fetches)(_swapped(v, rewired) for v in fetches)
    return _swap(fetches, rewired)
