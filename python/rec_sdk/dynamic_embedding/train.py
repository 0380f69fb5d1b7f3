"""de.train: TF2 checkpoints of de.Variables (TFRA's `dynamic_embedding.train` names).

A de.Variable is a trackable whose children are its tables, and each table saves its keys,
rows and optimizer slots as tensors, so tf.train.Checkpoint itself saves and restores them
(restoring replaces a table's contents in one step). `Checkpoint` and `DECheckpoint` are
that checkpoint under TFRA's names.

SavedModels of models with de.Variables hold rec_sdk's ops (namespace "RecSdk"): save them
with tf.saved_model.SaveOptions(namespace_whitelist=["RecSdk"]), or no whitelist. A TFRA
script's whitelist of "TFRA" (its ops' namespace) is taken to mean rec_sdk's ops too, so that
such scripts port unchanged.
"""

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.ops.table_ops import OP_NAMESPACE

TFRA_NAMESPACE = "TFRA"


class DECheckpoint(tf.train.Checkpoint):
    """tf.train.Checkpoint (TFRA's DECheckpoint): saves the tables of the de.Variables it
    reaches, with their slots, next to every other variable."""


Checkpoint = DECheckpoint


class DEHvdSaver:  # pylint: disable=too-few-public-methods
    """TFRA's Horovod saver: out of scope in rec_sdk."""

    def __init__(self, *args, **kwargs):
        del args, kwargs
        raise NotImplementedError(
            "de.train.DEHvdSaver needs Horovod, which rec_sdk does not "
            "support; use tf.compat.v1.train.Saver or DECheckpoint"
        )


def _verify_ops(original, graph_def, namespace_whitelist):
    """SavedModel's op-namespace check accepts rec_sdk's ops where a whitelist names TFRA's
    namespace (TensorFlow's check reads the whitelist as given)."""
    if namespace_whitelist is not None and TFRA_NAMESPACE in namespace_whitelist:
        namespace_whitelist = list(namespace_whitelist) + [OP_NAMESPACE]
    return original(graph_def, namespace_whitelist)


tf_patches.install("saved_model.save._verify_ops", _verify_ops)
