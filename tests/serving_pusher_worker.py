"""A trainer that exports and pushes serving updates, for tests/test_serving_updates.py.

python serving_pusher_worker.py ROOT first   export, push updates 1 and 2, then start update
                                              3 and stall inside its writes (ROOT/stalled
                                              appears): the test kills it there
python serving_pusher_worker.py ROOT second  a new trainer (other rows) pushes into the same
                                              chain; its evaluation outputs go to
                                              ROOT/expected.npz
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from rec_sdk.base import atomic_dir
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.serving import Pusher, export_serving_model
from rec_sdk.util.initialize import init


def main(root, mode):
    tf.compat.v1.disable_eager_execution()
    init(use_dynamic_expansion=False)
    seed = 1 if mode == "first" else 7
    table = create_table(
        tf.int64,
        4,
        "users",
        tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=seed),
        device_vocabulary_size=1000,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    w = tf.compat.v1.get_variable(
        "w", [4, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed)
    )

    def model(train):
        e = sparse_lookup(table, ids, is_train=train, name="train" if train else "eval")
        return tf.reshape(tf.matmul(e, w), [-1]), e

    probs, _ = model(True)
    loss = tf.reduce_mean(tf.square(probs - 1.0))
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, var_list=[w]),
        lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            zip(tf.gradients(loss, [table]), [table])
        ),
    )
    eval_probs, eval_emb = model(False)
    rng = np.random.RandomState(seed)
    push_dir = os.path.join(root, "push")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())

        def steps(n):
            for _ in range(n):
                sess.run(train, {ids: rng.randint(0, 100, 16)})

        steps(3)
        if mode == "first":
            export_serving_model(
                sess,
                os.path.join(root, "export"),
                {"ids": ids},
                {"p": eval_probs, "e": eval_emb},
                push_dir,
            )
        pusher = Pusher(push_dir)
        if mode == "first":
            for _ in range(2):
                steps(2)
                pusher.push(sess)
            write = atomic_dir.write_file

            def stalling_write(path, data):
                write(path, data)
                open(os.path.join(root, "stalled"), "w").close()
                time.sleep(600)

            atomic_dir.write_file = stalling_write  # the update's files stall
            steps(2)
            pusher.push(sess)
        else:
            steps(2)
            pusher.push(sess)
            q = np.arange(0, 120, dtype=np.int64)
            out = sess.run({"p": eval_probs, "e": eval_emb}, {ids: q})
            np.savez(os.path.join(root, "expected.npz"), ids=q, **out)
            print("whole tables:", pusher.whole_tables)


if __name__ == "__main__":
    main(*sys.argv[1:])
