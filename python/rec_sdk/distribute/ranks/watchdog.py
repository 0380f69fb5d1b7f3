"""The ranks' liveness watchdog: a background thread that asks every peer's TensorFlow server
for its status (the worker service's GetStatus RPC, the call TensorFlow's own
MultiWorkerMirroredStrategy checks its peers with, over the grpcio TensorFlow depends on)
every few seconds.

* A peer that has not answered for PEER_TIMEOUT_ENV seconds (default 45: killed, stopped,
  its host or network gone) while this rank is inside a step over ranks ends this process
  with exit code PEER_LOST_EXIT and an error naming the rank: a collective waiting for a
  peer that will never come can be neither cancelled nor reused in its process, so the step
  cannot end otherwise. Every rank waiting for the peer exits within the timeout plus one
  interval (<= 60 s by default). A killed peer ends the others' step sooner: its server's
  connections close and their collectives fail at once (RankLostError).
* A peer that answers is never aborted, however slow (a long save, a stalled input
  pipeline). When this rank's step has waited longer than PROGRESS_ENV seconds (default
  60), it logs which ranks it waits for and what each is doing (its step, phase and for how
  long), read from each peer's step headers (RankHeaderActivity), again every period.
* A peer that stops answering while this rank is between steps is logged once; the next
  step ends as above.
"""

import atexit
import os
import threading
import time

import grpc
import tensorflow as tf

from rec_sdk.base.log import logger
from rec_sdk.distribute.cluster import rank_of, worker_addresses, worker_devices
from rec_sdk.ops import table_ops

PEER_TIMEOUT_ENV = "REC_SDK_PEER_TIMEOUT_S"
PROGRESS_ENV = "REC_SDK_RANK_PROGRESS_S"
PEER_LOST_EXIT = 17  # the exit code of a rank whose peer stopped answering
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"  # GetStatusRequest is empty: b""


def _seconds(name, default):
    value = os.environ.get(name, str(default))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError("%s must be a number of seconds, got %r" % (name, value)) from None
    if seconds <= 0:
        raise ValueError("%s must be > 0 seconds, got %r" % (name, value))
    return seconds


