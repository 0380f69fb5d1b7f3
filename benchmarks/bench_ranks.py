"""The SDK API over N ranks (rec_sdk.distribute.ranks) on loopback against one process that
trains the same global batch, in one run.

Table workload: bench_table.py's batches (65,536 int64 keys Zipf(1.1) from a 10M-key space,
about 20k unique per batch, dim 16) as the global batch of each step; rank r of N looks up the
r-th 1/N of it. A step is sparse_lookup + sum of squares + lazy Adam by address
(create_table under init(use_dynamic_expansion=True)), in one process (the whole batch), or
in N processes started here as a cluster of N training tasks on 127.0.0.1 free ports
(collectives: the keys, rows and gradients exchanged every step). Reported: median ms per
step, steps/s relative to one process, bytes over the loopback interface per step (all ranks,
both directions, gRPC framing included; /proc/net/dev "lo") and per unique key of the global
batch. Then the DLRM model of rec_sdk.examples.train (--api sdk, synthetic Criteo-schema
data, 26 tables) at a global batch of 2,048: samples/s of training over N ranks against one
process.

    .venv/bin/python benchmarks/bench_ranks.py [--ranks 2,4] [--steps 30] [--dlrm-steps 150]
        [--json OUT] [--netns RATE [--per-host L]]

--json OUT writes the figures for benchmarks/rank_model.py. --netns RATE (root, Linux): the
table workload's ranks run in network namespaces of their own, joined by veth pairs to a
bridge, each veth limited to RATE by tc (e.g. 1gbit), so that the wire time is real; the
bytes are then those of the veths (each rank's sent bytes, summed). The namespaces, veths and
bridge (rsbench*) are removed afterwards, also when a rank fails. --per-host L (with
--netns): L consecutive ranks share a namespace (a host), and each rank count runs twice,
without and with per-host dedup (REC_SDK_RANKS_PER_HOST=auto, hosts told apart by their
addresses); the bytes are those between hosts (each host's veth).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rec_sdk  # noqa: E402
import rec_sdk.distribute as dist  # noqa: E402
from bench_distributed import loopback_tx_bytes  # noqa: E402
from bench_table import BATCH, DIM, zipf_batches  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.distribute.launch import local_cluster  # noqa: E402
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address  # noqa: E402
from rec_sdk.util.communication import hccl_ops  # noqa: E402
from rec_sdk.util.initialize import init  # noqa: E402

tf.compat.v1.disable_eager_execution()
DLRM_BATCH = 2048


def table_steps(steps, warmup):
    """One rank (TF_CONFIG) or one process: -> {"ms": median ms per step, "bytes": loopback
    bytes per timed step}."""
    server = dist.start_server(collective=True) if os.environ.get("TF_CONFIG") else None
    init(use_dynamic_expansion=True)
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    per_rank = BATCH // ranks  # (3 ranks: the global batch's last key is left out)
    batches = [b[rank * per_rank : (rank + 1) * per_rank] for b in zipf_batches(steps + warmup)]
    device = dist.worker_devices(dist.current_task())[rank] if server else "/CPU:0"
    with tf.device(device):
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH // ranks])
        table = create_table(
            tf.int64,
            DIM,
            "bench",
            tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
            device_vocabulary_size=1 << 20,
        )
        loss = tf.reduce_sum(tf.square(sparse_lookup(table, keys)))
        opt = create_hash_optimizer_by_address(learning_rate=0.001)
        train = opt.apply_gradients(
            zip(
                tf.gradients(
                    loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
                ),
                tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET),
            )
        )
    times, sent = [], 0
    config = dist.worker_config(server, collective=True) if server else None
    with tf.compat.v1.Session(server.target if server else "", config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i, batch in enumerate(batches):
            before, start = _tx_bytes(), time.perf_counter()
            sess.run(train, {keys: batch})
            if i >= warmup:
                times.append(time.perf_counter() - start)
                sent += _tx_bytes() - before
    return {"ms": float(np.median(times)) * 1e3, "bytes": sent / len(times)}


def _tx_bytes():
    """Bytes sent over loopback (all ranks), or over this rank's veth (--netns)."""
    device = os.environ.get("REC_SDK_BENCH_DEV")
    if not device:
        return loopback_tx_bytes()
    with open("/sys/class/net/%s/statistics/tx_bytes" % device) as f:
        return int(f.read())


