"""End-to-end model benchmark: DLRM with rec_sdk tables vs dense tf.Variable tables vs TFRA.

Workloads:
  criteo     synthetic Criteo-schema data (rec_sdk.examples.synthetic: 13 dense + 26
             categorical fields, Zipf ids, Criteo's cardinalities x --scale), one table per
             field (26 tables), dim 16, batch 4,096;
  movielens  MovieLens-100k (user and item tables), dim 16, batch 1,024.
Libraries (the same DLRM, the same data, the same number of steps):
  rec_sdk        rec_sdk tables, LazyAdam on the rows of each batch;
  rec_sdk_de     rec_sdk.dynamic_embedding variables (TFRA's API on rec_sdk tables) with
                 DynamicEmbeddingOptimizer(Adam): the TFRA script, ported by an import;
  dense_adam     tf.Variable tables with the hashing trick (ids % rows, rows = the field's
                 cardinality, so no collisions), TF's AdamOptimizer;
  dense_adagrad  the same tables with TF's AdagradOptimizer (its sparse update touches only
                 the batch's rows, unlike TF1 Adam, which decays every row's slots each step);
  tfra           TFRA 0.7.2 dynamic_embedding variables with DynamicEmbeddingOptimizer(Adam)
                 (skipped when it is not installed; `make bench` installs it).
Dense layers train with TF's Adam in every case. Each library runs in its own process, and the
libraries alternate in --rounds rounds; medians are reported. Per run: samples/s over the
timed steps (after warm-up), the keys the tables hold, and the eval AUC after training.

Memory: per library, in its own process, a dim-16 table trained with Adam on batches of 65,536
keys never seen before up to --memory-keys keys: RSS growth divided by the keys added
(the dense table: its whole allocation divided by its rows), next to the payload of a key
(8 B key + 16 floats of embedding + 2 x 16 floats of Adam slots = 200 B).

Scaling (--scaling): rec_sdk train steps of the table benchmark's workload (65,536 Zipf keys,
dim 16, LazyAdam) on a table pre-filled with 1M to 20M keys: step time and bytes per key.

Precision (--precision): the scaling measurement per row dtype (float32, bfloat16, float16
rows with float32 slots, each with the default index layout, which is compact for half
rows; bfloat16 rows with a full index; bfloat16 rows with bfloat16 slots) at dim 64 with row-wise
Adagrad (its one float per row stays float32) and at dim 16 with LazyAdam, on a table of
--precision-keys keys, the dtypes alternating in --rounds rounds: bytes per key and train
step time, each as a ratio to float32 of the same round.

    .venv/bin/python benchmarks/bench_models.py [--steps 300] [--rounds 3] [--scaling]
                                                [--plot benchmarks/scaling.png] [--profile 5]
                                                [--precision]

--profile N traces N more steps per run (RunMetadata) and prints op time by op type.
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

import model_reports  # benchmarks/, the folder of this script
from rec_sdk.examples import embeddings as examples_embeddings
from rec_sdk.examples.demo import evaluate
from rec_sdk.examples.embeddings import Embeddings

LIBRARIES = ("rec_sdk", "rec_sdk_de", "dense_adam", "dense_adagrad", "tfra")
PAYLOAD_BYTES = 8 + 16 * 4 * 3  # key + dim-16 embedding + 2 Adam slots


def rss_bytes(trim=False):
    """The process's resident memory; with trim, after giving freed heap memory back (so
    that batches' temporaries do not count)."""
    if trim:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# --- embeddings per library (same interface as rec_sdk.examples.embeddings.RecSdkEmbeddings) ---


class DenseEmbeddings(Embeddings):
    """tf.Variable tables [rows, dim] read with ids % rows; TF's own optimizer."""

    def __init__(self, source, dim, learning_rate, optimizer):
        self.source = source
        self.learning_rate = learning_rate
        self.optimizer = optimizer
        self.rows = {}
        self.variables = {}
        for name in source.tables:
            rows = int(source.vocabulary[name])
            self.rows[name] = rows
            self.variables[name] = tf.compat.v1.get_variable(
                "dense_" + name,
                [rows, dim],
                initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=1),
            )

    def lookup(self, field, ids, is_train, name):
        del is_train
        return tf.nn.embedding_lookup(
            self.variables[field.table], tf.math.floormod(ids, self.rows[field.table]), name=name
        )

    def gradient_targets(self):
        return list(self.variables.values())

    def apply_gradients(self, grads, targets):
        cls = (
            tf.compat.v1.train.AdamOptimizer
            if self.optimizer == "adam"
            else tf.compat.v1.train.AdagradOptimizer
        )
        return cls(self.learning_rate).apply_gradients(zip(grads, targets))

    def keys(self, sess):
        return sum(self.rows.values())


