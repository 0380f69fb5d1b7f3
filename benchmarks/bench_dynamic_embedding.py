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

TF2 section (eager execution, in a child process of its own: the graph section disables eager
execution for good), the same batches, TFRA's TF2 API for both libraries:
  eager lookup      var.lookup(keys) called eagerly
  tf.function step  a tf.function: de.shadow_ops.embedding_lookup through a ShadowVariable,
                    GradientTape, DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam)
                    .apply_gradients
  Keras fit         model.fit of de.keras.layers.Embedding (ids [4096, 16] per batch, summed)
                    + Dense(1), DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam), MSE;
                    ms per step of fit over the batches after a warm-up fit

    .venv/bin/python benchmarks/bench_dynamic_embedding.py [--steps 50] [--repeat 3]
        [--section graph|tf2|all]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_table import BATCH, DIM, computed, session, time_steps, zipf_batches  # noqa: E402


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
        var = de.get_variable(
            "bench",
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            dim=DIM,
            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
        )
        keys = tf.compat.v1.placeholder(tf.int64, [BATCH])
        if mode == "lookup":
            fetch = computed(var.lookup(keys))
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


FIT_ROWS = 4096  # Keras fit: ids [FIT_ROWS, BATCH // FIT_ROWS] per batch


def _timed(fn, batches, warmup):
    """Median seconds of fn(batch) over the batches after warm-up."""
    times = []
    for i, keys in enumerate(batches):
        start = time.perf_counter()
        fn(keys)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_tf2(de, batches, warmup, tag):
    """ms/step of the TF2 section with the module `de` (eager)."""
    init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=1)
    tensors = [tf.constant(b) for b in batches]
    results = {}
    var = de.get_variable(
        "tf2_lookup_" + tag, key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, initializer=init
    )
    results["eager_lookup"] = _timed(var.lookup, tensors, warmup)

    var = de.get_variable(
        "tf2_step_" + tag, key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, initializer=init
    )
    shadow = de.shadow_ops.ShadowVariable(var, name="tf2_step_shadow_" + tag)
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.001))

    @tf.function
    def step(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(de.shadow_ops.embedding_lookup(shadow, keys)))
        opt.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))

    results["function_step"] = _timed(step, tensors, warmup)
    results["size"] = int(var.size())

    inputs = tf.keras.layers.Input(shape=(BATCH // FIT_ROWS,), dtype=tf.int64)
    emb = de.keras.layers.Embedding(DIM, initializer=init, name="tf2_fit_" + tag)(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.reduce_sum(emb, axis=1)))
    model.compile(
        optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.001)), loss="mse"
    )
    ids = [b.reshape(FIT_ROWS, -1) for b in batches]
    labels = np.zeros([FIT_ROWS, 1], np.float32)
    data = tf.data.Dataset.from_tensor_slices(np.stack(ids)).map(lambda x: (x, labels))
    model.fit(data.take(warmup), epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(data.skip(warmup), epochs=1, verbose=0)
    results["keras_fit"] = (time.perf_counter() - start) / (len(ids) - warmup)
    return results


def _table(med, rows):
    print(
        "| operation | rec_sdk ms | %s | rec_sdk is |" % ("TFRA 0.7.2 ms" if "tfra" in med else "-")
    )
    print("|---|---|---|---|")
    for mode, label in rows:
        ours = med["rec_sdk"][mode]
        if "tfra" in med:
            theirs = med["tfra"][mode]
            print(
                "| %s | %.2f | %.2f | %.1fx faster |"
                % (label, ours * 1e3, theirs * 1e3, theirs / ours)
            )
        else:
            print("| %s | %.2f | - | - |" % (label, ours * 1e3))


def _libraries():
    libraries = {"rec_sdk": load("rec_sdk")}
    try:
        libraries["tfra"] = load("tfra")
    except Exception as e:  # not installed, or does not load into this TF
        print("TFRA not measured (%s: %s)" % (type(e).__name__, e))
    return libraries


def _median_rounds(libraries, repeat, run):
    rounds = {name: [] for name in libraries}
    for i in range(repeat):
        for name, de in libraries.items():
            rounds[name].append(run(de, "%s_%d" % (name, i)))
    return {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()
    }


def main_tf2(args):
    batches = zipf_batches(args.steps + args.warmup)
    libraries = _libraries()
    med = _median_rounds(
        libraries, args.repeat, lambda de, tag: bench_tf2(de, batches, args.warmup, tag)
    )
    print("\n### TF2 (eager, tf.function, Keras)\n")
    _table(
        med,
        (
            ("eager_lookup", "eager lookup (no insert)"),
            ("function_step", "tf.function train step (shadow lookup + Keras Adam)"),
            ("keras_fit", "Keras model.fit step (de Embedding + Dense, Keras Adam)"),
        ),
    )
    print(
        "\nkeys stored after the tf.function steps: rec_sdk %d%s"
        % (med["rec_sdk"]["size"], ", TFRA %d" % med["tfra"]["size"] if "tfra" in med else "")
    )
    return 0


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--section", choices=("graph", "tf2", "all"), default="all")
    args = parser.parse_args()
    if args.section == "tf2":
        return main_tf2(args)
    tf.compat.v1.disable_eager_execution()
    batches = zipf_batches(args.steps + args.warmup)
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
        % (
            BATCH,
            statistics.mean(len(np.unique(b)) for b in batches),
            DIM,
            args.steps,
            args.warmup,
            args.repeat,
        )
    )
    libraries = _libraries()
    med = _median_rounds(libraries, args.repeat, lambda de, tag: bench(de, batches, args.warmup))
    print("\n### Graph mode (tf.compat.v1.Session)\n")
    _table(
        med,
        (
            ("lookup", "lookup (no insert)"),
            ("upsert", "upsert"),
            ("train", "train step (embedding_lookup + Adam)"),
        ),
    )
    print(
        "\nkeys stored after training: rec_sdk %d%s"
        % (med["rec_sdk"]["size"], ", TFRA %d" % med["tfra"]["size"] if "tfra" in med else "")
    )
    if args.section == "all":
        sys.stdout.flush()
        return subprocess.call(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--section",
                "tf2",
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--repeat",
                str(args.repeat),
            ]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
