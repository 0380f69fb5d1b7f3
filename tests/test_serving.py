"""Serving export: a SavedModel with only stock TensorFlow ops, loaded in a process that never
imports rec_sdk, predicts exactly what the training graph's evaluation predicts."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from helpers import new_session
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.serving import export_saved_model
from rec_sdk.util.initialize import init

_LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    assert "rec_sdk" not in sys.modules
    export_dir, inputs_path, out_path = sys.argv[1:]
    feeds = np.load(inputs_path)
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        ops = {op.type for op in sess.graph.get_operations()}
        assert not any(t.startswith("RecSdk") for t in ops), ops
        sig = meta.signature_def["serving_default"]
        feed = {sig.inputs[k].name: feeds[k] for k in sig.inputs}
        out = sess.run({k: v.name for k, v in sig.outputs.items()}, feed)
    np.savez(out_path, **out)
    assert "rec_sdk" not in sys.modules
""")


def test_saved_model_without_plugin_matches_eval(tmp_path):
    init(use_dynamic_expansion=False)
    users = create_table(
        tf.int64,
        4,
        "users",
        tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1),
        device_vocabulary_size=100,
    )
    items = create_table(
        tf.int64,
        4,
        "items",
        tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=2),
        device_vocabulary_size=100,
    )
    user_ids = tf.compat.v1.placeholder(tf.int64, [None], name="user_ids")
    item_ids = tf.compat.v1.placeholder(tf.int32, [None, 2], name="item_ids")
    dense = tf.compat.v1.placeholder(tf.float32, [None, 3], name="dense")
    w = tf.compat.v1.get_variable(
        "w", [4 + 8 + 3, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3)
    )

    def model(is_train):
        u = sparse_lookup(
            users,
            user_ids,
            is_train=is_train,
            name="u_train" if is_train else "u_eval",
            serving_default_value=None if is_train else 0.25,
        )
        # Item ids go through preprocessing ops before the lookup.
        i = sparse_lookup(
            items,
            tf.cast(item_ids, tf.int64) + 7,
            is_train=is_train,
            name="i_train" if is_train else "i_eval",
        )
        x = tf.concat([u, tf.reshape(i, [-1, 8]), dense], 1)
        return tf.reshape(tf.sigmoid(tf.matmul(x, w)), [-1])

    train_probs = model(True)
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    loss = tf.reduce_mean(tf.square(train_probs - labels))
    tables = [users, items]
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, var_list=[w]),
        lazy_adam.create_hash_optimizer(0.05).apply_gradients(
            zip(tf.gradients(loss, tables), tables)
        ),
    )
    eval_probs = model(False)
    rng = np.random.RandomState(0)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(20):
            sess.run(
                train,
                {
                    user_ids: rng.randint(0, 30, 16),
                    item_ids: rng.randint(0, 20, (16, 2)),
                    dense: rng.rand(16, 3),
                    labels: rng.rand(16),
                },
            )
        # Evaluation batch with keys never trained (users 50.., items 40..).
        feeds = {
            "user_ids": np.concatenate([rng.randint(0, 30, 6), [50, 51]]).astype(np.int64),
            "item_ids": np.concatenate([rng.randint(0, 20, (6, 2)), [[40, 3], [2, 41]]]).astype(
                np.int32
            ),
            "dense": rng.rand(8, 3).astype(np.float32),
        }
        expected = sess.run(
            eval_probs,
            {user_ids: feeds["user_ids"], item_ids: feeds["item_ids"], dense: feeds["dense"]},
        )
        rows = export_saved_model(
            sess,
            str(tmp_path / "serving"),
            inputs={"user_ids": user_ids, "item_ids": item_ids, "dense": dense},
            outputs={"probability": eval_probs},
        )
        assert rows == sess.run(users.size_tensor()) + sess.run(items.size_tensor())
    np.savez(str(tmp_path / "inputs.npz"), **feeds)
    script = tmp_path / "load.py"
    script.write_text(_LOADER)
    subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "serving"),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "out.npz"),
        ],
        check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    with np.load(str(tmp_path / "out.npz")) as out:
        np.testing.assert_array_equal(out["probability"], expected)


