"""A worker of tests/test_distribute.py's asynchronous test (TFRA's ps/worker recipe): the
task of TF_CONFIG trains a de.Variable on the ps tasks and a dense layer placed by
replica_device_setter with MonitoredTrainingSession; the chief (task 0) also restricts the
variable and saves checkpoints. Writes the keys it trained (and with --export, only the
variable's keys as the ps tasks hold them) to an .npy. Files beside OUT make the two start
training together: worker 1 opens its session once the chief's is up (so it does not sit out
TensorFlow's 30 s readiness poll), and the chief trains once worker 1's is up.

    python async_worker.py OUT.npy CKPT_DIR [--export] [--steps N]
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import rec_sdk.distribute
import rec_sdk.dynamic_embedding as de

tf.compat.v1.disable_eager_execution()
BATCH, STEPS, DIM = 32, 100, 4


def main(out, ckpt_dir, export, steps=STEPS):
    server = rec_sdk.distribute.start_server()
    task = server.rec_sdk_task
    chief = task.task_index == 0
    with tf.compat.v1.device(
        tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task.task_index, cluster=task.cluster
        )
    ):
        var = de.get_variable(
            "emb",
            dim=DIM,
            devices=rec_sdk.distribute.ps_devices(server),
            initializer=0.1,
            restrict_policy=de.TimestampRestrictPolicy,
        )
        ids = tf.compat.v1.placeholder(tf.int64, [BATCH])
        emb = de.embedding_lookup(var, ids, name="lookup")
        w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(emb, w) - 1.0))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
            loss, global_step=step
        )
        restrict = var.restrict(10**6, trigger=1)  # the chief's eviction pass (keeps all)
        keys = var.export()[0]
    config = rec_sdk.distribute.worker_config(server)
    if export:
        with tf.compat.v1.Session(server.target, config=config) as sess:
            np.save(out, sess.run(keys))
        return
    rng = np.random.default_rng(task.task_index)
    trained = []
    here = os.path.dirname(os.path.abspath(out))
    if not chief:
        _wait_for(os.path.join(here, "chief.ready"))
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=chief,
        config=config,
        checkpoint_dir=ckpt_dir if chief else None,
        save_checkpoint_steps=10,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    ) as sess:
        open(os.path.join(here, "%s.ready" % ("chief" if chief else "worker")), "w").close()
        if chief:
            _wait_for(os.path.join(here, "worker.ready"))
        for i in range(steps):
            batch = rng.integers(task.task_index * 1000, task.task_index * 1000 + 500, BATCH)
            sess.run(train, {ids: batch})
            trained.append(batch)
            if chief and i % 25 == 24:
                sess.run(restrict)
    np.save(out, np.unique(np.concatenate(trained)))


def _wait_for(path, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError("%s did not appear in %d s" % (path, timeout))
        time.sleep(0.05)


if __name__ == "__main__":
    extra = sys.argv[3:]
    main(
        sys.argv[1],
        sys.argv[2],
        "--export" in extra,
        int(extra[extra.index("--steps") + 1]) if "--steps" in extra else STEPS,
    )
