"""What differs between the supported TensorFlow versions (rec_sdk.base.tf_compat): Estimator
only on 2.15, with a clear error naming the version elsewhere; Keras 2 (tf.keras on 2.15,
tf_keras on >= 2.16) for de's Keras layers, and a clear error for Keras 3's optimizers.

These run on whichever TensorFlow the venv has (`make test`, `make test TF=2.21`)."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from rec_sdk.base import tf_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, legacy_keras):
    """Runs `code` in a fresh interpreter, with or without TF_USE_LEGACY_KERAS."""
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_estimator_exists_only_on_2_15_and_else_is_a_clear_error():
    if not tf_compat.KERAS_3:
        assert tf_compat.estimator() is tf.estimator
        return
    with pytest.raises(tf_compat.EstimatorUnavailableError) as error:
        tf_compat.estimator()
    message = str(error.value)
    assert "TensorFlow %s" % tf.__version__ in message and "removed Estimator in 2.16" in message
    assert (
        "MonitoredTrainingSession" in message
        and "`pip install tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0`" in message
    )


@pytest.mark.skipif(not tf_compat.KERAS_3, reason="TensorFlow 2.15 has Estimator")
def test_the_examples_estimator_mode_says_why_it_cannot_run():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.examples.train",
            "--mode",
            "estimator",
            "--steps",
            "1",
            "--data",
            "synthetic",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert (
        "EstimatorUnavailableError: tf.estimator is not part of TensorFlow %s" % tf.__version__
        in result.stderr
    ), result.stderr[-2000:]


def test_keras_is_keras_2():
    keras = tf_compat.keras
    assert keras.__name__ == (
        "tf_keras" if tf_compat.KERAS_3 else "tensorflow.keras"
    ) or keras.__name__.startswith(("keras", "tf_keras"))
    assert hasattr(keras.optimizers, "legacy")  # Keras 3 has no legacy optimizers


def test_missing_tf_keras_is_a_clear_error():
    missing = tf_compat._MissingKeras("tf_keras")  # pylint: disable=protected-access
    with pytest.raises(tf_compat.KerasUnavailableError) as error:
        missing.layers.Layer  # noqa: B018  (the access raises)
    assert "pip install tf-keras==" in str(error.value)
    assert tf.__version__ in str(error.value)


# A tf_keras model (not tf.keras) with a de layer trains with model.fit; on TF >= 2.16 without
# TF_USE_LEGACY_KERAS, tf.keras is Keras 3 and its optimizers are refused clearly.
_KERAS_2_FIT = """
import numpy as np
from rec_sdk import dynamic_embedding as de
from rec_sdk.base.tf_compat import keras
import tensorflow as tf
layer = de.keras.layers.Embedding(4, name="emb", init_capacity=64)
inputs = keras.layers.Input(shape=(None,), dtype=tf.int64)
x = keras.layers.GlobalAveragePooling1D()(layer(inputs))
model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
              loss="binary_crossentropy")
rng = np.random.RandomState(0)
features = rng.randint(0, 50, (256, 4)).astype(np.int64)
labels = (features[:, 0] % 2).astype(np.float32)
history = model.fit(features, labels, batch_size=32, epochs=6, verbose=0)
assert history.history["loss"][-1] < history.history["loss"][0] - 0.05, history.history
assert int(layer.params.size()) == len(np.unique(features))
if tf_compat_keras_3:
    try:
        de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
    except TypeError as e:
        assert "Keras 3 optimizer" in str(e) and "tf_keras.optimizers" in str(e), e
        print("KERAS3-REFUSED")
print("FIT-OK")
"""


def test_keras_2_model_with_a_de_layer_trains_without_legacy_keras_env():
    code = "from rec_sdk.base.tf_compat import KERAS_3 as tf_compat_keras_3\n" + _KERAS_2_FIT
    result = _run(code, legacy_keras=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FIT-OK" in result.stdout
    assert ("KERAS3-REFUSED" in result.stdout) == tf_compat.KERAS_3
