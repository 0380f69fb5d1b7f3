"""TF2 tests (eager, tf.function, Keras): run in a process of their own by tests/test_tf2.py,
since the main suite runs graph mode (tests/conftest.py) and TensorFlow cannot switch back."""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if importlib.util.find_spec("tf_keras") is not None:  # TF >= 2.16: tf.keras is tf_keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
