"""Pushers: the training side of serving updates.

A Pusher publishes, into the push directory of an export_serving_model, the next update of
the chain (update_files.py): every row its tables changed and every key they removed or
evicted since the chain's newest whole update (the tables' own change tracking, TakeChanges,
accumulated over the pushes since), plus the dense variables. When that grows past
`base_fraction` of the rows of the newest whole update, or when the changes cannot follow
the chain's last update (a new process, a failed write, a restored or cleared table), it
writes a whole update instead (every table whole), so a replica catches up with at most two
updates whatever happened to the trainer. After each push it deletes the updates no replica
needs any more, once older than `keep_secs` (update_files.retire_old_updates).

PushHook pushes every N seconds or steps from a MonitoredSession (Estimator); push_after_save
makes a CheckpointSaverListener that pushes after each save; PushCallback pushes from Keras'
fit() every N seconds or batches. In these a failed push is logged and training goes on.
"""

import os
import threading
import time

import numpy as np
import tensorflow as tf

from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.base.tf_compat import keras
from rec_sdk.ops.serving_ops import Changes
from rec_sdk.serving import update_files
from rec_sdk.serving.mutable import without_reserved_keys
from rec_sdk.serving.rank_parts import RankParts, is_over_ranks, push_over_ranks
from rec_sdk.serving.static import dense_variables, serving_layers
from rec_sdk.serving.update_files import UpdateError
from rec_sdk.tables.table import tables_of_graph


def _find(names, available, what, push_dir):
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(
            "the update chain in %s serves %s %s, which this program does not "
            "have" % (push_dir, what, missing)
        )
    return [available[n] for n in names]


def merge_shards(name, shards):
    """The TableUpdate of one served table from its shards' Changes."""
    keys = np.concatenate([np.asarray(s.keys, np.int64) for s in shards])
    values = np.concatenate([np.asarray(s.values, np.float32) for s in shards])
    removed = np.concatenate([np.asarray(s.removed, np.int64) for s in shards])
    replace = all(bool(s.replace) for s in shards)
    keys, values = without_reserved_keys(name, keys, values)
    # A key removed and then written again since the last push is not removed.
    removed = without_reserved_keys(name, np.setdiff1d(removed, keys))[0]
    return update_files.TableUpdate(
        name, keys, values, removed, replace, [int(s.push_id) for s in shards]
    )


def accumulate(prior, new):
    """The TableUpdate holding the changes of `prior` followed by those of `new` (new rows
    win; a key removed by one and written by the other ends as the later one left it)."""
    later = np.concatenate([new.keys, new.removed])
    kept = ~np.isin(prior.keys, later)
    removed = np.union1d(np.setdiff1d(prior.removed, new.keys), new.removed)
    return update_files.TableUpdate(
        new.name,
        np.concatenate([prior.keys[kept], new.keys]),
        np.concatenate([prior.values[kept], new.values]),
        removed,
        prior.replace,
        new.push_ids,
    )


def _finite_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def _empty(name, dim):
    return update_files.TableUpdate(
        name,
        np.zeros([0], np.int64),
        np.zeros([0, dim], np.float32),
        np.zeros([0], np.int64),
        False,
        [],
    )


