"""Packaging of rec_sdk. pyproject.toml declares only the build system: the distribution's
name follows the TensorFlow the op library is built against, which a [project] table cannot
say (PEP 621 wants its name static). One distribution per TensorFlow minor version,
rec-sdk-tf2-18 for TensorFlow 2.18 (python/rec_sdk/base/release.py says why), at version
0.1.0, requiring that TensorFlow. The wheel holds the op library, so setuptools tags it for this
interpreter and platform; `make wheel` then gives it the CPython tags of that TensorFlow's
release and the manylinux tag its symbols allow (auditwheel).

From an sdist (which holds the sources, not the op library), building the wheel first builds
the op library as the README does: configure.py, then Bazel (BuildPy, build_op_library)."""

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = os.path.join(HERE, "python", "rec_sdk", "ops")
LIBRARY = os.path.join(OPS, "_rec_sdk_ops.so")
BUILT_FOR = os.path.join(OPS, "_rec_sdk_ops.tf_version")

# The packages, named explicitly: the graph passes live in graph_rewrite/ and import as
# rec_sdk_graph_rewrite, a name no other package uses (tests/test_imports.py checks this list
# against the source tree).
PACKAGES = [
    "rec_sdk",
    "rec_sdk.base",
    "rec_sdk.constants",
    "rec_sdk.core",
    "rec_sdk.core.asc",
    "rec_sdk.distribute",
    "rec_sdk.distribute.ranks",
    "rec_sdk.dynamic_embedding",
    "rec_sdk.dynamic_embedding.keras",
    "rec_sdk.examples",
    "rec_sdk.graph",
    "rec_sdk.ops",
    "rec_sdk.optimizers",
    "rec_sdk.saver",
    "rec_sdk.serving",
    "rec_sdk.tables",
    "rec_sdk.util",
    "rec_sdk.util.communication",
    "rec_sdk_graph_rewrite",
]


def _release_module():
    """rec_sdk.base.release, loaded by path: importing the package would import TensorFlow."""
    spec = importlib.util.spec_from_file_location(
        "_rec_sdk_release", os.path.join(HERE, "python", "rec_sdk", "base", "release.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RELEASE = _release_module()


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def built_for():
    """The TensorFlow the op library was built against (an sdist carries the version file of
    the build it was made from); before a build (the editable install of a new venv), the
    TensorFlow installed here, else the oldest supported one."""
    version = _read(BUILT_FOR)
    if version:
        return version
    for package in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return RELEASE.RELEASES[RELEASE.OLDEST].tensorflow


def from_sdist():
    """Whether this is an unpacked sdist (it has PKG-INFO; a checkout does not)."""
    return os.path.exists(os.path.join(HERE, "PKG-INFO"))


def _tensorflow_here():
    """The version of the TensorFlow this Python imports ('' if none), asked of a child
    process: importing TensorFlow here would keep it loaded through the build."""
    done = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    return (
        done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
    )


def build_op_library(expected):
    """The op library built from the sources against this Python's TensorFlow, which must be
    `expected` (the release the sdist is for): configure.py writes .bazelrc, Bazel (Debian's
    bazel-bootstrap) builds into an output base of its own that is removed afterwards."""
    bazel = shutil.which(os.environ.get("BAZEL", "bazel"))
    if bazel is None:
        sys.exit(
            "Building rec_sdk from source needs Bazel and a C++ compiler (on Debian 12: "
            "apt-get install bazel-bootstrap g++); or install the wheel: "
            + RELEASE.install_wheel_command(expected)
        )
    installed = _tensorflow_here()
    if installed != expected:
        sys.exit(
            "This is the source of %s, for TensorFlow %s, but the build environment has %s: "
            "`%s` first, or build the source of the distribution for that TensorFlow"
            % (
                RELEASE.distribution(expected),
                expected,
                "TensorFlow " + installed if installed else "no TensorFlow",
                RELEASE.install_tensorflow_command(expected, installed=installed or None),
            )
        )
    subprocess.check_call([sys.executable, "configure.py"], cwd=HERE)
    output_base = tempfile.mkdtemp(prefix="rec_sdk_bazel_")
    startup = [bazel, "--output_base=" + output_base]
    try:
        subprocess.check_call(
            startup + ["build", "//tf_ops:_rec_sdk_ops.so", "//tf_ops:tf_version"], cwd=HERE
        )
        built = os.path.join(HERE, "bazel-bin", "tf_ops")
        shutil.copyfile(os.path.join(built, "_rec_sdk_ops.so"), LIBRARY)
        shutil.copyfile(os.path.join(built, "_rec_sdk_ops.tf_version"), BUILT_FOR)
    finally:
        subprocess.call(startup + ["shutdown"], cwd=HERE)
        shutil.rmtree(output_base, ignore_errors=True)


class BuildPy(build_py):
    """Builds the op library first when building from an sdist."""

    def run(self):
        if from_sdist() and not os.path.exists(LIBRARY):
            build_op_library(TF_VERSION)
        super().run()


class BinaryDistribution(Distribution):
    """A distribution with a compiled part (the op library), so wheels get a platform tag."""

    def has_ext_modules(self):
        return True


# The README's sections a package index shows as the project's description: what rec_sdk is,
# how to install it, an example. The others are about the source tree (make targets, CI).
DESCRIPTION_SECTIONS = ("Install", "Example")


def long_description():
    """The README's title and introduction and its DESCRIPTION_SECTIONS, with links into the
    source tree (which an index page cannot follow) reduced to their text."""
    with open(os.path.join(HERE, "README.md")) as f:
        parts = re.split(r"(?m)^(?=## )", f.read())
    kept = [parts[0]] + [
        part for part in parts[1:] if part[3:].splitlines()[0].strip() in DESCRIPTION_SECTIONS
    ]
    text = "".join(kept)
    return re.sub(r"\[([^\]]+)\]\((?![a-z]+://)[^)]*\)", r"\1", text)


TF_VERSION = built_for()
PYTHONS = RELEASE.pythons(TF_VERSION)
setup(
    name=RELEASE.distribution(TF_VERSION),
    version=RELEASE.VERSION,
    description="Huge sparse embedding tables for recommendation models on stock TensorFlow "
    "(this distribution: for TensorFlow %s)" % RELEASE.minor(TF_VERSION),
    long_description=long_description(),
    long_description_content_type="text/markdown",
    license=RELEASE.LICENSE,
    license_files=["LICENSE"],
    project_urls=RELEASE.PROJECT_URLS,
    keywords=["tensorflow", "recommendation", "embedding", "sparse", "hash table"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C++",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
    ]
    + ["Programming Language :: Python :: %s" % version for version in PYTHONS]
    + [
        "Programming Language :: Python :: Implementation :: CPython",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Software Development :: Libraries :: Python Modules",
    ],
    python_requires=RELEASE.python_requires(TF_VERSION),
    install_requires=RELEASE.requirements(TF_VERSION),
    package_dir={"": "python", "rec_sdk_graph_rewrite": "graph_rewrite"},
    packages=PACKAGES,
    package_data={"rec_sdk.ops": ["_rec_sdk_ops.so", "_rec_sdk_ops.tf_version"]},
    cmdclass={"build_py": BuildPy},
    distclass=BinaryDistribution,
)
