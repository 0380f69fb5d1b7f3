"""Packaging of rec_sdk beyond pyproject.toml: the wheel holds the op library, so it is tagged
for this Python and platform (not "any"); its version names the TensorFlow the library was
built against (0.1.0+tf2.18: python/rec_sdk/ops/_rec_sdk_ops.tf_version, written by `make
build`) and it requires that TensorFlow (python/rec_sdk/base/release.py knows what each needs)."""

import importlib.metadata
import importlib.util
import os

from setuptools import setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT_FOR = os.path.join(HERE, "python", "rec_sdk", "ops", "_rec_sdk_ops.tf_version")


def _release_module():
    """rec_sdk.base.release, loaded by path: importing the package would import TensorFlow."""
    spec = importlib.util.spec_from_file_location(
        "_rec_sdk_release", os.path.join(HERE, "python", "rec_sdk", "base", "release.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RELEASE = _release_module()


class BinaryDistribution(Distribution):
    """A distribution with a compiled part (the op library), so wheels get a platform tag."""

    def has_ext_modules(self):
        return True


def built_for():
    """The TensorFlow the op library was built against; before a build (the editable install
    of a new venv), the TensorFlow installed here, else the oldest supported one."""
    try:
        with open(BUILT_FOR) as f:
            version = f.read().strip()
        if version:
            return version
    except OSError:
        pass
    for package in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return RELEASE.RELEASES[RELEASE.OLDEST].tensorflow


TF_VERSION = built_for()
setup(
    distclass=BinaryDistribution,
    version=RELEASE.wheel_version(TF_VERSION),
    install_requires=RELEASE.requirements(TF_VERSION),
)
