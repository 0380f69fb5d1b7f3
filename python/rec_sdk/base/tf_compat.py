"""The one place that knows how the supported TensorFlow versions' APIs differ (2.15, the last
with Estimator and Keras 2 as tf.keras; 2.16 to the newest, with Keras 3 as tf.keras and no
Estimator). Which versions those are and what each pins: rec_sdk.base.release.

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

from rec_sdk.base import release

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
            "graph modification, Saver and EvictHook), or TensorFlow %s (`%s`) to run "
            "Estimator models."
            % (
                TF_VERSION,
                release.OLDEST,
                release.install_tensorflow_command(release.RELEASES[release.OLDEST].tensorflow),
            )
        )
    return module


class _MissingKeras(types.ModuleType):
    """Stands for tf_keras when it is not installed: any use says what to install."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise KerasUnavailableError(
            "rec_sdk's Keras API (de.keras layers, Keras optimizers) needs Keras 2, which is "
            "the tf_keras package on TensorFlow %s (tf.keras is Keras 3 there): `pip install "
            "tf-keras==%s.*`, and build models with tf_keras (or set "
            "TF_USE_LEGACY_KERAS=1 so tf.keras is tf_keras)."
            % (TF_VERSION, release.minor(TF_VERSION))
        )


def _keras():
    if not KERAS_3:
        return tf.keras
    try:
        return importlib.import_module("tf_keras")
    except ImportError:
        return _MissingKeras("tf_keras")


keras = _keras()
