"""Shared test setup: graph mode for the whole process, and a clean rec_sdk configuration and
default graph around every test."""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests' Keras models are Keras 2 code written against tf.keras: on TensorFlow >= 2.16 that
# is tf_keras, as for users porting Keras 2 code (tests/test_tf_versions.py covers tf_keras
# without this and Keras 3's refusal). Set before TensorFlow's import; subprocesses inherit it.
if importlib.util.find_spec("tf_keras") is not None:  # installed with TF >= 2.16 only
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from rec_sdk.base import tf_compat  # noqa: E402
from rec_sdk.util import initialize

# rec_sdk is a tf.compat.v1 graph-mode library, as the SDK it mirrors.
tf.compat.v1.disable_eager_execution()

# tests/tf2 needs eager execution: tests/test_tf2.py runs it in a process of its own.
collect_ignore = ["tf2"]


def pytest_configure(config):
    config.addinivalue_line("markers", "estimator: uses tf.estimator (TensorFlow 2.15 only)")
    config.addinivalue_line(
        "markers",
        "stress: long multi-process runs, in `make stress` "
        "(not in `make test`, which runs shorter runs of the same code)",
    )
    config.addinivalue_line(
        "markers",
        "once: long, and what it checks does not depend on "
        "TensorFlow's version (the op library's core, rec_sdk's own files "
        "and logic): CI runs it with the pinned TensorFlow only",
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `estimator` are skipped on a TensorFlow without Estimator (>= 2.16)."""
    del config
    try:
        tf_compat.estimator()
        return
    except tf_compat.EstimatorUnavailableError:
        pass
    skip = pytest.mark.skip(
        reason="tf.estimator does not exist in TensorFlow %s" % tf_compat.TF_VERSION
    )
    for item in items:
        if item.get_closest_marker("estimator") is not None:
            item.add_marker(skip)


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
