"""A rewrite pass's result applied back onto a live tf.Graph (update_live_graph): TF1 sessions
run the graph the user's Python objects belong to, so the GraphDef a rec_sdk_graph_rewrite
pass returns is applied to that graph by rewiring its ops' inputs in place (the passes
themselves stay pure GraphDef -> GraphDef)."""

from rec_sdk.base import tf_patches
from rec_sdk_graph_rewrite.core import RewriteError


def _inputs_of(node):
    """(data inputs in order, set of control inputs) of a NodeDef, normalised."""
    data = [i if ":" in i else i + ":0" for i in node.input if not i.startswith("^")]
    control = {i[1:] for i in node.input if i.startswith("^")}
    return data, control


def update_live_graph(graph, graph_def, pass_name="update_live_graph"):
    """Edits the ops of a live tf.Graph so that their inputs are those of graph_def.

    TF1 sessions run the graph that the user's Python objects (train op, tensors, hooks)
    belong to, so a pass's output GraphDef is applied back onto that graph: graph_def must hold
    exactly the graph's ops (passes here only rewire inputs), and only inputs differ. Data
    inputs are moved and control inputs added or removed (tf_patches' op editing). The graph
    is then compared with graph_def again; any difference is a RewriteError. Returns the number
    of ops edited. The graph must not be finalized and no session may have run it yet.
    """
    if graph.finalized:
        raise RewriteError(
            pass_name,
            [],
            "the graph is finalized; modify it before a "
            "MonitoredSession or Estimator finalizes it (e.g. in a hook's begin())",
        )
    live = {op.name: op for op in graph.get_operations()}
    wanted = {n.name: n for n in graph_def.node}
    extra = sorted(set(wanted) - set(live))
    missing = sorted(set(live) - set(wanted))
    if extra or missing:
        raise RewriteError(
            pass_name,
            extra + missing,
            "the rewritten graph adds or drops ops; only inputs may change",
        )
    edited = 0
    for name, node in wanted.items():
        op = live[name]
        data, control = _inputs_of(node)
        current = [t.name for t in op.inputs]
        current_control = {c.name for c in op.control_inputs}
        if data == current and control == current_control:
            continue
        if len(data) != len(current):
            raise RewriteError(pass_name, [name], "the number of data inputs changed")
        for i, (new, old) in enumerate(zip(data, current)):
            if new != old:
                tf_patches.update_op_input(op, i, graph.get_tensor_by_name(new))
        if control != current_control:
            keep = [c for c in op.control_inputs if c.name in control]
            tf_patches.set_control_inputs(
                op, keep + [live[c] for c in sorted(control - current_control)]
            )
        edited += 1
    for name, node in wanted.items():
        op = live[name]
        data, control = _inputs_of(node)
        if data != [t.name for t in op.inputs] or control != {c.name for c in op.control_inputs}:
            raise RewriteError(
                pass_name,
                [name],
                "the live graph does not match the rewritten graph after the update",
            )
    return edited