def _run(command, env=None):
    result = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800
    )
    if result.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (" ".join(command), result.stdout[-3000:]))
    return result.stdout


NETNS = "rsbench"


def _netns(ranks, rate):
    """Network namespaces rsbench0.. (`ranks` of them: one per host) with 10.77.0.(r+1) on a
    veth limited to `rate`, bridged -> the per-namespace command prefixes."""
    _netns_down(ranks)
    run = lambda *a: subprocess.run(a, check=True)  # noqa: E731
    run("ip", "link", "add", NETNS + "br", "type", "bridge")
    run("ip", "link", "set", NETNS + "br", "up")
    for r in range(ranks):
        ns, outer, inner = "%s%d" % (NETNS, r), "%sv%d" % (NETNS, r), "%sp%d" % (NETNS, r)
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", ns)
        run("ip", "link", "set", outer, "master", NETNS + "br")
        run("ip", "link", "set", outer, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", "10.77.0.%d/24" % (r + 1), "dev", inner)
        run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        run(
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            inner,
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "1mb",
            "latency",
            "100ms",
        )
    return [["ip", "netns", "exec", "%s%d" % (NETNS, r)] for r in range(ranks)]


def _netns_down(ranks):
    for r in range(max(ranks, 8)):
        subprocess.run(["ip", "netns", "del", "%s%d" % (NETNS, r)], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "del", NETNS + "br"], stderr=subprocess.DEVNULL)


