"""Graph rewrite passes (Grappler-style, in Python) for rec_sdk's automatic graph modification.

Each pass is a pure function of a GraphDef (the input is never mutated) with a declared
pattern, a rewrite, and checks of the graph's invariants before and after; see core.GraphPass.
Analyses (iterator_sources) only read a GraphDef. rec_sdk.base.live_graph.update_live_graph
applies a pass's result back onto the tf.Graph a TF1 session runs.
"""

from rec_sdk_graph_rewrite.add_control_inputs import AddControlInputs
from rec_sdk_graph_rewrite.core import (
    GraphPass,
    PassResult,
    RewriteError,
    check_graph,
    import_graph,
    run_passes,
)
from rec_sdk_graph_rewrite.drop_variable_updates import DropVariableUpdates
from rec_sdk_graph_rewrite.embedding_variables import (
    EmbeddingVariable,
    EmbeddingVariables,
    GatherRead,
    SkippedVariable,
    find_embedding_variables,
)
from rec_sdk_graph_rewrite.iterator_sources import (
    IteratorSource,
    Trace,
    extract_subgraph,
    iterator_source,
    replayable_upstream,
    trace_to_iterator,
    upstream_ops,
)
from rec_sdk_graph_rewrite.reroute_inputs import RerouteInputs, tensor_name

__all__ = [
    "AddControlInputs",
    "GraphPass",
    "IteratorSource",
    "PassResult",
    "RewriteError",
    "RerouteInputs",
    "Trace",
    "check_graph",
    "extract_subgraph",
    "import_graph",
    "iterator_source",
    "replayable_upstream",
    "run_passes",
    "trace_to_iterator",
    "upstream_ops",
    "DropVariableUpdates",
    "EmbeddingVariable",
    "EmbeddingVariables",
    "GatherRead",
    "SkippedVariable",
    "find_embedding_variables",
    "tensor_name",
]
