"""A rank of tests/test_serving_ranks.py: two servable tables (dims 4 and 8) trained over the
ranks of a cluster (TF_CONFIG) by lazy Adam, keys unseen for 2 steps evicted every 3 steps
(in QUIET_STEPS only rank 0 owns table 0's keys: the other shards must age all the same),
dense weights summed with hccl_ops.allreduce, in a plain Session. Rank 0 exports the serving
model after step EXPORT_AT (export_serving_model into DIR/export, push_dir DIR/push, and
export_saved_model into DIR/frozen) and pushes an update every --push-every steps after it.
With --local N one process trains the N ranks' global batch and does the same in its DIR.
At the export and each push rank 0 also saves every shard's rows (DIR/rows-<version>.npz):
what every served version must read.

    serving_rank_worker.py DIR [--local N] [--steps S] [--push-every K]
                           [--base-fraction F]
"""

import argparse
import faulthandler
import os

import numpy as np
import tensorflow as tf

import rec_sdk.distribute as dist
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import evict_tables
from rec_sdk.distribute import ranks as ranks_module
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.serving import Pusher, export_saved_model, export_serving_model
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.initialize import init
from rec_sdk.util.tf_version_adapter import hccl_ops as hccl_adapter

tf.compat.v1.disable_eager_execution()
BATCH = 6
DIMS = (4, 8)
EXPORT_AT = 3
DEFAULT = -0.5  # what a key not in a table serves
QUIET_STEPS = (5, 6, 7, 8)


def batch(rank, step, ranks):
    rng = np.random.default_rng(100 * step + rank)
    # Keys drift with the steps so that old ones are evicted and new ones arrive.
    ids = [
        rng.integers(-8 + 3 * step, 30 + 3 * step, size=(BATCH, 2)).astype(np.int64) for _ in DIMS
    ]
    if step in QUIET_STEPS:  # table 0's keys all owned by rank 0: the other shards get none
        ids[0] = ids[0] - np.fmod(ids[0], ranks)
    labels = (rng.random((BATCH, 1)) < 0.5).astype(np.float32)
    return ids + [labels]


def main():
    faulthandler.dump_traceback_later(240, exit=False)
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--local", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--push-every", type=int, default=1)
    parser.add_argument("--base-fraction", type=float, default=0.25)
    args = parser.parse_args()
    server = None if args.local else dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    global_step = tf.compat.v1.train.get_or_create_global_step()
    tables = [
        create_table(
            tf.int64,
            dim,
            "emb%d" % t,
            tf.compat.v1.truncated_normal_initializer(seed=3 + t),
            device_vocabulary_size=1000,
            steps_to_live=2,
            servable=True,
        )
        for t, dim in enumerate(DIMS)
    ]
    ids = [
        tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids%d" % t) for t in range(len(DIMS))
    ]
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    w = tf.compat.v1.get_variable(
        "w", [sum(DIMS), 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=5)
    )

    def model(embs):
        return tf.matmul(tf.concat([tf.reduce_sum(e, 1) for e in embs], 1), w)

    embs = [sparse_lookup(t, i, name="lookup%d" % n) for n, (t, i) in enumerate(zip(tables, ids))]
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=model(embs))
    )
    sparse_train = create_hash_optimizer_by_address(learning_rate=0.05).minimize(
        loss, var_list=tables
    )
    dense_grad = tf.gradients(loss, w)[0]
    if not args.local:
        dense_grad = hccl_adapter.allreduce(dense_grad, "sum") / ranks
    with tf.control_dependencies([sparse_train]):
        train = tf.group(w.assign_sub(0.1 * dense_grad), global_step.assign_add(1))
    serve_ids = [
        tf.compat.v1.placeholder(tf.int64, [None, 2], name="serve_ids%d" % t)
        for t in range(len(DIMS))
    ]
    served = [
        sparse_lookup(t, i, is_train=False, name="serve%d" % n, serving_default_value=DEFAULT)
        for n, (t, i) in enumerate(zip(tables, serve_ids))
    ]
    inputs = {"ids%d" % t: i for t, i in enumerate(serve_ids)}
    outputs = {"p": tf.sigmoid(model(served))}
    outputs.update({"rows%d" % t: e for t, e in enumerate(served)})
    evict = evict_tables(tables)
    # Every shard's rows (rank 0 has a handle of each; the other ranks need none).
    exports = []
    for t in tables:
        shards = []
        for _, shard, r, _ in ranks_module.managed_shards(t):
            with tf.device(t.ranks.devices[r] if t.ranks else None):
                shards.append(shard.export())
        exports.append(shards)
    out = args.dir
    os.makedirs(out, exist_ok=True)
    pusher = None
    config = dist.worker_config(server, collective=True) if server else None
    with tf.compat.v1.Session(server.target if server else "", config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(args.steps):
            parts = [batch(r, step, args.local or ranks) for r in range(args.local or ranks)]
            if args.local:
                data = [np.concatenate(p) for p in zip(*parts)]
            else:
                data = parts[rank]
            # Progress, shown by the test when a rank fails or hangs (which step, which part).
            print("rank %d step %d: train" % (rank, step), flush=True)
            sess.run(train, dict(zip(ids + [labels], data)))
            if rank != 0:
                continue
            print("rank 0 step %d: evict, export or push" % step, flush=True)
            if step % 3 == 2:
                sess.run(evict)
            if step == EXPORT_AT:
                export_serving_model(
                    sess, os.path.join(out, "export"), inputs, outputs, os.path.join(out, "push")
                )
                export_saved_model(sess, os.path.join(out, "frozen"), inputs, outputs)
                pusher = Pusher(os.path.join(out, "push"), base_fraction=args.base_fraction)
                version = 0
            elif pusher is not None and (step - EXPORT_AT) % args.push_every == 0:
                version = pusher.push(sess)
            else:
                continue
            if version is not None:
                rows = {}
                for t, shards in enumerate(sess.run(exports)):
                    rows["keys%d" % t] = np.concatenate([keys for keys, _, _ in shards])
                    rows["values%d" % t] = np.concatenate([values for _, values, _ in shards])
                np.savez(os.path.join(out, "rows-%d.npz" % version), **rows)
        # The last step's exchange waits for every rank: each leaves after rank 0's pushes.
        if not args.local:
            sess.run(hccl_adapter.allreduce(tf.ones([1]), "sum"))
    print("rank %d done, pushed %d" % (rank, pusher.pushes if pusher else 0), flush=True)


if __name__ == "__main__":
    main()
