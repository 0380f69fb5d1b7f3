"""TFRA's FileSystemSaver with Keras models: the tables of a de.Variable whose kv_creator has a
FileSystemSaver(proc_size, proc_rank) are also written as TFRA's key and value files when the
model is saved (Model.save, save_weights, de_save_model) and read back from them by
Model.load_weights, into <SavedModel>/variables/TFRADynamicEmbedding (beside the weights'
checkpoint for save_weights; or the saver config's save_path). Each of proc_size processes
(Horovod-style, each with its own tables) saves its own files (`_rank<r>_size<s>`, or calls
var.save_to_file_system itself) and, on load, takes from every file of the variable the keys
of its rank, partitioner(key, proc_size) == proc_rank, in any number of processes: the model
reloads across a change of process count. The checkpoint still holds the tables as tensors
(a process without the saver restores those); with the files present, they replace them.
"""

import os

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.base.tf_compat import KerasUnavailableError, keras
from rec_sdk.dynamic_embedding.kv_creator import FileSystemSaver
from rec_sdk.dynamic_embedding.variable import Variable

DIRECTORY = "TFRADynamicEmbedding"


def file_system_variables(model):
    """[(de.Variable, its FileSystemSaver)] of the model's layers (their `params`)."""
    found = []
    for module in [model] + list(model.submodules):
        var = getattr(module, "params", None)
        saver = getattr(getattr(var, "kv_creator", None), "saver", None)
        if (
            isinstance(var, Variable)
            and isinstance(saver, FileSystemSaver)
            and all(var is not v for v, _ in found)
        ):
            found.append((var, saver))
    return found


def directory(filepath, saver):
    """Where the files of a model saved at `filepath` are (TFRA's choice)."""
    configured = getattr(saver.config, "save_path", None)
    if configured:
        return configured
    filepath = os.fspath(filepath)
    if tf.io.gfile.isdir(filepath):  # a SavedModel
        return os.path.join(filepath, "variables", DIRECTORY)
    return os.path.join(os.path.dirname(filepath) or ".", DIRECTORY)


def _rank(saver):
    return {"proc_size": saver.proc_size or 1, "proc_rank": saver.proc_rank or 0}


def save_tables(model, filepath):
    """Writes the FileSystemSaver variables' files for a model saved at filepath (eager)."""
    if not tf.executing_eagerly() or str(filepath).endswith((".h5", ".keras")):
        return
    for var, saver in file_system_variables(model):
        path = directory(filepath, saver)
        tf.io.gfile.makedirs(path)
        var.save_to_file_system(path, **_rank(saver))


def load_tables(model, filepath):
    """Replaces each FileSystemSaver variable's rows by its rank's keys of the files saved
    for a model at filepath, where there are files (eager)."""
    if not tf.executing_eagerly():
        return
    for var, saver in file_system_variables(model):
        path = directory(filepath, saver)
        if var.saved_files(path):
            var.clear()
            var.load_from_file_system_with_restore_function(path, **_rank(saver))


def _saving(original, self, filepath, *args, **kwargs):
    result = original(self, filepath, *args, **kwargs)
    save_tables(self, filepath)
    return result


def _loading(original, self, filepath, *args, **kwargs):
    status = original(self, filepath, *args, **kwargs)
    load_tables(self, filepath)
    return status


try:
    keras.Model  # noqa: B018  (the attribute's access is what fails without Keras)
except KerasUnavailableError:
    pass  # no Keras 2 here: nothing to patch
else:
    tf_patches.install("keras.Model.save", _saving)
    tf_patches.install("keras.Model.save_weights", _saving)
    tf_patches.install("keras.Model.load_weights", _loading)
