"""Runs one task of a cluster with rec_sdk's op library loaded (a ps task, typically):

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' \\
        python -m rec_sdk.distribute.server
    python -m rec_sdk.distribute.server --cluster '{"ps": [...], "worker": [...]}' --job ps --task 0

It prints "rec_sdk server /job:<job>/task:<i> at <target>" once serving, and serves until the
process is stopped (SIGTERM).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's per-RunGraph info lines

from rec_sdk.distribute import ClusterTask, start_server, task_from_tf_config  # noqa: E402


def parse(argv):
    """The ClusterTask the command line (or TF_CONFIG) names."""
    parser = argparse.ArgumentParser(
        prog="python -m rec_sdk.distribute.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--cluster", help='the cluster as JSON {job: ["host:port", ...]} (default: TF_CONFIG\'s)'
    )
    parser.add_argument("--job", help="this task's job (default: TF_CONFIG's task type)")
    parser.add_argument("--task", type=int, help="this task's index in its job")
    args = parser.parse_args(argv)
    if args.cluster is None:
        if args.job is not None or args.task is not None:
            parser.error("--job and --task need --cluster (or give neither and set TF_CONFIG)")
        return task_from_tf_config()
    if args.job is None:
        parser.error("--cluster needs --job (and --task, default 0)")
    try:
        cluster = json.loads(args.cluster)
    except ValueError as e:
        parser.error("--cluster is not JSON (%s): %r" % (e, args.cluster))
    return ClusterTask(cluster, args.job, 0 if args.task is None else args.task)


def main(argv=None):
    task = parse(sys.argv[1:] if argv is None else argv)
    server = start_server(task.cluster, task.job_name, task.task_index)
    print(
        "rec_sdk server /job:%s/task:%d at %s" % (task.job_name, task.task_index, server.target),
        flush=True,
    )
    server.join()


if __name__ == "__main__":
    main()
