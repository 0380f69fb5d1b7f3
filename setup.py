"""Packaging of rec_sdk beyond pyproject.toml: the wheel holds the op library, so it is tagged
for this Python and platform (not "any"), and it requires the TensorFlow version the library
was built against (python/rec_sdk/ops/_rec_sdk_ops.tf_version, written by `make build`)."""
import os

from setuptools import setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT_FOR = os.path.join(HERE, "python", "rec_sdk", "ops", "_rec_sdk_ops.tf_version")


class BinaryDistribution(Distribution):
    """A distribution with a compiled part (the op library), so wheels get a platform tag."""

    def has_ext_modules(self):
        return True


def dependencies():
    """TensorFlow pinned to the library's version (2.15.1, the pinned runtime, before a
    build), and what rec_sdk imports besides it."""
    try:
        with open(BUILT_FOR) as f:
            version = f.read().strip() or "2.15.1"
    except OSError:
        version = "2.15.1"
    needs = ["tensorflow-cpu==" + version, "absl-py"]
    if version.startswith("2.15."):
        # The last TF that ships Estimator and Keras 2 as tf.keras; it needs numpy 1.
        needs += ["tensorflow-estimator==2.15.0", "numpy<2"]
    else:
        # tf.keras is Keras 3 from TF 2.16 on: rec_sdk's Keras layers use tf_keras (Keras 2),
        # released in step with TensorFlow.
        major_minor = ".".join(version.split(".")[:2])
        needs += ["tf-keras==%s.*" % major_minor, "numpy"]
    return needs


setup(distclass=BinaryDistribution, install_requires=dependencies())
