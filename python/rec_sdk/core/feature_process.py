"""Eviction and table statistics hooks (mirrors mx_rec.core.feature_process).

EvictHook runs eviction during training; TableStatsHook writes each table's counters as
TensorBoard scalars. evict_tables() is the module-level way to evict without a hook.
"""

import numbers
import time

import tensorflow as tf

from rec_sdk.base.log import logger
from rec_sdk.base.validation import INT32_MAX, check_bool, check_int
from rec_sdk.constants.constants import DEFAULT_EVICT_TIME_INTERVAL
from rec_sdk.distribute import ranks
from rec_sdk.ops import table_ops
from rec_sdk.tables.table import tables_of_graph
from rec_sdk.tables.tier import TIER_STATS


def evictable_tables(graph=None):
    """The tables of `graph` that have an eviction threshold (or steps_to_live)."""
    return [t for t in tables_of_graph(graph) if t.eviction_threshold >= 0]


def evict_tables(tables=None, name=None):
    """Op evicting every table in `tables` (default: every evictable table of the default
    graph); returns {table_name: (rows evicted, pending evicted)}. A table sharded over
    ranks is evicted by rank 0, every shard (<table_name>@<rank>of<ranks>), after rank 0's
    checkpoint of the step; the other ranks evict nothing."""
    tables = evictable_tables() if tables is None else list(tables)
    with tf.name_scope(name or "rec_sdk_evict"):
        # A table sharded over ranks is evicted by rank 0, every shard (ranks.managed_shards),
        # once every rank has applied the step's updates (ranks.fence).
        out = {}
        for t in tables:
            shards = ranks.managed_shards(t)
            fence = ranks.fence(t)
            with tf.control_dependencies([fence] if fence is not None else []):
                out.update({label: shard.evict() for label, shard, _, _ in shards})
        return out


class EvictHook(tf.compat.v1.train.SessionRunHook):
    """Runs feature eviction during training.

    Eviction runs after a training step when `evict_time_interval` wall seconds have passed
    since the last eviction (or since the session started), or when the global step reaches
    a multiple of `evict_step_interval` (once per multiple; not at the first step seen). In
    MonitoredTrainingSession (and tf.estimator) the default hooks run first, so an eviction at
    the step of a checkpoint comes after it: that checkpoint holds the rows before it. Each
    evictable table (an eviction_threshold from its FeatureSpecs or access_and_evict_config, or
    steps_to_live) drops the keys whose age reached its threshold: their rows, optimizer slots and
    admission counts. Use it in training only (MonitoredTrainingSession hooks, or tf.estimator train
    hooks).

    Args:
      evict_enable: False makes the hook do nothing.
      evict_time_interval: seconds of wall time between evictions, an int in [1, 2**31-1].
      evict_step_interval: None, or evict whenever global_step % evict_step_interval == 0
        (an int in [1, 2**31-1]); needs a global step in the graph.
      time_fn: the wall clock (for tests); default time.time.
    """

    def __init__(
        self,
        evict_enable=False,
        evict_time_interval=DEFAULT_EVICT_TIME_INTERVAL,
        evict_step_interval=None,
        time_fn=None,
    ):
        self._enable = check_bool("evict_enable", evict_enable)
        self._time_interval = check_int("evict_time_interval", evict_time_interval, 1, INT32_MAX)
        if evict_step_interval is not None:
            evict_step_interval = check_int(
                "evict_step_interval", evict_step_interval, 1, INT32_MAX
            )
        self._step_interval = evict_step_interval
        self._time_fn = time_fn or time.time
        self._evict_ops = None
        self._global_step = None
        self._last_time = None
        self._last_bucket = None  # global_step // evict_step_interval at the last check
        self.evictions = 0  # how many times eviction ran
        self.last_result = {}  # {table_name: (rows evicted, pending evicted)} of the last run

    def begin(self):
        if not self._enable:
            return
        tables = evictable_tables()
        if not tables:
            logger.warning(
                "EvictHook: no table has an eviction_threshold or steps_to_live; "
                "nothing will be evicted"
            )
        self._evict_ops = evict_tables(tables)
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._step_interval is not None and self._global_step is None:
            raise ValueError(
                "EvictHook: evict_step_interval=%d needs a global step; create "
                "it with tf.compat.v1.train.get_or_create_global_step()" % self._step_interval
            )

    def after_create_session(self, session, coord):
        del session, coord
        self._last_time = self._time_fn()

    def before_run(self, run_context):
        if not self._enable or self._global_step is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if not self._enable:
            return
        now = self._time_fn()
        if self._last_time is None:
            self._last_time = now
        due = now - self._last_time >= self._time_interval
        step = run_values.results if self._global_step is not None else None
        if self._step_interval is not None and isinstance(step, numbers.Integral):
            # The step fetched with the run was read while the training op ran, before or
            # after its increment: near a multiple of the interval, read it again, now that
            # the step is done, and fire when it enters a new multiple.
            step = int(step)
            if (
                self._last_bucket is not None
                and (step + 1) // self._step_interval > self._last_bucket
            ):
                step = int(run_context.session.run(self._global_step))
            bucket = step // self._step_interval
            if self._last_bucket is not None and bucket > self._last_bucket:
                due = True
            self._last_bucket = bucket
        if not due:
            return
        self.evict(run_context.session)
        self._last_time = now

    def evict(self, session):
        """Runs eviction now."""
        if not self._evict_ops:
            return {}
        result = session.run(self._evict_ops)
        self.evictions += 1
        self.last_result = {name: (int(r), int(p)) for name, (r, p) in result.items()}
        logger.info(
            "EvictHook: evicted %s",
            ", ".join(
                "%s: %d rows, %d pending keys" % (n, r, p) for n, (r, p) in self.last_result.items()
            ),
        )
        return self.last_result


