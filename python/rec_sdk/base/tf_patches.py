"""Every change rec_sdk makes to TensorFlow's own classes and functions, in one place.

Each patch wraps one TensorFlow attribute (`PATCHES`: what it wraps, what rec_sdk adds, the
TensorFlow versions it was checked on, and why no public API serves). They are installed by
one convention, `install(name, hook)`: the attribute is replaced, once per process, by a
function that calls `hook(original, *args, **kwargs)`; the replacement carries the patch's name
(`PATCH_MARK`), so a second install of the same patch (a module reloaded, two callers) finds
it and does nothing. `add(name, value)` adds an attribute TensorFlow does not have.

The hooks live with the code that knows what they do (the Saver's in rec_sdk.saver, the
Session's in rec_sdk.ops.loader, ...) and each owner installs its patches when it is imported;
this module knows only where TensorFlow keeps each attribute. `installed()` lists what a
process has patched (tests check the table against it).
"""

import collections
import functools
import sys

import tensorflow as tf
from tensorflow.python.checkpoint import util as checkpoint_util
from tensorflow.python.saved_model import builder_impl
from tensorflow.python.saved_model import save as saved_model_save
from tensorflow.python.training import optimizer as tf_optimizer

PATCH_MARK = "__rec_sdk_patch__"
CHECKED = "2.15.1 to 2.21.0"  # the whole suite runs on 2.15 and 2.21, its smoke subset between

Patch = collections.namedtuple("Patch", ["name", "owner", "attr", "does", "why"])

