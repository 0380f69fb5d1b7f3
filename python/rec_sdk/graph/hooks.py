"""The SDK's slicer hooks (mirrors mx_rec.graph.hooks): session hooks that move the key
preprocessing of tensor lookups into the input pipeline before the session starts (see
rec_sdk.graph.slicers). Put them before GraphModifierHook in an Estimator's hooks:

    hooks = [OrphanLookupKeySlicerHook(), LookupSubgraphSlicerHook(op_types=["StringToNumber"]),
             GraphModifierHook()]
"""

import tensorflow as tf

from rec_sdk.graph import slicers


def _graph(full_graph):
    if full_graph is not None and not isinstance(full_graph, tf.Graph):
        raise TypeError("full_graph must be a tf.Graph or None, got %r" % (full_graph,))
    return full_graph


class LookupSubgraphSlicerHook(tf.compat.v1.train.SessionRunHook):
    """begin() moves the ops of the types in `op_types` (e.g. ["StringToNumber"]) that compute
    lookup ids from a batch, with what they depend on, into the batch's input pipeline.

    Args:
      op_types: a non-empty list of op type names.
      full_graph: the graph (default: the default graph when begin() runs).
    """

    def __init__(self, op_types, full_graph=None):
        if (
            not isinstance(op_types, (list, tuple))
            or not op_types
            or not all(isinstance(t, str) and t for t in op_types)
        ):
            raise ValueError(
                "op_types must be a non-empty list of op type names, got %r" % (op_types,)
            )
        self._op_types = frozenset(op_types)
        self._graph = _graph(full_graph)
        self.moved = 0  # tensors moved by the last begin()

    def begin(self):
        graph = self._graph or tf.compat.v1.get_default_graph()
        self.moved = slicers.slice_lookup_subgraphs(graph, self._op_types)


class OrphanLookupKeySlicerHook(tf.compat.v1.train.SessionRunHook):
    """begin() moves the ids of lookups that are computed without any iterator (from
    constants) into the input pipeline of the other lookups of their mode, so that they are
    part of each batch (and graph modification can handle their lookups).

    Args:
      full_graph: the graph (default: the default graph when begin() runs).
    """

    def __init__(self, full_graph=None):
        self._graph = _graph(full_graph)
        self.moved = 0  # lookups moved by the last begin()

    def begin(self):
        graph = self._graph or tf.compat.v1.get_default_graph()
        self.moved = slicers.slice_orphan_lookup_keys(graph)


class ACGPushOpsToDatasetHook(LookupSubgraphSlicerHook):
    """The earlier SDK's hook (mx_rec.graph.acg_push_ops): begin() moves the StringSplit and
    StringToNumber ops, and ops whose name contains "ACG_PUSH_NODE", that compute lookup ids
    into the input pipeline, as LookupSubgraphSlicerHook does.

    Args:
      dump_graph: accepted for the SDK's API (the moves are logged).
    """

    OP_TYPES = ("StringSplit", "StringSplitV2", "StringToNumber")
    NAME_MARKER = "ACG_PUSH_NODE"

    def __init__(self, dump_graph=False, full_graph=None):
        if not isinstance(dump_graph, bool):
            raise TypeError("dump_graph must be a bool, got %r" % (dump_graph,))
        super().__init__(list(self.OP_TYPES), full_graph)

    def begin(self):
        graph = self._graph or tf.compat.v1.get_default_graph()
        self.moved = slicers.slice_lookup_subgraphs(
            graph, self._op_types, self.NAME_MARKER, hook="ACGPushOpsToDatasetHook"
        )
