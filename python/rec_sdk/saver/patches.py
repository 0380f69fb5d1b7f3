"""tf.compat.v1.train.Saver and SavedModelBuilder with rec_sdk tables (rec_sdk.saver
writes and reads the tables' directories): Saver.save writes the tables beside TensorFlow's
checkpoint, Saver.restore restores them, a Saver's var_list may name tables and de.Variables,
and the Saver of a SavedModel restores the tables in its restore op (restore_tables_in_graph),
also when the graph has no TensorFlow variable to save."""

import contextlib
import glob
import numbers
import os
import shutil
import weakref

import tensorflow as tf
from tensorflow.core.protobuf import saver_pb2
from tensorflow.python.training import saver as tf_saver  # BulkSaverBuilder: no public name

from rec_sdk.base import tf_patches
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.distribute import ranks
from rec_sdk.ops import table_ops
from rec_sdk.saver.tables import (
    SPARSE_PREFIX,
    commit_tables,
    existing_save,
    restore_tables,
    sparse_dir,
    tables_of_session,
    write_tables,
)
from rec_sdk.tables.table import SparseEmbedding, tables_of_graph

# The name of the restore op of a Saver whose restore also restores the graph's tables, from
# the table directory beside the checkpoint it is given (see restore_tables_in_graph).
_IN_GRAPH_RESTORE = "rec_sdk_restore_with_tables"


def restore_tables_in_graph(saver, graph=None):
    """Makes `saver`'s restore op (saver_def.restore_op_name, what SavedModel loaders run:
    tf.compat.v1.saved_model.loader.load and tf.saved_model.load both feed it the variables
    path and run it) also restore the graph's tables from sparse_dir(<that path>), so that a
    SavedModel written with this saver reloads with every row in any process. Tables sharded
    over ranks are left to Saver.restore. Returns `saver`."""
    graph = graph or tf.compat.v1.get_default_graph()
    saver_def = saver.saver_def
    if saver_def is not None and saver_def.restore_op_name.split("/")[-1] == _IN_GRAPH_RESTORE:
        return saver
    tables = [
        t
        for t in tables_of_graph(graph)
        if t.is_save and t.checkpoint_ops is not None and t.ranks is None
    ]
    if not tables:
        return saver
    if saver_def is None:
        # A Saver with nothing of TensorFlow's to save (a graph of tables and no variable)
        # has no SaverDef, and loaders restore nothing without one: give it one whose
        # restore op restores the tables alone.
        saver_def = _tables_only_saver_def(graph)
        saver.saver_def = saver_def
    filename = graph.as_graph_element(saver_def.filename_tensor_name)
    restore = graph.as_graph_element(saver_def.restore_op_name)
    with (
        graph.as_default(),
        tf.compat.v1.name_scope(None),
        tf.compat.v1.name_scope("rec_sdk_tables_restore"),
    ):
        directory = tf.strings.regex_replace(filename, "([^/]*)$", SPARSE_PREFIX + "\\1")
        restores = []
        for i, table in enumerate(tables):
            path = tf.strings.join([directory, table.table_name], separator="/")
            restores.append(
                table_ops.restore(
                    table.handle,
                    tf.reshape(path, [1]),
                    tf.constant(0, tf.int64),
                    tf.constant(1, tf.int64),
                    name="table_%d" % i,
                )[0]
            )
        combined = tf.group(restore, *restores, name=_IN_GRAPH_RESTORE)
    saver_def.restore_op_name = combined.name
    return saver


TABLES_ONLY_MARKER = "rec_sdk_tables_only"
_TABLES_ONLY_SCOPE = "rec_sdk_tables_saver"  # the name scope of such a SaverDef's ops


