"""FeatureSpec pipeline and admission benchmark, in one process and one run.

(a) Input pipeline: batches/s of a tf.data pipeline mapped with get_asc_insert_func (per
    table: gather the features' ids, dedup, inverse indices, admission counts, per-key
    timestamps), next to the same pipeline without it, on
      - MovieLens-100k-sized batches: 1,024 samples of user id, item id, 3 genre ids
        (user table; item table shared by item and genres), timestamps;
      - Criteo-shaped synthetic batches: 4,096 samples x 26 categorical fields (one table
        each, Zipf(1.1) ids over 1M values per field), timestamps.
(b) Admission cost on the table benchmark's train step (bench_table.py's workload: 65,536
    Zipf keys, dim 16, lookup + LazyAdam): admission off, admission on (threshold 2, so
    rarely seen keys stay pending), and admission plus eviction bookkeeping (per-sample
    timestamps), as step throughput relative to admission off.
(c) Graph modification: a model reading Criteo-shaped batches (4,096 x 26 fields, one dim-16
    table per field, admission threshold 1, LazyAdam) from a tf.data iterator, trained with
    id-tensor lookups as written (dedup and counting inside the step), after
    modify_graph_and_start_emb_cache (that work moved into the prefetched input pipeline),
    and in FeatureSpec mode; samples/s relative to the unmodified graph.

    .venv/bin/python benchmarks/bench_pipeline.py [--batches 200] [--steps 50] [--repeat 3]
"""

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from bench_table import BATCH, DIM, lazy_adam_train_op, session, time_steps, zipf_batches


def movielens_like(samples, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "user": rng.integers(0, 943, samples, dtype=np.int64),
        "item": rng.integers(0, 1682, samples, dtype=np.int64),
        "genres": rng.integers(10_000, 10_019, (samples, 3), dtype=np.int64),
        "timestamp": rng.integers(874_724_710, 893_286_638, samples, dtype=np.int64),
        "label": rng.random(samples, dtype=np.float32),
    }


def criteo_like(samples, seed=0):
    rng = np.random.default_rng(seed)
    data = {
        "label": rng.random(samples, dtype=np.float32),
        "timestamp": np.sort(rng.integers(0, 86_400, samples, dtype=np.int64)),
    }
    for f in range(26):
        ranks = np.minimum(rng.zipf(1.1, samples), 1_000_000)
        data["C%d" % (f + 1)] = (ranks * 2654435761 + f) % 1_000_000
    return data