def worker(args):
    """One library on one workload, in this process; prints a JSON line."""
    from rec_sdk.examples import train
    from rec_sdk.util.initialize import init
    from rec_sdk.util.variable import get_dense_and_sparse_variable

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(0)
    if args.workload == "criteo":
        source = train.make_source("synthetic", rows=args.rows, scale=args.scale)
        batch_size = 4096
    else:
        source = train.make_source("movielens")
        batch_size = 1024
    init()
    train_batch = tf.compat.v1.data.make_one_shot_iterator(
        source.train_dataset(batch_size, 0).prefetch(4)
    ).get_next()
    eval_it = tf.compat.v1.data.make_initializable_iterator(source.eval_dataset(8192))
    if args.library == "rec_sdk":
        emb = examples_embeddings.RecSdkEmbeddings(source, 16, args.learning_rate, False)
    elif args.library.startswith("dense"):
        emb = DenseEmbeddings(source, 16, args.learning_rate, args.library.split("_")[1])
    elif args.library == "rec_sdk_de":
        emb = examples_embeddings.DynamicEmbeddings(source, 16, args.learning_rate, False)
    else:
        import tensorflow_recommenders_addons.dynamic_embedding as tfra

        emb = examples_embeddings.DynamicEmbeddings(source, 16, args.learning_rate, False, de=tfra)
    top = [int(u) for u in args.dlrm_top.split(",") if u]
    _, _, loss = train.build("dlrm", source, emb, train_batch, True, 16, top)
    probs, labels, _ = train.build("dlrm", source, emb, eval_it.get_next(), False, 16, top)
    dense = [v for v in get_dense_and_sparse_variable()[0] if v.name.startswith("dlrm/")]
    train_op = emb.train_op(loss, dense, tf.compat.v1.train.AdamOptimizer(args.learning_rate))
    keys_op = None
    if args.library == "rec_sdk":
        keys_op = tf.add_n([t.size_tensor() for t in emb.tables.values()])
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(args.warmup):
            sess.run(train_op)
        start = time.perf_counter()
        for _ in range(args.steps):
            sess.run(train_op)
        elapsed = time.perf_counter() - start
        keys = int(sess.run(keys_op)) if keys_op is not None else emb.keys(sess)
        test_auc, _ = evaluate(sess, eval_it.initializer, probs, labels)
        profile = op_profile(sess, train_op, args.profile) if args.profile else None
    print(
        json.dumps(
            {
                "library": args.library,
                "workload": args.workload,
                "samples_per_s": args.steps * batch_size / elapsed,
                "keys": keys,
                "auc": test_auc,
                "steps": args.steps + args.warmup,
                "profile": profile,
            }
        )
    )


