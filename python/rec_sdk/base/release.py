"""rec_sdk's version and the TensorFlow releases it is built for: one row per TensorFlow minor
version, with what a wheel for it requires and how to install that wheel.

This module imports only the standard library (setup.py and the build backend load it by path
before TensorFlow is importable, and `import rec_sdk` reads it); rec_sdk.base.tf_compat knows
how the versions' APIs differ, the requirements-tf<minor>.txt files pin each version's
development venv (tests check they agree with this table).
"""

import collections
import sys

VERSION = "0.1.0"

# One distribution per TensorFlow minor version, rec-sdk-tf2-18 for TensorFlow 2.18, each at
# VERSION: a package index (PyPI) refuses a local version such as 0.1.0+tf2.18, and pip picks
# a wheel by its name, version and tags only, never by the TensorFlow installed beside it, so
# the TensorFlow a wheel's op library was compiled against has to be in the name that users
# install. Each imports as `rec_sdk`; installing one for another TensorFlow over it replaces
# its files (uninstall the first: switch_command and install_wheel_command say so).
DISTRIBUTION_PREFIX = "rec-sdk-tf"
LICENSE = "Apache-2.0"
# Where the project's home, documentation and issue tracker are published (a wheel's
# Project-URL fields); empty until they are: a wheel names no address that does not exist.
PROJECT_URLS = {}

# tensorflow: the pinned release of that minor version; package: its PyPI name in a wheel's
# requirements (tf-keras requires `tensorflow` itself, so from 2.16 on a wheel requires that
# and not tensorflow-cpu, which would put a second copy of TensorFlow into the same folder);
# tf_keras: the Keras 2 package rec_sdk's Keras API uses where tf.keras is Keras 3;
# estimator: tensorflow-estimator's release (2.15 is the last TensorFlow with Estimator);
# pins: what else a wheel must hold back; pythons: the CPython versions TensorFlow publishes
# wheels of that release for (`pip index versions tensorflow --python-version 3.X`), the ones
# rec_sdk's wheel for it is tagged for (its op library calls no Python API, so one build serves
# them all). TensorFlow 2.20 requires protobuf >= 5.28 with no
# upper bound, and its tf.io.write_graph (which MonitoredTrainingSession's checkpoint hook
# calls) passes text_format.MessageToString a float_format that protobuf 7.34 removed.
Release = collections.namedtuple(
    "Release", ["tensorflow", "package", "tf_keras", "estimator", "pins", "pythons"]
)
_PY39_311 = ("3.9", "3.10", "3.11")
_PY39_312 = _PY39_311 + ("3.12",)

RELEASES = collections.OrderedDict(
    (
        ("2.15", Release("2.15.1", "tensorflow-cpu", None, "2.15.0", (), _PY39_311)),
        ("2.16", Release("2.16.2", "tensorflow", "2.16.0", None, (), _PY39_312)),
        ("2.17", Release("2.17.1", "tensorflow", "2.17.0", None, (), _PY39_312)),
        ("2.18", Release("2.18.1", "tensorflow", "2.18.0", None, (), _PY39_312)),
        ("2.19", Release("2.19.1", "tensorflow", "2.19.0", None, (), _PY39_312)),
        (
            "2.20",
            Release(
                "2.20.0", "tensorflow", "2.20.1", None, ("protobuf<7.34",), _PY39_312 + ("3.13",)
            ),
        ),
        (
            "2.21",
            Release("2.21.0", "tensorflow", "2.21.0", None, (), ("3.10", "3.11", "3.12", "3.13")),
        ),
    )
)
OLDEST, NEWEST = next(iter(RELEASES)), next(reversed(RELEASES))


def minor(tf_version):
    """'2.18' for '2.18.1' (also for '2.18.0rc1' or '2.18')."""
    return ".".join(tf_version.split(".")[:2])


def release(tf_version):
    """The Release row of `tf_version`'s minor version, or None when rec_sdk has no wheel for
    it."""
    return RELEASES.get(minor(tf_version))


def distribution(tf_version):
    """The name of rec_sdk's distribution for `tf_version`'s minor version: rec-sdk-tf2-18
    (see DISTRIBUTION_PREFIX)."""
    return DISTRIBUTION_PREFIX + minor(tf_version).replace(".", "-")


def pythons(tf_version):
    """The CPython versions ('3.10', ...) the wheel for `tf_version` is for: those TensorFlow
    publishes that release for, or this one's when rec_sdk has no row for it."""
    row = release(tf_version)
    if row is None:
        return ("%d.%d" % sys.version_info[:2],)
    return row.pythons


