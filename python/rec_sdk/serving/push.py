"""Pushers: the training side of serving updates.

A Pusher publishes, into the push directory of an export_serving_model, the rows its tables
changed and the keys they removed or evicted since the last push (the tables' own change
tracking: TakeChanges), plus the dense variables that changed, as the next numbered update
of the chain (update_files.py). A push that cannot follow the chain's last update (a new
process, a failed write, a restored or cleared table) sends the tables whole instead, so the
chain stays complete whatever happened to the trainer.

PushHook pushes every N seconds or steps from a MonitoredSession (Estimator); push_after_save
makes a CheckpointSaverListener that pushes after each save; PushCallback pushes from Keras'
fit() every N seconds or batches. In these a failed push is logged and training goes on.
"""
import threading
import time

import numpy as np
import tensorflow as tf

from rec_sdk.core.table import tables_of_graph
from rec_sdk.serving import update_files
from rec_sdk.serving.update_files import UpdateError
from rec_sdk.serving.mutable import without_reserved_keys
from rec_sdk.serving.static import dense_variables, serving_layers
from rec_sdk.util.graph_state import state_of
from rec_sdk.util.log import logger
from rec_sdk.util.tf_compat import keras


def _find(names, available, what, push_dir):
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError("the update chain in %s serves %s %s, which this program does not "
                         "have" % (push_dir, what, missing))
    return [available[n] for n in names]


def merge_shards(name, shards):
    """One served table's update from its shards' takes (keys, values, removed, replace,
    since, push_id): -> (name, keys, values, removed, replace, [push ids])."""
    keys = np.concatenate([np.asarray(s[0], np.int64) for s in shards])
    values = np.concatenate([np.asarray(s[1], np.float32) for s in shards])
    removed = np.concatenate([np.asarray(s[2], np.int64) for s in shards])
    replace = all(bool(s[3]) for s in shards)
    keys, values = without_reserved_keys(name, keys, values)
    # A key removed and then written again since the last push is not removed.
    removed = without_reserved_keys(name, np.setdiff1d(removed, keys))[0]
    return (name, keys, values, removed, replace, [int(s[5]) for s in shards])


class Pusher:
    """Publishes updates of the chain in push_dir.

    Graph mode (Session, Estimator): Pusher(push_dir[, graph]) finds the chain's tables and
    dense variables in the graph by name; create it while the graph can still take ops
    (before a MonitoredSession finalizes it), then push(sess). TF2 (eager, Keras):
    Pusher(push_dir, model=keras_model) finds them in the model's de.keras layers and
    variables; push() takes no session.
    """

    def __init__(self, push_dir, graph=None, model=None):
        self.push_dir = push_dir
        head = update_files.chain_head(push_dir)
        if head is None:
            raise ValueError("%s holds no update chain: export the model with "
                             "export_serving_model (or export_keras_serving_model) and "
                             "push_dir=%r first" % (push_dir, push_dir))
        self.chain = head["chain"]
        self.table_names = head["table_names"]
        self.dense_names = head["dense_names"]
        if model is not None:
            self._source = _EagerSource(self, model)
        else:
            self._source = _GraphSource(self, graph or tf.compat.v1.get_default_graph())
        self._expected = None   # the push ids this process's last push ended at
        self._last_dense = None
        self._writer = None
        self._error = None
        self.pushes = 0
        self.whole_tables = 0
        self.failures = 0  # pushes that failed in hooks and callbacks (push_logging_errors)

    def push(self, sess=None, wait=True):
        """Takes the changes and publishes them as the next update. With wait=False the files
        are written by a background thread (the next push waits for it). Returns the version
        published (None when nothing changed)."""
        self.wait()
        head = update_files.chain_head(self.push_dir)
        if head is None or head["chain"] != self.chain:
            raise ValueError("the update chain in %s changed under this pusher" % self.push_dir)
        published = update_files.published_versions(self.push_dir)
        if published and published[-1] > head["version"]:
            raise UpdateError("update %d in %s cannot be read (its MANIFEST is missing or "
                              "corrupt): the chain cannot go on past it; export the model "
                              "again with a new push_dir" % (published[-1], self.push_dir))
        expected = self._expected or update_files.shard_push_ids(head)
        taken = self._source.take(sess)
        tables = []
        for i, name in enumerate(self.table_names):
            shards = taken[i]
            follows = all(bool(s[3]) or s[4] == want for s, want in zip(shards, expected[i]))
            if not follows or (any(bool(s[3]) for s in shards) and
                               not all(bool(s[3]) for s in shards)):
                # The changes do not follow the chain's last update: send the table whole.
                shards = self._source.take_table(sess, i)
            if all(bool(s[3]) for s in shards):
                self.whole_tables += 1
            tables.append(merge_shards(name, shards))
        dense_values = self._source.dense(sess)
        changed = self._last_dense is None or any(
            not np.array_equal(a, b) for a, b in zip(dense_values, self._last_dense))
        dense = [(name, value if changed else None)
                 for name, value in zip(self.dense_names, dense_values)]
        ids = [t[5] for t in tables]
        if not changed and not any(len(t[1]) or len(t[3]) or t[4] for t in tables):
            self._expected = ids  # an empty take: the chain continues from these ids
            return None
        version = head["version"] + 1

        def write():
            update_files.write_update(self.push_dir, version, head["version"], self.chain,
                                      tables, dense)
            self._expected = ids
            self._last_dense = dense_values
            self.pushes += 1

        if wait:
            write()
        else:
            def run():
                try:
                    write()
                except Exception as e:  # reported by the next push or wait()
                    self._error = e
            self._writer = threading.Thread(target=run, name="rec_sdk_push", daemon=True)
            self._writer.start()
        return version

    def wait(self):
        """Waits for a background write; raises its error (the next push then sends the
        tables whole)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            error, self._error = self._error, None
            self._expected = None
            raise error


def de_variables_of(graph):
    """{name: de.Variable} of the de.Variables a graph's lookups read (graph mode)."""
    state = state_of(graph)
    out = dict(state.de_variables)
    out.update({r["variable"].name: r["variable"] for r in state.de_lookups})
    return out


