"""The table benchmark through the TFRA-style API: rec_sdk.dynamic_embedding vs TFRA 0.7.2,
the same script code for both (only the `de` module differs), in one process and one run.

Workload (bench_table.py's): batches of 65,536 int64 keys drawn Zipf(1.1) from a 10M-key
space (about 20k unique keys per batch), dim 16, random-uniform initializer,
tf.compat.v1.Session, median ms/step over the timed steps after warm-up:
  lookup      var.lookup(keys) (missing keys read initial values, nothing inserted)
  upsert      var.upsert(keys, values)
  train step  de.embedding_lookup + DynamicEmbeddingOptimizer(AdamOptimizer).minimize
              (sum of squares; keys are inserted with their Adam slots)
The libraries alternate in --repeat rounds; the median round counts. TFRA is skipped when it
is not installed (`make bench` installs it).

    .venv/bin/python benchmarks/bench_dynamic_embedding.py [--steps 50] [--repeat 3]
"""
import argparse
import os
import platform
import statistics
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_table import BATCH, DIM, session, time_steps, zipf_batches  # noqa: E402


def load(library):
    if library == "tfra":
        import tensorflow_recommenders_addons.dynamic_embedding as de
    else:
        import rec_sdk.dynamic_embedding as de
    return de


def bench(de, batches, warmup):
    """ms/step of lookup, upsert and the train step with the module `de`."""
    results = {}
    for mode in ("lookup", "upsert", "train"):
        tf.compat.v1.reset_default_graph()
        var = de.get_variable("bench", key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                              initializer=tf.compat.v1.random_uniform_initializer(
                                  -0.05, 0.05, seed=1))
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        if mode == "lookup":
            fetch = tf.group(var.lookup(keys))
        elif mode == "upsert":
            fetch = var.upsert(keys, tf.fill([BATCH, DIM], 0.5))
        else:
            loss = tf.reduce_sum(tf.square(de.embedding_lookup(var, keys, name="lookup")))
            opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.001))
            fetch = opt.minimize(loss)
        with session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            results[mode] = time_steps(sess, fetch, keys, batches, warmup)
            if mode == "train":
                results["size"] = int(sess.run(var.size()))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    batches = zipf_batches(args.steps + args.warmup)
    print("machine: %s, %d cores, Python %s, TensorFlow %s" % (
        platform.processor() or platform.machine(), os.cpu_count(), platform.python_version(),
        tf.__version__))
    print("batch %d keys (%.0f unique on average), dim %d, %d timed steps after %d warm-up; "
          "median ms/step, median of %d interleaved rounds"
          % (BATCH, statistics.mean(len(np.unique(b)) for b in batches), DIM, args.steps,
             args.warmup, args.repeat))
    libraries = {"rec_sdk": load("rec_sdk")}
    try:
        libraries["tfra"] = load("tfra")
    except Exception as e:  # not installed, or does not load into this TF
        print("TFRA not measured (%s: %s)" % (type(e).__name__, e))
    rounds = {name: [] for name in libraries}
    for _ in range(args.repeat):
        for name, de in libraries.items():
            rounds[name].append(bench(de, batches, args.warmup))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in rounds.items()}
    print()
    print("| operation | rec_sdk ms | %s | rec_sdk is |" % (
        "TFRA 0.7.2 ms" if "tfra" in med else "-"))
    print("|---|---|---|---|")
    for mode, label in (("lookup", "lookup (no insert)"), ("upsert", "upsert"),
                        ("train", "train step (embedding_lookup + Adam)")):
        ours = med["rec_sdk"][mode]
        if "tfra" in med:
            theirs = med["tfra"][mode]
            print("| %s | %.2f | %.2f | %.1fx faster |" % (label, ours * 1e3, theirs * 1e3,
                                                          theirs / ours))
        else:
            print("| %s | %.2f | - | - |" % (label, ours * 1e3))
    print("\nkeys stored after training: rec_sdk %d%s" % (
        med["rec_sdk"]["size"], ", TFRA %d" % med["tfra"]["size"] if "tfra" in med else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
