"""Starts a whole cluster on this machine for a quick try: ps tasks
(`python -m rec_sdk.distribute.server`) and worker processes running a script, each with its
TF_CONFIG on free 127.0.0.1 ports.

    python -m rec_sdk.distribute.launch --ps 2 --workers 2 -- python my_train.py --steps 100

Worker i runs the command with TF_CONFIG {"cluster": ..., "task": {"type": "worker",
"index": i}} (worker 0 is the chief: `rec_sdk.distribute.current_task().task_index == 0`).
Every output line is prefixed with its task ("[worker 1] ..."). The launch ends when every
worker has exited (or one failed: the others are stopped), stops the ps tasks and exits with
the first failing worker's code, else 0. On several machines, start the same processes by
hand with TF_CONFIG naming the real hosts (see docs/DISTRIBUTED.md).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading

from rec_sdk.distribute import ClusterTask


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


def _start(command, cluster, job, index, out):
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
    )
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    threading.Thread(target=_pump, args=(process, "%s %d" % (job, index), out), daemon=True).start()
    return process


def launch(command, num_ps=2, num_workers=2, out=None):
    """Runs `command` (a list) as num_workers workers beside num_ps ps tasks; returns the exit
    code (0 when every worker succeeded)."""
    if not command:
        raise ValueError("command is empty: give the worker's command after --")
    out = out or sys.stdout
    cluster = local_cluster(num_ps, num_workers)
    ps = [
        _start([sys.executable, "-m", "rec_sdk.distribute.server"], cluster, "ps", i, out)
        for i in range(num_ps)
    ]
    workers = []
    try:
        workers = [_start(command, cluster, "worker", i, out) for i in range(num_workers)]
        code = 0
        pending = list(workers)
        while pending:
            for process in list(pending):
                try:
                    result = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                pending.remove(process)
                if result != 0 and code == 0:
                    code = result
                    for other in pending:
                        other.send_signal(signal.SIGTERM)
        return code
    finally:
        for process in ps + workers:
            if process.poll() is None:
                process.kill()
            process.wait()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "usage: python -m rec_sdk.distribute.launch [--ps N] [--workers N] -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m rec_sdk.distribute.launch")
    parser.add_argument("--ps", type=int, default=2, help="ps tasks (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv[:split])
    if args.ps < 0 or args.workers < 1:
        parser.error(
            "--ps must be >= 0 and --workers >= 1, got %d and %d" % (args.ps, args.workers)
        )
    return launch(argv[split + 1 :], args.ps, args.workers)


if __name__ == "__main__":
    sys.exit(main())
