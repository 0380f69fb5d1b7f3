"""Shared test setup: graph mode for the whole process, and a clean rec_sdk configuration and
default graph around every test."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from rec_sdk.util import initialize  # noqa: E402

# rec_sdk is a tf.compat.v1 graph-mode library, as the SDK it mirrors.
tf.compat.v1.disable_eager_execution()

# tests/tf2 needs eager execution: tests/test_tf2.py runs it in a process of its own.
collect_ignore = ["tf2"]


@pytest.fixture(autouse=True)
def _clean_rec_sdk():
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    yield
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()



@pytest.fixture
def initialized():
    """rec_sdk initialised with fixed-capacity tables."""
    initialize.init(use_dynamic_expansion=False)
