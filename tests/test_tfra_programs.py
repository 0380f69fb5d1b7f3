"""What TFRA's demo programs (demo/dynamic_embedding of tensorflow/recommenders-addons) rely on,
used the way they use it: TF1-style SavedModels with de tables served by a process that
loads them with either loader (every row there: served predictions equal the training
graph's), and the warm start of de.Variables from another model's checkpoint."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk.base import tf_compat
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.util.initialize import init

USERS = np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int64)
ITEMS = np.array([10, 20, 30, 40, 10, 20, 30, 40], np.int64)

# A serving process: it imports rec_sdk (for the op library) and nothing of the training
# script, loads the SavedModel with both loaders and prints both loaders' predictions.
_SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
import rec_sdk.dynamic_embedding  # noqa: F401  (the op library, as `import tfra` for TFRA)
export, signature, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
feed = {k: np.array(v, np.int64) for k, v in inputs.items()}
with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export)
    sig = meta.signature_def[signature]
    out_name = next(iter(sig.outputs.values())).name
    v1 = sess.run(out_name, {sig.inputs[k].name: v for k, v in feed.items()})
loaded = tf.saved_model.load(export)
fn = loaded.signatures[signature]
v2 = next(iter(fn(**{k: tf.constant(v) for k, v in feed.items()}).values())).numpy()
print("SERVED " + json.dumps({"v1": np.ravel(v1).tolist(), "v2": np.ravel(v2).tolist()}))
"""