def op_profile(sess, fetch, steps):
    """Traced runs of `fetch`: wall ms per step and op time (ms per step, summed over
    threads) by op type, largest first."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    by_type, wall = {}, []
    for _ in range(steps):
        meta = tf.compat.v1.RunMetadata()
        start = time.perf_counter()
        sess.run(fetch, options=options, run_metadata=meta)
        wall.append(time.perf_counter() - start)
        for device in meta.step_stats.dev_stats:
            for node in device.node_stats:
                # timeline_label: "name = OpType(inputs)"
                op = node.timeline_label.split(" = ")[-1].split("(")[0] or node.node_name
                micros = node.op_end_rel_micros - node.op_start_rel_micros
                by_type[op] = by_type.get(op, 0) + micros
    ops = sorted(by_type.items(), key=lambda kv: -kv[1])
    tables = sum(us for op, us in by_type.items() if op.startswith("RecSdk"))
    return {
        "wall_ms": statistics.median(wall) * 1e3,
        "op_ms": sum(by_type.values()) / 1e3 / steps,
        "table_op_ms": tables / 1e3 / steps,  # rec_sdk's own kernels (lookups, updates)
        "ops": [[op, round(us / 1e3 / steps, 2)] for op, us in ops[:25]],
    }


def memory_worker(args):
    """Bytes of RSS per stored key of one library: a dim-16 table trained with Adam on
    batches of 65,536 keys never seen before (so every key gets a row and both slots), from
    the first batch to args.keys keys; growth / keys added."""
    import rec_sdk
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
    from rec_sdk.util.initialize import init

    tf.compat.v1.disable_eager_execution()
    batch = 65536
    keys = tf.compat.v1.placeholder(tf.int64, [batch])
    if args.library == "rec_sdk":
        init(use_dynamic_expansion=True)
        table = create_table(
            tf.int64,
            16,
            "memory",
            tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
            device_vocabulary_size=batch,
        )
        emb = sparse_lookup(table, keys, is_train=True)
        embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addrs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        step = create_hash_optimizer_by_address(1e-3).apply_gradients(
            zip(tf.gradients(tf.reduce_sum(tf.square(emb)), embs), addrs)
        )
        size = table.size_tensor()
    elif args.library == "tfra":
        import tensorflow_recommenders_addons.dynamic_embedding as de

        var = de.get_variable(
            "memory",
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            dim=16,
            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05),
        )
        emb = de.embedding_lookup(var, keys)
        step = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3)).minimize(
            tf.reduce_sum(tf.square(emb))
        )
        size = var.size()
    else:
        var = tf.compat.v1.get_variable(
            "memory", [args.keys, 16], initializer=tf.compat.v1.zeros_initializer()
        )
        emb = tf.nn.embedding_lookup(var, tf.math.floormod(keys, args.keys))
        step = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(tf.reduce_sum(tf.square(emb)))
        size = tf.constant(args.keys, tf.int64)
    with tf.compat.v1.Session() as sess:
        before = rss_bytes()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(step, {keys: np.arange(batch, dtype=np.int64)})
        if args.library.startswith("dense"):
            first = 0  # the whole table is allocated at initialisation
        else:
            before, first = rss_bytes(), int(sess.run(size))
        for start in range(batch, args.keys, batch):
            sess.run(step, {keys: np.arange(start, start + batch, dtype=np.int64)})
        grown = rss_bytes() - before
        stored = int(sess.run(size))
    print(
        json.dumps(
            {
                "library": args.library,
                "keys": stored,
                "bytes_per_key": grown / max(stored - first, 1),
            }
        )
    )


def scaling_worker(args):
    """rec_sdk train step time and bytes per key on a table pre-filled with args.keys keys."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rec_sdk
    from bench_table import BATCH, DIM, lazy_adam_train_op, zipf_batches
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import adagrad_rowwise
    from rec_sdk.util.initialize import init

    tf.compat.v1.disable_eager_execution()
    init(use_dynamic_expansion=True)
    before = rss_bytes(trim=True)
    dim = args.dim or DIM
    table = create_table(
        tf.int64,
        dim,
        "scaling",
        tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
        device_vocabulary_size=1 << 20,
        emb_dtype=args.emb_dtype,
        slot_dtype=args.slot_dtype,
        index_layout=args.index_layout,
    )
    fill = tf.compat.v1.placeholder(tf.int64, [None])
    fill_op = tf.group(sparse_lookup(table, fill, is_train=True, name="fill"))
    keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
    emb = sparse_lookup(table, keys, is_train=True)
    if args.optimizer == "rowwise_adagrad":
        loss = tf.reduce_sum(tf.square(emb))
        grads = tf.gradients(
            loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        )
        step = adagrad_rowwise.create_hash_optimizer_by_address(0.01).apply_gradients(
            zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
        )
    else:
        step = lazy_adam_train_op(emb)
    batches = zipf_batches(args.steps + 5)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        chunk = 1 << 16  # small fills: their temporaries stay small next to the table
        for start in range(0, args.keys, chunk):
            # Keys beyond the Zipf batches' 10M space, so that the fill does not pre-insert them.
            sess.run(
                fill_op,
                {fill: np.arange(start, min(start + chunk, args.keys), dtype=np.int64) + (1 << 40)},
            )
        sess.run(step, {keys: batches[0]})  # slots attached
        grown = rss_bytes(trim=True) - before
        size = int(sess.run(table.size_tensor()))
        times = []
        for b in batches[1:]:
            t0 = time.perf_counter()
            sess.run(step, {keys: b})
            times.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "keys": size,
                "ms_per_step": statistics.median(times[4:]) * 1e3,
                "bytes_per_key": grown / size,
            }
        )
    )