def table_summaries(tables=None, family="rec_sdk", collections=None):
    """tf.compat.v1.summary scalar ops for each table's counters (size, capacity, admitted,
    rejected, evicted, pending; with an SSD tier also hot, cold, promotions, demotions and the
    tier's bytes read, written and on disk), named <family>/<table>/<counter>. By default they join
    the SUMMARIES collection, so tf.estimator and MonitoredTrainingSession save them with other
    summaries; `collections` picks others ([] for none)."""
    tables = tables_of_graph() if tables is None else list(tables)
    ops = []
    for table in tables:
        stats = table.stats()
        for key in table_ops.stat_names():
            if key == "newest_clock":  # a clock, not a counter
                continue
            if key in TIER_STATS and getattr(table, "tier", None) is None:
                continue  # the SSD tier's counters, of a table without one
            ops.append(
                tf.compat.v1.summary.scalar(
                    "%s/%s/%s" % (family, table.table_name, key),
                    stats[key],
                    collections=collections,
                )
            )
    return ops


class TableStatsHook(tf.compat.v1.train.SessionRunHook):
    """Writes each table's counters as TensorBoard scalars every `every_n_steps` steps.

    Args:
      output_dir: the event file directory (or give summary_writer).
      every_n_steps: an int in [1, 2**31-1].
      summary_writer: a tf.compat.v1.summary.FileWriter to use instead of output_dir.
      tables: the tables to report (default: every table of the graph).
    """

    def __init__(self, output_dir=None, every_n_steps=100, summary_writer=None, tables=None):
        if output_dir is None and summary_writer is None:
            raise ValueError("TableStatsHook needs output_dir or summary_writer")
        self._output_dir = output_dir
        self._every = check_int("every_n_steps", every_n_steps, 1, INT32_MAX)
        self._writer = summary_writer
        self._tables = tables
        self._summary = None
        self._global_step = None
        self._calls = 0

    def begin(self):
        if self._writer is None:
            self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir)
        # Kept out of SUMMARIES so that they are written once, by this hook.
        ops = table_summaries(self._tables, family="rec_sdk_stats", collections=[])
        self._summary = tf.compat.v1.summary.merge(ops) if ops else None
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        self._calls += 1
        if self._summary is None or self._calls % self._every != 0:
            return None
        fetches = {"summary": self._summary}
        if self._global_step is not None:
            fetches["step"] = self._global_step
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        if run_values.results is None:
            return
        step = run_values.results.get("step", self._calls)
        self._writer.add_summary(run_values.results["summary"], step)

    def end(self, session):
        if self._writer is not None:
            self._writer.flush()
