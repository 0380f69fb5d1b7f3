"""Pushers: the training side of serving updates.

A Pusher publishes, into the push directory of an export_serving_model, the rows its tables
changed and the keys they removed or evicted since the last push (the tables' own change
tracking: TakeChanges), plus the dense variables that changed, as the next numbered update
of the chain (update_files.py). A push that cannot follow the chain's last update (a new
process, a failed write, a restored or cleared table) sends the tables whole instead, so the
chain stays complete whatever happened to the trainer.

PushHook pushes every N seconds or steps from a MonitoredSession (Estimator); push_after_save
makes a CheckpointSaverListener that pushes after each save.
"""
import threading
import time

import numpy as np
import tensorflow as tf

from rec_sdk.core.table import tables_of_graph
from rec_sdk.serving import update_files
from rec_sdk.serving.mutable import without_reserved_keys
from rec_sdk.util.log import logger


def _find(names, available, what, push_dir):
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError("the update chain in %s serves %s %s, which this graph does not have"
                         % (push_dir, what, missing))
    return [available[n] for n in names]


class Pusher:
    """Publishes updates of the chain in push_dir from a graph's tables and variables.

    Create it while the graph can still take ops (before a MonitoredSession finalizes it);
    push(sess) then publishes one update (or nothing when nothing changed).
    """

    def __init__(self, push_dir, graph=None):
        self.push_dir = push_dir
        head = update_files.chain_head(push_dir)
        if head is None:
            raise ValueError("%s holds no update chain: export the model with "
                             "export_serving_model(..., push_dir=%r) first"
                             % (push_dir, push_dir))
        self.chain = head["chain"]
        self.table_names = head["table_names"]
        self.dense_names = head["dense_names"]
        graph = graph or tf.compat.v1.get_default_graph()
        self.tables = _find(self.table_names, {t.table_name: t for t in tables_of_graph(graph)},
                            "tables", push_dir)
        variables = {v.op.name: v for v in
                     graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        self.variables = _find(self.dense_names, variables, "dense variables", push_dir)
        with graph.as_default():
            self._take = [t.take_changes(full=False) for t in self.tables]
            self._take_whole = [t.take_changes(full=True) for t in self.tables]
        self._expected = None   # the push ids this process's last push ended at
        self._last_dense = None
        self._writer = None
        self._error = None
        self.pushes = 0
        self.whole_tables = 0

    def push(self, sess, wait=True):
        """Takes the changes and publishes them as the next update. With wait=False the files
        are written by a background thread (the next push waits for it). Returns the version
        published (None when nothing changed)."""
        self.wait()
        head = update_files.chain_head(self.push_dir)
        if head is None or head["chain"] != self.chain:
            raise ValueError("the update chain in %s changed under this pusher" % self.push_dir)
        expected = self._expected or head["table_push_ids"]
        taken = sess.run(self._take)
        tables = []
        for i, (table, got) in enumerate(zip(self.tables, taken)):
            keys, values, removed, replace, since, push_id = got
            if not replace and since != expected[i]:
                # The changes do not follow the chain's last update: send the table whole.
                keys, values, removed, replace, since, push_id = sess.run(self._take_whole[i])
            if replace:
                self.whole_tables += 1
            keys, values = without_reserved_keys(table.table_name, keys, values)
            removed = np.setdiff1d(np.asarray(removed, np.int64), keys)
            removed = without_reserved_keys(table.table_name, removed)[0]
            tables.append((table.table_name, keys.astype(np.int64), values, removed,
                           bool(replace), int(push_id)))
        dense_values = sess.run(self.variables) if self.variables else []
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
            self.pusher.push(run_context.session, wait=False)

    def end(self, session):
        self.pusher.push(session)


class _PushAfterSave(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self, push_dir):
        self.push_dir = push_dir
        self.pusher = None

    def begin(self):
        self.pusher = Pusher(self.push_dir)

    def after_save(self, session, global_step_value):
        version = self.pusher.push(session)
        logger.info("pushed serving update %s after checkpoint %d", version, global_step_value)


def push_after_save(push_dir):
    """A CheckpointSaverListener that pushes an update after each checkpoint save."""
    return _PushAfterSave(push_dir)