def _serve(export, signature, inputs):
    """Predictions of the SavedModel at `export` in a fresh process, by both loaders."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _SERVE,
            export,
            signature,
            json.dumps({k: v.tolist() for k, v in inputs.items()}),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("SERVED ")]
    assert lines, result.stderr[-3000:]
    served = json.loads(lines[0][len("SERVED ") :])
    return np.array(served["v1"]), np.array(served["v2"])


def _data():
    rng = np.random.RandomState(0)
    users = rng.randint(1, 9, 512).astype(np.int64)
    items = rng.choice([10, 20, 30, 40], 512).astype(np.int64)
    labels = (users % 3 + items / 10.0).astype(np.float32)  # depends on both ids
    return users, items, labels


def _model_fn(features, labels, mode, params):
    estimator = tf_compat.estimator()
    train = mode == estimator.ModeKeys.TRAIN
    initializer = (
        tf.keras.initializers.RandomNormal(0.0, 0.1) if train else tf.keras.initializers.Zeros()
    )
    user = de.get_variable("user_emb", dim=4, initializer=initializer)
    item = de.get_variable(params.get("item_name", "item_emb"), dim=4, initializer=initializer)
    u = de.embedding_lookup(user, features["user_id"], name="u")
    m = de.embedding_lookup(item, features["movie_id"], name="m")
    weights = tf.compat.v1.get_variable(params.get("dense_name", "dense"), [8, 1])
    out = tf.reshape(tf.matmul(tf.concat([u, m], 1), weights), [-1])
    if mode == estimator.ModeKeys.PREDICT:
        return estimator.EstimatorSpec(
            mode,
            predictions={"out": out},
            export_outputs={"out": estimator.export.PredictOutput({"out": out})},
        )
    loss = tf.reduce_mean(tf.square(out - labels))
    opt = de.DynamicEmbeddingOptimizer(
        tf.compat.v1.train.AdamOptimizer(params.get("learning_rate", 0.05))
    )
    return estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step()),
        training_chief_hooks=params.get("chief_hooks", []),
    )


def _input_fn():
    users, items, labels = _data()
    return (
        tf.data.Dataset.from_tensor_slices(({"user_id": users, "movie_id": items}, labels))
        .repeat(10)
        .batch(64)
    )


def _predict_input():
    return tf.data.Dataset.from_tensor_slices({"user_id": USERS, "movie_id": ITEMS}).batch(8)


@pytest.mark.estimator
def test_an_estimators_saved_model_serves_every_row_through_both_loaders(tmp_path):
    estimator = tf_compat.estimator()
    model = estimator.Estimator(_model_fn, model_dir=str(tmp_path / "ckpt"), params={})
    model.train(_input_fn, max_steps=60)
    trained = np.array([p["out"] for p in model.predict(_predict_input)])
    receiver = estimator.export.build_raw_serving_input_receiver_fn(
        {"user_id": tf.constant([1], tf.int64), "movie_id": tf.constant([1], tf.int64)}
    )
    export = model.export_saved_model(str(tmp_path / "export"), receiver).decode()
    assert os.path.isdir(os.path.join(export, "variables", "sparse-variables"))
    v1, v2 = _serve(export, "serving_default", {"user_id": USERS, "movie_id": ITEMS})
    assert np.std(trained) > 0.3  # the rows matter: an empty table serves one constant
    np.testing.assert_allclose(v1, trained, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v2, trained, rtol=1e-5, atol=1e-6)


def test_a_builders_saved_model_of_both_apis_serves_every_row(tmp_path):
    """tf.compat.v1.saved_model.Builder in a Session (no Estimator), with a de.Variable and
    a create_table table in one graph."""
    init(use_dynamic=True)
    users, items, labels = _data()
    user_ids = tf.compat.v1.placeholder(tf.int64, [None], name="user_id")
    item_ids = tf.compat.v1.placeholder(tf.int64, [None], name="movie_id")
    target = tf.compat.v1.placeholder(tf.float32, [None])
    user = de.get_variable(
        "user_emb", dim=4, initializer=tf.keras.initializers.RandomNormal(0.0, 0.1)
    )
    table = create_table(
        tf.int64,
        4,
        "item_table",
        tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=1),
        device_vocabulary_size=100,
    )
    u = de.embedding_lookup(user, user_ids, name="u")
    m = sparse_lookup(table, item_ids, None, is_train=True, name="m")
    weights = tf.compat.v1.get_variable("dense", [8, 1])
    out = tf.reshape(tf.matmul(tf.concat([u, m], 1), weights), [-1], name="out")
    loss = tf.reduce_mean(tf.square(out - target))
    train = tf.group(
        de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05)).minimize(loss),
        lazy_adam.create_hash_optimizer(0.05).minimize(loss, var_list=[table]),
    )
    export = str(tmp_path / "export")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(60):
            batch = slice((step * 64) % 512, (step * 64) % 512 + 64)
            sess.run(train, {user_ids: users[batch], item_ids: items[batch], target: labels[batch]})
        trained = sess.run(out, {user_ids: USERS, item_ids: ITEMS})
        signature = tf.compat.v1.saved_model.predict_signature_def(
            {"user_id": user_ids, "movie_id": item_ids}, {"out": out}
        )
        builder = tf.compat.v1.saved_model.Builder(export)
        builder.add_meta_graph_and_variables(
            sess, ["serve"], signature_def_map={"serving_default": signature}
        )
        builder.save()
    v1, v2 = _serve(export, "serving_default", {"user_id": USERS, "movie_id": ITEMS})
    assert np.std(trained) > 0.3
    np.testing.assert_allclose(v1, trained, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v2, trained, rtol=1e-5, atol=1e-6)


@pytest.mark.estimator
def test_warm_start_of_tables_from_another_models_checkpoint(tmp_path):
    """de.WarmStartHook in training_chief_hooks starts a new model from the first model's
    rows."""
    estimator = tf_compat.estimator()
    first_dir = str(tmp_path / "first")
    first = estimator.Estimator(_model_fn, model_dir=first_dir, params={})
    first.train(_input_fn, max_steps=40)
    # The second model: other dense variables and another item table, the user table
    # warm-started (not trained: learning rate 0).
    second = estimator.Estimator(
        _model_fn,
        model_dir=str(tmp_path / "second"),
        params={
            "item_name": "other_items",
            "dense_name": "other_dense",
            "learning_rate": 0.0,
            "chief_hooks": [de.WarmStartHook(first_dir, ["user_emb"])],
        },
    )
    second.train(_input_fn, max_steps=1)

    def rows(model_dir, name):
        with tf.Graph().as_default():
            var = de.get_variable(name, dim=4)
            tf.compat.v1.train.get_or_create_global_step()
            export = var.export()
            with tf.compat.v1.Session() as sess:
                tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(model_dir))
                keys, values = sess.run(export)
        return dict(zip(keys.tolist(), values.tolist()))

    warmed, original = rows(str(tmp_path / "second"), "user_emb"), rows(first_dir, "user_emb")
    assert sorted(warmed) == sorted(original) == list(range(1, 9))
    for key in original:
        np.testing.assert_allclose(warmed[key], original[key], rtol=1e-6)