def pipeline_rate(data, batch_size, specs, batches, repeat):
    """batches/s of iterating the dataset (with get_asc_insert_func when specs are given)."""
    from rec_sdk.core.asc.helper import get_asc_insert_func

    rates = []
    for _ in range(repeat):
        tf.compat.v1.reset_default_graph()
        # Elements are whole batches (as after .batch()), so the figures show the cost of
        # the preprocessing rather than of batching single samples.
        batched = {
            k: v[: len(v) // batch_size * batch_size].reshape((-1, batch_size) + v.shape[1:])
            for k, v in data.items()
        }
        dataset = tf.data.Dataset.from_tensor_slices(batched).repeat()
        if specs is not None:
            dataset = dataset.map(
                get_asc_insert_func(tgt_key_specs=specs, is_training=True), num_parallel_calls=1
            )
        dataset = dataset.prefetch(4)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        fetch = tf.group(tf.nest.flatten(batch))
        with session() as sess:
            for _ in range(10):
                sess.run(fetch)
            start = time.perf_counter()
            for _ in range(batches):
                sess.run(fetch)
            rates.append(batches / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_pipelines(args):
    from rec_sdk.core.asc.feature_spec import FeatureSpec
    from rec_sdk.util.initialize import init, terminate_config_initializer

    init()
    ml_specs = [
        FeatureSpec("user", access_threshold=2, eviction_threshold=86400),
        FeatureSpec("item", access_threshold=2, eviction_threshold=86400),
        FeatureSpec("genres", table_name="item", access_threshold=2, eviction_threshold=86400),
        FeatureSpec("timestamp", is_timestamp=True),
    ]
    criteo_specs = [
        FeatureSpec("C%d" % (f + 1), access_threshold=2, eviction_threshold=3600) for f in range(26)
    ] + [FeatureSpec("timestamp", is_timestamp=True)]
    rows = []
    for name, data, batch_size, specs in (
        (
            "MovieLens-sized (1,024 x [user, item, 3 genres])",
            movielens_like(100_000),
            1024,
            ml_specs,
        ),
        ("Criteo-shaped (4,096 x 26 fields, 26 tables)", criteo_like(200_000), 4096, criteo_specs),
    ):
        plain = pipeline_rate(data, batch_size, None, args.batches, args.repeat)
        mapped = pipeline_rate(data, batch_size, specs, args.batches, args.repeat)
        rows.append((name, batch_size, plain, mapped))
    terminate_config_initializer()
    return rows


def bench_admission(batches, warmup, repeat):
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.util.initialize import init, terminate_config_initializer

    modes = ("off", "admission", "admission+timestamps")
    times = {m: [] for m in modes}
    for _ in range(repeat):
        for mode in modes:
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
            kwargs = {}
            if mode == "admission":
                kwargs["access_and_evict_config"] = {"access_threshold": 2}
            elif mode == "admission+timestamps":
                # 64 samples of 1,024 ids each, one timestamp per sample.
                kwargs["access_and_evict_config"] = {
                    "access_threshold": 2,
                    "eviction_threshold": 3600,
                }
                kwargs["timestamps"] = tf.range(64, dtype=tf.int64)
            ids = tf.reshape(keys, [64, BATCH // 64])
            fetch = lazy_adam_train_op(sparse_lookup(table, ids, is_train=True, **kwargs))
            with session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                times[mode].append(time_steps(sess, fetch, keys, batches, warmup))
                if mode != "off":
                    stats = sess.run(table.stats())
            terminate_config_initializer()
    return {m: statistics.median(t) for m, t in times.items()}, stats


def bench_modify_graph(steps, warmup, repeat):
    import rec_sdk  # noqa: F401
    from rec_sdk.core.asc.feature_spec import FeatureSpec
    from rec_sdk.core.asc.helper import get_asc_insert_func
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
    from rec_sdk.optimizers import lazy_adam
    from rec_sdk.util.initialize import init, terminate_config_initializer

    batch_size, fields = 4096, ["C%d" % (f + 1) for f in range(26)]
    data = criteo_like(batch_size * 16)
    modes = ("as written", "modified", "FeatureSpec")
    rates = {m: [] for m in modes}
    for _ in range(repeat):
        for mode in modes:
            tf.compat.v1.reset_default_graph()
            init()
            specs = [FeatureSpec(f, access_threshold=1) for f in fields]
            dataset = tf.data.Dataset.from_tensor_slices(data).repeat().batch(batch_size)
            if mode == "FeatureSpec":
                dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs))
            batch = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(10)).get_next()
            embs = []
            for field, spec in zip(fields, specs):
                table = create_table(
                    tf.int64,
                    DIM,
                    field,
                    tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
                    device_vocabulary_size=1 << 18,
                )
                if mode == "FeatureSpec":
                    embs.append(sparse_lookup(table, spec, batch=batch))
                else:
                    embs.append(
                        sparse_lookup(
                            table,
                            batch[field],
                            modify_graph=True,
                            access_and_evict_config={"access_threshold": 1},
                        )
                    )
            logits = tf.reduce_sum(tf.add_n(embs), axis=1)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits)
            )
            train = lazy_adam.create_hash_optimizer(learning_rate=1e-3).minimize(loss)
            if mode == "modified":
                modify_graph_and_start_emb_cache()
            with session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(warmup):
                    sess.run(train)
                start = time.perf_counter()
                for _ in range(steps):
                    sess.run(train)
                rates[mode].append(steps * batch_size / (time.perf_counter() - start))
            terminate_config_initializer()
    return {m: statistics.median(r) for m, r in rates.items()}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=200, help="pipeline batches timed")
    parser.add_argument("--steps", type=int, default=50, help="train steps timed")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    print(
        "machine: %s, %d cores, Python %s, TensorFlow %s"
        % (
            platform.processor() or platform.machine(),
            os.cpu_count(),
            platform.python_version(),
            tf.__version__,
        )
    )
    print("\n(a) input pipeline, median of %d runs of %d batches" % (args.repeat, args.batches))
    print("| batches | plain batches/s | with insert function batches/s | M ids/s | ratio |")
    print("|---|---|---|---|---|")
    for name, batch_size, plain, mapped in bench_pipelines(args):
        ids_per_batch = batch_size * (5 if batch_size == 1024 else 26)
        print(
            "| %s | %.0f | %.0f | %.1f | %.2fx |"
            % (name, plain, mapped, mapped * ids_per_batch / 1e6, mapped / plain)
        )
    batches = zipf_batches(args.steps + args.warmup)
    times, stats = bench_admission(batches, args.warmup, args.repeat)
    print(
        "\n(b) train step (65,536 Zipf keys, dim 16, LazyAdam), median of %d rounds" % args.repeat
    )
    print("| admission | ms/step | throughput vs off |")
    print("|---|---|---|")
    for mode, seconds in times.items():
        print("| %s | %.2f | %.2fx |" % (mode, seconds * 1e3, times["off"] / seconds))
    print(
        "\nlast admission table: %d keys with rows, %d pending, %d admitted, %d rejected"
        % (stats["size"], stats["pending"], stats["admitted"], stats["rejected"])
    )
    rates = bench_modify_graph(args.steps, args.warmup, args.repeat)
    print(
        "\n(c) graph modification, Criteo-shaped model (4,096 x 26 fields, 26 tables), "
        "median of %d rounds" % args.repeat
    )
    print("| lookups | samples/s | vs as written |")
    print("|---|---|---|")
    for mode, rate in rates.items():
        print("| %s | %.0f | %.2fx |" % (mode, rate, rate / rates["as written"]))


if __name__ == "__main__":
    sys.exit(main())
