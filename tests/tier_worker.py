"""A training process with a tiered table (64 rows in memory, the rest on SSD) that saves a
checkpoint every few steps and runs until it is killed: tests/test_tier.py kills it with
SIGKILL in the middle of demotions and compactions and checks what a restore gives.

The model is deterministic (batch k depends on k only), so a test can replay it.

Usage: python tests/tier_worker.py CHECKPOINT_DIR SSD_DIR
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.optimizers import lazy_adam  # noqa: E402
from rec_sdk.util import initialize  # noqa: E402

DIM = 8
SAVE_EVERY = 5


def batch(step):
    """The keys of step `step` (Zipf, unique)."""
    rng = np.random.default_rng(step)
    return np.unique(rng.zipf(1.2, 48) % 5000).astype(np.int64)


def build(ssd_dir=None):
    """(ids placeholder, train op, table, global step): a tiered table when ssd_dir is
    given, otherwise all in memory."""
    initialize.init()
    sizes = dict(device_vocabulary_size=64, host_vocabulary_size=0)
    if ssd_dir is not None:
        sizes.update(host_vocabulary_size=1, ssd_vocabulary_size=100000, ssd_data_path=ssd_dir)
        sizes["device_vocabulary_size"] = 63
    else:
        sizes["device_vocabulary_size"] = 100000
    table = create_table(
        tf.int64, DIM, "tiered", tf.compat.v1.random_normal_initializer(seed=5), **sizes
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, name="lookup")
    loss = tf.reduce_sum(tf.square(emb - 0.25))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = lazy_adam.create_hash_optimizer(learning_rate=0.05).minimize(loss, global_step=step)
    return ids, train, table, step


def main(checkpoint_dir, ssd_dir):
    tf.compat.v1.disable_eager_execution()
    ids, train, _, step = build(ssd_dir)
    saver = tf.compat.v1.train.Saver(max_to_keep=3)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        k = 0
        while True:
            sess.run(train, {ids: batch(k)})
            k += 1
            if k % SAVE_EVERY == 0:
                saver.save(sess, os.path.join(checkpoint_dir, "model"), global_step=step)
                print("saved", k, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