def _table_over_ranks(ranks, steps, warmup, netns=None, per_host=1, dedup=False):
    """table_steps in `ranks` processes of a local cluster -> rank 0's result (netns: in
    network namespaces of `per_host` ranks each, with every namespace's bytes; dedup: with
    per-host dedup)."""
    cluster = local_cluster(0, ranks)
    prefixes = [[] for _ in range(ranks)]
    hosts = ranks // per_host
    if netns:
        cluster = {
            "worker": [
                "10.77.0.%d:%s" % (r // per_host + 1, a.rsplit(":", 1)[1])
                for r, a in enumerate(cluster["worker"])
            ]
        }
        prefixes = [prefix for prefix in _netns(hosts, netns) for _ in range(per_host)]
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--rank-worker",
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    processes = []
    try:
        for i in range(ranks):
            env = dict(
                os.environ,
                TF_CPP_MIN_LOG_LEVEL="2",
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            )
            if netns:
                env["REC_SDK_BENCH_DEV"] = "%sp%d" % (NETNS, i // per_host)
            env["REC_SDK_RANKS_PER_HOST"] = "auto" if dedup else "0"
            processes.append(
                subprocess.Popen(
                    prefixes[i] + command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=1800)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        if netns:
            _netns_down(hosts)
    for p, out in zip(processes, outputs):
        if p.returncode != 0:
            raise RuntimeError("a rank failed:\n%s" % out[-3000:])
    results = [
        json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        for out in outputs
    ]
    if netns:
        results[0]["bytes"] = sum(r["bytes"] for r in results[::per_host])
    return results[0]


def _dlrm_samples_per_s(ranks, steps):
    """The example trainer's DLRM at a global batch of DLRM_BATCH: samples/s of training
    (in a cluster: every rank's samples)."""
    train = [
        sys.executable,
        "-m",
        "rec_sdk.examples.train",
        "--model",
        "dlrm",
        "--data",
        "synthetic",
        "--rows",
        "200000",
        "--steps",
        str(steps),
        "--eval-every",
        str(steps),
        "--eval-batches",
        "2",
        "--batch-size",
        str(DLRM_BATCH // ranks),
    ]
    if ranks == 1:
        out = _run(train, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    else:
        out = _run(
            [
                sys.executable,
                "-m",
                "rec_sdk.distribute.launch",
                "--ps",
                "0",
                "--workers",
                str(ranks),
                "--",
            ]
            + train,
            dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
    rates = [float(m.group(1)) for m in re.finditer(r"final: .* (\d+) samples/s", out)]
    if len(rates) != ranks:
        raise RuntimeError("no result in:\n%s" % out[-3000:])
    return min(rates) * ranks  # the ranks go in lockstep: the slowest sets the pace


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--dlrm-steps", type=int, default=150)
    parser.add_argument("--no-table", action="store_true", help="the DLRM table only")
    parser.add_argument("--rank-worker", action="store_true")
    parser.add_argument("--json", help="write the figures here (for rank_model.py)")
    parser.add_argument("--netns", help="rate of each rank's veth (tc tbf), e.g. 1gbit")
    parser.add_argument(
        "--per-host",
        type=int,
        default=1,
        help="with --netns: ranks per namespace; runs with and without per-host dedup",
    )
    args = parser.parse_args()
    if args.rank_worker:
        print(json.dumps(table_steps(args.steps, args.warmup)), flush=True)
        return
    counts = [int(n) for n in args.ranks.split(",")]
    print(
        "machine: %s, %d cores, TensorFlow %s"
        % (platform.processor() or platform.machine(), os.cpu_count(), tf.__version__)
    )
    unique = float(
        np.mean([np.unique(b).size for b in zipf_batches(args.steps + args.warmup)[args.warmup :]])
    )
    print(
        "global batch %d keys (%.0f unique), dim %d, %d timed steps after %d"
        % (BATCH, unique, DIM, args.steps, args.warmup)
    )
    one = None
    figures = {
        "machine": {"cores": os.cpu_count(), "tensorflow": tf.__version__},
        "table": {"batch": BATCH, "unique": unique, "dim": DIM, "ms": {}, "bytes": {}},
        "dlrm": {"batch": DLRM_BATCH, "samples_per_s": {}},
        "netns": args.netns,
    }
    if not args.no_table:
        one = json.loads(
            _run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--rank-worker",
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                ],
                dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
            ).splitlines()[-1]
        )
    if one is not None:
        print(
            "\n| processes | ms per step | steps/s vs 1 process | %s bytes/step | "
            "bytes per unique key |" % ("between hosts:" if args.netns else "loopback")
        )
        print("|---|---|---|---|---|")
        print("| 1 | %.2f | 1.00x | - | - |" % one["ms"])
        figures["table"]["ms"][1] = one["ms"]
    if args.per_host > 1 and (not args.netns or any(n % args.per_host for n in counts)):
        parser.error("--per-host needs --netns and rank counts it divides")
    for n in counts if one is not None else []:
        for dedup in (False, True) if args.per_host > 1 else (False,):
            got = _table_over_ranks(n, args.steps, args.warmup, args.netns, args.per_host, dedup)
            label = "%d%s" % (
                n,
                (" (%d hosts, %s)" % (n // args.per_host, "per-host dedup" if dedup else "direct"))
                if args.per_host > 1
                else "",
            )
            if not dedup:
                figures["table"]["ms"][n], figures["table"]["bytes"][n] = (got["ms"], got["bytes"])
            else:
                figures["table"].setdefault("host_dedup", {})[n] = got
            print(
                "| %s | %.2f | %.2fx | %.2f MB | %.0f |"
                % (
                    label,
                    got["ms"],
                    one["ms"] / got["ms"],
                    got["bytes"] / 1e6,
                    got["bytes"] / unique,
                ),
                flush=True,
            )
    if args.dlrm_steps:
        print("\nDLRM (26 tables, global batch %d):\n" % DLRM_BATCH)
        print("| processes | samples/s | vs 1 process |")
        print("|---|---|---|")
        base = _dlrm_samples_per_s(1, args.dlrm_steps)
        print("| 1 | %.0f | 1.00x |" % base, flush=True)
        figures["dlrm"]["samples_per_s"][1] = base
        for n in counts:
            rate = _dlrm_samples_per_s(n, args.dlrm_steps)
            figures["dlrm"]["samples_per_s"][n] = rate
            print("| %d | %.0f | %.2fx |" % (n, rate, rate / base), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
