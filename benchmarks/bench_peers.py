"""Peer benchmark: rec_sdk beside TorchRec/FBGEMM's CPU fused table-batched embedding (TBE),
TFRA and a dense tf.Variable table, on the same saved key batches, in one run.

Workload (bench_table.py's generator, seed 0): --batches (8) batches of 65,536 int64 keys
drawn Zipf(1.1) from a 10M-key space (about 20k unique keys per batch), dim 16, saved to
benchmarks/out/peer_keys.npz (`batches` int64 [num_batches, 65536], `vocab` 10,000,000).
Every library runs on exactly these batches with 2 threads (torch.set_num_threads(2); TF
intra- and inter-op pools of 2), is warmed up by one pass over all batches (so the tables
hold the keys, as in steady state), then times --steps (50) steps cycling the batches and
reports the median ms/step. Train steps back-propagate a gradient of ones (the gradient of
sum(emb)) into the table, learning rate 0.05, nothing else in the model. TorchRec and rec_sdk
are measured in --rounds (3) alternating rounds; the table shows the median over rounds and
the ratio is the median of the rounds' own ratios (with their range), as this machine's speed
drifts by up to 2x over minutes.

  TorchRec  benchmarks/torchrec_worker.py, run in the peer venv .venv-peers (made by
            `bash benchmarks/setup_peers.sh`) as a subprocess: fbgemm_gpu's
            SplitTableBatchedEmbeddingBagsCodegen, one FP32 table of 10M rows on the host;
            lookup = forward; train_* = forward + backward with the optimizer fused into the
            backward (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD; ADAM is refused on
            the CPU and listed as unsupported).
  rec_sdk   in this process (tf.compat.v1 graph mode, Session): a fixed-capacity table
            (create_table, init(use_dynamic_expansion=False)); lookup = the training lookup
            sparse_lookup(is_train=True) alone (dedup + find_or_insert + gather); train_* = that
            lookup + tf.gradients of sum(emb) with respect to the table + the fused sparse
            optimizer's apply_gradients (rec_sdk.optimizers.<m>.create_hash_optimizer:
            gradient_descent, adagrad, adagrad_rowwise when it exists, lazy_adam).
  TFRA      when tensorflow_recommenders_addons imports: de.embedding_lookup of a
            de.get_variable; train_* = DynamicEmbeddingOptimizer around
            tf.compat.v1.train's GradientDescent, Adagrad and Adam.
  dense     tf.Variable[1M, 16] + tf.nn.embedding_lookup of keys % 1M; lookup and a
            GradientDescent step (a sparse scatter update).

What differs semantically (the figures compare the same job, not the same algorithm):
  * rec_sdk and TFRA are hash tables: keys are hashed into the table and new keys get rows
    inserted (after the warm-up pass no key is new: the timed steps replay stored keys, so
    they measure steady-state finds, not inserts). FBGEMM's table is fixed-size and indexed
    directly by the key (a dense 10M-row array: no hashing, no insert, memory for every
    possible key). The dense TF baseline is the same with keys folded into 1M rows.
  * rec_sdk deduplicates a batch's keys before the table (the optimizer sees each row once
    with its summed gradient); FBGEMM's exact optimizers sum duplicates inside the backward.
  * Adagrad: FBGEMM's accumulator starts at 0 and eps (1e-8) is added outside the sqrt;
    rec_sdk's and TF's Adagrad take no eps and refuse an initial accumulator of 0, so they get
    the smallest value they accept (the output says which). With a gradient of ones every
    stored row's accumulator is >= 1, so the updates agree to float32 precision.
  * TFRA's lookup inserts nothing (missing keys read initial values; the optimizer's update
    inserts), so its lookup table stays empty.
  * Adam: FBGEMM's CPU TBE has none; rec_sdk's row is lazy Adam (m, v updated on the batch's
    rows only), TFRA's is tf.compat.v1 Adam through DynamicEmbeddingOptimizer; for reference.
  * Each TF step is a Session.run (tens of microseconds of dispatch); each torch step is a
    Python call into the TBE module.

    .venv/bin/python benchmarks/bench_peers.py [--steps 50] [--batches 8] [--quick]
        [--no-torchrec] [--no-tfra]
"""