class _GraphSource:
    """A graph's served tables (rec_sdk tables by table name, de.Variables by name: their
    shards) and variables (by op name), read through ops built once."""

    def __init__(self, pusher, graph):
        available = {name: v.tables for name, v in de_variables_of(graph).items()}
        available.update({t.table_name: [t] for t in tables_of_graph(graph)})
        shards = _find(pusher.table_names, available, "tables", pusher.push_dir)
        variables = {v.op.name: v for v in
                     graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        self.variables = _find(pusher.dense_names, variables, "dense variables",
                               pusher.push_dir)
        with graph.as_default():
            self._take = [[t.take_changes(full=False) for t in ts] for ts in shards]
            self._take_whole = [[t.take_changes(full=True) for t in ts] for ts in shards]

    def take(self, sess):
        return sess.run(self._take)

    def take_table(self, sess, i):
        return sess.run(self._take_whole[i])

    def dense(self, sess):
        return sess.run(self.variables) if self.variables else []


class _EagerSource:
    """A Keras model's de.keras embedding layers (by their de.Variable's name; each shard a
    rec_sdk table) and variables (by name), read eagerly."""

    def __init__(self, pusher, model):
        layers = serving_layers(model)
        self.variables = _find(pusher.dense_names,
                               {v.name: v for v in dense_variables(model, layers)},
                               "dense variables", pusher.push_dir)
        self.tables = [v.tables for v in _find(pusher.table_names,
                                               {l.params.name: l.params for l in layers},
                                               "tables", pusher.push_dir)]

    @staticmethod
    def _numpy(taken):
        return tuple(np.asarray(x) for x in taken)

    def take(self, sess):
        return [[self._numpy(t.take_changes(full=False)) for t in shards]
                for shards in self.tables]

    def take_table(self, sess, i):
        return [self._numpy(t.take_changes(full=True)) for t in self.tables[i]]

    def dense(self, sess):
        return [v.numpy() for v in self.variables]


def push_logging_errors(pusher, sess=None, wait=True):
    """pusher.push for hooks and callbacks: a failed push is logged and training goes on (the
    next push sends the tables whole); counted in pusher.failures."""
    try:
        return pusher.push(sess, wait=wait)
    except (UpdateError, OSError, tf.errors.OpError, ValueError) as e:
        pusher.failures += 1
        logger.error("serving push to %s failed: %s; training goes on, the next push sends "
                     "the tables whole", pusher.push_dir, e)
        return None


class PushHook(tf.compat.v1.train.SessionRunHook):
    """Pushes every `every_secs` seconds (or `every_steps` steps) and at the end, from a
    MonitoredSession (Estimator, MonitoredTrainingSession). Files are written by a
    background thread while training goes on."""

    def __init__(self, push_dir, every_secs=30.0, every_steps=None):
        self.push_dir = push_dir
        self.every_secs, self.every_steps = every_secs, every_steps
        self.pusher = None

    def begin(self):
        self.pusher = Pusher(self.push_dir)
        self._last = time.monotonic()
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        due = (self._steps >= self.every_steps if self.every_steps else
               time.monotonic() - self._last >= self.every_secs)
        if due:
            self._steps = 0
            self._last = time.monotonic()
            push_logging_errors(self.pusher, run_context.session, wait=False)

    def end(self, session):
        push_logging_errors(self.pusher, session)


class _PushAfterSave(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self, push_dir):
        self.push_dir = push_dir
        self.pusher = None

    def begin(self):
        self.pusher = Pusher(self.push_dir)

    def after_save(self, session, global_step_value):
        version = push_logging_errors(self.pusher, session)
        logger.info("pushed serving update %s after checkpoint %d", version, global_step_value)


def push_after_save(push_dir):
    """A CheckpointSaverListener that pushes an update after each checkpoint save."""
    return _PushAfterSave(push_dir)


class PushCallback(keras.callbacks.Callback):
    """Pushes from Keras' fit() every `every_secs` seconds (or `every_batches` batches) and
    when training ends; files are written by a background thread."""

    def __init__(self, push_dir, every_secs=30.0, every_batches=None):
        super().__init__()
        self.push_dir = push_dir
        self.every_secs, self.every_batches = every_secs, every_batches
        self.pusher = None
        self._batches = 0
        self._last = time.monotonic()

    def on_train_begin(self, logs=None):
        if self.pusher is None:
            self.pusher = Pusher(self.push_dir, model=self.model)
        self._last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        due = (self._batches >= self.every_batches if self.every_batches else
               time.monotonic() - self._last >= self.every_secs)
        if due:
            self._batches = 0
            self._last = time.monotonic()
            push_logging_errors(self.pusher, wait=False)

    def on_train_end(self, logs=None):
        push_logging_errors(self.pusher)
