"""Table benchmark: rec_sdk vs a dense tf.Variable table vs TFRA, in one process and one run.

Workload (the foundation issue's): batches of 65,536 int64 keys drawn Zipf(1.1) from a
10M-key space (about 20k unique keys per batch), dim 16, tf.compat.v1.Session, 50 timed steps
after warm-up; reports the median ms/step and keys/s.

  (a) lookup: rec_sdk sparse_lookup (dedup, find_or_insert, gather; a training lookup inserts
      the ~9k new keys of each batch, an eval lookup of stored keys inserts nothing)
      vs dense tf.nn.embedding_lookup on tf.Variable[1M, 16] with keys % 1M
  (b) train step: rec_sdk lookup + LazyAdam (sparse, rows in the batch only)
      vs the dense table with GradientDescent (a sparse scatter update)
  TFRA 0.7.2 (de.embedding_lookup, DynamicEmbeddingOptimizer(Adam)) runs too when installed
  (`make bench` tries to install it).

    .venv/bin/python benchmarks/bench_table.py [--steps 50] [--warmup 10] [--repeat 3]
"""

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

BATCH = 65_536
KEY_SPACE = 10_000_000
DIM = 16
DENSE_ROWS = 1_000_000


def zipf_batches(count, seed=0, batch=BATCH):
    """Zipf(1.1) ranks truncated to the key space, scattered over it by a fixed permutation."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        ranks = rng.zipf(1.1, size=batch * 2)
        ranks = ranks[ranks <= KEY_SPACE][:batch]
        while ranks.size < batch:
            extra = rng.zipf(1.1, size=batch)
            ranks = np.concatenate([ranks, extra[extra <= KEY_SPACE]])[:batch]
        # A multiplicative hash spreads popular ranks over the whole key space.
        batches.append(((ranks.astype(np.int64) * 2654435761) % KEY_SPACE).astype(np.int64))
    return batches


def time_steps(sess, fetch, keys_ph, batches, warmup):
    times = []
    for i, keys in enumerate(batches):
        start = time.perf_counter()
        sess.run(fetch, {keys_ph: keys})
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def computed(rows):
    """A fetch that makes a lookup's rows be computed: its last element. (tf.group(rows) is
    not enough: Grappler turns stateless ops that only feed control edges into no-ops, so
    the gather that produces the rows would not run.)"""
    return tf.reshape(rows, [-1])[-1]


def session():
    return tf.compat.v1.Session(graph=tf.compat.v1.get_default_graph())


def lazy_adam_train_op(emb):
    """The benchmark's rec_sdk train step on a lookup's embeddings: sum of squares, LazyAdam by
    address on the rows of every training lookup in the graph."""
    import rec_sdk
    from rec_sdk.optimizers import lazy_adam_by_addr

    loss = tf.reduce_sum(tf.square(emb))
    opt = lazy_adam_by_addr.create_hash_optimizer_by_address(0.001)
    grads = tf.gradients(loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB))
    return opt.apply_gradients(
        zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
    )


def bench_rec_sdk(batches, warmup):
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.util.initialize import init, terminate_config_initializer

    results = {}
    for mode in ("lookup", "train"):
        tf.compat.v1.reset_default_graph()
        init(use_dynamic_expansion=True)
        table = create_table(
            tf.int64,
            DIM,
            "bench",
            tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
            device_vocabulary_size=1 << 20,
        )
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        emb = sparse_lookup(table, keys, is_train=True)
        if mode == "lookup":
            fetch = computed(emb)
        else:
            # Evaluation lookups (no insert) of the same batches, timed after training when
            # their keys are stored.
            eval_fetch = computed(sparse_lookup(table, keys, is_train=False, name="eval"))
            fetch = lazy_adam_train_op(emb)
        with session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            results[mode] = time_steps(sess, fetch, keys, batches, warmup)
            results[mode + "_size"] = sess.run(table.size_tensor())
            if mode == "train":
                results["eval_lookup"] = time_steps(sess, eval_fetch, keys, batches, warmup)
        terminate_config_initializer()
    return results


def bench_dense(batches, warmup):
    results = {}
    for mode in ("lookup", "train"):
        tf.compat.v1.reset_default_graph()
        table = tf.compat.v1.get_variable(
            "dense",
            [DENSE_ROWS, DIM],
            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
            use_resource=True,
        )
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        emb = tf.nn.embedding_lookup(table, keys % DENSE_ROWS)
        if mode == "lookup":
            fetch = computed(emb)
        else:
            loss = tf.reduce_sum(tf.square(emb))
            fetch = tf.compat.v1.train.GradientDescentOptimizer(0.001).minimize(loss)
        with session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            results[mode] = time_steps(sess, fetch, keys, batches, warmup)
    return results


def bench_tfra(batches, warmup):
    try:
        import tensorflow_recommenders_addons.dynamic_embedding as de
    except Exception as e:  # not installed, or does not load into this TF
        return {"error": "%s: %s" % (type(e).__name__, e)}
    results = {}
    for mode in ("lookup", "train"):
        tf.compat.v1.reset_default_graph()
        var = de.get_variable(
            "tfra",
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            dim=DIM,
            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
        )
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        if mode == "lookup":
            fetch = computed(var.lookup(keys))
        else:
            emb = de.embedding_lookup(var, keys)
            loss = tf.reduce_sum(tf.square(emb))
            opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.001))
            fetch = opt.minimize(loss)
        with session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            results[mode] = time_steps(sess, fetch, keys, batches, warmup)
    return results


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of all libraries, interleaved; the median round counts "
        "(evens out drift on a shared machine)",
    )
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    batches = zipf_batches(args.steps + args.warmup)
    unique = statistics.mean(len(np.unique(b)) for b in batches)
    print(
        "machine: %s, %d cores, Python %s, TensorFlow %s"
        % (
            platform.processor() or platform.machine(),
            os.cpu_count(),
            platform.python_version(),
            tf.__version__,
        )
    )
    print(
        "batch %d keys (%.0f unique on average), dim %d, %d timed steps after %d warm-up; "
        "median ms/step, median of %d interleaved rounds"
        % (BATCH, unique, DIM, args.steps, args.warmup, args.repeat)
    )
    rounds = []
    for _ in range(args.repeat):
        rounds.append(
            (
                bench_dense(batches, args.warmup),
                bench_rec_sdk(batches, args.warmup),
                bench_tfra(batches, args.warmup),
            )
        )

    def median_of(index):
        results = [r[index] for r in rounds]
        if "error" in results[0]:
            return results[0]
        return {k: statistics.median(r[k] for r in results) for k in results[0]}

    dense, ours, tfra = median_of(0), median_of(1), median_of(2)

    def row(name, seconds, baseline):
        ratio = baseline / seconds
        return "| %s | %.2f | %.1f | %.2fx |" % (name, seconds * 1e3, BATCH / seconds / 1e6, ratio)

    print()
    print("| operation | ms/step | M keys/s | speed vs dense |")
    print("|---|---|---|---|")
    print(row("dense tf.Variable[1M,16] lookup", dense["lookup"], dense["lookup"]))
    print(
        row(
            "rec_sdk training lookup (dedup + find_or_insert + gather)",
            ours["lookup"],
            dense["lookup"],
        )
    )
    print(
        row(
            "rec_sdk eval lookup (keys stored, nothing inserted)",
            ours["eval_lookup"],
            dense["lookup"],
        )
    )
    if "error" not in tfra:
        print(row("TFRA 0.7.2 lookup", tfra["lookup"], dense["lookup"]))
    print(row("dense train step (GradientDescent)", dense["train"], dense["train"]))
    print(row("rec_sdk train step (LazyAdam)", ours["train"], dense["train"]))
    if "error" not in tfra:
        print(row("TFRA 0.7.2 train step (Adam)", tfra["train"], dense["train"]))
        print()
        print(
            "rec_sdk vs TFRA: lookup %.1fx, train step %.1fx"
            % (tfra["lookup"] / ours["lookup"], tfra["train"] / ours["train"])
        )
    else:
        print("\nTFRA not measured (%s)" % tfra["error"])
    print("rec_sdk table size after the run: %d keys" % ours["train_size"])


if __name__ == "__main__":
    sys.exit(main())