import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_table import BATCH, DENSE_ROWS, DIM, KEY_SPACE, computed, time_steps, zipf_batches  # noqa: E402

# Row-wise Adagrad is being added to rec_sdk; measured only when the module exists.
try:
    from rec_sdk.optimizers import adagrad_rowwise

    ROWWISE_MISSING = None
except Exception as e:  # noqa: BLE001 (missing, or half-written while it is being developed)
    adagrad_rowwise = None
    ROWWISE_MISSING = "rec_sdk.optimizers.adagrad_rowwise does not import (%s: %s)" % (
        type(e).__name__,
        e,
    )

OUT_DIR = os.path.join(HERE, "out")
KEYS_FILE = os.path.join(OUT_DIR, "peer_keys.npz")
JSON_FILE = os.path.join(OUT_DIR, "bench_peers.json")
TORCHREC_FILE = os.path.join(OUT_DIR, "bench_peers_torchrec.json")
PEERS_PYTHON = os.path.join(HERE, "..", ".venv-peers", "bin", "python")
WORKER = os.path.join(HERE, "torchrec_worker.py")

THREADS = 2
LR = 0.05
EPS = 1e-8  # FBGEMM's Adagrad eps (torchrec_worker.py); passed to rec_sdk only where accepted
TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32 > 0
OPS = ("lookup", "train_sgd", "train_adagrad", "train_rowwise_adagrad", "train_adam")
# rec_sdk's training lookup again with its keys from a tf.data pipeline (as training reads
# them) instead of a feed; compared with TorchRec's lookup (keys from tensors in memory).
DATASET_LOOKUP = "lookup_dataset"
LIBRARIES = ("rec_sdk", "torchrec", "tfra", "dense")


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "os": platform.platform()}


def save_keys(num_batches):
    """The batches (bench_table.zipf_batches, seed 0) in KEYS_FILE; returns them [n, BATCH]."""
    keys = np.stack(zipf_batches(num_batches))
    os.makedirs(OUT_DIR, exist_ok=True)
    np.savez(KEYS_FILE, batches=keys, vocab=np.int64(KEY_SPACE))
    return keys


def run_torchrec(steps, warmup):
    """The worker's result dict, or {"error": why} when the peer venv is missing or fails."""
    python = os.path.normpath(PEERS_PYTHON)
    if not os.path.exists(python):
        return {
            "error": "peer venv missing (%s); create it with `bash benchmarks/setup_peers.sh`"
            % python
        }
    command = [
        python,
        WORKER,
        "--keys",
        KEYS_FILE,
        "--dim",
        str(DIM),
        "--threads",
        str(THREADS),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--out",
        TORCHREC_FILE,
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": "torchrec_worker.py did not finish in an hour"}
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"error": "torchrec_worker.py exited %d: %s" % (done.returncode, " | ".join(tail))}
    with open(TORCHREC_FILE) as f:
        result = json.load(f)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def session():
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=THREADS, inter_op_parallelism_threads=THREADS
    )
    return tf.compat.v1.Session(graph=tf.compat.v1.get_default_graph(), config=config)


def timed_ms(sess, fetch, keys_ph, batches, steps):
    """Median ms/step: one untimed pass over all batches, then `steps` timed ones, cycled."""
    cycle = [batches[i % len(batches)] for i in range(len(batches) + steps)]
    return round(time_steps(sess, fetch, keys_ph, cycle, len(batches)) * 1e3, 4)


def initializer():
    return tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1)  # FBGEMM's range


def smallest_accumulator(factory, **kwargs):
    """(optimizer, initial accumulator): factory(initial_accumulator_value=0) as FBGEMM starts,
    or, when 0 is refused, the smallest normal float32 (no effect beside a gradient of ones)."""
    error = None
    for value in (0.0, TINY):
        try:
            return factory(initial_accumulator_value=value, **kwargs), value
        except ValueError as e:
            error = e
    raise error