class Watchdog:
    """The watchdog of this process's rank (one per process: watch())."""

    def __init__(self, task):
        self.task = task
        self.rank, self.size = rank_of(task)
        self.timeout = _seconds(PEER_TIMEOUT_ENV, 45)
        self.budget = _seconds(PROGRESS_ENV, 60)
        self.interval = min(5.0, self.timeout / 6)
        addresses = worker_addresses(task)
        self.peers = {r: a for r, a in enumerate(addresses) if r != self.rank}
        self.channels = {r: grpc.insecure_channel(a) for r, a in self.peers.items()}
        self.calls = {
            r: channel.unary_unary(
                _GET_STATUS, request_serializer=bytes, response_deserializer=bytes
            )
            for r, channel in self.channels.items()
        }
        now = time.monotonic()
        self.answered = {r: now for r in self.peers}
        self.warned = set()
        self.lock = threading.Lock()
        self.step = None  # (since, what) while this rank runs a step over ranks
        self.reported = 0
        self.stopping = threading.Event()
        self.reports = []  # the threads reading the peers' steps
        self.thread = threading.Thread(target=self._loop, name="rec_sdk_watchdog", daemon=True)
        self.thread.start()
        # Stopped before the interpreter exits: a daemon thread still inside TensorFlow or
        # gRPC then would abort the process.
        atexit.register(self.stop)

    def stop(self):
        self.stopping.set()
        for thread in [self.thread] + self.reports:
            thread.join(2 * self.interval + 1)
        for channel in self.channels.values():
            channel.close()

    def enter(self, what):
        with self.lock:
            self.step = (time.monotonic(), what)
            self.reported = 0

    def leave(self):
        with self.lock:
            self.step = None

    def silent(self):
        """[(rank, address, seconds)] of the peers that have not answered for over two
        intervals."""
        now = time.monotonic()
        return [
            (r, self.peers[r], now - t)
            for r, t in sorted(self.answered.items())
            if now - t > 2 * self.interval
        ]

    def explain_failure(self):
        """Logs, when this rank's step failed while peers are silent, that they are the
        cause (a rank ending for a silent peer fails the steps of the others first)."""
        silent = self.silent()
        if silent:
            logger.error(
                "rec_sdk: rank %d's step failed while %s not answered (stopped, killed, or its "
                "host or network is gone): the cause",
                self.rank,
                ", ".join("rank %d (%s) has for %.0f s" % s for s in silent),
            )

    def _loop(self):
        while not self.stopping.wait(self.interval):
            for rank, call in self.calls.items():
                try:
                    call(b"", timeout=self.interval)
                    self.answered[rank] = time.monotonic()
                    self.warned.discard(rank)
                except grpc.RpcError:
                    pass
            self._act(time.monotonic())

    def _act(self, now):
        gone = sorted(r for r, t in self.answered.items() if now - t > self.timeout)
        with self.lock:
            step = self.step
        if gone and step is not None:
            self._end(gone, now, step)
        for rank in gone:
            if rank not in self.warned:
                self.warned.add(rank)
                logger.warning(
                    "rec_sdk: rank %d (%s) has not answered for %.0f s; this rank's next step "
                    "over ranks ends if it still does not",
                    rank,
                    self.peers[rank],
                    now - self.answered[rank],
                )
        if step is not None and now - step[0] > self.budget * (self.reported + 1):
            self.reported += 1
            # In a thread of its own: reading the peers' steps must not hold up the pings.
            live = [r for r in sorted(self.peers) if now - self.answered[r] <= 2 * self.interval]
            report = threading.Thread(
                target=self._report, args=(now - step[0], step[1], live), daemon=True
            )
            self.reports = [t for t in self.reports if t.is_alive()] + [report]
            report.start()

    def _report(self, waited, what, live):
        logger.warning(
            "rec_sdk: rank %d has waited %.0f s in %s; %s",
            self.rank,
            waited,
            what,
            self._peers_doing(live),
        )

    def _end(self, gone, now, step):
        message = (
            "rec_sdk: %s stopped answering (%s for over %.0f s: killed, stopped, or its host or "
            "network is gone) while rank %d waits in %s; what it waits for cannot be "
            "cancelled, so rank %d exits (code %d). Start every rank again from the last "
            "checkpoint (python -m rec_sdk.distribute.launch --max-restarts N does it)."
            % (
                ", ".join("rank %d (%s)" % (r, self.peers[r]) for r in gone),
                ", ".join("%.0f s" % (now - self.answered[r]) for r in gone),
                self.timeout,
                self.rank,
                step[1],
                self.rank,
                PEER_LOST_EXIT,
            )
        )
        logger.error(message)
        print(message, flush=True)
        os._exit(PEER_LOST_EXIT)

    def _peers_doing(self, live):
        """What each peer that answers (`live`) is doing, from its step headers
        (RankHeaderActivity), read in a session of this rank's server over those peers."""
        silent = [r for r in sorted(self.peers) if r not in live]
        said = ["rank %d does not answer" % r for r in silent]
        if not live:
            return "; ".join(said)
        graph = tf.Graph()
        devices = worker_devices(self.task)
        with graph.as_default():
            ops = []
            for rank in live:
                with tf.device(devices[rank]):
                    ops.append(table_ops.rank_header_activity(name="activity_%d" % rank))
        own = self.task.cluster.task_address(self.task.job_name, self.task.task_index)
        config = tf.compat.v1.ConfigProto(
            device_filters=[devices[r].rsplit("/device:", 1)[0] for r in [self.rank] + live]
        )
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(self.interval * 1000))
        try:
            with tf.compat.v1.Session("grpc://" + own, graph, config) as session:
                rows = session.run(ops, options=options)
        except tf.errors.OpError as e:
            return "; ".join(said + ["the peers' steps could not be read (%s)" % type(e).__name__])
        return "; ".join([_describe(r, row) for r, row in zip(live, rows)] + said)


def _describe(rank, row):
    step, phase, began, checked, left, now = (int(v) for v in row)
    name = table_ops.PHASE_NAMES.get(phase, "unknown")
    if left:
        return "rank %d left (%s) %.0f s ago" % (rank, name, (now - began) / 1000)
    if not began:
        return "rank %d has run no step over ranks yet" % rank
    if not checked:
        return "rank %d waits in the header of its step %d (%s) since %.0f s" % (
            rank,
            step,
            name,
            (now - began) / 1000,
        )
    return (
        "rank %d passed the header of its step %d (%s) %.0f s ago and runs the step or other "
        "work (its input pipeline, a save, an evaluation)"
        % (rank, step, name, (now - checked) / 1000)
    )


_watchdog = [None]
_lock = threading.Lock()


def watch(task):
    """This process's Watchdog for the ranks of `task` (started on first call)."""
    with _lock:
        if _watchdog[0] is None:
            _watchdog[0] = Watchdog(task)
        return _watchdog[0]