def python_tag(tf_version):
    """The wheel's Python tag: cp39.cp310.cp311 for TensorFlow 2.15 (a compressed tag set,
    one wheel for each of those CPythons; its ABI tag is `none`)."""
    return ".".join("cp" + p.replace(".", "") for p in pythons(tf_version))


def python_requires(tf_version):
    """Requires-Python of the wheel for `tf_version`: '>=3.9,<3.12' for TensorFlow 2.15."""
    versions = pythons(tf_version)
    newest = versions[-1].split(".")
    return ">=%s,<%s.%d" % (versions[0], newest[0], int(newest[1]) + 1)


def requirements(tf_version):
    """What a wheel built against `tf_version` requires (pip requirement strings)."""
    row = release(tf_version)
    if row is None:
        return ["tensorflow-cpu==" + tf_version, "absl-py"]
    needs = ["%s==%s" % (row.package, tf_version), "absl-py"]
    if row.estimator:
        # The last TF with Estimator and Keras 2 as tf.keras; it needs numpy 1.
        needs += ["tensorflow-estimator==" + row.estimator, "numpy<2"]
    if row.tf_keras:
        # tf.keras is Keras 3 there: rec_sdk's Keras layers use tf_keras (Keras 2), released
        # in step with TensorFlow.
        needs += ["tf-keras==%s.*" % minor(tf_version), "numpy"]
    return needs + list(row.pins)


def _tensorflow_packages(tf_version):
    """The pip packages a wheel for `tf_version` brings in with TensorFlow: its TensorFlow
    package and tf-keras or tensorflow-estimator."""
    row = release(tf_version)
    if row is None:
        return ["tensorflow-cpu"]
    return [row.package, "tf-keras" if row.tf_keras else "tensorflow-estimator"]


def _uninstall_other_tensorflow(tf_version, installed):
    """'pip uninstall -y tensorflow-cpu tensorflow-estimator && ' when the TensorFlow
    `installed` now came in another package than `tf_version`'s (tensorflow-cpu for 2.15,
    tensorflow from 2.16): both would write one site-packages/tensorflow folder, and the mix
    does not import. '' otherwise."""
    if installed is None or release(installed) is None or release(tf_version) is None:
        return ""
    if release(installed).package == release(tf_version).package:
        return ""
    return "pip uninstall -y %s && " % " ".join(_tensorflow_packages(installed))


def install_tensorflow_command(tf_version, installed=None):
    """The pip command that installs the TensorFlow (and Keras 2 or Estimator) a wheel built
    against `tf_version` needs; `installed`, the TensorFlow version installed now, adds the
    uninstall of its packages first when they are other packages (_uninstall_other_tensorflow)."""
    row = release(tf_version)
    if row is None:
        return "pip install tensorflow-cpu==%s" % tf_version
    extra = (
        " tf-keras==%s" % row.tf_keras
        if row.tf_keras
        else " tensorflow-estimator==%s" % row.estimator
    )
    extra += "".join(" '%s'" % pin for pin in row.pins)
    return "%spip install %s==%s%s" % (
        _uninstall_other_tensorflow(tf_version, installed),
        row.package,
        tf_version,
        extra,
    )


def install_wheel_command(tf_version, folder=None, replacing=None):
    """The pip command that installs rec_sdk's wheel for `tf_version`'s minor version from the
    package index (or from a folder, --find-links, such as dist/<minor>/ that `make wheel`
    writes). `replacing`, the TensorFlow version of an installed rec_sdk wheel for another
    minor version, adds the uninstall of that wheel and of this one first: both own the files
    of `rec_sdk`, so when both were installed, uninstalling one deleted the other's files
    while pip still lists it (pip skips, with a warning, the one that is not installed)."""
    command = "pip install%s %s" % (
        " --find-links " + folder if folder else "",
        distribution(tf_version),
    )
    if replacing is not None and minor(replacing) != minor(tf_version):
        command = "pip uninstall -y %s %s && %s" % (
            distribution(replacing),
            distribution(tf_version),
            command,
        )
    return command


def switch_command(installed, tf_version):
    """The pip command that replaces rec_sdk's wheel for TensorFlow `installed` (and that
    TensorFlow) with the wheel for `tf_version` (and its TensorFlow): the old wheel goes, and
    the old TensorFlow's packages too when the new one comes in other packages."""
    packages = [distribution(installed)]
    if _uninstall_other_tensorflow(tf_version, installed):
        packages += _tensorflow_packages(installed)
    return "pip uninstall -y %s && pip install %s" % (" ".join(packages), distribution(tf_version))


def supported():
    """'2.15 to 2.21', for messages."""
    return "%s to %s" % (OLDEST, NEWEST)