def rec_sdk_optimizer(op):
    """(rec_sdk sparse optimizer of a fixed-capacity table, its parameters) for a train op."""
    from rec_sdk.optimizers import adagrad, gradient_descent, lazy_adam

    if op == "train_sgd":
        return gradient_descent.create_hash_optimizer(LR), {"weight_decay": None}
    if op == "train_adagrad":
        opt, acc = smallest_accumulator(adagrad.create_hash_optimizer, learning_rate=LR)
        return opt, {"initial_accumulator_value": acc, "epsilon": 0.0}
    if op == "train_rowwise_adagrad":
        factory = adagrad_rowwise.create_hash_optimizer
        accepted = inspect.signature(factory).parameters
        kwargs = {"learning_rate": LR}
        params = {}
        if "epsilon" in accepted:
            kwargs["epsilon"] = params["epsilon"] = EPS
        if "initial_accumulator_value" in accepted:
            opt, params["initial_accumulator_value"] = smallest_accumulator(factory, **kwargs)
        else:
            opt = factory(**kwargs)
        return opt, params
    if op == "train_adam":
        return lazy_adam.create_hash_optimizer(LR), {
            "beta1": 0.9,
            "beta2": 0.999,
            "epsilon": 1e-8,
            "lazy": True,
        }
    raise ValueError(op)


def dataset_ms(sess, fetch, batches, steps):
    """Median ms/step of a fetch whose keys come from the graph's dataset (no feed): one
    untimed pass over the batches, then `steps` timed steps."""
    for _ in batches:
        sess.run(fetch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sess.run(fetch)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 4)


def bench_rec_sdk(op, batches, steps, capacity):
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.util.initialize import init, terminate_config_initializer

    tf.compat.v1.reset_default_graph()
    init(use_dynamic_expansion=False)
    try:
        table = create_table(tf.int64, DIM, "peers", initializer(), device_vocabulary_size=capacity)
        if op == DATASET_LOOKUP:
            # The batches cycled from memory through tf.data, two prefetched ahead.
            dataset = tf.data.Dataset.from_tensor_slices(np.stack(batches)).repeat().prefetch(2)
            keys = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            keys.set_shape([BATCH])
        else:
            keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        emb = sparse_lookup(table, keys, is_train=True)
        params = {}
        if op == DATASET_LOOKUP:
            with session() as sess:
                ms = dataset_ms(sess, computed(emb), batches, steps)
                params["table_keys"] = int(sess.run(table.size_tensor()))
            return ms, params
        if op == "lookup":
            fetch = computed(emb)
        else:
            opt, params = rec_sdk_optimizer(op)
            loss = tf.reduce_sum(emb)  # its gradient with respect to emb is ones
            fetch = opt.apply_gradients(zip(tf.gradients(loss, [table]), [table]))
        with session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            ms = timed_ms(sess, fetch, keys, batches, steps)
            params["table_keys"] = int(sess.run(table.size_tensor()))
        return ms, params
    finally:
        terminate_config_initializer()


def bench_tfra(de, op, batches, steps):
    tf.compat.v1.reset_default_graph()
    var = de.get_variable(
        "peers", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, initializer=initializer()
    )
    keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
    emb = de.embedding_lookup(var, keys, name="peers_lookup")
    params = {}
    if op == "lookup":
        fetch = computed(emb)
    else:
        if op == "train_sgd":
            inner = tf.compat.v1.train.GradientDescentOptimizer(LR)
        elif op == "train_adagrad":
            inner, acc = smallest_accumulator(tf.compat.v1.train.AdagradOptimizer, learning_rate=LR)
            params = {"initial_accumulator_value": acc, "epsilon": 0.0}
        else:
            inner = tf.compat.v1.train.AdamOptimizer(LR)
            params = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
        fetch = de.DynamicEmbeddingOptimizer(inner).minimize(tf.reduce_sum(emb))
    with session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        ms = timed_ms(sess, fetch, keys, batches, steps)
        params["table_keys"] = int(sess.run(var.size()))
    return ms, params