def _tables_only_saver_def(graph):
    """A SaverDef of no TensorFlow variable: its filename tensor (the loaders feed the
    variables path), a save tensor that only returns it, and a restore op doing nothing (the
    tables' restores join it)."""
    with (
        graph.as_default(),
        tf.compat.v1.name_scope(None),
        tf.compat.v1.name_scope(_TABLES_ONLY_SCOPE),
    ):
        filename = tf.compat.v1.placeholder_with_default("model", [], name="filename")
        # A checkpoint of one marker tensor: loaders (TensorFlow Serving's among them) run
        # the restore op only when the variables' checkpoint exists.
        written = tf.raw_ops.SaveV2(
            prefix=filename,
            tensor_names=[TABLES_ONLY_MARKER],
            shape_and_slices=[""],
            tensors=[tf.constant(True)],
        )
        with tf.control_dependencies([written]):
            saved = tf.identity(filename, name="save")
        nothing = tf.no_op(name="restore")
    return saver_pb2.SaverDef(
        filename_tensor_name=filename.name,
        save_tensor_name=saved.name,
        restore_op_name=nothing.name,
        sharded=True,
        version=saver_pb2.SaverDef.V2,
    )


def _restores_tables_in_graph(saver):
    saver_def = saver.saver_def
    return saver_def is not None and saver_def.restore_op_name.split("/")[-1] == _IN_GRAPH_RESTORE


def _tables_held(item):
    """The rec_sdk tables `item` of a Saver's var_list stands for (a table, or a
    de.Variable's shards), or None when it is not one of them."""
    if isinstance(item, SparseEmbedding):
        return [item]
    if isinstance(getattr(type(item), "shard", None), property):  # a de.Variable's table
        return [item.shard]
    held = getattr(item, "shards", None)  # a de.Variable (or its slot): its shards
    if (
        isinstance(held, (list, tuple))
        and held
        and all(isinstance(t, SparseEmbedding) for t in held)
    ):
        return list(held)
    return None


def _split_var_list(var_list):
    """-> (var_list without tables, the tables it named, or None if it named none)."""
    named = isinstance(var_list, dict)
    items = list(var_list.items()) if named else [(None, v) for v in var_list]
    rest, tables = [], []
    for key, value in items:
        held = _tables_held(value)
        if held is None:
            rest.append((key, value))
        else:
            tables.extend(t for t in held if t not in tables)
            strings = getattr(value, "key_strings", None)  # a de.Variable's string keys
            if strings is not None:
                rest.append((None if key is None else key + "/key_strings", strings.table))
    rest = dict(rest) if named else [v for _, v in rest]
    return rest, (tables if tables else None)


def _tfra_saveables(items):
    """TFRA's checkpoint tensors (`<table op>-keys` / `-values`, de.TfraTable.saveable) of the
    de.Variables and de tables among `items` that are checkpointed in this process."""
    found = {}
    for item in items:
        tables = (
            [item]
            if isinstance(getattr(type(item), "shard", None), property)
            else getattr(item, "tables", None)
            if hasattr(item, "shards")
            else None
        )
        for table in tables or ():
            shard = getattr(table, "shard", None)  # de.TfraTable (TensorFlow's tables: None)
            if shard is not None and shard.is_save and shard.ranks is None:
                saveable = table.saveable
                found.setdefault(saveable.name, saveable)
    return list(found.values())


# Whether Savers built from now on write de tables' TFRA checkpoint tensors.
_write_tfra_tensors = [True]


def enable_tfra_checkpoint_tensors(enabled=True):
    """Whether tf.compat.v1.train.Savers built from now on also write each de.Variable
    shard's keys and values into the TensorFlow checkpoint as TFRA's tensors
    `<table op>-keys` / `-values` (default: on, as TFRA's checkpoints hold them; TFRA's
    warm-start recipes read them with restore_v2). The rows are saved and restored with their
    slots from the table files either way; off saves that second copy (about the embedding's
    size per checkpoint)."""
    if not isinstance(enabled, bool):
        raise TypeError("enabled must be a bool, got %r" % (enabled,))
    _write_tfra_tensors[0] = enabled


class _WrittenOnly(tf_saver.BaseSaverBuilder.SaveableObject):
    """A saveable a Saver writes and never restores."""

    def __init__(self, saveable):
        super().__init__(saveable.op, saveable.specs, saveable.name)


