"""The steps' headers: what keeps ranks from waiting for each other forever.

The first collective of every batch of lookups is its header: each rank's step number,
phase (train or eval), restart id, the step's plan (the batches it exchanges, in order, and
the other collectives it runs) and
the batch's need (its largest count of keys for one rank), gathered over every rank and
checked alike by each (tf_ops/core/step_header.h). The headers of every graph share one
collective instance key per position in a plan, so ranks that run different steps, phases,
batches or graphs meet there and fail together with an error naming the ranks and what each
runs, before any other collective of the step started (a collective that fails or is
cancelled cannot be reused in its process). A header runs once the batch's keys exist and
carries whether the rank's input had an element (rec_sdk.distribute.ranks.input_end): at the
end of one rank's input every rank's step fails with OutOfRangeError after the header, so
that the ranks stop together at the end of the shortest input.

Around every session run (rec_sdk.ops.loader.wrap_session_runs) a graph with headers gets
the run's plan fed: the batches its fetches reach, in the order they were built, the same on
every rank that runs the same fetches; the batch at position p starts its header once
position p - 1 was checked. A rank leaves with a leave header at the first position: when
it closes its session after running steps, so that a rank still running steps fails with an
error saying so; and when its input ended in a way the headers did not see (an
OutOfRangeError out of a run that did not come from a header). A rank that saw a peer leave
sends none.
"""

import inspect
import os
import re
import sys
import threading
import weakref
import zlib

import numpy as np
import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.distribute.cluster import rank_of, worker_devices
from rec_sdk.distribute.ranks import input_end, watchdog
from rec_sdk.ops import loader, table_ops

RESTART_ENV = "REC_SDK_RESTART"  # the restart id rec_sdk.distribute.launch gives each rank
LEAVE_TIMEOUT_ENV = "REC_SDK_RANK_LEAVE_TIMEOUT_S"
_HEADER_OP = "RankStepHeader"
# Collectives whose op names are the same on every rank (broadcasts are not: rank 0 sends).
_OTHER_COLLECTIVES = re.compile(r"Collective(AllToAll|Reduce|Gather)")
_FROM_HEADERS = re.compile(r"rank_check_headers")
# The check's words when a rank's input ended (tf_ops/core/step_header.cc).
_ENDED_INPUT = "ran out of input: every rank stops at this step"


