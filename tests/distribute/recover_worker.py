"""A worker of tests/test_distribute.py's ps-failure test: the chief trains a de.Variable on
the ps task of TF_CONFIG under MonitoredTrainingSession with a checkpoint every 10 steps. After
step 25 it writes "killme" beside OUT and waits until "restarted" appears (the test kills the
ps with SIGKILL and starts a new one on the same port meanwhile). Then it goes on to step 40:
MonitoredTrainingSession recreates the session and the Saver restores the tables from the
last checkpoint (step 20). OUT.npz gets the global step, the keys held at the end and the
per-step log of (step run, global step after it).

    python recover_worker.py OUT.npz CKPT_DIR
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import rec_sdk.distribute
import rec_sdk.dynamic_embedding as de

tf.compat.v1.disable_eager_execution()
BATCH, DIM = 16, 4


def main(out, ckpt_dir):
    server = rec_sdk.distribute.start_server()
    here = os.path.dirname(os.path.abspath(out))
    with tf.device("/job:worker/task:0"):
        var = de.get_variable(
            "emb", dim=DIM, devices=rec_sdk.distribute.ps_devices(server), initializer=0.1
        )
        ids = tf.compat.v1.placeholder(tf.int64, [BATCH])
        loss = tf.reduce_sum(de.embedding_lookup(var, ids, name="lookup"))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
            loss, global_step=step
        )
        keys = var.export()[0]
    log = []
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=True,
        checkpoint_dir=ckpt_dir,
        save_checkpoint_steps=10,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        config=rec_sdk.distribute.worker_config(server),
    ) as sess:
        done = 0
        while done < 40:
            # A run that meets the dead ps is retried by MonitoredTrainingSession on a new
            # session (TensorFlow's preemption handling).
            value = sess.run([train, step], {ids: np.arange(BATCH) + 100 * (done // 10)})[1]
            done += 1
            log.append((done, value))
            if done == 25:
                open(os.path.join(here, "killme"), "w").close()
                while not os.path.exists(os.path.join(here, "restarted")):
                    time.sleep(0.05)
        held = sess.run(keys)
        final = sess.run(step)
    np.savez(out, log=np.array(log), held=np.sort(held), final=final)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
