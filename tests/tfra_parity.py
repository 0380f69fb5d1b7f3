"""Runs one scenario with TFRA 0.7.2 or with rec_sdk.dynamic_embedding and prints the results
as JSON (run by tests/test_dynamic_embedding.py in a subprocess per library: importing TFRA
patches TensorFlow globally).

    python tests/tfra_parity.py tfra|rec_sdk
"""

import json
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
DIM = 4


def sorted_rows(keys, values):
    order = np.argsort(keys)
    return [int(k) for k in keys[order]], values[order].round(6).tolist()


def main(library):
    if library == "tfra":
        import tensorflow_recommenders_addons.dynamic_embedding as de
    else:
        import rec_sdk.dynamic_embedding as de
    out = {}
    rng = np.random.default_rng(0)
    # 1. lookup / upsert / remove / accum / export / size on 3 shards.
    v = de.Variable(dim=DIM, initializer=0.25, devices=["/CPU:0"] * 3, name="semantics")
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    flags = tf.compat.v1.placeholder(tf.bool, [None])
    ops = {
        "upsert": v.upsert(keys, values),
        "remove": v.remove(keys),
        "accum": v.accum(keys, values * 0.0, values, flags),
    }
    looked, exists = v.lookup(keys, return_exists=True)
    export, size = v.export(), v.size()
    trace = []
    # 2. training on a table pre-filled with values (so initial values agree), unique ids.
    opts = {
        "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
        "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
        "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    }
    trained = {}
    for name, make in opts.items():
        t = de.Variable(dim=DIM, initializer=0.1, name="train_" + name)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        target = tf.compat.v1.placeholder(tf.float32, [None])
        emb = de.embedding_lookup(t, ids, name="lookup_" + name)
        dense = tf.compat.v1.get_variable("dense_" + name, initializer=tf.ones([DIM]) * 0.3)
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(emb * dense, axis=1) - target))
        train = de.DynamicEmbeddingOptimizer(make()).minimize(loss)
        trained[name] = (t, ids, target, loss, train)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(20):
            k = rng.integers(-30, 30, size=10).astype(np.int64)
            what = ["upsert", "remove", "accum"][step % 3]
            if what == "upsert":
                k = np.unique(k)
            feed = {
                keys: k,
                values: rng.normal(size=(len(k), DIM)).astype(np.float32),
                flags: rng.random(len(k)) < 0.5,
            }
            if what == "accum":
                feed[keys] = np.unique(k)
                feed[values] = feed[values][: len(feed[keys])]
                feed[flags] = feed[flags][: len(feed[keys])]
            sess.run(ops[what], feed)
            probe = np.arange(-32, 32, dtype=np.int64)
            got, ex = sess.run([looked, exists], {keys: probe})
            trace.append(
                {
                    "lookup": got.round(6).tolist(),
                    "exists": ex.tolist(),
                    "size": int(sess.run(size)),
                    "export": sorted_rows(*sess.run(export)),
                }
            )
        out["semantics"] = trace
        for name, (t, ids, target, loss, train) in trained.items():
            init = np.arange(0, 40, dtype=np.int64)
            sess.run(
                t.upsert(
                    tf.constant(init),
                    tf.constant(rng.normal(0, 0.1, size=(40, DIM)).astype(np.float32)),
                )
            )
            losses = []
            for _ in range(15):
                batch = rng.choice(60, size=16, replace=False).astype(np.int64)  # 40..59 new
                feed = {ids: batch, target: (batch % 3).astype(np.float32)}
                losses.append(float(sess.run([loss, train], feed)[0]))
            out["train_" + name] = {"losses": losses, "export": sorted_rows(*sess.run(t.export()))}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