PATCHES = {
    p.name: p
    for p in (
        Patch(
            "Saver.__init__",
            lambda: tf.compat.v1.train.Saver,
            "__init__",
            "takes rec_sdk tables (and de.Variables) in var_list: they are saved by rec_sdk, "
            "the rest goes to TensorFlow (rec_sdk.saver.patches)",
            "Saver has no extension point for objects that are not variables or "
            "SaveableObjects; a table's files are not tensors",
        ),
        Patch(
            "Saver.save",
            lambda: tf.compat.v1.train.Saver,
            "save",
            "writes the tables' files beside the TensorFlow checkpoint, atomically, before "
            "it; deletes them with the checkpoints max_to_keep drops (rec_sdk.saver.patches)",
            "MonitoredTrainingSession and Estimator call Saver.save themselves; users expect "
            "their checkpoints to hold the tables with no extra code",
        ),
        Patch(
            "Saver.restore",
            lambda: tf.compat.v1.train.Saver,
            "restore",
            "restores the tables from the directory beside the checkpoint (rec_sdk.saver.patches)",
            "as Saver.save",
        ),
        Patch(
            "SavedModelBuilder._maybe_create_saver",
            lambda: builder_impl._SavedModelBuilder,  # pylint: disable=protected-access
            "_maybe_create_saver",
            "the Saver of a SavedModel restores the tables in its restore op, so loaders "
            "that only run that op get every row (rec_sdk.saver.patches.restore_tables_in_graph)",
            "SavedModel loaders run saver_def.restore_op_name and nothing else; the builder "
            "makes its Saver internally (Estimator.export_saved_model)",
        ),
        Patch(
            "Session.run",
            lambda: tf.compat.v1.Session,
            "run",
            "re-raises a missing op library, a lost rank or a restarted task as an error "
            "saying what happened and what to do (rec_sdk.ops.loader)",
            "TensorFlow offers no hook on a session's errors; MonitoredTrainingSession and "
            "Estimator run the session themselves",
        ),
        Patch(
            "Session.close",
            lambda: tf.compat.v1.Session,
            "close",
            "a session that ran steps over ranks first sends the rank's leave header, so a "
            "rank still running steps fails saying so instead of waiting "
            "(rec_sdk.distribute.ranks.headers)",
            "MonitoredTrainingSession, Estimator and `with Session()` close the session "
            "themselves; TensorFlow has no hook on it",
        ),
        Patch(
            "Scaffold.finalize",
            lambda: tf.compat.v1.train.Scaffold,
            "finalize",
            "with tables sharded over ranks, batches the lookups no optimizer batched into "
            "one exchange and adds the broadcast of rank 0's variables to the local init op "
            "(rec_sdk.distribute.ranks)",
            "MonitoredTrainingSession and Estimator build the Scaffold; its local_init_op "
            "can only be replaced, not extended, from outside",
        ),
        Patch(
            "optimizer._get_processor",
            lambda: tf_optimizer,
            "_get_processor",
            "tf.compat.v1 optimizers take rec_sdk tables and de trainables in var_list "
            "(rec_sdk.base.tf_processors)",
            "compute_gradients picks a processor per variable with this private function "
            "and refuses any type it does not know",
        ),
        Patch(
            "checkpoint.util.serialize_slot_variables",
            lambda: checkpoint_util,
            "serialize_slot_variables",
            "marks the thread while TensorFlow lists optimizers' slot variables, so de "
            "optimizers leave their per-lookup slots out of TF2 checkpoints "
            "(rec_sdk.dynamic_embedding.optimizer)",
            "slot variables are listed by this function only; the optimizers' public API "
            "has no way to hide a slot from checkpoints",
        ),
        Patch(
            "saved_model.save._verify_ops",
            lambda: saved_model_save,
            "_verify_ops",
            "a SavedModel namespace whitelist naming TFRA's op namespace accepts rec_sdk's "
            "(rec_sdk.dynamic_embedding.train)",
            "TFRA scripts pass namespace_whitelist=['TFRA']; the check reads it as given",
        ),
        Patch(
            "keras.Model.save",
            lambda: _keras_model(),
            "save",
            "also writes the tables of de.Variables whose kv_creator has a FileSystemSaver to "
            "TFRA's key and value files, <SavedModel>/variables/TFRADynamicEmbedding "
            "(rec_sdk.dynamic_embedding.keras.file_system)",
            "TFRA's FileSystemSaver is defined by where Keras saves; Keras has no hook on it",
        ),
        Patch(
            "keras.Model.save_weights",
            lambda: _keras_model(),
            "save_weights",
            "as keras.Model.save, beside the weights' checkpoint",
            "as keras.Model.save",
        ),
        Patch(
            "keras.Model.load_weights",
            lambda: _keras_model(),
            "load_weights",
            "loads those tables back from the files, each process the keys of its rank (TFRA's "
            "FileSystemSaver(proc_size, proc_rank))",
            "as keras.Model.save",
        ),
        Patch(
            "Dataset.eos_map",
            lambda: tf.data.Dataset,
            "eos_map",
            "the SDK's dataset.eos_map(...) (rec_sdk.util.ops): added, TensorFlow has none",
            "the SDK's scripts call it as a Dataset method",
        ),
    )
}


class _NoKeras:
    """Stands for Keras 2's Model where it is not installed: its patches are not installed."""

    save = save_weights = load_weights = None


def _keras_model():
    """Keras 2's Model (rec_sdk.base.tf_compat.keras.Model, read from the module the patches'
    owner imported: importing it here would import rec_sdk.util, which imports this module's
    importers), or _NoKeras."""
    compat = sys.modules.get("rec_sdk.base.tf_compat")
    if compat is None:
        return _NoKeras
    try:
        return compat.keras.Model
    except compat.KerasUnavailableError:
        return _NoKeras


def _patch(name):
    try:
        return PATCHES[name]
    except KeyError:
        raise KeyError(
            "no TensorFlow patch %r; the patches are %s" % (name, sorted(PATCHES))
        ) from None


def install(name, hook):
    """Replaces the attribute of patch `name` by a function calling hook(original, *args,
    **kwargs) (once per process: a second install does nothing). Returns the original."""
    patch = _patch(name)
    owner = patch.owner()
    current = getattr(owner, patch.attr)
    if getattr(current, PATCH_MARK, None) == name:
        return current.__wrapped__
    original = current

    @functools.wraps(original)
    def patched(*args, **kwargs):
        return hook(original, *args, **kwargs)

    setattr(patched, PATCH_MARK, name)
    setattr(owner, patch.attr, patched)
    return original


