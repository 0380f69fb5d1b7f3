"""Trains one graph of five tables for 100 steps with a given number of intra-op threads and
saves every table's contents: tests/test_threads.py runs it with 1, 2 and 8 threads and
compares the results bit for bit.

The tables: plain (LazyAdam), admission and eviction after 20 steps (row-wise Adagrad),
evict_when_full at a fixed capacity smaller than the keys (SGD), bfloat16 rows (Adam), an SSD
tier with 3,000 rows in memory (LazyAdam), and an evict_when_full table with admission that
two lookups of other keys read in each step (SGD; their order shows in what it keeps).
Batches of 4,096 Zipf keys (about 1,500 distinct), the same for every run.

Usage: python tests/threads_worker.py THREADS OUT.npz SSD_DIR

With TF_CONFIG set it is one rank of a cluster: it trains its slice of each batch (rank r
takes every ranks-th key from the r-th) and saves its shards to OUT with {rank} replaced.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rec_sdk.distribute as dist  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.core.feature_process import evict_tables  # noqa: E402
from rec_sdk.ops import table_ops  # noqa: E402
from rec_sdk.optimizers import adagrad_rowwise, gradient_descent, lazy_adam  # noqa: E402
from rec_sdk.util import initialize  # noqa: E402
from rec_sdk.util.communication import hccl_ops  # noqa: E402

DIM = 8
STEPS = 100


def batch(step):
    rng = np.random.default_rng(step)
    return (rng.zipf(1.1, 4096) % 50000).astype(np.int64)


def tables(ssd_dir):
    init = tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=7)
    return {
        "plain": (create_table(tf.int64, DIM, "plain", init, device_vocabulary_size=100000), {}),
        "admission": (
            create_table(
                tf.int64, DIM, "admission", init, device_vocabulary_size=100000, steps_to_live=20
            ),
            {"access_threshold": 2, "eviction_threshold": -1},
        ),
        "full": (
            create_table(
                tf.int64, DIM, "full", init, device_vocabulary_size=3000, evict_when_full=True
            ),
            {},
        ),
        "half": (
            create_table(
                tf.int64, DIM, "half", init, device_vocabulary_size=100000, emb_dtype="bfloat16"
            ),
            {},
        ),
        "twice": (
            create_table(
                tf.int64, DIM, "twice", init, device_vocabulary_size=2000, evict_when_full=True
            ),
            {"access_threshold": 2, "eviction_threshold": -1},
        ),
        "tiered": (
            create_table(
                tf.int64,
                DIM,
                "tiered",
                init,
                device_vocabulary_size=2999,
                host_vocabulary_size=1,
                ssd_vocabulary_size=100000,
                ssd_data_path=ssd_dir,
            ),
            {},
        ),
    }


def main(threads, out, ssd_dir):
    tf.compat.v1.disable_eager_execution()
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads
    )
    server = None
    if os.environ.get("TF_CONFIG"):
        task = dist.task_from_tf_config()
        config = dist.worker_config(task, collective=True)
        config.intra_op_parallelism_threads = config.inter_op_parallelism_threads = threads
        server = dist.start_server(config=config, collective=True)
    initialize.init()
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    more_ids = tf.compat.v1.placeholder(tf.int64, [None])
    step = tf.compat.v1.train.get_or_create_global_step()
    made = tables(ssd_dir)
    optimizers = {
        "plain": lazy_adam.create_hash_optimizer(learning_rate=0.05),
        "admission": adagrad_rowwise.create_hash_optimizer(learning_rate=0.05),
        "full": gradient_descent.create_hash_optimizer(learning_rate=0.05),
        "half": lazy_adam.create_hash_optimizer(learning_rate=0.05),
        "tiered": lazy_adam.create_hash_optimizer(learning_rate=0.05),
        "twice": gradient_descent.create_hash_optimizer(learning_rate=0.05),
    }
    train = []
    for name, (table, admission) in made.items():
        config = dict(admission, faae_coefficient=1) if admission else None
        emb = sparse_lookup(table, ids, is_train=True, name=name, access_and_evict_config=config)
        loss = tf.reduce_sum(tf.square(emb - 0.3))
        if name == "twice":  # a second lookup of the table in the step, of other keys
            emb = sparse_lookup(
                table, more_ids, is_train=True, name=name + "2", access_and_evict_config=config
            )
            loss += tf.reduce_sum(tf.square(emb + 0.2))
        train.append(optimizers[name].minimize(loss, var_list=[table]))
    with tf.control_dependencies(train):
        train_op = tf.compat.v1.assign_add(step, 1)
    evict = evict_tables([made["admission"][0]])
    result = {}
    target = server.target if server else ""
    with tf.compat.v1.Session(target, config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for k in range(STEPS):
            feed = {ids: batch(k)[rank::ranks], more_ids: batch(k + STEPS)[rank::ranks]}
            sess.run(train_op, feed)
            if k % 10 == 9:
                sess.run(evict)
        for name, (table, _) in made.items():
            keys, values, slots = sess.run(table.export())
            access_keys, last_seen, counts = sess.run(table_ops.export_access(table.handle))
            order = keys.argsort(kind="stable")
            result[name + "/keys"] = keys[order]
            result[name + "/values"] = values[order]
            result[name + "/slots"] = slots[:, order, :]
            access = access_keys.argsort(kind="stable")
            result[name + "/access"] = np.stack(
                [access_keys[access], last_seen[access], counts[access]]
            )
            result[name + "/stats"] = sess.run(table_ops.stats(table.handle))
    np.savez(out.replace("{rank}", str(rank)), **result)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
