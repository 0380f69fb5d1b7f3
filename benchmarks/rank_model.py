"""A throughput model of the SDK API's tables over N ranks (rec_sdk.distribute.ranks), checked
against bench_ranks.py's figures on this machine and used to predict 8, 32 and 128 ranks.

Per step and rank it computes, from the workload's real keys (each rank's slice of the
global batch, deduplicated per table, sent to owner abs(key % N)):
  * the bytes each rank sends: the step headers' all-gather, the keys all-to-all (a header of T
    counts and the parts padded to the batch's size class: one class above the largest
    pair count of the steps, as the hint of rec_sdk.distribute.ranks holds it), the rows (dim + 1
    floats per key) and the gradients (dim floats) in the same class, and for DLRM the dense
    all-reduce (ring);
  * the collectives and the stages of the critical path (the needs gather, keys, rows,
    gradients; no barrier);
  * the keys each rank owns (the owner's find-or-insert, gather and optimizer work).
The step time on this machine, where every rank shares the same 2 cores, is
    t(N) = t(1) + stage * stages(N) + per_byte * N * bytes(N)
(the collective stages of a step's critical path, each a round of messages and CPU whatever
its size; every rank's bytes, whose packing, framing and copies add up on the shared cores),
fitted by least squares on the measured rank counts, each also predicted from a fit that
leaves it out. On a cluster of one rank per machine (each with this machine's 2 cores,
`--gbps` Gb/s, `--rtt-us` per round trip) a rank computes its share of the step and runs its
own exchange:
    t(N) = t(1) / N + stages * (stage + rtt) + per_byte * bytes(N) + bytes(N) / bandwidth
Hot keys: what a cache of the hottest rows on every rank, or a per-host dedup, would save
(hot_keys).

    .venv/bin/python benchmarks/rank_model.py --measured FIGURES.json [--gbps 25]

FIGURES.json: `bench_ranks.py --ranks 2,3,4 --json FIGURES.json`.

Pinned figures (`bench_ranks.py --pinned --stages --ranks 2 --json FIGURES.json`: one core
per rank, a whole batch per rank) calibrate the cluster form directly on a rank's own
measured split (pinned): its CPU beyond one process's is per byte it sends (the exchange's
packing, gRPC's framing and copies), its wall time beyond its CPU is per collective stage
(waiting for the other rank's part of each stage). That reproduces 2 ranks by construction
(this machine has no third core to check it on); DLRM at 2 ranks is then predicted with the
table's constants and compared with its measured pinned efficiency.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_table import BATCH, DIM, zipf_batches  # noqa: E402
from rec_sdk.ops.table_ops import size_class_of, size_class_rows  # noqa: E402

DLRM_TABLES, DLRM_DIM, DLRM_DENSE = 26, 16, 13
HEADER_BYTES = 64  # a rank's step header (tf_ops/core/step_header.h: 8 int64)


def table_batches(steps, batch):
    """The table workload's global batches (bench_table.zipf_batches, any size): [[keys]] per
    step, one table."""
    return [[keys] for keys in zipf_batches(steps, batch=batch)]


def dlrm_batches(steps, batch):
    """DLRM's global batches of the synthetic Criteo-schema data: [[keys of field f]]."""
    from rec_sdk.examples.synthetic import Generator

    rows = Generator(seed=0).rows(0, steps * batch)["categorical"]
    return [
        [rows[s * batch : (s + 1) * batch, f].astype(np.int64) for f in range(DLRM_TABLES)]
        for s in range(steps)
    ]


def exchange(batches, ranks, dim, dense_params=0):
    """Per step and rank (averaged over steps; the busiest rank): bytes sent, collectives,
    round trips, keys owned per rank, padding (bytes sent over the exact payload)."""
    tables = len(batches[0])
    per_key = 8 + 4 * (dim + 1) + 4 * dim  # key, row with its found flag, gradient
    sent, owned, padding, caps = [], [], [], []
    steps = []
    for step in batches:
        # counts[s, d]: distinct (table, key) pairs rank s sends owner d.
        counts = np.zeros((ranks, ranks), np.int64)
        pairs = []  # (table, key) of every rank's distinct keys, as t * 2**40 + key
        for t, keys in enumerate(step):
            per_rank = len(keys) // ranks
            for s in range(ranks):
                distinct = np.unique(keys[s * per_rank : (s + 1) * per_rank])
                counts[s] += np.bincount(np.abs(np.fmod(distinct, ranks)), minlength=ranks)
                pairs.append(distinct + (t << 40))
        pairs = np.unique(np.concatenate(pairs))
        caps.append(int(counts.max()))
        steps.append((counts, pairs))
    # The hint: one class above the largest need (tf_ops/core/size_class.h).
    cap = size_class_rows(size_class_of(max(caps, default=0)) + 1)
    key_width = 1  # the table workload has no admission counts or timestamps
    per_dest = (cap + tables) * key_width * 8 + cap * (dim + 1) * 4 + cap * dim * 4
    for counts, pairs in steps:
        exact = counts.sum(1) - np.diag(counts)  # keys each rank sends to others
        sent.append((ranks - 1) * per_dest + (ranks - 1) * HEADER_BYTES)
        owned.append(
            int(np.bincount(np.abs(np.fmod(pairs & ((1 << 40) - 1), ranks)), minlength=ranks).max())
        )
        padding.append((ranks - 1) * per_dest / max(1.0, float(exact.max()) * per_key))
    dense = 2 * (ranks - 1) / ranks * dense_params * 4 if ranks > 1 else 0.0
    collectives = 4 + (1 if dense_params else 0)
    return {
        "bytes": float(np.mean(sent)) + dense,
        "owned": float(np.mean(owned)),
        "padding": float(np.mean(padding)),
        "collectives": collectives if ranks > 1 else 0,
        "stages": 4 if ranks > 1 else 0,
    }