def test_export_rejects_feature_spec_style_graphs(tmp_path):
    init()
    table = create_table(
        tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=10
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, is_train=False)
    # An output that reads the table another way than through an id-tensor lookup.
    values, _ = table.lookup(ids)
    out = tf.reduce_sum(emb) + tf.reduce_sum(values)
    with new_session() as sess:
        with pytest.raises(ValueError, match="depend on rec_sdk ops"):
            export_saved_model(sess, str(tmp_path / "s"), {"ids": ids}, {"out": out})


def test_export_serves_embeddings_and_survives_name_clashes(tmp_path):
    init()
    table = create_table(
        tf.int64,
        3,
        "t",
        tf.compat.v1.random_uniform_initializer(0.5, 1.0, seed=1),
        device_vocabulary_size=10,
    )
    # Inputs named like the export's own scopes, int32 ids cast before the lookup.
    ids = tf.compat.v1.placeholder(tf.int32, [None], name="ids")
    model = tf.compat.v1.placeholder(tf.float32, [None], name="model")
    emb = sparse_lookup(table, tf.cast(ids, tf.int64), is_train=False)
    score = tf.reduce_sum(emb, 1) * model
    with new_session() as sess:
        sess.run(table.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 3])))
        feed = {ids: np.array([1, 2, 7], np.int32), model: np.array([1.0, 2.0, 3.0], np.float32)}
        expected_emb, expected_score = sess.run([emb, score], feed)
        export_saved_model(
            sess,
            str(tmp_path / "s"),
            {"ids": ids, "model": model},
            {"embedding": emb, "score": score},
        )
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(tmp_path / "s"))
        sig = meta.signature_def["serving_default"]
        out = sess.run(
            {k: v.name for k, v in sig.outputs.items()},
            {sig.inputs["ids"].name: [1, 2, 7], sig.inputs["model"].name: [1.0, 2.0, 3.0]},
        )
    np.testing.assert_array_equal(out["embedding"], expected_emb)
    np.testing.assert_array_equal(out["score"], expected_score)


