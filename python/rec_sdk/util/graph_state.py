"""What rec_sdk records about one tf.Graph, in one object (`state_of(graph)`), instead of
registries spread over modules or attributes stuck onto TensorFlow objects.

It lives at the bottom layer (it imports only TensorFlow) so that every layer
can read and write it; the records themselves (lookup anchors, modified iterators,
converted variables, de.Variables) are plain objects of the modules that make them. A graph
that is dropped takes its state along (a weak-keyed map).
"""
import threading
import weakref

import tensorflow as tf

_lock = threading.Lock()
_states = weakref.WeakKeyDictionary()  # tf.Graph -> GraphState


class GraphState:
    """Per-graph records. Lists and dicts are appended to under `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        # Tensor lookups made with modify_graph=True (rec_sdk.core.anchors.Anchor).
        self.anchors = []
        # [(FeatureSpecs, is_training)] of the get_asc_insert_func functions built here.
        self.insert_specs = []
        # Iterators built by graph modification (rec_sdk.graph.modifier.ModifiedIterator).
        self.modified_iterators = []
        # {variable op name: ConvertedVariable} (rec_sdk.graph.convert).
        self.converted = {}
        # {full name: de.Variable} made by de.get_variable.
        self.de_variables = {}
        # Names of tensors known to hold distinct keys (the pipeline's dedup output), and of
        # index ranges [0, n) that the trainable-rows gradient emits; optimizers skip a
        # second dedup for them.
        self.unique_keys = set()
        self.row_ranges = set()


def state_of(graph):
    """The GraphState of `graph` (made on first use)."""
    with _lock:
        state = _states.get(graph)
        if state is None:
            state = _states[graph] = GraphState()
        return state



def modified_iterators(graph=None, is_training=None):
    """The iterators graph modification built in `graph` (default: the default graph),
    optionally only the training (True) or evaluation (False) ones."""
    state = state_of(graph or tf.compat.v1.get_default_graph())
    with state.lock:
        found = list(state.modified_iterators)
    return [m for m in found if is_training is None or m.is_training == is_training]
