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
        [--json OUT] [--netns RATE [--per-host L]] [--pinned [--rounds R]] [--stages]

--pinned: weak scaling with one core per rank: rank i pinned to core i (taskset; TensorFlow's
pools sized to it by rec_sdk.distribute.pinned_config), one process pinned to core 0; each
rank trains a whole batch of the table workload (65,536 keys; rank r of N takes batch
s * N + r at step s) and DLRM at 1,024 samples per rank; efficiency = global keys (samples)
per second / (N x one process's). One process and N ranks are alternated --rounds times
(default 3) and the medians reported. --stages: rank 0 traces 5 steps and reports the CPU of
each stage of the step (the exchange's name scopes; each collective's span apart: mostly
waiting) and the process's CPU per step beside its wall time.

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
DLRM_PINNED_BATCH = 1024  # per rank, --pinned


def table_steps(steps, warmup, weak=False, trace=False):
    """One rank (TF_CONFIG) or one process: -> {"ms": median ms per step, "bytes": loopback
    bytes per timed step} (trace: and "stages", the CPU per step of each stage of the exchange
    on this rank: stage_ms). weak: each rank's batch is a whole batch of the table benchmark
    (rank r of N takes batch s * N + r at step s), else its 1/N of the step's batch."""
    server = dist.start_server(collective=True) if os.environ.get("TF_CONFIG") else None
    init(use_dynamic_expansion=True)
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    if weak:
        per_rank = BATCH
        batches = zipf_batches((steps + warmup) * ranks)[rank::ranks]
    else:
        per_rank = BATCH // ranks  # (3 ranks: the global batch's last key is left out)
        batches = [b[rank * per_rank : (rank + 1) * per_rank] for b in zipf_batches(steps + warmup)]
    device = dist.worker_devices(dist.current_task())[rank] if server else "/CPU:0"
    with tf.device(device):
        keys = tf.compat.v1.placeholder(tf.int64, [per_rank])
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
    times, cpu, sent = [], [], 0
    config = dist.worker_config(server, collective=True) if server else dist.pinned_config()
    with tf.compat.v1.Session(server.target if server else "", config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i, batch in enumerate(batches):
            before, start, used = _tx_bytes(), time.perf_counter(), time.process_time()
            sess.run(train, {keys: batch})
            if i >= warmup:
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - used)
                sent += _tx_bytes() - before
        out = {
            "ms": float(np.median(times)) * 1e3,
            "bytes": sent / len(times),
            "cpu_ms": float(np.median(cpu)) * 1e3,  # every thread of the process
        }
        if trace:
            out["stages"] = stage_ms(sess, train, [{keys: b} for b in batches[-TRACED:]])
    return out


TRACED = 5  # steps traced for the stage figures (after the timed ones)
# The stages of a step, by the names of its ops (rec_sdk.distribute.ranks.exchange's name
# scopes; the first match wins). The collectives' own time (each op's span) is mostly waiting
# for the other ranks: reported apart (WAITING).
STAGES = [
    ("collective: step header gather, reductions", r"CollectiveGather|CollectiveReduce"),
    ("collective: keys all-to-all", r"(exchange|resend)_keys/Collective"),
    ("collective: rows all-to-all", r"exchange_rows/Collective"),
    ("collective: gradients all-to-all", r"exchange_gradients/Collective"),
    ("gRPC receives (RecvBuf)", r"RecvBuf"),
    ("step header, size class", r"rank_step_header|rank_check_headers|RankObserveSize|RankSize"),
    ("keys: route to owners, pack", r"route_keys/"),
    ("owner: received keys, dedup", r"owner_keys/"),
    ("rows: pack, send back, unpack", r"rows_back/"),
    ("gradients: pack, send", r"rank_gradients/send/"),
    ("gradients: owners' sums", r"rank_gradients/"),
    ("table: dedup, find or insert, rows", r"find_or_insert|GatherRowsByIndex$|/unique$"),
    ("table: gradient sums, lazy Adam", r"GatherRowsByIndex_grad|LazyAdam"),
    ("model: loss, its gradients", r"^gradients/|Square|^Sum"),
]


WAITING = {name for name, _ in STAGES[:5]}  # the collectives: mostly waiting for the others


def stage_ms(sess, fetch, feeds):
    """{stage: ms per step} of this process's ops over the traced steps (RunMetadata, each
    op's own time; ops of no stage: "other")."""
    totals, steps = {}, 0
    patterns = [(name, re.compile(pattern)) for name, pattern in STAGES]
    for feed in feeds:
        meta = tf.compat.v1.RunMetadata()
        sess.run(
            fetch,
            feed,
            options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
            run_metadata=meta,
        )
        steps += 1
        for device in meta.step_stats.dev_stats:
            for node in device.node_stats:
                stage = next((n for n, p in patterns if p.search(node.node_name)), "other")
                micros = node.all_end_rel_micros or node.op_end_rel_micros
                totals[stage] = totals.get(stage, 0.0) + micros / 1e3
    return {stage: ms / steps for stage, ms in totals.items()}


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


def _worker_command(args):
    """This file's command line running table_steps as `args` says."""
    command = [sys.executable, os.path.abspath(__file__), "--rank-worker"]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    return command + ["--weak"] * args.pinned + ["--trace"] * args.stages


def _pin(rank):
    """The command prefix pinning a process to core `rank` (modulo the cores)."""
    return ["taskset", "-c", str(rank % os.cpu_count())]


def _table_over_ranks(ranks, args, dedup=False):
    """table_steps in `ranks` processes of a local cluster -> rank 0's result (--netns: in
    network namespaces of --per-host ranks each, with every namespace's bytes; dedup: with
    per-host dedup; --pinned: rank i on core i)."""
    netns, per_host = args.netns, args.per_host
    cluster = local_cluster(0, ranks)
    prefixes = [_pin(i) if args.pinned else [] for i in range(ranks)]
    hosts = ranks // per_host
    if netns:
        cluster = {
            "worker": [
                "10.77.0.%d:%s" % (r // per_host + 1, a.rsplit(":", 1)[1])
                for r, a in enumerate(cluster["worker"])
            ]
        }
        prefixes = [prefix for prefix in _netns(hosts, netns) for _ in range(per_host)]
    command = _worker_command(args)
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


# Runs its arguments as a command pinned to the core of the process's rank (TF_CONFIG's task
# index, 0 without one): launch starts every rank with the same command.
PIN_BY_RANK = (
    "import json, os, sys; c = os.environ.get('TF_CONFIG'); "
    "i = json.loads(c)['task']['index'] if c else 0; "
    "os.sched_setaffinity(0, {i % os.cpu_count()}); os.execv(sys.argv[1], sys.argv[1:])"
)


def _dlrm_samples_per_s(ranks, steps, pinned=False):
    """The example trainer's DLRM: samples/s of training (in a cluster: every rank's
    samples), at a global batch of DLRM_BATCH, or (pinned) at DLRM_PINNED_BATCH per rank with
    rank i pinned to core i."""
    train = [sys.executable, "-c", PIN_BY_RANK] if pinned else []
    train += [
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
        str(DLRM_PINNED_BATCH if pinned else DLRM_BATCH // ranks),
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


def _weak_unique(ranks, args):
    """The distinct keys of a weak-scaling step's global batch (every rank's), on average."""
    batches = zipf_batches((args.steps + args.warmup) * ranks)
    steps = range(args.warmup, args.steps + args.warmup)
    return float(
        np.mean(
            [np.unique(np.concatenate(batches[s * ranks : (s + 1) * ranks])).size for s in steps]
        )
    )


def _median_result(results):
    """table_steps results of several rounds -> one, each figure the rounds' median."""
    out = dict(results[0])
    for key in ("ms", "cpu_ms", "bytes"):
        out[key] = float(np.median([r[key] for r in results]))
    if results[0].get("stages") is not None:
        names = set().union(*(r["stages"] for r in results))
        out["stages"] = {
            name: float(np.median([r["stages"].get(name, 0.0) for r in results])) for name in names
        }
    return out


def _print_stages(results):
    """The stage table: {label: table_steps result with "stages"} side by side."""
    labels = list(results)
    print("\nCPU per step by stage (ms; rank 0's ops, traced, %d steps):\n" % TRACED)
    print("| stage | %s |" % " | ".join(labels))
    print("|---|%s" % ("---|" * len(labels)))
    for stage in [name for name, _ in STAGES] + ["other"]:
        cells = ["%.2f" % results[label]["stages"].get(stage, 0.0) for label in labels]
        print("| %s | %s |" % (stage, " | ".join(cells)))
    for key, label in (("ms", "step, wall"), ("cpu_ms", "step, process CPU")):
        print("| %s | %s |" % (label, " | ".join("%.2f" % r[key] for r in results.values())))
    print(
        "| all but the collectives | %s |"
        % " | ".join(
            "%.2f" % sum(ms for stage, ms in r["stages"].items() if stage not in WAITING)
            for r in results.values()
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--dlrm-steps", type=int, default=150)
    parser.add_argument("--no-table", action="store_true", help="the DLRM table only")
    parser.add_argument("--rank-worker", action="store_true")
    parser.add_argument("--weak", action="store_true", help="(a rank worker) a whole batch")
    parser.add_argument("--trace", action="store_true", help="(a rank worker) stage figures")
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="weak scaling: rank i pinned to core i, each rank a whole batch",
    )
    parser.add_argument("--stages", action="store_true", help="the CPU of each stage")
    parser.add_argument(
        "--rounds", type=int, default=3, help="--pinned: rounds of 1 process and N ranks"
    )
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
        print(json.dumps(table_steps(args.steps, args.warmup, args.weak, args.trace)), flush=True)
        return
    counts = [int(n) for n in args.ranks.split(",")]
    if args.pinned and (args.netns or max(counts) > os.cpu_count()):
        parser.error("--pinned needs a core per rank (%d cores) and no --netns" % os.cpu_count())
    print(
        "machine: %s, %d cores, TensorFlow %s"
        % (platform.processor() or platform.machine(), os.cpu_count(), tf.__version__)
    )
    unique = float(
        np.mean([np.unique(b).size for b in zipf_batches(args.steps + args.warmup)[args.warmup :]])
    )
    print(
        "%s %d keys (%.0f unique), dim %d, %d timed steps after %d%s"
        % (
            "batch per rank" if args.pinned else "global batch",
            BATCH,
            unique,
            DIM,
            args.steps,
            args.warmup,
            "; weak scaling, rank i pinned to core i, one process to core 0" if args.pinned else "",
        )
    )
    one = None
    figures = {
        "machine": {"cores": os.cpu_count(), "tensorflow": tf.__version__},
        "table": {
            "batch": BATCH,
            "unique": unique,
            "dim": DIM,
            "ms": {},
            "cpu_ms": {},
            "bytes": {},
            "stages": {},
        },
        "dlrm": {"batch": DLRM_BATCH, "pinned_batch": DLRM_PINNED_BATCH, "samples_per_s": {}},
        "netns": args.netns,
        "pinned": args.pinned,
    }
    stages = {}
    measured = {}  # pinned: {n: the median of --rounds rounds}
    if not args.no_table:
        ones, rounds = [], {n: [] for n in counts}
        # Pinned: one process and N ranks alternated --rounds times (this machine's speed
        # drifts within minutes: each round's ratio is of figures taken seconds apart).
        for _ in range(args.rounds if args.pinned else 1):
            ones.append(
                json.loads(
                    _run(
                        (_pin(0) if args.pinned else []) + _worker_command(args),
                        dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                    ).splitlines()[-1]
                )
            )
            for n in counts if args.pinned else []:
                rounds[n].append(_table_over_ranks(n, args))
        if args.pinned and args.rounds > 1:
            for n in counts:
                print(
                    "%d ranks, each round's efficiency: %s"
                    % (
                        n,
                        ", ".join(
                            "%.2f (%.2f / %.2f ms)" % (o["ms"] / g["ms"], o["ms"], g["ms"])
                            for o, g in zip(ones, rounds[n])
                        ),
                    )
                )
        one = _median_result(ones)
        measured = {n: _median_result(got) for n, got in rounds.items() if got}
        stages["1 process"] = one
    if one is not None:
        print(
            "\n| processes | ms per step | %s | %s bytes/step | "
            "bytes per unique key |"
            % (
                "efficiency (keys/s / N x 1 process)" if args.pinned else "steps/s vs 1 process",
                "between hosts:" if args.netns else "loopback",
            )
        )
        print("|---|---|---|---|---|")
        print("| 1 | %.2f | 1.00x | - | - |" % one["ms"])
        figures["table"]["ms"][1], figures["table"]["cpu_ms"][1] = one["ms"], one["cpu_ms"]
        figures["table"]["stages"][1] = one.get("stages")
    if args.per_host > 1 and (not args.netns or any(n % args.per_host for n in counts)):
        parser.error("--per-host needs --netns and rank counts it divides")
    for n in counts if one is not None else []:
        for dedup in (False, True) if args.per_host > 1 else (False,):
            got = measured[n] if n in measured else _table_over_ranks(n, args, dedup)
            label = "%d%s" % (
                n,
                (" (%d hosts, %s)" % (n // args.per_host, "per-host dedup" if dedup else "direct"))
                if args.per_host > 1
                else "",
            )
            if not dedup:
                figures["table"]["ms"][n], figures["table"]["bytes"][n] = (got["ms"], got["bytes"])
                figures["table"]["cpu_ms"][n] = got["cpu_ms"]
                figures["table"]["stages"][n] = got.get("stages")
                stages["%d ranks" % n] = got
            else:
                figures["table"].setdefault("host_dedup", {})[n] = got
            # Weak scaling: every rank's batch is one process's, so the keys/s ratio is the
            # step time's.
            print(
                "| %s | %.2f | %.2fx | %.2f MB | %.0f |"
                % (
                    label,
                    got["ms"],
                    one["ms"] / got["ms"],
                    got["bytes"] / 1e6,
                    got["bytes"] / (_weak_unique(n, args) if args.pinned else unique),
                ),
                flush=True,
            )
    if args.stages and stages:
        _print_stages(stages)
    if args.dlrm_steps:
        batch = (
            "%d per rank, rank i pinned to core i" % DLRM_PINNED_BATCH
            if args.pinned
            else "global batch %d" % DLRM_BATCH
        )
        print("\nDLRM (26 tables, %s):\n" % batch)
        print("| processes | samples/s | %s |" % ("efficiency" if args.pinned else "vs 1 process"))
        print("|---|---|---|")
        # Pinned: one process and N ranks alternated --rounds times, the medians reported.
        bases, rates = [], {n: [] for n in counts}
        for _ in range(args.rounds if args.pinned else 1):
            bases.append(_dlrm_samples_per_s(1, args.dlrm_steps, args.pinned))
            for n in counts:
                rates[n].append(_dlrm_samples_per_s(n, args.dlrm_steps, args.pinned))
        base = float(np.median(bases))
        print("| 1 | %.0f | 1.00x |" % base, flush=True)
        figures["dlrm"]["samples_per_s"][1] = base
        for n in counts:
            rate = float(np.median(rates[n]))
            figures["dlrm"]["samples_per_s"][n] = rate
            share = rate / (base * n) if args.pinned else rate / base
            print("| %d | %.0f | %.2fx |" % (n, rate, share), flush=True)
            if len(bases) > 1:
                print(
                    "\n%d ranks, each round's efficiency: %s\n"
                    % (n, ", ".join("%.2f" % (r / (b * n)) for b, r in zip(bases, rates[n])))
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