def bench_dense(op, batches, steps):
    tf.compat.v1.reset_default_graph()
    table = tf.compat.v1.get_variable(
        "dense", [DENSE_ROWS, DIM], initializer=initializer(), use_resource=True
    )
    keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
    emb = tf.nn.embedding_lookup(table, keys % DENSE_ROWS)
    if op == "lookup":
        fetch = computed(emb)
    else:
        fetch = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(tf.reduce_sum(emb))
    with session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return timed_ms(sess, fetch, keys, batches, steps), {}


def measure(name, ops, run, result):
    """Runs run(op) -> (ms, params) for each op into result[name]; failures are recorded."""
    entry = result.setdefault(name, {"ms_per_step": {}, "params": {}, "errors": {}})
    for op in ops:
        try:
            ms, params = run(op)
        except Exception as e:  # noqa: BLE001 (reported in the output, the others still run)
            entry["errors"][op] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
            print("  %s %s: FAILED (%s)" % (name, op, entry["errors"][op]), flush=True)
            continue
        entry["ms_per_step"][op] = ms
        if params:
            entry["params"][op] = params
        print("  %s %s: %.3f ms/step" % (name, op, ms), flush=True)


def cell(value, digits=2):
    return "-" if value is None else "%.*f" % (digits, value)


def main():
    global THREADS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50, help="timed steps per operation")
    parser.add_argument("--batches", type=int, default=8, help="saved key batches")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of TorchRec then rec_sdk, alternated (the ratio is the "
        "median of the rounds' ratios: each compares runs minutes apart at most)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=THREADS,
        help="threads of every library (TF intra- and inter-op pools, torch); run once "
        "with 1 and once with 2 for the scaling of each operation",
    )
    parser.add_argument("--quick", action="store_true", help="3 steps, 1 round: a smoke run")
    parser.add_argument("--no-torchrec", action="store_true")
    parser.add_argument("--no-tfra", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 3, 1
    if args.steps < 1 or args.batches < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--steps, --batches, --rounds and --threads must be >= 1")
    THREADS = args.threads

    keys = save_keys(args.batches)
    batches = list(keys)
    unique_per_batch = statistics.mean(len(np.unique(b)) for b in batches)
    unique_total = len(np.unique(keys))
    capacity = max(1 << 20, 2 * unique_total)  # the fixed-capacity rec_sdk table never fills
    info = machine()
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__}
    print(
        "machine: %s, %d cores; Python %s, TensorFlow %s"
        % (info["cpu"], info["cores"], versions["python"], versions["tensorflow"])
    )
    print(
        "keys: %s, %d batches x %d keys, Zipf(1.1) over %d keys: %.0f unique per batch, "
        "%d unique in all; dim %d, %d threads, lr %g; %d timed steps after one pass over "
        "the batches; median ms/step"
        % (
            os.path.relpath(KEYS_FILE),
            len(batches),
            BATCH,
            KEY_SPACE,
            unique_per_batch,
            unique_total,
            DIM,
            THREADS,
            LR,
            args.steps,
        )
    )
    result = {
        "workload": {
            "keys_file": KEYS_FILE,
            "num_batches": len(batches),
            "batch_size": BATCH,
            "vocab": KEY_SPACE,
            "zipf": 1.1,
            "seed": 0,
            "unique_per_batch": round(unique_per_batch),
            "unique_total": unique_total,
            "dim": DIM,
            "threads": THREADS,
            "learning_rate": LR,
            "gradient": "ones",
            "steps": args.steps,
            "warmup": "one pass over the %d batches" % len(batches),
            "rec_sdk_capacity": capacity,
            "dense_rows": DENSE_ROWS,
        },
        "machine": info,
        "versions": versions,
        "libraries": {},
        "notes": [],
    }
    libs = result["libraries"]

    # Rounds of TorchRec (first, alone: the worker process holds 10M-row tables) then rec_sdk,
    # so that each round's ratio compares runs close in time on a machine whose speed drifts.
    tf.compat.v1.disable_eager_execution()
    rounds = []  # per round: {library: {op: ms}}
    for number in range(1, args.rounds + 1):
        print("round %d of %d" % (number, args.rounds), flush=True)
        this = {}
        if not args.no_torchrec and "skipped" not in libs.get("torchrec", {}):
            print("TorchRec/FBGEMM (%s) ..." % os.path.relpath(WORKER), flush=True)
            worker = run_torchrec(args.steps, len(batches))
            if "error" in worker:
                libs["torchrec"] = {"skipped": worker["error"]}
                print("  TorchRec unavailable: %s" % worker["error"], flush=True)
            else:
                libs["torchrec"] = {"unsupported": worker.get("unsupported", {}), "worker": worker}
                this["torchrec"] = worker["ms_per_step"]
                versions.update({k: v for k, v in worker["versions"].items() if k != "python"})
                versions["python (peer venv)"] = worker["versions"].get("python")
                for op, ms in worker["ms_per_step"].items():
                    print("  torchrec %s: %.3f ms/step" % (op, ms), flush=True)
                for op, why in worker.get("unsupported", {}).items():
                    print("  torchrec %s: unsupported (%s)" % (op, why.splitlines()[0][:200]))
        print("rec_sdk ...", flush=True)
        try:
            import rec_sdk
            from rec_sdk.ops.loader import load_ops

            load_ops()  # fail here, once, if the op library does not load
            versions["rec_sdk"] = rec_sdk.__version__
            rec_ops = [op for op in OPS if op != "train_rowwise_adagrad" or adagrad_rowwise]
            rec_ops.insert(1, DATASET_LOOKUP)
            entry = {}
            measure(
                "rec_sdk",
                rec_ops,
                lambda op: bench_rec_sdk(op, batches, args.steps, capacity),
                entry,
            )
            libs["rec_sdk"] = {
                "params": entry["rec_sdk"]["params"],
                "errors": entry["rec_sdk"]["errors"],
            }
            this["rec_sdk"] = entry["rec_sdk"]["ms_per_step"]
            if adagrad_rowwise is None:
                libs["rec_sdk"]["errors"]["train_rowwise_adagrad"] = "skipped: " + ROWWISE_MISSING
                print("  rec_sdk train_rowwise_adagrad: skipped (%s)" % ROWWISE_MISSING)
        except Exception as e:  # noqa: BLE001
            libs["rec_sdk"] = {"skipped": "%s: %s" % (type(e).__name__, e)}
            print("  rec_sdk unavailable: %s" % libs["rec_sdk"]["skipped"], flush=True)
        rounds.append(this)
    if args.no_torchrec:
        libs["torchrec"] = {"skipped": "--no-torchrec"}
    for library in ("torchrec", "rec_sdk"):
        per_op = {}
        for this in rounds:
            for op, ms in this.get(library, {}).items():
                per_op.setdefault(op, []).append(ms)
        if per_op:
            libs[library]["ms_per_step"] = {op: statistics.median(v) for op, v in per_op.items()}
            libs[library]["rounds"] = per_op
    round_ratios = {}
    for this in rounds:
        for op, ours in this.get("rec_sdk", {}).items():
            theirs = this.get("torchrec", {}).get("lookup" if op == DATASET_LOOKUP else op)
            if theirs:
                round_ratios.setdefault(op, []).append(theirs / ours)
    result["rounds"] = rounds

    if args.no_tfra:
        libs["tfra"] = {"skipped": "--no-tfra"}
    else:
        try:
            import tensorflow_recommenders_addons as tfra
            import tensorflow_recommenders_addons.dynamic_embedding as de
        except Exception as e:  # noqa: BLE001 (not installed, or does not load into this TF)
            libs["tfra"] = {"skipped": "%s: %s" % (type(e).__name__, e)}
            print("TFRA not measured (%s)" % libs["tfra"]["skipped"], flush=True)
        else:
            versions["tfra"] = tfra.__version__
            print("TFRA %s ..." % tfra.__version__, flush=True)
            measure(
                "tfra",
                ("lookup", "train_sgd", "train_adagrad", "train_adam"),
                lambda op: bench_tfra(de, op, batches, args.steps),
                libs,
            )

    print("dense tf.Variable[%d, %d] ..." % (DENSE_ROWS, DIM), flush=True)
    measure("dense", ("lookup", "train_sgd"), lambda op: bench_dense(op, batches, args.steps), libs)

    def ms(library, op):
        return libs.get(library, {}).get("ms_per_step", {}).get(op)

    notes = result["notes"]
    for library in ("rec_sdk", "tfra"):
        acc = (
            libs.get(library, {})
            .get("params", {})
            .get("train_adagrad", {})
            .get("initial_accumulator_value")
        )
        if acc:
            notes.append(
                "%s Adagrad: initial_accumulator_value %.3g (0 is refused; FBGEMM "
                "starts at 0) and no eps (FBGEMM: 1e-8 outside the sqrt)" % (library, acc)
            )
    acc = (
        libs.get("rec_sdk", {})
        .get("params", {})
        .get("train_rowwise_adagrad", {})
        .get("initial_accumulator_value")
    )
    if acc:
        notes.append(
            "rec_sdk row-wise Adagrad: initial_accumulator_value %.3g (0 is refused)" % acc
        )
    for op, why in libs.get("torchrec", {}).get("unsupported", {}).items():
        notes.append("TorchRec %s: unsupported on the CPU (%s)" % (op, why.splitlines()[0][:160]))
    if "worker" in libs.get("torchrec", {}):
        notes.append("TorchRec pooling: %s" % libs["torchrec"]["worker"].get("pooling"))
    for library in LIBRARIES:
        entry = libs.get(library, {})
        if "skipped" in entry:
            notes.append("%s not measured: %s" % (library, entry["skipped"]))
        for op, why in entry.get("errors", {}).items():
            notes.append("%s %s: %s" % (library, op, why))
    notes.append(
        "rec_sdk and TFRA hash keys into tables that insert new keys (none are new "
        "after the warm-up pass); FBGEMM's table is fixed-size, indexed by the key; "
        "TFRA's lookup inserts nothing"
    )

    ratios = {}
    print()
    print(
        "| operation | rec_sdk ms | TorchRec ms | rec_sdk speed vs TorchRec (TorchRec ms / "
        "rec_sdk ms; median of %d rounds [range]) | TFRA ms | dense ms |" % len(rounds)
    )
    print("|---|---|---|---|---|---|")
    for op in OPS[:1] + (DATASET_LOOKUP,) + OPS[1:]:
        ours, theirs = ms("rec_sdk", op), ms("torchrec", "lookup" if op == DATASET_LOOKUP else op)
        ratio = statistics.median(round_ratios[op]) if op in round_ratios else None
        if ratio is not None:
            ratios[op] = {
                "median": round(ratio, 3),
                "rounds": [round(r, 3) for r in round_ratios[op]],
            }
        if all(ms(library, op) is None for library in LIBRARIES):
            continue
        print(
            "| %s | %s | %s | %s | %s | %s |"
            % (
                op,
                cell(ours),
                cell(theirs),
                "-"
                if ratio is None
                else "%.2fx [%.2f-%.2f]" % (ratio, min(round_ratios[op]), max(round_ratios[op])),
                cell(ms("tfra", op)),
                cell(ms("dense", op)),
            )
        )
    result["rec_sdk_speed_vs_torchrec"] = ratios
    print()
    print("versions: " + ", ".join("%s %s" % kv for kv in versions.items()))
    print("machine: %s, %d cores" % (info["cpu"], info["cores"]))
    print("speed ratio > 1: rec_sdk faster. dense: keys % 1M, lookup and GradientDescent only.")
    for note in notes:
        print("note: " + note)
    with open(JSON_FILE, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote %s" % os.path.relpath(JSON_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