def restart_id():
    """This process's restart id (RESTART_ENV, 0 when unset)."""
    value = os.environ.get(RESTART_ENV, "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError("%s must be an integer, got %r" % (RESTART_ENV, value)) from None


def _leave_timeout_ms():
    value = os.environ.get(LEAVE_TIMEOUT_ENV, "600")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(
            "%s must be a number of seconds, got %r" % (LEAVE_TIMEOUT_ENV, value)
        ) from None
    return max(1, int(seconds * 1000))


class StepHeaders:
    """The headers of one graph: the plan fed to its runs, the batch ids it gave, the leave
    header, and whether this process left (or saw a peer leave) since its last good step."""

    def __init__(self, graph, ranks):
        self.task, self.size = ranks.task, ranks.size
        self.rank = rank_of(ranks.task)[0]
        devices = worker_devices(ranks.task)
        # "/job:worker/replica:0/task:1/" of each other rank: ops a run places on its task
        self.peer_tasks = [
            d.rsplit("device:", 1)[0] for i, d in enumerate(devices) if i != self.rank
        ]
        self.restart = restart_id()
        self.batches = 0
        self.phases = {}  # {batch id: its phase}
        self.plans = {}  # {run signature: plan (np.int64 array) or None: no header}
        self.left = False
        # Whether the ranks stopped together at the end of the shortest input: their closes
        # meet once more (meet_at_close).
        self.ended = False
        self.ran = False  # whether a session ran the graph
        self.lock = threading.Lock()
        with (
            graph.as_default(),
            graph.control_dependencies(None),
            tf.device(worker_devices(ranks.task)[self.rank]),
            tf.name_scope("rec_sdk_step_headers"),
        ):
            self.plan = tf.compat.v1.placeholder_with_default(
                tf.constant([], tf.int64), [None], name="plan"
            )
            self.leave_phase = tf.compat.v1.placeholder(tf.int64, [], name="leave_phase")
            self.leave_header = _gather(
                table_ops.rank_leave_header(self.leave_phase, self.restart),
                tf.constant(table_ops.FIRST_HEADER_KEY),
                self.size,
            )

    def new_batch(self, phase):
        with self.lock:
            self.batches += 1
            self.phases[self.batches] = phase
            return self.batches

    def describe(self, plan):
        """What a run of `plan` is, for the watchdog's messages."""
        batches = [int(b) for b in plan if b > 0]  # the last entry names other collectives
        train = any(self.phases.get(b) == table_ops.PHASE_TRAIN for b in batches)
        return "%s step over ranks (%d batch%s of lookups)" % (
            "a training" if train else "an evaluation",
            len(batches),
            "" if len(batches) == 1 else "es",
        )

    def plan_of(self, graph, fetches, feed_dict):
        """(the plan of a run of `fetches`: np.int64 batch ids in build order, or None when
        it runs no header; whether it runs ops on another rank's task)."""
        leaves = _leaves(fetches)
        fed = [] if not feed_dict else list(feed_dict)
        key = (tuple(_name(x) for x in leaves), tuple(sorted(_name(x) for x in fed)))
        with self.lock:
            if key in self.plans:
                return self.plans[key]
        found = _reached(graph, leaves, fed, self.peer_tasks)
        with self.lock:
            self.plans[key] = found
        return found

    def leave(self, session, phase):
        """Sends this rank's leave header (once; none after a peer left)."""
        with self.lock:
            if self.left:
                return
            self.left = True
        options = tf.compat.v1.RunOptions(timeout_in_ms=_leave_timeout_ms())
        dog = watchdog.watch(self.task)
        dog.enter("its leave header (%s)" % table_ops.PHASE_NAMES[phase])
        try:
            session.run(self.leave_header, {self.leave_phase: phase}, options=options)
        except tf.errors.OpError as e:
            # The peers are gone or never came (nothing waits for this rank any more).
            logger.warning(
                "rec_sdk: rank %d left (%s) without meeting every rank: %s: %s",
                self.rank,
                table_ops.PHASE_NAMES[phase],
                type(e).__name__,
                _first_line(e),
            )
        finally:
            dog.leave()

    def meet_at_close(self, session):
        """After the ranks stopped together at the end of the shortest input (each sent or
        saw the leave header of that step, so none sends another), their closes meet once
        more with a gather of leave headers: without it a rank whose input ended first
        exited while rank 0 still ran its final save, which reads the other ranks' tasks,
        or closed its session, which deregisters its graphs there, and rank 0 waited for a
        task that was gone."""
        with self.lock:
            if not self.ended:
                return
            self.ended = False
        options = tf.compat.v1.RunOptions(timeout_in_ms=_leave_timeout_ms())
        dog = watchdog.watch(self.task)
        dog.enter("meeting every rank at the end of the input")
        try:
            session.run(
                self.leave_header, {self.leave_phase: table_ops.PHASE_LEFT}, options=options
            )
        except tf.errors.OpError as e:
            logger.warning(
                "rec_sdk: rank %d closed without meeting every rank at the end of the input: "
                "%s: %s",
                self.rank,
                type(e).__name__,
                _first_line(e),
            )
        finally:
            dog.leave()


def _gather(header, instance_key, size):
    return tf.raw_ops.CollectiveGatherV2(
        input=header,
        group_size=tf.constant(size),
        group_key=tf.constant(1),
        instance_key=instance_key,
        ordering_token=[],
    )


def _leaves(fetches):
    """The fetches in a structure of lists, tuples and dicts (MonitoredSession keys its dicts
    by hooks, which tf.nest cannot sort), in order."""
    if isinstance(fetches, dict):
        return [leaf for value in fetches.values() for leaf in _leaves(value)]
    if isinstance(fetches, (list, tuple)):
        return [leaf for value in fetches for leaf in _leaves(value)]
    return [fetches]


def _name(x):
    """A fetch's or feed key's name for the plans' cache (the object itself if it has none)."""
    if isinstance(x, (tf.Tensor, tf.Operation, str)):
        return x if isinstance(x, str) else x.name
    name = getattr(x, "name", None)
    return name if isinstance(name, str) else ("<%s %x>" % (type(x).__name__, id(x)))


def _elements(graph, leaves):
    """The ops and tensors of fetches or feed keys: what Session.run takes (names, tensors,
    ops, sparse tensors, and objects it converts, such as variables and the result of a
    resource variable's assign_add, whose op is the update with the step's control inputs
    and whose graph element is a read after it)."""
    out = []
    for leaf in leaves:
        if isinstance(leaf, (tf.SparseTensor, tf.compat.v1.SparseTensorValue)):
            out.extend([leaf.indices, leaf.values, leaf.dense_shape])
            continue
        if not isinstance(leaf, (tf.Tensor, tf.Operation)):
            try:
                leaf = graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            except (KeyError, ValueError, TypeError):
                continue
        if isinstance(leaf, (tf.Tensor, tf.Operation)):
            out.append(leaf)
    return out


def _reached(graph, fetches, fed, peer_tasks):
    """(the plan: the header batches `fetches` reach in build order, then one negative entry
    naming the other collectives they reach, or None when they reach no header; whether they
    reach an op of a peer's task)."""
    fed_names = {t.name for t in _elements(graph, fed) if isinstance(t, tf.Tensor)}
    todo = [x if isinstance(x, tf.Operation) else x.op for x in _elements(graph, fetches)]
    seen, batches, collectives, remote = set(), [], [], False
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type.endswith(_HEADER_OP):
            batches.append(op.get_attr("batch"))
        elif _OTHER_COLLECTIVES.match(op.type):
            collectives.append(op.name)
        remote = remote or any(task in op.device for task in peer_tasks)
        todo.extend(t.op for t in op.inputs if t.name not in fed_names)
        todo.extend(op.control_inputs)
    if not batches:
        return None, remote
    if len(batches) >= table_ops.MAX_PLAN_POSITIONS:
        raise ValueError(
            "a session run exchanges %d batches of lookups over ranks; at most %d are allowed "
            "in one run" % (len(batches), table_ops.MAX_PLAN_POSITIONS - 1)
        )
    # The collectives besides the headers (the gradients' all-to-alls, dense all-reduces)
    # enter the plan's digest: ranks whose runs share the lookups but not the rest of the
    # step (one trains, another only computes the loss; each applies another optimizer) fail
    # at the header instead of waiting in a collective the other never runs.
    named = zlib.crc32("\n".join(sorted(collectives)).encode()) if collectives else 0
    return np.array(sorted(batches) + [-1 - named], np.int64), remote


def headers_of(graph, ranks=None):
    """The StepHeaders of `graph` (made for `ranks`, a RankPlacement, when given and none
    exists), or None."""
    state = state_of(graph)
    with state.lock:
        headers = state.rank_headers
    if headers is None and ranks is not None:
        headers = StepHeaders(graph, ranks)
        with state.lock:
            if state.rank_headers is None:
                state.rank_headers = headers
            headers = state.rank_headers
    return headers


def checked_need(ranks, need, has_data, phase):
    """The step header of a new batch of lookups (this rank's `need`: its largest count of
    keys for one rank; `has_data`: whether its input had an element, input_end.has_data),
    gathered over every rank and checked: -> the largest need of any rank. Built in the
    default graph, on this rank's device."""
    graph = tf.compat.v1.get_default_graph()
    headers = headers_of(graph, ranks)
    instance, header, position = table_ops.rank_step_header(
        headers.plan,
        need,
        has_data,
        headers.new_batch(phase),
        phase,
        headers.restart,
        name="rank_step_header",
    )
    gathered = _gather(header, instance, headers.size)
    return table_ops.rank_check_headers(gathered, position, name="rank_check_headers")


_ran = weakref.WeakSet()  # sessions that ran a header
_TASK_GONE = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)


