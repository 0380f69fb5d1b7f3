"""Tables larger than memory: a table with an SSD tier against the same table all in memory,
in one run.

Workload: dim 64, LazyAdam (two slots: 792-byte rows), 6.5M keys (5.1 GB of rows) filled in
before timing, the most popular keys last; each step looks up 16,384 ids drawn Zipf(s) over
the 6.5M keys (s = 1.05, 1.1, 1.2) as 4,096 samples of 4 ids, and trains either the lookup
alone (sum of squares: the worst case for the tier, a step of almost no compute) or a model
(the 4 embeddings concatenated into an MLP 256-512-256-1 with a logistic loss, dense Adam),
with lazy Adam on the table. The tiered
table keeps 512 MB of rows in memory (677,886 rows: a tenth of the keys) and the others in
O_DIRECT record files under --ssd-dir (so the page cache hides no I/O); it runs with the next
batch's ids prefetched in the same step (table.prefetch) and without. The same steps run on
an all-in-memory table (capacity 6.5M) in the same process afterwards.

Reported per s: steps/s and the ratio to all in memory, promotions per step (and how many the
prefetch served), MB read and written on the SSD tier per step, space amplification (bytes
in the record files per byte of cold rows), the tiered run's resident memory above the process
before the table (VmRSS) against the memory budget plus the index, and the disk's ceiling of
4 KiB random O_DIRECT reads (1 and 16 in flight) measured in the same run.

    .venv/bin/python benchmarks/bench_tiered.py [--zipf 1.05,1.1,1.2] [--steps 200]
        [--ssd-dir DIR] [--quick]
"""

import argparse
import ctypes
import json
import mmap
import os
import platform
import random
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import rec_sdk  # noqa: F401
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.util.initialize import init, terminate_config_initializer

DIM = 64
ROW_BYTES = 24 + 4 * DIM * 3  # header, embedding, two Adam slots
BATCH = 16384
FILL_CHUNK = 100_000


def trim_heap():
    """Gives freed heap memory back to the system, so that VmRSS shows what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def disk_ceiling(directory, seconds=2.0):
    """4 KiB random O_DIRECT reads of a 1 GiB file: reads/s with 1 and with 16 in flight."""
    path = os.path.join(directory, "rec_sdk_disk_probe.bin")
    size = 1 << 30
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        result = {}
        for threads in (1, 16):
            counts = [0] * threads
            stop = time.perf_counter() + seconds

            def work(t, stop=stop, counts=counts):
                buf = mmap.mmap(-1, 4096)
                rng = random.Random(t)
                while time.perf_counter() < stop:
                    os.preadv(fd, [buf], rng.randrange(size // 4096) * 4096)
                    counts[t] += 1

            workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            result["reads_per_s_qd%d" % threads] = round(sum(counts) / seconds)
        return result
    finally:
        os.close(fd)
        os.remove(path)


def zipf_ids(s, keys, count, seed):
    """`count` batches of BATCH ids: Zipf(s) ranks <= keys, scattered by a fixed permutation
    (rank r is key perm(r))."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ranks = np.empty(0, np.int64)
        while ranks.size < BATCH:
            draw = rng.zipf(s, BATCH * 2)
            ranks = np.concatenate([ranks, draw[draw <= keys]])
        out.append(key_of(ranks[:BATCH] - 1, keys))
    return out


def key_of(rank, keys):
    return (rank.astype(np.int64) * 2654435761) % keys


def build(keys, memory_rows, ssd_dir, model):
    """(table, ids, next_ids, train op, prefetch op) for a tiered table (ssd_dir) or one
    all in memory; model: "lookup" or "mlp"."""
    terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    init(use_dynamic_expansion=False)
    initializer = tf.compat.v1.random_normal_initializer(stddev=0.05, seed=1)
    if ssd_dir is None:
        table = create_table(tf.int64, DIM, "emb", initializer, device_vocabulary_size=keys)
    else:
        table = create_table(
            tf.int64,
            DIM,
            "emb",
            initializer,
            device_vocabulary_size=memory_rows - 1,
            host_vocabulary_size=1,
            ssd_vocabulary_size=keys,
            ssd_data_path=ssd_dir,
            ssd_direct_io=True,
        )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    next_ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, name="lookup")
    sparse = lazy_adam.create_hash_optimizer(learning_rate=0.01)
    if model == "lookup":
        train = sparse.minimize(tf.reduce_sum(tf.square(emb)))
    else:
        x = tf.reshape(emb, [-1, 4 * DIM])
        dense_init = tf.compat.v1.glorot_uniform_initializer(seed=2)
        for width in (512, 256):
            x = tf.compat.v1.layers.dense(x, width, tf.nn.relu, kernel_initializer=dense_init)
        logits = tf.squeeze(tf.compat.v1.layers.dense(x, 1, kernel_initializer=dense_init), 1)
        labels = tf.cast(tf.math.floormod(tf.reshape(ids, [-1, 4])[:, 0], 2), tf.float32)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        dense_vars = tf.compat.v1.trainable_variables()
        train = tf.group(
            sparse.minimize(loss),
            tf.compat.v1.train.AdamOptimizer(0.001).minimize(loss, var_list=dense_vars),
        )
    return table, ids, next_ids, train, table.prefetch(next_ids)


def fill(sess, table, keys):
    """Every key, least popular first (the most popular end up in memory)."""
    rows = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    chunk_keys = tf.compat.v1.placeholder(tf.int64, [None])
    upsert = table.upsert(chunk_keys, rows)
    rng = np.random.default_rng(7)
    for last in range(keys, 0, -FILL_CHUNK):
        ranks = np.arange(max(0, last - FILL_CHUNK), last)
        values = rng.normal(0, 0.05, (ranks.size, DIM)).astype(np.float32)
        sess.run(upsert, {chunk_keys: key_of(ranks, keys), rows: values})


