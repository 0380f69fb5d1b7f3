"""Graph rewrite passes (Grappler-style, in Python) for rec_sdk's automatic graph modification.

Each pass is a pure function of a GraphDef (the input is never mutated) with a declared
pattern, a rewrite, and checks of the graph's invariants before and after; see core.GraphPass.
"""
from graph_rewrite.core import GraphPass, PassResult, RewriteError, check_graph, run_passes
from graph_rewrite.reroute_inputs import RerouteInputs

__all__ = ["GraphPass", "PassResult", "RewriteError", "RerouteInputs", "check_graph",
           "run_passes"]
