"""What rec_sdk records about one tf.Graph, in one object (`state_of(graph)`), instead of
registries spread over modules or attributes stuck onto TensorFlow objects.

It lives at the bottom layer (it imports only TensorFlow) so that every layer
can read and write it; the records themselves (lookup anchors, modified iterators,
converted variables, de.Variables and their lookups) are plain objects of the modules that
make them, except TableLookups (what a graph's lookups did with each table), defined here.
A graph that is dropped takes its state along (a weak-keyed map).
"""

import threading
import weakref

import tensorflow as tf

_lock = threading.Lock()
_states = weakref.WeakKeyDictionary()  # tf.Graph -> GraphState


class TableLookups:
    """What the lookups built so far in one graph did with one table (by table name)."""

    def __init__(self):
        self.count = 0  # sparse_lookup calls
        self.training = 0  # training lookups and de updates: the graph trains the table
        self.names = set()  # the name= of every lookup
        self.specs = set()  # (FeatureSpec name, is_train) of FeatureSpec lookups
        # Per tensor lookup: {"ids", "embeddings", "serving_default_value", "addresses" (of
        # its unique keys), "inverse" (ids shape: position of each id's key in addresses),
        # "name", "is_train"}.
        self.tensor = []
        # FeatureSpec lookups of one batch share one find_or_insert:
        # (the batch's unique-keys tensor name, is_train) -> its rows (embedding.pipeline_rows).
        self.shared_rows = {}
        self.trained_address_names = set()  # lookups' addresses with padding keys as -1
        # Training lookups built without admission counting or timestamps.
        self.uncounted_training = []
        # (op, control-flow context) of the last training find-or-insert built: the next one
        # in the same context runs after it (rec_sdk.core.lookup_rows.in_build_order).
        self.last_training = None


class GraphState:
    """Per-graph records. Lists and dicts are appended to under `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        # {table name: TableLookups}.
        self.table_lookups = {}
        # {variable op name: dynamic_embedding LookupRecord} of the trainables de lookups made.
        self.trainable_lookups = {}
        # Savers built with a var_list (they may restore checkpoints written without tables).
        self.savers_of_chosen_variables = weakref.WeakSet()
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
        # Every de.Variable built in graph mode: a Saver also writes their tables' keys and
        # values as TFRA's checkpoint tensors (rec_sdk.saver.patches).
        self.all_de_variables = []
        # {"variable", "ids", "embeddings", "max_norm"} of the de lookups built in graph
        # mode (rec_sdk.serving cuts a served graph at them).
        self.de_lookups = []
        # Names of tensors known to hold distinct keys (the pipeline's dedup output), and of
        # index ranges [0, n) that the trainable-rows gradient emits; optimizers skip a
        # second dedup for them.
        self.unique_keys = set()
        self.row_ranges = set()
        # {TrainableRows output name: the keys of its rows} of lookups whose gradient carries its
        # keys (shadows shared by ParameterServerStrategy workers, de.shadow_ops)
        self.gradient_keys = {}
        # {token tensor name: its lookup} of lookups of tables sharded over ranks (both tokens
        # of a lookup once batched: its own exchange's and its batch's; rec_sdk.distribute.ranks)
        self.rank_lookups = {}
        # Rank 0's wait for every rank's finished update steps (rec_sdk.distribute.ranks.fence)
        self.rank_fence = None
        # The steps' headers of the graph's batches over ranks (rec_sdk.distribute.ranks.headers)
        self.rank_headers = None
        # IteratorGetNext reads rewired to optional ones (rec_sdk.distribute.ranks.input_end):
        # the has_data tensors not wired yet [(stub, keys)], {old op name: (has value, new
        # tensors, read op)}, {new tensor's op name: old op}, {old tensor name: new tensor}
        self.rank_input_stubs = []
        self.rank_input_ends = {}
        self.rank_read_of = {}
        self.rank_rewired = {}

    def lookups_of(self, table_name):
        """The TableLookups of table `table_name` (made on first use)."""
        with self.lock:
            found = self.table_lookups.get(table_name)
            if found is None:
                found = self.table_lookups[table_name] = TableLookups()
            return found


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


def trainable_lookup(var):
    """The record (a dynamic_embedding LookupRecord) of the lookup that made trainable `var`,
    or None for any other variable or value."""
    graph, op = getattr(var, "graph", None), getattr(var, "op", None)
    if not isinstance(graph, tf.Graph) or op is None:
        return None
    with _lock:
        state = _states.get(graph)
    if state is None:
        return None
    with state.lock:
        return state.trainable_lookups.get(op.name)
