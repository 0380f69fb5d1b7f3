"""The TensorFlow releases rec_sdk builds wheels for (rec_sdk.base.release): the table agrees with
the requirements files the venvs are made from and with the Makefile's list, each row's wheel
requirements and distribution name say which TensorFlow it is for in a form a package index
accepts, its Python tags the CPythons that TensorFlow ships for, and this venv runs one of the
pinned releases."""

import importlib
import os
import re
import subprocess

import pytest
import tensorflow as tf
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from rec_sdk.base import release, tf_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _requirements_file(minor):
    name = "requirements.txt" if minor == release.OLDEST else "requirements-tf%s.txt" % minor
    with open(os.path.join(ROOT, name)) as f:
        return {
            Requirement(line).name: Requirement(line)
            for line in f.read().splitlines()
            if line.strip() and not line.startswith("#")
        }


def test_every_requirements_file_has_a_row_and_the_makefile_lists_them_all():
    files = sorted(
        re.match(r"requirements-tf(.+)\.txt$", name).group(1)
        for name in os.listdir(ROOT)
        if re.match(r"requirements-tf.+\.txt$", name)
    )
    assert [release.OLDEST] + files == list(release.RELEASES)
    listed = subprocess.run(
        ["make", "-s", "--no-print-directory", "tf-versions"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed == list(release.RELEASES)


@pytest.mark.parametrize("minor", list(release.RELEASES))
def test_the_requirements_files_pin_the_rows_releases(minor):
    row = release.RELEASES[minor]
    pins = _requirements_file(minor)
    assert str(pins[row.package].specifier) == "==" + row.tensorflow
    assert release.minor(row.tensorflow) == minor
    other = "tensorflow" if row.package == "tensorflow-cpu" else "tensorflow-cpu"
    assert other not in pins, "two TensorFlow packages in one venv"
    if row.tf_keras:
        assert str(pins["tf-keras"].specifier) == "==" + row.tf_keras
        assert row.tf_keras.startswith(minor + ".") and row.estimator is None
    else:
        assert str(pins["tensorflow-estimator"].specifier) == "==" + row.estimator
        assert "tf-keras" not in pins
    for pin in map(Requirement, row.pins):
        assert pins[pin.name].specifier == pin.specifier, (pin, pins[pin.name])


@pytest.mark.parametrize("minor", list(release.RELEASES))
def test_a_wheels_requirements_and_version_name_its_tensorflow(minor):
    row = release.RELEASES[minor]
    needs = {Requirement(r).name: Requirement(r) for r in release.requirements(row.tensorflow)}
    assert needs[row.package].specifier.contains(row.tensorflow)
    assert not needs[row.package].specifier.contains(
        release.RELEASES[release.NEWEST].tensorflow
        if minor != release.NEWEST
        else release.RELEASES[release.OLDEST].tensorflow
    )
    if row.tf_keras:
        assert needs["tf-keras"].specifier.contains(row.tf_keras)
        assert "tensorflow-cpu" not in needs  # tf-keras requires `tensorflow` itself
    else:
        assert needs["tensorflow-estimator"].specifier.contains(row.estimator)
    assert all(pin in release.requirements(row.tensorflow) for pin in row.pins)
    # One distribution per TensorFlow minor version, at a public version an index accepts.
    name = release.distribution(row.tensorflow)
    assert name == "rec-sdk-tf" + minor.replace(".", "-") == canonicalize_name(name)
    assert Version(release.VERSION).local is None and not Version(release.VERSION).is_prerelease
    assert sorted(
        {release.distribution(r.tensorflow) for r in release.RELEASES.values()}
    ) == sorted(release.distribution(r.tensorflow) for r in release.RELEASES.values())
    # Its Python tags and Requires-Python say the same CPythons, those TensorFlow ships for.
    versions = release.pythons(row.tensorflow)
    tags = release.python_tag(row.tensorflow).split(".")
    assert tags == ["cp" + v.replace(".", "") for v in versions]
    requires = SpecifierSet(release.python_requires(row.tensorflow))
    for v in ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14"):
        assert requires.contains(v + ".0") == (v in versions), (minor, v, requires)
    assert "3.10" in versions and "3.11" in versions
    command = release.install_wheel_command(row.tensorflow)
    assert command == "pip install " + name
    local = release.install_wheel_command(row.tensorflow, folder="dist/" + minor)
    assert local == "pip install --find-links dist/%s %s" % (minor, name)
    other = release.RELEASES[release.NEWEST if minor != release.NEWEST else release.OLDEST]
    # Over a wheel for another TensorFlow: both go first (when both were installed, removing
    # one deleted the other's files while pip still lists it).
    replacing = release.install_wheel_command(row.tensorflow, replacing=other.tensorflow)
    assert replacing == "pip uninstall -y %s %s && %s" % (
        release.distribution(other.tensorflow),
        name,
        command,
    )
    assert release.install_tensorflow_command(row.tensorflow).startswith(
        "pip install %s==%s " % (row.package, row.tensorflow)
    )


def test_moving_between_tensorflow_packages_uninstalls_the_old_ones():
    """TensorFlow 2.15 comes as tensorflow-cpu (+ tensorflow-estimator), 2.16 on as tensorflow
    (+ tf-keras): both write site-packages/tensorflow, so the commands that move from one to
    the other uninstall the old packages first; between two `tensorflow` releases pip upgrades
    in place."""
    old, new, newer = "2.15.1", "2.18.1", "2.21.0"
    assert release.install_tensorflow_command(newer, installed=old) == (
        "pip uninstall -y tensorflow-cpu tensorflow-estimator && pip install tensorflow==2.21.0 "
        "tf-keras==2.21.0"
    )
    assert release.install_tensorflow_command(old, installed=newer) == (
        "pip uninstall -y tensorflow tf-keras && pip install tensorflow-cpu==2.15.1 "
        "tensorflow-estimator==2.15.0"
    )
    assert release.install_tensorflow_command(newer, installed=new) == (
        release.install_tensorflow_command(newer)
    )
    assert release.switch_command(old, newer) == (
        "pip uninstall -y rec-sdk-tf2-15 tensorflow-cpu tensorflow-estimator && "
        "pip install rec-sdk-tf2-21"
    )
    assert release.switch_command(new, newer) == (
        "pip uninstall -y rec-sdk-tf2-18 && pip install rec-sdk-tf2-21"
    )


def test_this_venv_runs_a_pinned_release_with_its_keras_and_estimator():
    row = release.release(tf.__version__)
    assert row is not None and row.tensorflow == tf.__version__
    assert tf_compat.KERAS_3 == (row.tf_keras is not None)
    if row.tf_keras:
        assert importlib.import_module("tf_keras").__version__ == row.tf_keras
    else:
        assert tf_compat.estimator() is tf.estimator


def test_unknown_versions():
    assert release.release("2.14.1") is None and release.release("3.0.0") is None
    assert release.minor("2.18.0rc1") == "2.18" and release.minor("2.18") == "2.18"
    assert release.requirements("2.99.1")[0] == "tensorflow-cpu==2.99.1"
    assert release.supported() == "%s to %s" % (release.OLDEST, release.NEWEST)


def test_the_readme_table_has_every_release_with_its_pins_and_install_command():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    rows = [line for line in readme.splitlines() if re.match(r"\| 2\.\d+\.\d+ \|", line)]
    assert [line.split("|")[1].strip() for line in rows] == [
        row.tensorflow for row in release.RELEASES.values()
    ]
    for line, row in zip(rows, release.RELEASES.values()):
        for requirement in release.requirements(row.tensorflow):
            if requirement.startswith(("tensorflow", "tf-keras")) or requirement in row.pins:
                assert "`%s`" % requirement in line, (requirement, line)
        assert "`%s`" % release.install_wheel_command(row.tensorflow) in line
        assert ("| yes |" in line) == (row.estimator is not None)
