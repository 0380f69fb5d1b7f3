"""A CTR model whose embedding table is sharded over the ps tasks of a TensorFlow cluster
(TFRA's ps/worker recipe on rec_sdk), trained by asynchronous workers. Try it on one machine:

    python -m rec_sdk.distribute.launch --ps 2 --workers 2 -- \\
        python -m rec_sdk.examples.distributed_de --steps 300

or without a cluster (TF_CONFIG unset: the shards live in this process). Each worker reads
its own synthetic batches (user and item ids; the label is a fixed function of them), looks
both fields up in one de.Variable on the ps tasks, trains a small MLP with
DynamicEmbeddingOptimizer(Adam) under MonitoredTrainingSession, and prints its loss and
accuracy; the chief (worker 0) saves checkpoints with --checkpoint-dir.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rec_sdk.distribute as dist  # noqa: E402
import rec_sdk.dynamic_embedding as de  # noqa: E402

USERS, ITEMS, DIM = 5000, 2000, 8


def batch(rng, size):
    """(ids [size, 2] int64 with items offset past the users, labels [size, 1])."""
    users = rng.integers(0, USERS, size)
    items = rng.integers(0, ITEMS, size)
    labels = ((users % 7 + items % 5) % 2).astype(np.float32)[:, None]
    return np.stack([users, USERS + items], 1).astype(np.int64), labels


def _dense(x, units, name):
    w = tf.compat.v1.get_variable(
        name + "_w",
        [x.shape[-1], units],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=2),
    )
    b = tf.compat.v1.get_variable(name + "_b", [units], initializer=tf.zeros_initializer())
    return tf.matmul(x, w) + b


def model(ids, labels, devices):
    """-> (loss, accuracy, train op) of the ids' embeddings through an MLP."""
    table = de.get_variable(
        "user_item",
        dim=DIM,
        devices=devices,
        initializer=tf.compat.v1.random_normal_initializer(0, 0.1, seed=1),
    )
    emb = tf.reshape(de.embedding_lookup(table, ids, name="user_item_lookup"), [-1, 2 * DIM])
    hidden = tf.nn.relu(_dense(emb, 16, "hidden"))
    logits = _dense(hidden, 1, "logits")
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(logits > 0, labels > 0.5), tf.float32))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.01)).minimize(
        loss, global_step=step
    )
    return loss, accuracy, train


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m rec_sdk.examples.distributed_de", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=300, help="steps of this worker")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--checkpoint-dir", help="where the chief saves checkpoints")
    args = parser.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    if os.environ.get("TF_CONFIG"):
        server = dist.start_server()
        task = dist.current_task()
        index, chief, target = task.task_index, task.task_index == 0, server.target
        config = dist.worker_config(server)
        devices = dist.ps_devices(server) if "ps" in task.cluster.jobs else ["/CPU:0"]
        placement = tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % index, cluster=task.cluster
        )
    else:
        index, chief, target, config = 0, True, "", None
        devices, placement = ["/CPU:0", "/CPU:0"], None
    with tf.compat.v1.device(placement):
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss, accuracy, train = model(ids, labels, devices)
    rng = np.random.default_rng(index)
    seen = []
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=target,
        is_chief=chief,
        config=config,
        checkpoint_dir=args.checkpoint_dir if chief else None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    ) as sess:
        for i in range(1, args.steps + 1):
            x, y = batch(rng, args.batch)
            value, acc, _ = sess.run([loss, accuracy, train], {ids: x, labels: y})
            seen.append((value, acc))
            if i % 100 == 0 or i == args.steps:
                recent = np.mean(seen[-50:], axis=0)
                print(
                    "worker %d step %d: loss %.4f accuracy %.3f (last 50 steps)"
                    % (index, i, recent[0], recent[1]),
                    flush=True,
                )


if __name__ == "__main__":
    main()