class Pusher:
    """Publishes updates of the chain in push_dir.

    Graph mode (Session, Estimator): Pusher(push_dir[, graph]) finds the chain's tables and
    dense variables in the graph by name; create it while the graph can still take ops
    (before a MonitoredSession finalizes it), then push(sess). TF2 (eager, Keras):
    Pusher(push_dir, model=keras_model) finds them in the model's de.keras layers and
    variables; push() takes no session.

    base_fraction: a whole update is written when the changes since the newest whole one
    (rows plus removed keys) pass this fraction of its rows (default 0.25: each update is at
    most about a quarter of the model; smaller values write whole updates more often).
    keep_secs: updates no replica needs are deleted once this old (default 600).

    Tables sharded over ranks (graph mode): rank 0 pushes, each rank writing the rows it
    owns (rank_parts.py); a Pusher on another rank does nothing.
    """

    def __init__(self, push_dir, graph=None, model=None, base_fraction=0.25, keep_secs=600.0):
        if not isinstance(push_dir, (str, os.PathLike)):
            raise TypeError("push_dir must be a directory path, got %r" % (push_dir,))
        push_dir = os.fspath(push_dir)
        if not _finite_number(base_fraction) or not 0 < base_fraction:
            raise ValueError("base_fraction must be a number > 0, got %r" % (base_fraction,))
        if not _finite_number(keep_secs) or keep_secs < 0:
            raise ValueError("keep_secs must be a number >= 0 (seconds), got %r" % (keep_secs,))
        self.push_dir = push_dir
        self.base_fraction, self.keep_secs = base_fraction, keep_secs
        head = update_files.chain_head(push_dir)
        if head is None:
            raise ValueError(
                "%s holds no update chain: export the model with "
                "export_serving_model (or export_keras_serving_model) and "
                "push_dir=%r first" % (push_dir, push_dir)
            )
        self.chain = head["chain"]
        self.table_names = head["table_names"]
        self.dense_names = head["dense_names"]
        if model is not None:
            self._source = _EagerSource(self, model)
        else:
            self._source = _GraphSource(self, graph or tf.compat.v1.get_default_graph())
        # (chain version, push ids): where this pusher's last take ended, and the chain's
        # newest version then (an empty take publishes nothing but moves the push ids).
        self._expected = None
        self._last_dense = None
        self._writer = None
        self._error = None
        self.pushes = 0
        self.whole_updates = 0  # pushes that wrote every table whole
        self.whole_tables = 0  # tables taken whole because their changes could not follow
        self.failures = 0  # pushes that failed in hooks and callbacks (push_logging_errors)

    def took(self, version, push_ids, dense_values=None):
        """Records where this pusher's take ended: the chain's newest version then and the push
        ids of each table's shards (an empty take publishes nothing but moves them), and,
        after a publish, the dense values it wrote."""
        self._expected = (version, push_ids)
        if dense_values is not None:
            self._last_dense = dense_values

    def push(self, sess=None, wait=True):
        """Takes the changes and publishes them as the next update. With wait=False the files
        are written by a background thread (the next push waits for it). Returns the version
        published (None when nothing changed); with wait=False the version being written: if
        that write fails (the error is raised by the next push or wait()), the next update
        that is published takes that version number."""
        self.wait()
        if self._source.inactive:
            return None
        head = update_files.chain_head(self.push_dir)
        if head is None or head["chain"] != self.chain:
            raise ValueError("the update chain in %s changed under this pusher" % self.push_dir)
        published = update_files.published_versions(self.push_dir)
        if published and published[-1] > head["version"]:
            raise UpdateError(
                "update %d in %s cannot be read (its MANIFEST is missing or "
                "corrupt): the chain cannot go on past it; export the model "
                "again with a new push_dir" % (published[-1], self.push_dir)
            )
        if self._expected is not None and self._expected[0] == head["version"]:
            expected = self._expected[1]
        else:  # first push, or another pusher published since: follow the chain's head
            expected = update_files.shard_push_ids(head)
        if self._source.parts is not None:  # tables over ranks: each rank writes its rows
            return push_over_ranks(
                self, self._source.parts, sess, head, expected, *self._dense_now(sess)
            )
        taken = self._source.take(sess)
        whole = False
        for shards, want in zip(taken, expected):
            replaced = [bool(s.replace) for s in shards]
            if any(replaced) or not all(s.since == w for s, w in zip(shards, want)):
                # The changes do not follow the chain's last update (a new session, a
                # restored or cleared table, a failed push): every table goes whole.
                self.whole_tables += 1
                whole = True
        dense_values, dense_changed = self._dense_now(sess)
        tables = [merge_shards(name, shards) for name, shards in zip(self.table_names, taken)]
        if (
            not whole
            and not dense_changed
            and not any(len(t.keys) or len(t.removed) for t in tables)
        ):
            self.took(head["version"], [t.push_ids for t in tables])  # nothing new
            return None
        # The changes since the last update alone, for replicas at its version (unknown when
        # the changes do not follow it).
        steps = None if whole else tables
        prior = None if whole else self._since_base(head)
        if prior is not None:
            prior_tables, prior_dense, base, base_rows = prior
            tables = [accumulate(p, t) for p, t in zip(prior_tables, tables)]
            size = sum(len(t.keys) + len(t.removed) for t in tables)
            if size > self.base_fraction * base_rows:
                prior = None
        if prior is None:
            # A whole update: every table whole (a full take resets the tables' tracking).
            tables = [
                merge_shards(name, self._source.take_table(sess, i))
                for i, name in enumerate(self.table_names)
            ]
            dense = [update_files.DenseUpdate(*d) for d in zip(self.dense_names, dense_values)]
            base = 0
        else:
            dense = [
                update_files.DenseUpdate(
                    name, value if dense_changed or old.value is not None else None
                )
                for name, value, old in zip(self.dense_names, dense_values, prior_dense)
            ]
        ids = [t.push_ids for t in tables]
        version = head["version"] + 1

        def write():
            update_files.write_update(
                self.push_dir, version, base, self.chain, tables, dense, steps
            )
            self.took(version, ids, dense_values)
            self.pushes += 1
            self.whole_updates += int(prior is None)
            update_files.retire_old_updates(self.push_dir, self.keep_secs)

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

    def _dense_now(self, sess):
        """(the dense variables' values, whether they changed since the last push)."""
        values = self._source.dense(sess)
        changed = self._last_dense is None or any(
            not np.array_equal(a, b) for a, b in zip(values, self._last_dense)
        )
        return values, changed

    def _since_base(self, head):
        """(tables, dense, base, rows of the base) of the changes since the chain's newest
        whole update, which the next update accumulates onto; None when they cannot be read
        (the next update is then whole)."""
        dims = self._source.dims
        dtypes = self._source.dense_dtypes
        if head["whole"]:
            return (
                [_empty(n, d) for n, d in zip(self.table_names, dims)],
                [update_files.DenseUpdate(n, None) for n in self.dense_names],
                head["version"],
                sum(head["table_rows"]),
            )
        try:
            tables, dense = update_files.read_update(self.push_dir, head, dims, dtypes)
            base = head["base"]
            base_manifest = update_files.read_manifest(
                os.path.join(self.push_dir, update_files.BASE)
                if base == 0
                else os.path.join(
                    update_files.update_dir(self.push_dir, base), update_files.MANIFEST
                )
            )
        except (UpdateError, OSError) as e:
            logger.warning(
                "serving push: the newest update in %s cannot be read (%s): "
                "this push is a whole update",
                self.push_dir,
                e,
            )
            return None
        return tables, dense, base, sum(base_manifest["table_rows"])

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
        available = {name: v.shards for name, v in de_variables_of(graph).items()}
        available.update({t.table_name: [t] for t in tables_of_graph(graph)})
        shards = _find(pusher.table_names, available, "tables", pusher.push_dir)
        over_ranks = [ts[0] for ts in shards if is_over_ranks(ts[0])]
        self.parts = None
        if over_ranks and len(over_ranks) != len(shards):
            raise ValueError(
                "the update chain in %s serves tables over ranks (%s) and others: "
                "one served model takes tables over ranks or none"
                % (pusher.push_dir, [t.table_name for t in over_ranks])
            )
        variables = {
            v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        }
        self.variables = _find(pusher.dense_names, variables, "dense variables", pusher.push_dir)
        self.dims = [ts[0].dim for ts in shards]
        self.dense_dtypes = [v.dtype.base_dtype.as_numpy_dtype for v in self.variables]
        self.inactive = bool(over_ranks) and over_ranks[0].ranks.rank != 0
        with graph.as_default():
            if self.inactive:
                return  # rank 0 pushes for every rank (its PushHook may run on all ranks)
            if over_ranks:
                self.parts = RankParts(over_ranks)
                return
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
        self.variables = _find(
            pusher.dense_names,
            {v.name: v for v in dense_variables(model, layers)},
            "dense variables",
            pusher.push_dir,
        )
        self.parts, self.inactive = None, False
        self.tables = [
            v.shards
            for v in _find(
                pusher.table_names,
                {ln.params.name: ln.params for ln in layers},
                "tables",
                pusher.push_dir,
            )
        ]
        self.dims = [shards[0].dim for shards in self.tables]
        self.dense_dtypes = [v.dtype.base_dtype.as_numpy_dtype for v in self.variables]

    @staticmethod
    def _numpy(taken):
        return Changes(*(np.asarray(x) for x in taken))

    def take(self, sess):
        return [[self._numpy(t.take_changes(full=False)) for t in shards] for shards in self.tables]

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
        logger.error(
            "serving push to %s failed: %s; training goes on, the next push sends the tables whole",
            pusher.push_dir,
            e,
        )
        return None


