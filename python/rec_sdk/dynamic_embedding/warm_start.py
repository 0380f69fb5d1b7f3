"""TFRA's warm start of de.Variables from a checkpoint (graph mode): `warm_start` builds the op
that loads the chosen variables' tables from a checkpoint written by tf.compat.v1.train.Saver
(its table directories, rec_sdk.saver.sparse_dir), `WarmStartHook` runs it when a session is
created (tf.estimator)."""

import os
import re

import tensorflow as tf

from rec_sdk import saver as rec_saver
from rec_sdk.base.graph_state import state_of
from rec_sdk.dynamic_embedding.variable import Variable
from rec_sdk.ops import table_ops
from rec_sdk.tables import shard_names


class GraphKeys:
    """TFRA's collection names of de.Variables."""

    DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
    TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"


def _candidates(graph):
    """The de.Variables of the graph: those of its collection, then those of get_variable."""
    found = [
        v
        for v in graph.get_collection(GraphKeys.DYNAMIC_EMBEDDING_VARIABLES)
        if isinstance(v, Variable)
    ]
    found += [v for v in state_of(graph).de_variables.values() if v not in found]
    return found


def _chosen(graph, vars_to_warm_start):
    if vars_to_warm_start is None:
        return []
    if isinstance(vars_to_warm_start, (str, Variable)):
        vars_to_warm_start = [vars_to_warm_start]
    chosen = []
    for item in vars_to_warm_start:
        if isinstance(item, Variable):
            matches = [item]
        elif isinstance(item, str):
            matches = [v for v in _candidates(graph) if re.match(item, v.name)]
        else:
            raise TypeError(
                "vars_to_warm_start must hold de.Variables or regular expressions "
                "of their names, got %r" % (item,)
            )
        chosen += [v for v in matches if v not in chosen]
    return chosen


def warm_start(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_prev_var_name=None):
    """The op loading the chosen de.Variables (objects, or regular expressions matched against
    their names) from the checkpoint `ckpt_to_initialize_from` (a prefix, or a directory: its
    latest checkpoint). var_name_to_prev_var_name maps a variable's name to the name it was
    saved under. Each shard loads its own table directory, whole."""
    ckpt = ckpt_to_initialize_from
    if isinstance(ckpt, str) and os.path.isdir(ckpt):
        ckpt = tf.train.latest_checkpoint(ckpt) or ckpt
    if not isinstance(ckpt, str) or not ckpt:
        raise ValueError(
            "ckpt_to_initialize_from must be a checkpoint prefix or directory, "
            "got %r" % (ckpt_to_initialize_from,)
        )
    renames = dict(var_name_to_prev_var_name or {})
    graph = tf.compat.v1.get_default_graph()
    directory = rec_saver.sparse_dir(ckpt)
    ops = []
    with tf.name_scope("warm_start"):
        for var in _chosen(graph, vars_to_warm_start):
            prev = shard_names.table_base_name(renames.get(var.name, var.name))
            for table, saved in zip(var.shards, shard_names.variable_shards(prev, var.shard_num)):
                saved = os.path.join(directory, saved)
                rows, _ = table_ops.restore(
                    table.handle,
                    tf.constant([saved]),
                    tf.constant(0, tf.int64),
                    tf.constant(1, tf.int64),
                )
                ops.append(rows.op)
    return tf.group(ops, name="warm_start")


class WarmStartHook(tf.compat.v1.train.SessionRunHook):
    """Runs warm_start(...) once the session is created."""

    def __init__(
        self, ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_prev_var_name=None
    ):
        self._args = (ckpt_to_initialize_from, vars_to_warm_start, var_name_to_prev_var_name)
        self._op = None

    def begin(self):
        self._op = warm_start(*self._args)

    def after_create_session(self, session, coord):
        del coord
        session.run(self._op)