def _run_with_plan(run, session, fetches, feed_dict, options, run_metadata):
    """A session run with its plan fed when it exchanges rows over ranks (see the module
    doc); every other run as it is."""
    headers = headers_of(session.graph)
    if headers is None:
        return run(session, fetches, feed_dict, options, run_metadata)
    if not headers.ran:  # the graph's first run: its inputs' ends are wired now
        input_end.prepare(session.graph, every_read=True)
        headers.ran = True
    fetches, feed_dict = input_end.fetches_and_feeds(session.graph, fetches, feed_dict)
    plan, remote = headers.plan_of(session.graph, fetches, feed_dict)
    if plan is None and not remote:
        return run(session, fetches, feed_dict, options, run_metadata)
    dog = watchdog.watch(headers.task)
    if plan is None:  # ops on other ranks' tasks (rank 0's saves): watched, no header
        dog.enter("a run of ops on other ranks' tasks")
        try:
            return run(session, fetches, feed_dict, options, run_metadata)
        except _TASK_GONE as e:
            # A rank whose tables the run reads is gone: no collective failed, so the error
            # does not say so, and MonitoredTrainingSession would take it for a restarted
            # task, make a new session and wait for that task forever.
            raise loader.lost_rank(e) from e
        finally:
            dog.leave()
    feed = dict(feed_dict or {})
    feed[headers.plan] = plan
    _ran.add(session)
    dog.enter(headers.describe(plan))
    try:
        out = run(session, fetches, feed, options, run_metadata)
    except tf.errors.OutOfRangeError as e:
        if _FROM_HEADERS.search(getattr(e, "message", "")):
            headers.left = True  # a peer left: every rank knows
            headers.ended = _ENDED_INPUT in getattr(e, "message", "")
            # MonitoredTrainingSession and Estimator end quietly on OutOfRangeError: say why.
            logger.warning("rec_sdk: %s", _first_line(e))
        else:
            headers.leave(session, table_ops.PHASE_ENDED)
            headers.ended = True
        raise
    except tf.errors.FailedPreconditionError as e:
        if _FROM_HEADERS.search(getattr(e, "message", "")):
            headers.left = True  # every rank saw the same headers and fails alike
        raise
    except tf.errors.OpError:
        dog.explain_failure()
        raise
    finally:
        dog.leave()
    headers.left = False
    return out


