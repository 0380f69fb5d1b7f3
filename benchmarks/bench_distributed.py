"""A de.Variable on ps tasks of TensorFlow's gRPC runtime (loopback) against the same
variable in one process, in one run.

Workload: bench_table.py's batches (65,536 int64 keys Zipf(1.1) from a 10M-key space, about
20k unique per batch, dim 16), a train step of de.embedding_lookup + sum of squares +
DynamicEmbeddingOptimizer(AdamOptimizer), the variable sharded over N ps tasks
(`python -m rec_sdk.distribute.server`, started here on 127.0.0.1 free ports and stopped at
the end) with this process as the worker, against N local shards in this process. Reported
per layout: median ms per step, steps/s relative to the in-process run, and bytes over the
loopback interface per step (/proc/net/dev "lo" transmit bytes over the timed steps: both
directions, gRPC framing included) and per unique key.

The in-process and ps runs alternate in --repeat rounds per layout; medians count.
A second table: the DLRM model of rec_sdk.examples.train (--api dynamic_embedding, 26
variables on the synthetic Criteo-schema data, batch 1,024, Adam) the same way.

    .venv/bin/python benchmarks/bench_distributed.py [--steps 30] [--ps 1,2,4] [--repeat 3]
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rec_sdk.distribute  # noqa: E402
import rec_sdk.dynamic_embedding as de  # noqa: E402
from bench_table import BATCH, DIM, zipf_batches  # noqa: E402
from rec_sdk.distribute.launch import local_cluster  # noqa: E402
from rec_sdk.examples import embeddings as examples_embeddings  # noqa: E402
from rec_sdk.examples import train as examples_train  # noqa: E402

tf.compat.v1.disable_eager_execution()


def loopback_tx_bytes():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, data = line.partition(":")
            if name.strip() == "lo":
                return int(data.split()[8])
    return 0


def _start_ps(cluster, num_ps):
    processes = []
    for i in range(num_ps):
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "ps", "index": i}}),
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "rec_sdk.distribute.server"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    for p in processes:
        if "rec_sdk server" not in p.stdout.readline():
            raise RuntimeError("a ps task did not start")
    return processes


def run(batches, warmup, devices, target="", config=None, worker_device="/CPU:0"):
    """-> (median seconds per train step, loopback bytes per step, unique keys per step)."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(worker_device):
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        var = de.get_variable(
            "bench",
            dim=DIM,
            devices=devices,
            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
        )
        loss = tf.reduce_sum(tf.square(de.embedding_lookup(var, keys, name="lookup")))
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.001)).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    unique = float(np.mean([np.unique(b).size for b in batches[warmup:]]))
    return _timed(
        graph, init, target, config, warmup, [(train, {keys: batch}) for batch in batches]
    ) + (unique,)


def _timed(graph, init, target, config, warmup, runs):
    """(median seconds, loopback bytes per step) of the (fetch, feed) runs after warmup."""
    times, sent = [], 0
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
        sess.run(init)
        for i, (fetch, feed) in enumerate(runs):
            before, start = loopback_tx_bytes(), time.perf_counter()
            sess.run(fetch, feed)
            if i >= warmup:
                times.append(time.perf_counter() - start)
                sent += loopback_tx_bytes() - before
    return float(np.median(times)), sent / len(times)


DLRM_BATCH = 1024


def run_dlrm(source, steps, warmup, devices, target="", config=None, worker_device="/CPU:0"):
    """run() for the DLRM model (train step of the example trainer's graph)."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(worker_device):
        tf.compat.v1.set_random_seed(0)
        batch = tf.compat.v1.data.make_one_shot_iterator(
            source.train_dataset(DLRM_BATCH, 0).repeat().prefetch(4)
        ).get_next()
        embeddings = examples_embeddings.DynamicEmbeddings(
            source, 16, 0.001, False, devices=devices
        )
        _, _, loss = examples_train.build("dlrm", source, embeddings, batch, True, 16)
        dense = [
            v for v in tf.compat.v1.trainable_variables() if v not in embeddings.gradient_targets()
        ]
        train = embeddings.train_op(loss, dense, tf.compat.v1.train.AdamOptimizer(0.001))
        init = tf.compat.v1.global_variables_initializer()
    return _timed(graph, init, target, config, warmup, [(train, None)] * (steps + warmup)) + (
        float("nan"),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ps", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    batches = zipf_batches(args.steps + args.warmup)
    counts = [int(n) for n in args.ps.split(",")]
    print(
        "machine: %s, %d cores, TensorFlow %s"
        % (platform.processor() or platform.machine(), os.cpu_count(), tf.__version__)
    )
    print("batch %d keys, dim %d, %d timed steps after %d" % (BATCH, DIM, args.steps, args.warmup))
    rows = []
    cluster = local_cluster(max(counts), 1)
    # The worker's server serves for the whole run: its cluster names every ps port; a
    # layout of n ps tasks uses (and starts) the first n.
    server = rec_sdk.distribute.start_server(cluster, "worker", 0)
    source = examples_train.make_source("synthetic", rows=200_000, scale=0.05)
    dlrm_rows = []
    for n in counts:
        processes = _start_ps(cluster, n)
        config = tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % i for i in range(n)] + ["/job:worker/task:0"]
        )
        local, remote = [], []
        try:
            for _ in range(args.repeat):
                local.append(run(batches, args.warmup, ["/CPU:0"] * n))
                remote.append(
                    run(
                        batches,
                        args.warmup,
                        rec_sdk.distribute.ps_devices(server)[:n],
                        server.target,
                        config,
                        "/job:worker/task:0",
                    )
                )
            if n == 2:
                local_dlrm, remote_dlrm = [], []
                for _ in range(args.repeat):
                    local_dlrm.append(run_dlrm(source, args.steps, args.warmup, ["/CPU:0"] * n))
                    remote_dlrm.append(
                        run_dlrm(
                            source,
                            args.steps,
                            args.warmup,
                            rec_sdk.distribute.ps_devices(server)[:n],
                            server.target,
                            config,
                            "/job:worker/task:0",
                        )
                    )
                dlrm_rows.append((n, np.median(local_dlrm, axis=0), np.median(remote_dlrm, axis=0)))
        finally:
            for p in processes:
                p.send_signal(signal.SIGKILL)
                p.wait()
        rows.append((n, tuple(np.median(local, axis=0)), tuple(np.median(remote, axis=0))))
    print(
        "\n| shards | in-process ms | %s ms | ps / in-process steps/s | loopback bytes/step | "
        "bytes per unique key |" % "ps tasks (1 worker)"
    )
    print("|---|---|---|---|---|---|")
    for n, local, remote in rows:
        print(
            "| %d | %.2f | %.2f | %.2fx | %.2f MB | %.0f |"
            % (
                n,
                local[0] * 1e3,
                remote[0] * 1e3,
                local[0] / remote[0],
                remote[1] / 1e6,
                remote[1] / remote[2],
            )
        )
    if dlrm_rows:
        print("\nDLRM (26 variables, batch %d):\n" % DLRM_BATCH)
        print(
            "| shards | in-process ms | ps tasks (1 worker) ms | ps / in-process steps/s | "
            "loopback bytes/step |"
        )
        print("|---|---|---|---|---|")
        for n, local, remote in dlrm_rows:
            print(
                "| %d | %.2f | %.2f | %.2fx | %.2f MB |"
                % (n, local[0] * 1e3, remote[0] * 1e3, local[0] / remote[0], remote[1] / 1e6)
            )


if __name__ == "__main__":
    main()