def _spawn(extra):
    cmd = [sys.executable, os.path.abspath(__file__)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", nargs=2, metavar=("LIBRARY", "WORKLOAD"))
    parser.add_argument("--scaling-worker", type=int, default=None)
    parser.add_argument("--memory-worker", nargs=2, metavar=("LIBRARY", "KEYS"))
    parser.add_argument("--memory-keys", type=int, default=2_000_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--workloads", default="criteo,movielens")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--scaling-keys", default="1,2,5,10,20", help="millions of keys")
    parser.add_argument("--precision", action="store_true")
    parser.add_argument("--precision-keys", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=0, help="(scaling worker) dim")
    parser.add_argument("--optimizer", default="lazy_adam", help="(scaling worker)")
    parser.add_argument("--emb-dtype", default="float32", help="(scaling worker)")
    parser.add_argument("--slot-dtype", default="float32", help="(scaling worker)")
    parser.add_argument("--index-layout", default="auto", help="(scaling worker)")
    parser.add_argument("--plot", default=None, help="PNG of the scaling figures")
    parser.add_argument(
        "--dlrm-top", default="256,128", help="widths of DLRM's top MLP layers before the logit"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="with --worker: also trace STEPS steps and print op time by type",
    )
    args = parser.parse_args()
    if args.worker:
        args.library, args.workload = args.worker
        return worker(args)
    if args.memory_worker:
        args.library, args.keys = args.memory_worker[0], int(args.memory_worker[1])
        return memory_worker(args)
    if args.scaling_worker is not None:
        args.keys = args.scaling_worker
        return scaling_worker(args)

    print(
        "machine: %s, %d cores, Python %s, TensorFlow %s"
        % (
            platform.processor() or platform.machine(),
            os.cpu_count(),
            platform.python_version(),
            tf.__version__,
        )
    )
    common = [
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--rows",
        str(args.rows),
        "--scale",
        str(args.scale),
        "--learning-rate",
        str(args.learning_rate),
        "--dlrm-top",
        args.dlrm_top,
    ] + (["--profile", str(args.profile)] if args.profile else [])
    for workload in [w for w in args.workloads.split(",") if w]:
        runs = {lib: [] for lib in args.libraries.split(",")}
        for _ in range(args.rounds):
            for lib in runs:
                runs[lib].append(_spawn(["--worker", lib, workload] + common))
        print(
            "\n%s: DLRM (top MLP %s-1), %d timed steps after %d, median of %d rounds (one "
            "process per run)"
            % (workload, args.dlrm_top.replace(",", "-"), args.steps, args.warmup, args.rounds)
        )
        print("| library | samples/s | vs rec_sdk | keys stored | eval AUC |")
        print("|---|---|---|---|---|")
        ok = {lib: [r for r in rs if "error" not in r] for lib, rs in runs.items()}
        base = (
            statistics.median(r["samples_per_s"] for r in ok["rec_sdk"])
            if ok.get("rec_sdk")
            else None
        )
        for lib, rs in ok.items():
            if not rs:
                print("| %s | %s |  |  |  |" % (lib, runs[lib][0].get("error", "failed")))
                continue
            rate = statistics.median(r["samples_per_s"] for r in rs)
            print(
                "| %s | %.0f | %s | %d | %.4f |"
                % (
                    lib,
                    rate,
                    "%.2fx" % (rate / base) if base else "-",
                    statistics.median(r["keys"] for r in rs),
                    statistics.median(r["auc"] for r in rs),
                )
            )
        for lib, rs in ok.items():
            if rs and rs[0].get("profile"):
                p = rs[0]["profile"]
                print(
                    "  %s traced step: %.1f ms wall, %.1f ms op time (rec_sdk kernels %.1f ms, "
                    "%.0f%%): %s"
                    % (
                        lib,
                        p["wall_ms"],
                        p["op_ms"],
                        p.get("table_op_ms", 0.0),
                        100.0 * p.get("table_op_ms", 0.0) / max(p["op_ms"], 1e-9),
                        ", ".join("%s %.1f" % (op, ms) for op, ms in p["ops"][:8]),
                    )
                )
    memory = [
        _spawn(["--memory-worker", lib, str(args.memory_keys)])
        for lib in ("rec_sdk", "dense_adam", "tfra")
        if lib in args.libraries.split(",") and args.memory_keys > 0
    ]
    if memory:
        print(
            "\nmemory: RSS growth per stored key, dim 16 + Adam slots, %d keys trained in "
            "batches of 65,536 new keys (payload: key + embedding + 2 slots = %d B)"
            % (args.memory_keys, PAYLOAD_BYTES)
        )
        print("| library | keys | bytes/key | x payload |")
        print("|---|---|---|---|")
        for r in memory:
            if "error" in r:
                print("| - | %s | | |" % r["error"])
                continue
            print(
                "| %s | %d | %.0f | %.2fx |"
                % (r["library"], r["keys"], r["bytes_per_key"], r["bytes_per_key"] / PAYLOAD_BYTES)
            )
    if args.precision:
        model_reports.precision(args, _spawn)
    if args.scaling:
        sizes = [int(float(m) * 1_000_000) for m in args.scaling_keys.split(",")]
        results = [_spawn(["--scaling-worker", str(n), "--steps", "30"]) for n in sizes]
        print(
            "\nscaling: rec_sdk train step (65,536 Zipf keys, dim 16, LazyAdam by address) on "
            "a table pre-filled with N keys"
        )
        print("| keys | ms/step | bytes/key (RSS growth) | x payload |")
        print("|---|---|---|---|")
        for r in results:
            if "error" in r:
                print("| - | %s | | |" % r["error"])
                continue
            print(
                "| %d | %.2f | %.0f | %.2fx |"
                % (
                    r["keys"],
                    r["ms_per_step"],
                    r["bytes_per_key"],
                    r["bytes_per_key"] / PAYLOAD_BYTES,
                )
            )
        if args.plot:
            model_reports.plot(results, args.plot, PAYLOAD_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
