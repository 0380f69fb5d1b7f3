"""Starts a whole cluster on this machine for a quick try: ps tasks
(`python -m rec_sdk.distribute.server`) and worker processes running a script, each with its
TF_CONFIG on free 127.0.0.1 ports.

    python -m rec_sdk.distribute.launch --ps 2 --workers 2 -- python my_train.py --steps 100

Worker i runs the command with TF_CONFIG {"cluster": ..., "task": {"type": "worker",
"index": i}} (worker 0 is the chief: `rec_sdk.distribute.current_task().task_index == 0`).
Every output line is prefixed with its task ("[worker 1] ..."). The launch ends when every
worker has exited (or one failed: the others are stopped), stops the ps tasks and exits with
the first failing worker's code (128 + N when signal N killed it), else 0. Each task runs in
a process group of its own, stopped whole (SIGTERM, then SIGKILL after 20 s), so what a task
started stops with it; the launch stopped by SIGTERM, SIGHUP or Ctrl-C stops every task
first. On several machines, start the same processes by
hand with TF_CONFIG naming the real hosts (see docs/DISTRIBUTED.md).

With `--max-restarts N`, a failed worker (any exit code but 0, a signal included) makes the
launch stop every task and start them all again, on new ports, up to N times, as torchelastic
does: every task of restart k gets REC_SDK_RESTART=k (the restart id the ranks' step headers
compare, so a task left over from an earlier start cannot join a later one). A training script
that restores its checkpoint directory when it starts (MonitoredTrainingSession,
tf.estimator, a Saver's latest_checkpoint) resumes from the last checkpoint; what it trains
from there equals what an uninterrupted run restored from that checkpoint trains.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from rec_sdk.distribute import ClusterTask
from rec_sdk.distribute.ranks.headers import RESTART_ENV

STOP_GRACE_S = 20  # seconds a stopped task has to exit after SIGTERM, then SIGKILL


def free_ports(count):
    """`count` free TCP ports of 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(num_ps, num_workers):
    """{"ps": [...], "worker": [...]} on free ports of 127.0.0.1."""
    ports = free_ports(num_ps + num_workers)
    cluster = {"worker": ["127.0.0.1:%d" % p for p in ports[num_ps:]]}
    if num_ps:
        cluster["ps"] = ["127.0.0.1:%d" % p for p in ports[:num_ps]]
    ClusterTask(cluster, "worker", 0)  # checks it
    return cluster


def _pump(process, prefix, out):
    for line in process.stdout:
        out.write("[%s] %s" % (prefix, line))
        out.flush()


def _start(command, cluster, job, index, out, restart):
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
    )
    env[RESTART_ENV] = str(restart)
    # Each task in a process group of its own: stopping it stops what it started too (a
    # wrapped command: `bash -c`, a launcher script).
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    threading.Thread(target=_pump, args=(process, "%s %d" % (job, index), out), daemon=True).start()
    return process


def _signal_group(process, signum):
    """Sends `signum` to the task's process group (the task and what it started)."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group has no process left


def _stop(processes):
    """SIGTERM to every task still running (its process group), SIGKILL to those still
    running STOP_GRACE_S later; waits for all."""
    for process in processes:
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _run_once(command, num_ps, num_workers, out, restart):
    """Starts the cluster once -> (exit code: -N when signal N killed the worker, index of the
    first failed worker or None)."""
    cluster = local_cluster(num_ps, num_workers)
    ps = [
        _start([sys.executable, "-m", "rec_sdk.distribute.server"], cluster, "ps", i, out, restart)
        for i in range(num_ps)
    ]
    workers = []
    try:
        workers = [_start(command, cluster, "worker", i, out, restart) for i in range(num_workers)]
        pending = list(workers)
        while pending:
            for process in list(pending):
                try:
                    result = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                pending.remove(process)
                if result != 0:
                    _stop(pending)
                    return result, workers.index(process)
        return 0, None
    finally:
        for process in ps + workers:
            _signal_group(process, signal.SIGKILL)  # also what an exited task left running
            process.wait()


def launch(command, num_ps=2, num_workers=2, out=None, max_restarts=0):
    """Runs `command` (a list) as num_workers workers beside num_ps ps tasks, starting them
    all again (at most max_restarts times) when a worker fails; returns the exit code (0 when
    every worker of the last start succeeded, else the first failed worker's code: 128 + N
    when signal N killed it)."""
    if not command:
        raise ValueError("command is empty: give the worker's command after --")
    if max_restarts < 0:
        raise ValueError("max_restarts must be >= 0, got %d" % max_restarts)
    out = out or sys.stdout
    for restart in range(max_restarts + 1):
        code, failed = _run_once(command, num_ps, num_workers, out, restart)
        if code == 0:
            return 0
        what = "worker %d %s" % (
            failed,
            "was killed by signal %d" % -code if code < 0 else "exited with code %d" % code,
        )
        if restart == max_restarts:
            code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as shells say
            if max_restarts:
                out.write(
                    "[launch] %s; no restart left (--max-restarts %d)\n" % (what, max_restarts)
                )
            return code
        out.write(
            "[launch] %s; every task stopped, starting them all again from the last "
            "checkpoint (restart %d of %d)\n" % (what, restart + 1, max_restarts)
        )
        out.flush()
    return code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "usage: python -m rec_sdk.distribute.launch [--ps N] [--workers N] [--max-restarts N] "
            "-- COMMAND...",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m rec_sdk.distribute.launch")
    parser.add_argument("--ps", type=int, default=2, help="ps tasks (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="start every task again when a worker fails, at most N times (default 0)",
    )
    args = parser.parse_args(argv[:split])
    if args.ps < 0 or args.workers < 1 or args.max_restarts < 0:
        parser.error(
            "--ps and --max-restarts must be >= 0 and --workers >= 1, got %d, %d and %d"
            % (args.ps, args.max_restarts, args.workers)
        )
    # Stopped by SIGTERM (a job scheduler) or SIGHUP (its terminal closed), the launch still
    # stops every task it started (SystemExit runs the cleanup; the default action would
    # orphan them). SIGINT (Ctrl-C) does it through KeyboardInterrupt.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: sys.exit(128 + number))
    return launch(argv[split + 1 :], args.ps, args.workers, max_restarts=args.max_restarts)


if __name__ == "__main__":
    sys.exit(main())
