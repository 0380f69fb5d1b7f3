"""rec_sdk's PEP 517 build backend: setuptools' (setuptools.build_meta), plus, when a wheel is
built from an sdist, the TensorFlow release that sdist is for (and what its wheel requires)
among the build's requirements: an isolated build (pip's default for an sdist) then has the
TensorFlow headers and framework library that the op library is compiled and linked against
(setup.py's build_op_library). A build in a checkout, or with --no-build-isolation, uses the
TensorFlow already installed."""

import importlib.util
import os
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 (the hooks this backend does not change)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tensorflow_requirements():
    """What the wheel of the sdist in _ROOT requires, TensorFlow first; nothing in a checkout
    (no PKG-INFO) or when the sdist names no TensorFlow."""
    if not os.path.exists(os.path.join(_ROOT, "PKG-INFO")):
        return []
    try:
        with open(os.path.join(_ROOT, "python", "rec_sdk", "ops", "_rec_sdk_ops.tf_version")) as f:
            tf_version = f.read().strip()
    except OSError:
        return []
    if not tf_version:
        return []
    spec = importlib.util.spec_from_file_location(
        "_rec_sdk_release", os.path.join(_ROOT, "python", "rec_sdk", "base", "release.py")
    )
    release = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(release)
    python = "%d.%d" % sys.version_info[:2]
    if release.release(tf_version) is not None and python not in release.pythons(tf_version):
        # Said here: pip reads Requires-Python of a file in an index, not of an sdist in a
        # --find-links folder, and would only report that TensorFlow has no release for it.
        raise SystemExit(
            "%s is for Python %s (TensorFlow %s is published for those), not Python %s"
            % (
                release.distribution(tf_version),
                release.python_requires(tf_version),
                tf_version,
                python,
            )
        )
    return release.requirements(tf_version)


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _tensorflow_requirements()