class _TfraTensorsBuilder(tf_saver.BulkSaverBuilder):
    """TensorFlow's builder, whose Saver also writes de tables' keys and values as the
    tensors TFRA's checkpoints hold (`<table op>-keys` / `-values`), which TFRA's warm-start
    recipes read with restore_v2 or tf.train.load_variable. Its restore ops leave them out:
    the tables come back, with their slots, from the table files beside the checkpoint, and
    checkpoints written without these tensors restore as before. `items` is None for every
    de.Variable of the graph (a Saver of everything), else the Saver's var_list."""

    def __init__(self, write_version, items):
        super().__init__(write_version)
        self._items = items

    def written(self):
        """The written-only saveables of the de tables this Saver saves ([] when off)."""
        if not _write_tfra_tensors[0]:
            return []
        items = (
            self._items
            if self._items is not None
            else state_of(tf.compat.v1.get_default_graph()).all_de_variables
        )
        return [_WrittenOnly(s) for s in _tfra_saveables(items)]

    def _build_internal(self, names_to_saveables, *args, **kwargs):
        present = (
            set(names_to_saveables)
            if isinstance(names_to_saveables, dict)
            else {s.name for s in names_to_saveables if isinstance(s, _WrittenOnly)}
        )
        extra = [s for s in self.written() if s.name not in present]
        if extra and isinstance(names_to_saveables, dict):
            names_to_saveables = dict(names_to_saveables, **{s.name: s for s in extra})
        elif extra:
            names_to_saveables = list(names_to_saveables) + extra
        return super()._build_internal(names_to_saveables, *args, **kwargs)

    def _AddRestoreOps(self, filename_tensor, saveables, *args, **kwargs):  # pylint: disable=invalid-name
        kept = [s for s in saveables if not isinstance(s, _WrittenOnly)]
        if not kept:
            return tf.group(name=kwargs.get("name", "restore_all"))
        return super()._AddRestoreOps(filename_tensor, kept, *args, **kwargs)


def _saver_tables(saver, sess):
    """The tables a Saver saves and restores: those its var_list named, else every table of
    the graph with is_save (a var_list without tables leaves them all in, so that no table is
    ever left out of a checkpoint by accident)."""
    chosen = _chosen_tables.get(saver)
    if chosen is None:
        return tables_of_session(sess, None)
    return [t for t in chosen if ranks.managed_shards(t)]


# {Saver: the tables its var_list named} (Savers without: every table of the graph).
_chosen_tables = weakref.WeakKeyDictionary()


def _saver_init(original, self, var_list=None, *args, **kwargs):
    """Saver.__init__: tables (de.Variables, create_table tables) named in var_list are the
    ones this Saver saves and restores; the rest of var_list goes to TensorFlow's Saver."""
    tables = None
    named = (
        None
        if var_list is None
        else list(var_list.values() if isinstance(var_list, dict) else var_list)
    )
    if var_list is not None:
        var_list, tables = _split_var_list(var_list)
        if not var_list:
            kwargs["allow_empty"] = True
    if (
        len(args) < 7
        and kwargs.get("builder") is None
        and kwargs.get("saver_def") is None
        and kwargs.get("write_version", saver_pb2.SaverDef.V2) == saver_pb2.SaverDef.V2
        and not tf.executing_eagerly()
    ):
        builder = kwargs["builder"] = _TfraTensorsBuilder(saver_pb2.SaverDef.V2, named)
        if not kwargs.get("defer_build") and not (
            var_list
            if var_list is not None
            else tf.compat.v1.global_variables()
            + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        ):
            # Nothing of TensorFlow's to save but de tables (TFRA's Saver saves them): the
            # TF checkpoint holds their TFRA tensors, so that it exists (with its state file
            # for latest_checkpoint) as TFRA's does.
            var_list = builder.written() or var_list
    original(self, var_list, *args, **kwargs)
    if tables is not None:
        _chosen_tables[self] = tables
    elif var_list is not None:
        # A Saver of chosen dense variables may restore checkpoints written without
        # tables (one that names tables must find them).
        state_of(tf.compat.v1.get_default_graph()).savers_of_chosen_variables.add(self)


