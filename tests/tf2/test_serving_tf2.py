"""Serving updates from Keras (TF2): export_keras_serving_model + PushCallback; a process
that never imports rec_sdk loads the SavedModel with tf.saved_model.load, applies every update
through its "apply_update" signature and predicts what the trained model predicts."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk import serving

K = tf.keras.optimizers

_LOADER = """
import os, sys
import numpy as np
import tensorflow as tf
export_dir, push_dir, probe, out = sys.argv[1:]
served = tf.saved_model.load(export_dir)
with open(export_dir + "/saved_model.pb", "rb") as f:
    assert b"RecSdk>" not in f.read()
versions = [int(served.signatures["version"](request=tf.constant(0, tf.int64))["version"])]
for name in sorted(os.listdir(push_dir)):
    if name.isdigit():
        update_dir = tf.constant(os.path.join(push_dir, name))
        got = served.signatures["apply_update"](update_dir=update_dir)
        versions.append(int(got["version"]))
result = served.signatures["serving_default"](tf.constant(np.load(probe)))
np.savez(out, out=list(result.values())[0].numpy(), versions=np.array(versions))
assert "rec_sdk" not in sys.modules
"""


def _model(name, servable=True):
    inputs = tf.keras.layers.Input(shape=(2,), dtype=tf.int64)
    emb = de.keras.layers.Embedding(
        3, name=name, initializer=0.5, devices=["/CPU:0"] * 2, servable=servable
    )
    out = tf.keras.layers.Dense(1)(tf.reduce_sum(emb(inputs), axis=1))
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(K.legacy.Adam(0.05)), loss="mse")
    return model, emb


def test_keras_pushes_reach_a_model_served_by_stock_tensorflow(tmp_path):
    model, emb = _model("served_emb")
    rng = np.random.RandomState(0)
    model.fit(rng.randint(0, 20, (32, 2)), rng.rand(32, 1), batch_size=8, epochs=1, verbose=0)
    push_dir = str(tmp_path / "push")
    exported = serving.export_keras_serving_model(model, str(tmp_path / "export"), push_dir)
    assert exported["rows"] == int(emb.params.size())
    callback = serving.PushCallback(push_dir, every_batches=2)
    # New ids arrive: pushes carry the rows changed in both shards and the dense layer.
    model.fit(
        rng.randint(0, 60, (40, 2)),
        rng.rand(40, 1),
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[callback],
    )
    assert callback.pusher.pushes == 3 and callback.pusher.whole_tables == 0
    probe = np.array([[1, 2], [3, 59], [88, 99], [40, 41]], np.int64)  # 88, 99 never trained
    expected = model.predict(probe, verbose=0)
    np.save(str(tmp_path / "probe.npy"), probe)
    subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADER,
            str(tmp_path / "export"),
            push_dir,
            str(tmp_path / "probe.npy"),
            str(tmp_path / "out.npz"),
        ],
        check=True,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    got = np.load(str(tmp_path / "out.npz"))
    np.testing.assert_array_equal(got["versions"], [0, 1, 2, 3])
    np.testing.assert_allclose(got["out"], expected, rtol=1e-5, atol=1e-6)


def test_a_variable_that_is_not_servable_is_refused_by_name(tmp_path):
    model, _ = _model("plain_served_emb", servable=False)
    model.predict(np.array([[1, 2]], np.int64), verbose=0)
    with pytest.raises(ValueError, match="plain_served_emb.*servable=True"):
        serving.export_keras_serving_model(model, str(tmp_path / "e"), str(tmp_path / "p"))
