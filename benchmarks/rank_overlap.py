"""When the tables' gradient all-to-all runs in a step over ranks, against the dense
backward pass, the dense gradients' all-reduce and the updates: 4 tables (dim 16, lazy Adam
by address) under a 4-layer MLP, the dense gradients averaged with all_reduce_many. Rank 0
traces the last of 8 steps (RunMetadata) and prints each part's span in ms from the step's
start (on 2 shared cores the spans are long; which ones run at the same time is the point).

    .venv/bin/python -m rec_sdk.distribute.launch --ps 0 --workers 2 -- \\
        .venv/bin/python benchmarks/rank_overlap.py
"""

import numpy as np
import tensorflow as tf

import rec_sdk.distribute as dist
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.initialize import init

BATCH, TABLES, STEPS = 1024, 4, 8
PARTS = [
    (
        "tables' gradient all-to-all",
        lambda name: "exchange_gradients" in name and "Collective" in name,
    ),
    ("dense gradients' all-reduce", lambda name: "all_reduce" in name and "Collective" in name),
    ("dense weight gradients", lambda name: name.startswith("gradients/MatMul")),
    ("dense update", lambda name: name.startswith("GradientDescent/")),
    ("tables' update", lambda name: "LazyAdam" in name),
    ("whole step", lambda name: True),
]


def build():
    ids = [tf.compat.v1.placeholder(tf.int64, [BATCH], name="ids%d" % t) for t in range(TABLES)]
    tables = [
        create_table(
            tf.int64,
            16,
            "t%d" % t,
            tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=t),
            device_vocabulary_size=4096,
        )
        for t in range(TABLES)
    ]
    x = tf.concat(
        [
            sparse_lookup(table, i, name="lookup%d" % t)
            for t, (table, i) in enumerate(zip(tables, ids))
        ],
        1,
    )
    for k, width in enumerate((512, 512, 256, 1)):
        weights = tf.compat.v1.get_variable(
            "w%d" % k,
            [x.shape[1], width],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=k),
        )
        x = tf.matmul(x, weights)
        if width > 1:
            x = tf.nn.relu(x)
    loss = tf.reduce_mean(tf.square(x))
    dense = tf.compat.v1.trainable_variables()
    grads = tf.gradients(loss, dense + tables)
    dense_grads = dist.all_reduce_many(grads[: len(dense)], "mean")
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.01).apply_gradients(zip(dense_grads, dense)),
        create_hash_optimizer_by_address(learning_rate=0.01).apply_gradients(
            zip(grads[len(dense) :], tables)
        ),
    )
    return ids, train


def spans(metadata):
    nodes = [node for device in metadata.step_stats.dev_stats for node in device.node_stats]
    start = min(node.all_start_micros for node in nodes)
    for label, wanted in PARTS:
        chosen = [node for node in nodes if wanted(node.node_name)]
        if not chosen:
            print("%-30s -" % label)
            continue
        first = min(node.all_start_micros for node in chosen) - start
        last = max(node.all_start_micros + node.all_end_rel_micros for node in chosen) - start
        print("%-30s %7.1f - %7.1f ms (%d ops)" % (label, first / 1e3, last / 1e3, len(chosen)))


def main():
    tf.compat.v1.disable_eager_execution()
    server = dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank = hccl_ops.get_rank_id()
    ids, train = build()
    rng = np.random.default_rng(rank)
    trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=rank == 0,
        config=dist.worker_config(server, collective=True),
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    ) as sess:
        for _ in range(STEPS):
            metadata = tf.compat.v1.RunMetadata()
            sess.run(
                train,
                {i: rng.zipf(1.2, BATCH) % 100000 for i in ids},
                options=trace,
                run_metadata=metadata,
            )
    if rank == 0:
        spans(metadata)


if __name__ == "__main__":
    main()