class PushHook(tf.compat.v1.train.SessionRunHook):
    """Pushes every `every_secs` seconds (or `every_steps` steps) and at the end, from a
    MonitoredSession (Estimator, MonitoredTrainingSession). Files are written by a
    background thread while training goes on. pusher_options: Pusher's base_fraction and
    keep_secs."""

    def __init__(self, push_dir, every_secs=30.0, every_steps=None, **pusher_options):
        self.push_dir = push_dir
        self.every_secs, self.every_steps = every_secs, every_steps
        self.pusher_options = pusher_options
        self.pusher = None

    def begin(self):
        self.pusher = Pusher(self.push_dir, **self.pusher_options)
        self._last = time.monotonic()
        self._steps = 0

    def after_run(self, run_context, run_values):
        self._steps += 1
        due = (
            self._steps >= self.every_steps
            if self.every_steps
            else time.monotonic() - self._last >= self.every_secs
        )
        if due:
            self._steps = 0
            self._last = time.monotonic()
            push_logging_errors(self.pusher, run_context.session, wait=False)

    def end(self, session):
        push_logging_errors(self.pusher, session)


class _PushAfterSave(tf.compat.v1.train.CheckpointSaverListener):
    def __init__(self, push_dir, pusher_options):
        self.push_dir = push_dir
        self.pusher_options = pusher_options
        self.pusher = None

    def begin(self):
        self.pusher = Pusher(self.push_dir, **self.pusher_options)

    def after_save(self, session, global_step_value):
        version = push_logging_errors(self.pusher, session)
        logger.info("pushed serving update %s after checkpoint %d", version, global_step_value)


