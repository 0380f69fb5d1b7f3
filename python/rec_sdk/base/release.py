"""rec_sdk's version and the TensorFlow releases it is built for: one row per TensorFlow minor
version, with what a wheel for it requires and how to install that wheel.

This module imports nothing (setup.py loads it by path before TensorFlow is importable, and
`import rec_sdk` reads it); rec_sdk.base.tf_compat knows how the versions' APIs differ, the
requirements-tf<minor>.txt files pin each version's development venv (tests check they agree
with this table).
"""

import collections

VERSION = "0.1.0"

# tensorflow: the pinned release of that minor version; package: its PyPI name in a wheel's
# requirements (tf-keras requires `tensorflow` itself, so from 2.16 on a wheel requires that
# and not tensorflow-cpu, which would put a second copy of TensorFlow into the same folder);
# tf_keras: the Keras 2 package rec_sdk's Keras API uses where tf.keras is Keras 3;
# estimator: tensorflow-estimator's release (2.15 is the last TensorFlow with Estimator);
# pins: what else a wheel must hold back. TensorFlow 2.20 requires protobuf >= 5.28 with no
# upper bound, and its tf.io.write_graph (which MonitoredTrainingSession's checkpoint hook
# calls) passes text_format.MessageToString a float_format that protobuf 7.34 removed.
Release = collections.namedtuple(
    "Release", ["tensorflow", "package", "tf_keras", "estimator", "pins"]
)

RELEASES = collections.OrderedDict(
    (
        ("2.15", Release("2.15.1", "tensorflow-cpu", None, "2.15.0", ())),
        ("2.16", Release("2.16.2", "tensorflow", "2.16.0", None, ())),
        ("2.17", Release("2.17.1", "tensorflow", "2.17.0", None, ())),
        ("2.18", Release("2.18.1", "tensorflow", "2.18.0", None, ())),
        ("2.19", Release("2.19.1", "tensorflow", "2.19.0", None, ())),
        ("2.20", Release("2.20.0", "tensorflow", "2.20.1", None, ("protobuf<7.34",))),
        ("2.21", Release("2.21.0", "tensorflow", "2.21.0", None, ())),
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


def wheel_version(tf_version):
    """A wheel's version for the TensorFlow its op library was built against: a PEP 440
    local version, e.g. 0.1.0+tf2.18, so the file names differ and pip can select one."""
    return "%s+tf%s" % (VERSION, minor(tf_version))


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


def install_tensorflow_command(tf_version):
    """The pip command that installs the TensorFlow (and Keras 2 or Estimator) a wheel built
    against `tf_version` needs."""
    row = release(tf_version)
    if row is None:
        return "pip install tensorflow-cpu==%s" % tf_version
    extra = (
        " tf-keras==%s" % row.tf_keras
        if row.tf_keras
        else " tensorflow-estimator==%s" % row.estimator
    )
    extra += "".join(" '%s'" % pin for pin in row.pins)
    return "pip install %s==%s%s" % (row.package, tf_version, extra)


def install_wheel_command(tf_version, folder=None):
    """The pip command that installs rec_sdk's wheel for `tf_version`'s minor version from the
    folder `make wheels` writes it to (dist/<minor>/)."""
    return 'pip install --find-links %s "rec_sdk==%s"' % (
        folder or "dist/" + minor(tf_version),
        wheel_version(tf_version),
    )


def supported():
    """'2.15 to 2.21', for messages."""
    return "%s to %s" % (OLDEST, NEWEST)
