"""Lookups recorded by sparse_lookup(..., modify_graph=True), per graph (in its GraphState),
for graph modification.

An anchor holds the tensors of one tensor lookup that modification rewires: its ids (traced
back to the iterator), its per-step dedup results (row addresses, rows, inverse indices) that
the rebuilt input pipeline replaces, and what the pipeline needs to redo the work (table,
mode, admission weight, timestamps, send_count).
"""

from rec_sdk.base.graph_state import state_of


class Anchor:
    def __init__(
        self,
        name,
        table,
        ids,
        is_train,
        send_count,
        coefficient,
        timestamps,
        addresses,
        local_emb,
        inverse,
        batch,
        trained_addresses=None,
    ):
        self.name = name
        self.table = table
        self.ids = ids
        self.is_train = is_train
        self.send_count = send_count
        self.coefficient = coefficient
        self.timestamps = timestamps
        self.addresses = addresses
        # The addresses the lookup collections pair with local_emb (padding keys: -1).
        self.trained_addresses = addresses if trained_addresses is None else trained_addresses
        self.local_emb = local_emb
        self.inverse = inverse
        self.batch = batch
        self.modified = False

    def __repr__(self):
        return "<modify_graph lookup %r of table %r>" % (self.name, self.table.table_name)


def record(graph, anchor):
    state = state_of(graph)
    with state.lock:
        state.anchors.append(anchor)


def of_graph(graph):
    state = state_of(graph)
    with state.lock:
        return list(state.anchors)