def push_after_save(push_dir, **pusher_options):
    """A CheckpointSaverListener that pushes an update after each checkpoint save
    (pusher_options: Pusher's base_fraction and keep_secs)."""
    return _PushAfterSave(push_dir, pusher_options)


class PushCallback(keras.callbacks.Callback):
    """Pushes from Keras' fit() every `every_secs` seconds (or `every_batches` batches) and
    when training ends; files are written by a background thread. pusher_options: Pusher's
    base_fraction and keep_secs."""

    def __init__(self, push_dir, every_secs=30.0, every_batches=None, **pusher_options):
        super().__init__()
        self.push_dir = push_dir
        self.pusher_options = pusher_options
        self.every_secs, self.every_batches = every_secs, every_batches
        self.pusher = None
        self._batches = 0
        self._last = time.monotonic()

    def on_train_begin(self, logs=None):
        if self.pusher is None:
            self.pusher = Pusher(self.push_dir, model=self.model, **self.pusher_options)
        self._last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        due = (
            self._batches >= self.every_batches
            if self.every_batches
            else time.monotonic() - self._last >= self.every_secs
        )
        if due:
            self._batches = 0
            self._last = time.monotonic()
            push_logging_errors(self.pusher, wait=False)

    def on_train_end(self, logs=None):
        push_logging_errors(self.pusher)
