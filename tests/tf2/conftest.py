"""TF2 tests (eager, tf.function, Keras): run in a process of their own by tests/test_tf2.py,
since the main suite runs graph mode (tests/conftest.py) and TensorFlow cannot switch back."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