def run(sess, table, ids, next_ids, train, prefetch, batches, warmup, use_prefetch):
    fetch = [train, prefetch] if use_prefetch else train
    stats = table.stats()
    upcoming = [np.unique(b) for b in batches]
    for k in range(warmup):
        sess.run(fetch, {ids: batches[k], next_ids: upcoming[k + 1]})
    before = sess.run(stats)
    start = time.perf_counter()
    for k in range(warmup, len(batches) - 1):
        sess.run(fetch, {ids: batches[k], next_ids: upcoming[k + 1]})
    elapsed = time.perf_counter() - start
    after = sess.run(stats)
    steps = len(batches) - 1 - warmup
    delta = {k: after[k] - before[k] for k in after}
    return steps / elapsed, steps, delta, after


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zipf", default="1.05,1.1,1.2")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--keys", type=int, default=6_500_000)
    parser.add_argument("--budget-mb", type=int, default=512)
    parser.add_argument("--ssd-dir", default=None)
    parser.add_argument("--models", default="lookup,mlp")
    parser.add_argument(
        "--quick", action="store_true", help="650k keys and a 51 MB budget (a minute)"
    )
    args = parser.parse_args()
    if args.quick:
        args.keys, args.budget_mb, args.steps, args.warmup = 650_000, 51, 60, 30
    tf.compat.v1.disable_eager_execution()
    memory_rows = args.budget_mb * (1 << 20) // ROW_BYTES
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
    )
    ssd_root = args.ssd_dir or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build"
    )
    os.makedirs(ssd_root, exist_ok=True)
    results = {
        "machine": "%s, %d cores, Python %s, TF %s"
        % (
            platform.processor() or platform.machine(),
            os.cpu_count(),
            platform.python_version(),
            tf.__version__,
        ),
        "keys": args.keys,
        "dim": DIM,
        "memory_rows": memory_rows,
        "budget_mb": args.budget_mb,
        "batch_ids": BATCH,
    }
    with tempfile.TemporaryDirectory(dir=ssd_root, prefix="bench_tiered_") as ssd_dir:
        results["disk"] = disk_ceiling(ssd_dir)
        print("disk:", results["disk"], flush=True)
        index_mb = None
        for model, s in [
            (m, float(x)) for m in args.models.split(",") for x in args.zipf.split(",")
        ]:
            batches = zipf_ids(s, args.keys, args.warmup + args.steps + 1, seed=int(s * 100))
            row = {
                "model": model,
                "zipf": s,
                "unique_ids_per_step": int(np.mean([np.unique(b).size for b in batches])),
            }
            trim_heap()
            base_rss = rss_mb()
            table, ids, next_ids, train, prefetch = build(args.keys, memory_rows, ssd_dir, model)
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train, {ids: batches[0][:8]})  # the optimizer's slots, before filling
                start = time.perf_counter()
                fill(sess, table, args.keys)
                row["fill_s_tiered"] = round(time.perf_counter() - start, 1)
                for use_prefetch in (True, False):
                    # Each run its own batches: replayed ones would find their rows in memory.
                    own = (
                        batches
                        if use_prefetch
                        else zipf_ids(
                            s, args.keys, args.warmup + args.steps + 1, seed=int(s * 100) + 1
                        )
                    )
                    rate, steps, delta, stats = run(
                        sess, table, ids, next_ids, train, prefetch, own, args.warmup, use_prefetch
                    )
                    name = "prefetch" if use_prefetch else "no_prefetch"
                    row["steps_per_s_" + name] = round(rate, 2)
                    row["promotions_per_step_" + name] = round(delta["promotions"] / steps)
                    row["prefetch_served_per_step_" + name] = round(delta["prefetch_hits"] / steps)
                    row["mb_read_per_step_" + name] = round(
                        delta["ssd_bytes_read"] / steps / 2**20, 2
                    )
                    row["mb_written_per_step_" + name] = round(
                        delta["ssd_bytes_written"] / steps / 2**20, 2
                    )
                row["space_amplification"] = round(
                    stats["ssd_file_bytes"] / max(1, stats["cold"] * ROW_BYTES), 2
                )
                row["hot_rows"] = int(stats["hot"])
                trim_heap()
                row["rss_mb_tiered"] = round(rss_mb() - base_rss)
                # The index: 16-byte entries at most half full (32-64 B per key), plus 9 B of
                # bookkeeping per cold record and 8 B per memory row.
                index_mb = round((args.keys * 48 + stats["cold"] * 9 + memory_rows * 8) / 2**20)
                row["budget_plus_index_mb"] = args.budget_mb + index_mb
            trim_heap()
            base_rss = rss_mb()
            table, ids, next_ids, train, prefetch = build(args.keys, memory_rows, None, model)
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train, {ids: batches[0][:8]})
                fill(sess, table, args.keys)
                rate, _, _, _ = run(
                    sess, table, ids, next_ids, train, prefetch, batches, args.warmup, False
                )
                row["steps_per_s_memory"] = round(rate, 2)
                trim_heap()
                row["rss_mb_memory"] = round(rss_mb() - base_rss)
            row["ratio_prefetch"] = round(row["steps_per_s_prefetch"] / rate, 2)
            row["ratio_no_prefetch"] = round(row["steps_per_s_no_prefetch"] / rate, 2)
            results.setdefault("runs", []).append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