def hot_keys(batches, ranks, dim, per_host=8, cache_rows=(1024, 16384)):
    """What a per-rank cache of the hottest rows, or a per-host dedup, would save of the
    exchange's bytes over the wire (exact counts, no padding), per step, over the busiest
    rank or host:
      * cache: every rank holds the `cache_rows` hottest keys' rows (by the previous step's
        global counts), refreshed each step by their owners (each rank receives every cached
        row it does not own: cache_rows * (N-1)/N rows); a cached key's key and row are not
        sent, its gradient still is;
      * host dedup: ranks on one host (`per_host` of them) send each remote owner the host's
        distinct keys once (and get each row once; one summed gradient); traffic inside a host
        is not on the wire, for the exchange without dedup neither (its keys to the owners
        on the same host).
    -> {"base": bytes, "cache": {rows: bytes}, "host": bytes} per rank, averaged over steps."""
    key_row, grad = 8 + 4 * (dim + 1), 4 * dim
    hosts = max(1, ranks // per_host)
    base, host, cache = [], [], {c: [] for c in cache_rows}
    previous = None
    for step in batches:
        sent_pairs, host_pairs = 0, 0
        cached = {c: 0 for c in cache_rows}
        all_keys = []
        for t, keys in enumerate(step):
            per_rank = len(keys) // ranks
            tagged = keys[: per_rank * ranks] + (t << 40)
            all_keys.append(tagged)
            for s in range(ranks):
                distinct = np.unique(tagged[s * per_rank : (s + 1) * per_rank])
                owner = np.abs(np.fmod(distinct & ((1 << 40) - 1), ranks))
                remote = distinct[owner != s]
                # Over the wire: to owners on other hosts (one host: all but its own).
                sent_pairs += (
                    (owner // per_host != s // per_host).sum() if ranks > per_host else remote.size
                )
                if previous is not None:
                    for c in cache_rows:
                        cached[c] += np.isin(remote, previous[:c]).sum()
            for h in range(hosts):
                lo, hi = h * per_host, min(ranks, (h + 1) * per_host)
                distinct = np.unique(tagged[lo * per_rank : hi * per_rank])
                owner = np.abs(np.fmod(distinct & ((1 << 40) - 1), ranks))
                host_pairs += ((owner < lo) | (owner >= hi)).sum()
        base.append(sent_pairs * (key_row + grad) / ranks)
        host.append(host_pairs * (key_row + grad) / hosts / per_host if ranks > per_host else 0.0)
        if previous is not None:
            for c in cache_rows:
                refresh = c * (ranks - 1) / ranks * 4 * dim * ranks
                cache[c].append(
                    (sent_pairs * (key_row + grad) - cached[c] * key_row + refresh) / ranks
                )
        values, counts = np.unique(np.concatenate(all_keys), return_counts=True)
        previous = values[np.argsort(-counts, kind="stable")]
    return {
        "base": float(np.mean(base[1:])),
        "host": float(np.mean(host[1:])),
        "cache": {c: float(np.mean(v)) for c, v in cache.items()},
    }


def _terms(ex, ranks):
    """The time model's regressors on this machine: the collective stages in a step's
    critical path (each a round of messages and CPU whatever its size), and every rank's
    bytes (the ranks share the same cores, so their packing, framing and copies add up)."""
    return [ex["stages"], ranks * ex["bytes"]]


def fit(measured_ms, ex, ranks):
    """(ms per stage, ms per byte), both >= 0, by least squares on t(N) - t(1) over `ranks`
    (a coefficient the unconstrained fit makes negative is 0 and the other refitted)."""
    rows = np.array([_terms(ex[n], n) for n in ranks], float)
    rhs = np.array([measured_ms[n] - measured_ms[1] for n in ranks])
    k, *_ = np.linalg.lstsq(rows, rhs, rcond=None)
    if (k < 0).any():
        best = None
        for keep in (0, 1):
            column = rows[:, keep]
            value = max(0.0, float(column @ rhs / (column @ column)))
            trial = np.zeros(2)
            trial[keep] = value
            error = float(np.sum((rows @ trial - rhs) ** 2))
            if best is None or error < best[0]:
                best = (error, trial)
        k = best[1]
    return float(k[0]), float(k[1])


def machine_ms(t1, ex, k, ranks):
    return t1 + float(np.dot(k, _terms(ex, ranks)))


def _cluster_ms(t1, ex, k, ranks, gbps, rtt_us):
    """One rank per machine: its share of the compute, the stages (the fitted per-stage
    cost, plus a network round trip each), its own bytes' CPU (the fitted per-byte cost)
    and their wire time."""
    if ranks == 1:
        return t1
    wire = ex["bytes"] * 8 / (gbps * 1e9) * 1e3
    return t1 / ranks + ex["stages"] * (k[0] + rtt_us / 1e3) + k[1] * ex["bytes"] + wire


def pinned(measured, args, make_dlrm, dense):
    """The pinned calibration (see the module doc) and its predictions for 8-128 ranks, per-rank
    batch fixed, one rank per machine."""
    table = measured["table"]
    n = max(int(k) for k in table["ms"])
    t1, wall, cpu = table["ms"]["1"], table["ms"][str(n)], table["cpu_ms"][str(n)]
    ex = exchange(table_batches(args.steps, BATCH * n), n, DIM)
    per_byte = max(0.0, cpu - t1) / ex["bytes"]
    stage = max(0.0, wall - cpu) / ex["stages"]
    print(
        "Pinned: %d ranks, one core each, %d keys per rank: one process %.2f ms; a rank %.2f ms "
        "(CPU %.2f ms, %.0f KB sent): %.2f ns per byte sent, %.2f ms waiting per collective "
        "stage (%d stages)\n"
        % (n, BATCH, t1, wall, cpu, ex["bytes"] / 1e3, per_byte * 1e6, stage, ex["stages"])
    )
    rate = {int(k): v for k, v in measured["dlrm"]["samples_per_s"].items()}
    batch = measured["dlrm"].get("pinned_batch", 1024)
    workloads = [("table", lambda r: table_batches(args.steps, BATCH * r), DIM, 0, BATCH, t1)]
    if 1 in rate:
        workloads.append(
            ("dlrm", lambda r: make_dlrm(args.steps, batch * r), DLRM_DIM, dense, batch,
             batch / rate[1] * 1e3)
        )  # fmt: skip
    print("| workload | ranks | bytes/rank/step | step ms | wire ms | efficiency | measured |")
    print("|---|---|---|---|---|---|---|")
    for name, make, dim, dense_params, per_rank, one in workloads:
        for ranks in (n, 8, 32, 128):
            e = exchange(make(ranks), ranks, dim, dense_params)
            wire = e["bytes"] * 8 / (args.gbps * 1e9) * 1e3 if ranks > n else 0.0
            rtt = args.rtt_us / 1e3 if ranks > n else 0.0
            step = one + e["stages"] * (stage + rtt) + per_byte * e["bytes"] + wire
            got = "-"
            if ranks == n and name == "table":
                got = "%.2f" % (t1 / wall)
            elif ranks == n and ranks in rate:
                got = "%.2f" % (rate[ranks] / (rate[1] * ranks))
            print(
                "| %s (%d per rank) | %d | %.0f KB | %.2f | %.2f | %.2f | %s |"
                % (name, per_rank, ranks, e["bytes"] / 1e3, step, wire, one / step, got)
            )
    print()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--measured", required=True, help="bench_ranks.py --json output")
    parser.add_argument("--gbps", type=float, default=25.0)
    parser.add_argument("--rtt-us", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with open(args.measured) as f:
        measured = json.load(f)
    dense = (
        DLRM_DENSE * 64
        + 64
        + 64 * DLRM_DIM
        + DLRM_DIM
        + (27 * 26 // 2 + DLRM_DIM) * 256
        + 256
        + 256 * 128
        + 128
        + 128
        + 1
    )
    if measured.get("pinned"):
        pinned(measured, args, dlrm_batches, dense)
        return
    table_ms = {int(n): v for n, v in measured["table"]["ms"].items()}
    table_bytes = {int(n): v for n, v in measured["table"]["bytes"].items()}
    dlrm_rate = {int(n): v for n, v in measured["dlrm"]["samples_per_s"].items()}
    dlrm_batch = measured["dlrm"]["batch"]
    workloads = {
        "table": (lambda n, batch: table_batches(args.steps, batch), DIM, 0, BATCH, table_ms),
        "dlrm": (
            lambda n, batch: dlrm_batches(args.steps, batch),
            DLRM_DIM,
            dense,
            dlrm_batch,
            {n: dlrm_batch / r * 1e3 for n, r in dlrm_rate.items()},
        ),
    }
    print(
        "Model: benchmarks/rank_model.py --measured %s (--gbps %g, --rtt-us %g)\n"
        % (os.path.basename(args.measured), args.gbps, args.rtt_us)
    )
    for name, (make, dim, dense_params, batch, ms) in workloads.items():
        local = sorted(n for n in ms if n > 1)
        if len(local) < 3:
            print("%s: needs 1 and three rank counts measured; skipped\n" % name)
            continue
        ex = {n: exchange(make(n, batch), n, dim, dense_params) for n in [1] + local}
        k = fit(ms, ex, local)
        print(
            "%s (global batch %d, dim %d%s): %.2f ms per collective stage, %.2f ns per "
            "byte (all ranks' bytes: they share the cores), least squares over %s ranks; "
            '"left out": fitted on the other rank counts only\n'
            % (
                name,
                batch,
                dim,
                ", %d dense parameters" % dense_params if dense_params else "",
                k[0],
                k[1] * 1e6,
                ", ".join(map(str, local)),
            )
        )
        print(
            "| ranks | bytes/rank/step | padding | keys owned/rank | collectives | "
            "measured ms | model ms | error | left out: model ms, error |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for n in [1] + local:
            model = machine_ms(ms[1], ex[n], k, n) if n > 1 else ms[1]
            left = ""
            if n > 1:
                loo = machine_ms(ms[1], ex[n], fit(ms, ex, [m for m in local if m != n]), n)
                left = "%.2f, %+.0f%%" % (loo, 100.0 * (loo - ms[n]) / ms[n])
            measured_bytes = table_bytes.get(n) if name == "table" else None
            print(
                "| %d | %.0f KB%s | %.2fx | %.0f | %d | %.2f | %.2f | %+.0f%% | %s |"
                % (
                    n,
                    ex[n]["bytes"] / 1e3,
                    " (loopback %.0f KB)" % (measured_bytes / n / 1e3) if measured_bytes else "",
                    ex[n]["padding"],
                    ex[n]["owned"],
                    ex[n]["collectives"],
                    ms[n],
                    model,
                    100.0 * (model - ms[n]) / ms[n],
                    left,
                )
            )
        print(
            "\nPredicted, one rank per machine (2 cores each), %g Gb/s, global batch "
            "fixed (%d) and per-rank batch fixed (%d):\n" % (args.gbps, batch, batch // 4)
        )
        print(
            "| ranks | batch | bytes/rank/step | padding | step ms | wire ms | "
            "%s/s | vs 1 process |" % ("samples" if dense_params else "keys")
        )
        print("|---|---|---|---|---|---|---|---|")
        for n in (8, 32, 128):
            for global_batch in (batch, batch // 4 * n):
                if global_batch < n:
                    continue
                e = exchange(make(n, global_batch), n, dim, dense_params)
                t1 = ms[1] * global_batch / batch
                step = _cluster_ms(t1, e, k, n, args.gbps, args.rtt_us)
                print(
                    "| %d | %d | %.0f KB | %.2fx | %.2f | %.2f | %.0f | %.2fx |"
                    % (
                        n,
                        global_batch,
                        e["bytes"] / 1e3,
                        e["padding"],
                        step,
                        e["bytes"] * 8 / (args.gbps * 1e9) * 1e3,
                        global_batch / step * 1e3,
                        t1 / step,
                    )
                )
        print(
            "\nHot keys (per-rank batch %d%s): bytes per rank and step over the wire, "
            "exact; a cache of the hottest rows on every rank (refreshed each step) or a "
            "per-host dedup (8 ranks per host):\n"
            % (batch // 4, " samples" if dense_params else " keys")
        )
        print("| ranks | exchange | cache 1,024 rows | cache 16,384 rows | per-host dedup |")
        print("|---|---|---|---|---|")
        for n in (8, 32, 128):
            h = hot_keys(make(n, batch // 4 * n)[: max(2, args.steps)], n, dim)
            print(
                "| %d | %.0f KB | %+.0f%% | %+.0f%% | %s |"
                % (
                    n,
                    h["base"] / 1e3,
                    *[100.0 * (h["cache"][c] - h["base"]) / h["base"] for c in (1024, 16384)],
                    "%+.0f%%" % (100.0 * (h["host"] - h["base"]) / h["base"])
                    if n > 8
                    else "- (one host)",
                )
            )
        print()


if __name__ == "__main__":
    main()