def _first_line(error):
    """The line of an error's message that says what happened."""
    lines = [line for line in getattr(error, "message", str(error)).splitlines() if line.strip()]
    found = [line for line in lines if "ran out of input" in line or "task " in line]
    return (found or lines or [""])[0].strip()


def _leaving_close(original, session):
    """tf.compat.v1.Session.close: a session that ran steps over ranks first sends this
    rank's leave header (not from __del__ or at interpreter exit: a collective must not run
    from the garbage collector)."""
    headers = headers_of(session.graph) if session in _ran else None
    if (
        headers is not None
        and not tf_patches.session_closed(session)
        and not sys.is_finalizing()
        and not _from_del()
    ):
        headers.leave(session, table_ops.PHASE_LEFT)
        headers.meet_at_close(session)
    if headers is None:
        return original(session)
    # Closing deregisters the session's graphs on the other ranks' tasks: watched.
    dog = watchdog.watch(headers.task)
    dog.enter("closing its session")
    try:
        return original(session)
    finally:
        dog.leave()


def _from_del():
    """Whether the session's close was called by its __del__ (frames: this function,
    _leaving_close, the patch's wrapper, its caller)."""
    frame = inspect.currentframe()
    for _ in range(3):
        frame = frame.f_back if frame is not None else None
    return frame is not None and frame.f_code.co_name == "__del__"


loader.wrap_session_runs(_run_with_plan)
tf_patches.install("Session.close", _leaving_close)
