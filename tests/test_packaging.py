"""Packaging: setup.py's metadata for the TensorFlow the op library is built against, the sdist's
build backend asking for the TensorFlow that sdist is for, and the package index on 127.0.0.1
that tests/wheel_check.py installs from (tests/local_index.py), checked against pip itself.
The wheel and sdist themselves are checked by `make wheel-test` (part of `make test`)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import tensorflow as tf
from tests import local_index

from rec_sdk.base import release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup(*args):
    done = subprocess.run(
        [sys.executable, "setup.py", "-q"] + list(args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_setup_names_the_distribution_of_this_tensorflow():
    name, version = _setup("--name", "--version")
    assert name == release.distribution(tf.__version__)
    assert version == release.VERSION
    (classifiers,) = [_setup("--classifiers")]
    for python in release.pythons(tf.__version__):
        assert "Programming Language :: Python :: %s" % python in classifiers
    assert _setup("--license") == [release.LICENSE]


def _backend(tmp_path, sdist_of):
    """rec_sdk's build backend loaded from a copy of the tree in tmp_path, as in an unpacked
    sdist for TensorFlow `sdist_of` (None: a checkout, no PKG-INFO)."""
    shutil.copytree(os.path.join(ROOT, "build_backend"), tmp_path / "build_backend")
    base = tmp_path / "python" / "rec_sdk" / "base"
    base.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "python", "rec_sdk", "base", "release.py"), base)
    if sdist_of:
        (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.1\n")
        ops = tmp_path / "python" / "rec_sdk" / "ops"
        ops.mkdir(parents=True)
        (ops / "_rec_sdk_ops.tf_version").write_text(sdist_of + "\n")
    path = tmp_path / "build_backend" / "rec_sdk_build_backend.py"
    spec = importlib.util.spec_from_file_location("_rec_sdk_backend_%d" % id(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sdist_of", [None, "2.15.1", "2.18.1"])
def test_the_build_backend_asks_for_the_sdists_tensorflow(tmp_path, monkeypatch, sdist_of):
    backend = _backend(tmp_path, sdist_of)
    monkeypatch.setattr(backend._setuptools, "get_requires_for_build_wheel", lambda c=None: ["w"])
    wanted = ["w"] + (release.requirements(sdist_of) if sdist_of else [])
    assert backend.get_requires_for_build_wheel() == wanted
    # The sdist and editable hooks are setuptools' own.
    assert backend.get_requires_for_build_sdist is backend._setuptools.get_requires_for_build_sdist


def test_the_build_backend_refuses_a_python_the_tensorflow_is_not_published_for(
    tmp_path, monkeypatch
):
    backend = _backend(tmp_path, "2.15.1")
    monkeypatch.setattr(backend._setuptools, "get_requires_for_build_wheel", lambda c=None: [])
    monkeypatch.setattr(sys, "version_info", (3, 13, 0, "final", 0))
    with pytest.raises(
        SystemExit, match=r"rec-sdk-tf2-15 is for Python >=3.9,<3.12 .* not Python 3.13"
    ):
        backend.get_requires_for_build_wheel()


def _setup_functions():
    """setup.py's definitions (what runs before its setup() call), without running setup()."""
    path = os.path.join(ROOT, "setup.py")
    with open(path) as f:
        source = f.read().split("\nTF_VERSION = built_for()")[0]
    namespace = {"__file__": path, "__name__": "_rec_sdk_setup"}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def test_building_the_sdist_for_another_tensorflow_stops_before_bazel(monkeypatch, tmp_path):
    setup = _setup_functions()
    bazel = tmp_path / "bazel"
    bazel.write_text("#!/bin/sh\ntouch %s/ran\nexit 1\n" % tmp_path)
    bazel.chmod(0o755)
    monkeypatch.setenv("BAZEL", str(bazel))
    with pytest.raises(
        SystemExit,
        match="for TensorFlow 2.99.0, but the build environment has TensorFlow %s" % tf.__version__,
    ):
        setup["build_op_library"]("2.99.0")
    assert not (tmp_path / "ran").exists()


def test_the_index_description_is_the_readmes_introduction_install_and_example():
    text = _setup_functions()["long_description"]()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Install", "## Example"]
    assert text.startswith("# rec_sdk\n")
    assert "](" not in text.replace("](http", "")  # no link into the source tree is left
    assert "pip install rec-sdk-tf2-18" in text


def _wheel(folder, name, version, requires_python=None):
    """A minimal pure-Python wheel file of project `name`."""
    path = os.path.join(folder, "%s-%s-py3-none-any.whl" % (name, version))
    info = "%s-%s.dist-info" % (name, version)
    metadata = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    if requires_python:
        metadata += "Requires-Python: %s\n" % requires_python
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(name + "/__init__.py", "VERSION = %r\n" % version)
        archive.writestr(info + "/METADATA", metadata)
        archive.writestr(
            info + "/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(info + "/RECORD", "")
    return path


def _pip_download(url, requirement, out):
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check"]
        + ["--isolated", "--index-url", url + "/simple/", "-d", str(out), requirement],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pip_installs_from_the_local_index_by_its_rules(tmp_path):
    """pip finds a project under its normalized name, skips a file whose Requires-Python
    excludes this Python (data-requires-python) and refuses a file whose hash is not the
    index's."""
    made = tmp_path / "made"
    made.mkdir()
    files = [_wheel(str(made), "demo_pkg", "1.0"), _wheel(str(made), "demo_pkg", "2.0")]
    folder = tmp_path / "index"
    # A Requires-Python this Python meets: the newest version; one it does not: none.
    local_index.write_index(str(folder), files, {"demo-pkg": ">=3.0"})
    with local_index.serve(str(folder)) as url:
        got = _pip_download(url, "Demo.Pkg", tmp_path / "a")
        assert got.returncode == 0, got.stderr
        assert os.listdir(tmp_path / "a") == ["demo_pkg-2.0-py3-none-any.whl"]
    shutil.rmtree(folder)
    local_index.write_index(str(folder), files, {"demo-pkg": ">=3.99"})
    with local_index.serve(str(folder)) as url:
        got = _pip_download(url, "demo-pkg", tmp_path / "b")
        assert got.returncode != 0 and "Requires-Python" in got.stderr + got.stdout, got.stderr
    shutil.rmtree(folder)
    local_index.write_index(str(folder), files, {})
    with open(folder / "files" / "demo_pkg-2.0-py3-none-any.whl", "ab") as f:
        f.write(b"tampered")
    with local_index.serve(str(folder)) as url:
        got = _pip_download(url, "demo-pkg==2.0", tmp_path / "c")
        assert got.returncode != 0 and "HASH" in got.stderr.upper(), got.stderr