def _saver_save(original, self, sess, save_path, global_step=None, *args, **kwargs):
    """Saver.save: the tables first (atomically, beside the TF checkpoint), then TensorFlow's
    part; tables of checkpoints the Saver deletes go too."""
    tables = _saver_tables(self, sess)
    if tables:
        if global_step is not None and not isinstance(global_step, numbers.Integral):
            # Read the step once, so that the tables and the TF checkpoint agree on it.
            global_step = tf.compat.v1.train.global_step(sess, global_step)
        path = save_path if global_step is None else "%s-%d" % (save_path, global_step)
        _, save_ids = write_tables(sess, sparse_dir(path), tables)
    before = tf_patches.last_checkpoints(self)
    try:
        result = original(self, sess, save_path, global_step, *args, **kwargs)
        if (
            tables
            and result is None
            and self.saver_def is not None
            and self.saver_def.filename_tensor_name.startswith(_TABLES_ONLY_SCOPE + "/")
        ):
            # A Saver of tables alone with a SaverDef (restore_tables_in_graph): its
            # checkpoint's marker, which loaders look for before they restore.
            sess.run(self.saver_def.save_tensor_name, {self.saver_def.filename_tensor_name: path})
    except BaseException:
        if tables:
            # TensorFlow's part failed (a full disk, say): the tables written for this
            # checkpoint belong to no checkpoint, and were not committed, so the next
            # delta still follows the previous save. TensorFlow leaves its temporary
            # files of the failed save behind: they go too.
            shutil.rmtree(sparse_dir(path), ignore_errors=True)
            for leftover in glob.glob(glob.escape(path) + ".data-*.tempstate*") + glob.glob(
                glob.escape(path) + ".index.tempstate*"
            ):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
        raise
    if tables:
        commit_tables(sess, tables, save_ids)
        if result is None:
            # A Saver of tables only: TensorFlow saved nothing and says None; the
            # checkpoint is the tables' (restore it with this path).
            result = path
    after = set(tf_patches.last_checkpoints(self))
    for path in before:
        # Checkpoints the Saver deleted (max_to_keep) lose their tables too.
        if path not in after and not os.path.exists(path + ".index"):
            shutil.rmtree(sparse_dir(path), ignore_errors=True)
    return result


def _saver_restore(original, self, sess, save_path):
    """Saver.restore: TensorFlow's part, then the tables from the directory beside it."""
    result = original(self, sess, save_path)
    if save_path is None:
        return result
    tables = _saver_tables(self, sess)
    if _restores_tables_in_graph(self):
        # Its restore op restored the single-process tables (restore_tables_in_graph).
        tables = [t for t in tables if t.ranks is not None]
    if not tables:
        return result
    chosen = state_of(sess.graph).savers_of_chosen_variables
    if self in chosen and existing_save(os.path.abspath(sparse_dir(save_path))) is None:
        # A Saver of chosen variables (e.g. warm-starting dense layers) restoring a
        # checkpoint without tables: the tables keep their contents.
        logger.warning(
            "rec_sdk: checkpoint %r has no tables (%s); tables not restored",
            save_path,
            sparse_dir(save_path),
        )
        return result
    restore_tables(sess, sparse_dir(save_path), tables)
    return result


def _builder_saver(original, self, saver=None):
    """SavedModels (tf.compat.v1.saved_model.Builder, and so Estimator.export_saved_model)
    save with a Saver whose restore op restores the tables too."""
    return restore_tables_in_graph(original(self, saver))


# Tables are saved and restored by TensorFlow's Saver (and so by MonitoredTrainingSession and
# tf.estimator) in every process that imports rec_sdk (its package imports this module).
tf_patches.install("Saver.__init__", _saver_init)
tf_patches.install("Saver.save", _saver_save)
tf_patches.install("Saver.restore", _saver_restore)
tf_patches.install("SavedModelBuilder._maybe_create_saver", _builder_saver)
