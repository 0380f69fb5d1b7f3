"""The one place that knows how the supported TensorFlow versions differ (2.15, the last with
Estimator and Keras 2 as tf.keras; and the newest, 2.21, with Keras 3 as tf.keras).

* `keras`: the Keras 2 API rec_sdk's Keras layers, initializers and optimizers build on:
  tf.keras on TensorFlow 2.15; the `tf_keras` package on TensorFlow >= 2.16, where tf.keras is
  Keras 3 (whose layers and optimizers do not work with graph-mode variables and custom
  resource ops). Without tf_keras installed there, using it raises KerasUnavailableError.
* `estimator()`: tf.estimator, or EstimatorUnavailableError naming the TensorFlow version
  (Estimator was removed in 2.16).
"""
import importlib
import types

import tensorflow as tf

TF_VERSION = tf.__version__
_MAJOR_MINOR = tuple(int(part) for part in TF_VERSION.split(".")[:2])
KERAS_3 = _MAJOR_MINOR >= (2, 16)  # tf.keras is Keras 3 from TensorFlow 2.16 on


class EstimatorUnavailableError(ImportError):
    """tf.estimator is used with a TensorFlow that no longer has it."""


class KerasUnavailableError(ImportError):
    """rec_sdk's Keras 2 API is used with TensorFlow >= 2.16 but without tf_keras."""


def estimator():
    """tf.estimator (TensorFlow 2.15), else EstimatorUnavailableError naming the version."""
    module = getattr(tf, "estimator", None) if not KERAS_3 else None
    if module is None:
        raise EstimatorUnavailableError(
            "tf.estimator is not part of TensorFlow %s: TensorFlow removed Estimator in 2.16. "
            "Use tf.compat.v1.train.MonitoredTrainingSession with rec_sdk's hooks (the same "
            "graph modification, Saver and EvictHook), or TensorFlow 2.15 "
            "(tensorflow-cpu==2.15.1 with tensorflow-estimator==2.15.0) to run Estimator "
            "models." % TF_VERSION)
    return module


class _MissingKeras(types.ModuleType):
    """Stands for tf_keras when it is not installed: any use says what to install."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise KerasUnavailableError(
            "rec_sdk's Keras API (de.keras layers, Keras optimizers) needs Keras 2, which is "
            "the tf_keras package on TensorFlow %s (tf.keras is Keras 3 there): `pip install "
            "tf-keras==%d.%d.*`, and build models with tf_keras (or set "
            "TF_USE_LEGACY_KERAS=1 so tf.keras is tf_keras)." % ((TF_VERSION,) + _MAJOR_MINOR))


def _keras():
    if not KERAS_3:
        return tf.keras
    try:
        return importlib.import_module("tf_keras")
    except ImportError:
        return _MissingKeras("tf_keras")


keras = _keras()