def _variables_bytes(export_dir):
    folder = os.path.join(export_dir, "variables")
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def test_rows_served_in_float16_and_int8_within_their_stated_error(tmp_path):
    """row_dtype="float16" serves each value rounded to float16; "int8" serves each row
    quantized with its own scale and bias: every value within (max - min) / 510 of its row,
    in under 0.3x the bytes of float32 rows at dim 64 (72 bytes a row instead of 256). Keys
    without a row read zeros."""
    init()
    dim, n = 64, 500
    table = create_table(
        tf.int64, dim, "q", tf.compat.v1.zeros_initializer(), device_vocabulary_size=n
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(table, ids, is_train=False)
    rng = np.random.default_rng(5)
    values = (rng.normal(0, 0.1, (n, dim)) * rng.uniform(0.1, 3, (n, 1))).astype(np.float32)
    keys = np.arange(n, dtype=np.int64) * 7
    probe = np.concatenate([keys, [1, 2]])  # two keys without a row
    sizes = {}
    with new_session() as sess:
        sess.run(table.upsert(tf.constant(keys), tf.constant(values)))
        for row_dtype in ("float32", "float16", "int8"):
            export_dir = str(tmp_path / row_dtype)
            assert (
                export_saved_model(
                    sess, export_dir, {"ids": ids}, {"emb": emb}, row_dtype=row_dtype
                )
                == n
            )
            sizes[row_dtype] = _variables_bytes(export_dir)
            with tf.compat.v1.Session(graph=tf.Graph()) as serving:
                meta = tf.compat.v1.saved_model.loader.load(serving, ["serve"], export_dir)
                sig = meta.signature_def["serving_default"]
                served = serving.run(sig.outputs["emb"].name, {sig.inputs["ids"].name: probe})
            np.testing.assert_array_equal(served[n:], 0)
            served = served[:n]
            if row_dtype == "float32":
                np.testing.assert_array_equal(served, values)
            elif row_dtype == "float16":
                np.testing.assert_array_equal(served, values.astype(np.float16).astype(np.float32))
            else:
                bound = (values.max(1) - values.min(1)) / 510
                error = np.abs(served - values).max(1)
                assert np.all(error <= bound * 1.001 + 1e-7), (error / bound).max()
                assert np.mean(np.abs(served - values)) < np.mean(bound) * 0.6
    # The rows' bytes: the files less the keys (8 bytes each in every export).
    rows = {k: v - 8 * n for k, v in sizes.items()}
    assert rows["int8"] < 0.3 * rows["float32"], sizes
    assert rows["float16"] < 0.52 * rows["float32"], sizes
    with pytest.raises(ValueError, match="row_dtype must be one of float32, float16, int8"):
        export_saved_model(None, str(tmp_path / "x"), {"ids": ids}, {"emb": emb}, row_dtype="int4")


def test_int8_rows_serve_movielens_within_0_003_auc(tmp_path):
    """A MovieLens-100k model (user, item and genre embeddings of dim 32, an MLP) served
    from int8 rows predicts the test set with an AUC within 0.003 of its float32 rows."""
    from rec_sdk.examples import data
    from rec_sdk.examples.metrics import auc

    features, _ = data.load_movielens_100k()
    train_rows, test_rows = data.train_test_split(features, 0.2, seed=0)
    init()
    dim = 32
    names = ("user_id", "item_id", "genres")
    tables = {
        n: create_table(
            tf.int64,
            dim,
            n,
            tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=i + 1),
            device_vocabulary_size=2000,
        )
        for i, n in enumerate(names)
    }
    inputs = {
        n: tf.compat.v1.placeholder(tf.int64, [None] if n != "genres" else [None, 6], name=n)
        for n in names
    }
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    w1 = tf.compat.v1.get_variable(
        "w1", [3 * dim, 32], initializer=tf.compat.v1.glorot_uniform_initializer(seed=4)
    )
    w2 = tf.compat.v1.get_variable(
        "w2", [32, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=5)
    )

    def logits(is_train):
        parts = []
        for n in names:
            e = sparse_lookup(
                tables[n],
                inputs[n],
                is_train=is_train,
                name=n + ("_train" if is_train else "_eval"),
            )
            parts.append(tf.reduce_mean(e, 1) if n == "genres" else e)
        hidden = tf.nn.relu(tf.matmul(tf.concat(parts, 1), w1))
        return tf.reshape(tf.matmul(hidden, w2), [-1])

    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits(True))
    )
    table_list = list(tables.values())
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(3e-3).minimize(loss, var_list=[w1, w2]),
        lazy_adam.create_hash_optimizer(3e-3).apply_gradients(
            zip(tf.gradients(loss, table_list), table_list)
        ),
    )
    prob = tf.sigmoid(logits(False))
    n_train = len(train_rows["label"])
    test_feed = {n: test_rows[n] for n in names}
    aucs = {}
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _epoch in range(2):
            for first in range(0, n_train, 1024):
                batch = slice(first, first + 1024)
                feed = {inputs[n]: train_rows[n][batch] for n in names}
                feed[labels] = train_rows["label"][batch]
                sess.run(train, feed)
        expected = sess.run(prob, {inputs[n]: test_feed[n] for n in names})
        for row_dtype in ("float32", "int8"):
            export_dir = str(tmp_path / row_dtype)
            export_saved_model(sess, export_dir, inputs, {"prob": prob}, row_dtype=row_dtype)
            with tf.compat.v1.Session(graph=tf.Graph()) as serving:
                meta = tf.compat.v1.saved_model.loader.load(serving, ["serve"], export_dir)
                sig = meta.signature_def["serving_default"]
                served = serving.run(
                    sig.outputs["prob"].name, {sig.inputs[n].name: test_feed[n] for n in names}
                )
            aucs[row_dtype] = auc(test_rows["label"], served)
            if row_dtype == "float32":
                np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    print("served AUC", aucs)
    assert aucs["float32"] > 0.75, aucs
    assert abs(aucs["int8"] - aucs["float32"]) < 0.003, aucs