def add(name, value):
    """Adds the attribute of patch `name` (one TensorFlow does not have), as `value`."""
    patch = _patch(name)
    if not getattr(getattr(patch.owner(), patch.attr, None), PATCH_MARK, None):
        setattr(value, PATCH_MARK, name)
        setattr(patch.owner(), patch.attr, value)


def installed():
    """The names of the patches installed in this process."""
    return sorted(
        name
        for name, p in PATCHES.items()
        if getattr(getattr(p.owner(), p.attr, None), PATCH_MARK, None) == name
    )


# TensorFlow's private members that rec_sdk reads or calls where no public API serves, each
# named once, here (checked on TensorFlow 2.15 and 2.21, as the patches). The stock
# optimizers' private state has its own documented reader:
# rec_sdk.dynamic_embedding.optimizer_kinds.private_state / private_call.


def session_closed(session):
    """Whether a tf.compat.v1.Session was closed (BaseSession._closed)."""
    return getattr(session, "_closed", True)


def set_op_attr(op, name, attr_value):
    """Sets attribute `name` of a graph op to an AttrValue proto (Operation._set_attr): the
    value of a constant, or a table op's share mode, decided after the op was built."""
    op._set_attr(name, attr_value)


def update_op_input(op, index, tensor):
    """Rewires data input `index` of a graph op to `tensor` (Operation._update_input)."""
    op._update_input(index, tensor)


def set_control_inputs(op, ops):
    """Replaces a graph op's control inputs by `ops` (Operation._remove_all_control_inputs,
    _add_control_inputs)."""
    op._remove_all_control_inputs()
    op._add_control_inputs(list(ops))


def dataset_variant(dataset):
    """The variant tensor of a tf.data.Dataset (DatasetV2._variant_tensor)."""
    return dataset._variant_tensor


def at_graph_top_level(graph):
    """Whether ops built now in `graph` are under no control dependency and no control flow
    context (Graph._control_dependencies_stack, _get_control_flow_context)."""
    return (
        not getattr(graph, "_control_dependencies_stack", True)
        and graph._get_control_flow_context() is None
    )


def control_flow_context(graph):
    """The control-flow context (a tf.cond branch, a while loop body) of ops built now in
    `graph`, or None at its top level (Graph._get_control_flow_context)."""
    return graph._get_control_flow_context()


def track_trackable(parent, child, name):
    """Makes `child` a dependency of the Trackable `parent` under `name`
    (Trackable._track_trackable): SavedModel then saves and restores it with `parent`."""
    return parent._track_trackable(child, name)


def last_checkpoints(saver):
    """The checkpoint prefixes a tf.compat.v1.train.Saver keeps (Saver._last_checkpoints;
    last_checkpoints is public but drops the times)."""
    return [path for path, _ in getattr(saver, "_last_checkpoints", [])]


def scaffold_local_init(scaffold):
    """(local_init_op, ready_for_local_init_op) a tf.compat.v1.train.Scaffold was given (its
    private _local_init_op, _ready_for_local_init_op, set only by its constructor)."""
    return scaffold._local_init_op, scaffold._ready_for_local_init_op


def set_scaffold_local_init(scaffold, local_init_op, ready_for_local_init_op):
    """Sets a Scaffold's local_init_op and ready_for_local_init_op before it finalizes."""
    scaffold._local_init_op = local_init_op
    scaffold._ready_for_local_init_op = ready_for_local_init_op


def var_key(variable):
    """The key of `variable` in a tf.compat.v1.train.Optimizer's slot dicts (optimizer._var_key)."""
    return tf_optimizer._var_key(variable)


def v1_slot_dict(optimizer, slot_name):
    """A tf.compat.v1.train.Optimizer's dict of slot `slot_name` (Optimizer._slot_dict)."""
    return optimizer._slot_dict(slot_name)


def v1_create_slots(optimizer, var_list):
    """Creates a tf.compat.v1.train.Optimizer's slots of `var_list` (Optimizer._create_slots)."""
    optimizer._create_slots(var_list)
