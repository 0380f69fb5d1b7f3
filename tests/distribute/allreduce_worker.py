"""A worker of tests/test_distribute.py's data-parallel test: each training task of TF_CONFIG
fits its own copy of a linear model on its own batches, averaging the gradients with
rec_sdk.distribute.all_reduce every step; writes its final weights and its all-reduced
integer sums to OUT.npz.

    python allreduce_worker.py OUT.npz
"""

import sys

import numpy as np
import tensorflow as tf

import rec_sdk.distribute as dist

tf.compat.v1.disable_eager_execution()
STEPS = 20


def batches(rank):
    rng = np.random.default_rng(rank)
    return [
        (rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32))
        for _ in range(STEPS)
    ]


def main(out):
    server = dist.start_server(collective=True)
    task = dist.current_task()
    rank = dist.worker_devices(task).index(
        "/job:%s/replica:0/task:%d/device:CPU:0" % (task.job_name, task.task_index)
    )
    with tf.device("/job:%s/task:%d" % (task.job_name, task.task_index)):
        x = tf.compat.v1.placeholder(tf.float32, [8, 3])
        y = tf.compat.v1.placeholder(tf.float32, [8, 1])
        w = tf.Variable(tf.ones([3, 1]), name="w")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        grad = dist.all_reduce(tf.gradients(loss, w)[0], "mean")
        train = w.assign_sub(0.1 * grad)
        total = dist.all_reduce(tf.constant([rank + 1, 10 * (rank + 1)], tf.int64), "sum")
        largest = dist.all_reduce(tf.constant(float(rank)), "max")
    with tf.compat.v1.Session(server.target, config=dist.worker_config(task, True)) as sess:
        sess.run(w.initializer)
        for bx, by in batches(rank):
            sess.run(train, {x: bx, y: by})
        np.savez(out, w=sess.run(w), total=sess.run(total), largest=sess.run(largest))


if __name__ == "__main__":
    main(sys.argv[1])
