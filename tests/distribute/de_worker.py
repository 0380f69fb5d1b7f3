"""A worker of tests/test_distribute.py. It trains a de.Variable for 50 fixed batches, or
restores one from a Saver checkpoint, then writes its exports (keys, rows, slots, access
statistics) to an .npz. The variable's shards are on the ps tasks of TF_CONFIG (the worker
serves through its own server), or with --local on N shards in this process.

    python de_worker.py OUT.npz [--local N] [--save DIR | --restore DIR]
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import rec_sdk.distribute
import rec_sdk.dynamic_embedding as de
from rec_sdk.ops import table_ops

tf.compat.v1.disable_eager_execution()
BATCH, STEPS, DIM = 64, 50, 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--local", type=int)
    parser.add_argument("--save")
    parser.add_argument("--restore")
    args = parser.parse_args()
    if args.local:
        devices, target, config = ["/CPU:0"] * args.local, "", None
    else:
        server = rec_sdk.distribute.start_server()
        devices = rec_sdk.distribute.ps_devices(server)
        target, config = server.target, rec_sdk.distribute.worker_config(server)
    rng = np.random.default_rng(0)
    batches = [rng.integers(-300, 300, BATCH) for _ in range(STEPS)]
    with tf.device("/CPU:0" if args.local else "/job:worker/task:0"):
        ids = tf.compat.v1.placeholder(tf.int64, [BATCH])
        var = de.get_variable(
            "emb",
            dim=DIM,
            devices=devices,
            initializer=tf.compat.v1.random_normal_initializer(seed=3),
            restrict_policy=de.FrequencyRestrictPolicy,
        )
        emb = de.embedding_lookup(var, ids, name="lookup")
        w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(emb, w) - 1.0))
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05)).minimize(loss)
        exports = [
            (table_ops.export(t.handle, tf.int64, t.dim), table_ops.export_access(t.handle))
            for t in var.tables
        ]
        saver = tf.compat.v1.train.Saver()
    # TFRA's ps recipe: each table's size, an int64 tensor computed where the table lives.
    sizes = [t.size() for t in var.tables]
    assert [s.device for s in sizes] == [t.resource_handle.device for t in var.tables]
    with tf.compat.v1.Session(target, config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = []
        if args.restore:
            saver.restore(sess, tf.train.latest_checkpoint(args.restore))
        else:
            losses = [sess.run([loss, train], {ids: b})[0] for b in batches]
        if args.save:
            saver.save(sess, os.path.join(args.save, "model"), global_step=STEPS)
        arrays = {
            "losses": np.array(losses),
            "sizes": np.array(sess.run(sizes)),
            "devices": np.array([t.handle.device for t in var.tables]),
        }
        for i, ((keys, rows, slots), (akeys, seen, counts)) in enumerate(sess.run(exports)):
            order, aorder = np.argsort(keys), np.argsort(akeys)
            arrays.update(
                {
                    "keys%d" % i: keys[order],
                    "rows%d" % i: rows[order],
                    "slots%d" % i: slots[:, order],
                    "seen%d" % i: seen[aorder],
                    "counts%d" % i: counts[aorder],
                }
            )
        np.savez(args.out, **arrays)


if __name__ == "__main__":
    main()
