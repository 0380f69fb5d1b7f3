"""The wheel and sdist from `make wheel`, checked as a user gets them (`make wheel-test`, part
of `make test`): served from a package index on 127.0.0.1 (a PEP 503 folder behind
http.server, tests/local_index.py), installed with `pip install --index-url <that index>
"rec-sdk-tf2-18==0.1.0"` into a fresh venv (TensorFlow and the other requirements from pip's
own index), used from a directory outside the source tree. Checks that the wheel's name and
metadata say the TensorFlow its op library was built for (rec_sdk.base.release: the
distribution's name, Requires-Dist, Requires-Python, its CPython tags with ABI `none` and a
manylinux tag), that pip took it from the local index, that the README example trains from it
and a MonitoredTrainingSession saves a checkpoint, and that a wheel for another TensorFlow
fails at `import rec_sdk` with the pip commands that fix it.

Usage: python tests/wheel_check.py [--reuse-packages] [--python VERSION ...] DIST_DIR

--reuse-packages (`make smoke`): the scratch venv sees this Python's installed packages (a
path in a .pth file), so pip checks the wheel's requirements against them instead of
installing TensorFlow again (and needs no other index than the local one); the wheel itself is
still installed by pip and imported from the scratch venv.
--sdist: also install from the sdist (`--no-binary`: pip builds the wheel, compiling the op
library with Bazel against the TensorFlow it installs into the build environment) into a
fresh venv, and run the example from that.
--python 3.12 (repeatable; `all`: every CPython the wheel is tagged for): also install and run
the example in a fresh venv of that CPython, found as python3.12 on PATH or in pyenv's
versions (~/.pyenv/versions/3.12.*), TensorFlow from pip's index.
"""

import argparse
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

import local_index


def _release_module():
    """rec_sdk.base.release from this checkout, by path (importing rec_sdk imports TensorFlow)."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "python",
        "rec_sdk",
        "base",
        "release.py",
    )
    spec = importlib.util.spec_from_file_location("_rec_sdk_release", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _release_module()

EXAMPLE = r"""
import os
import tempfile
import numpy as np
import tensorflow as tf
import rec_sdk
from rec_sdk.util.initialize import init, terminate_config_initializer
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers.lazy_adam import create_hash_optimizer
from rec_sdk.util.variable import get_dense_and_sparse_variable

assert "site-packages" in rec_sdk.__file__, rec_sdk.__file__
tf.compat.v1.disable_eager_execution()
init(use_dynamic_expansion=False)
user_table = create_table(key_dtype=tf.int64, dim=tf.TensorShape([16]), name="user_table",
                          emb_initializer=tf.compat.v1.truncated_normal_initializer(seed=1),
                          device_vocabulary_size=1000)
rng = np.random.default_rng(0)
ids = rng.integers(0, 500, size=(256, 3))
labels = (ids[:, 0] % 2).astype(np.float32)
batch = tf.compat.v1.data.make_one_shot_iterator(
    tf.data.Dataset.from_tensor_slices({"user_ids": ids, "label": labels}).repeat().batch(32)
).get_next()
user_emb = sparse_lookup(user_table, batch["user_ids"], is_train=True)
weights = tf.compat.v1.get_variable("w", [48, 1],
                                  initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
logits = tf.squeeze(tf.matmul(tf.reshape(user_emb, [-1, 48]), weights), 1)
loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                              logits=logits))
dense_vars, sparse_vars = get_dense_and_sparse_variable()
train_op = tf.group(
    tf.compat.v1.train.AdamOptimizer(1e-2).minimize(loss, var_list=dense_vars),
    create_hash_optimizer(1e-2).apply_gradients(zip(tf.gradients(loss, sparse_vars),
                                                    sparse_vars)))
global_step = tf.compat.v1.train.get_or_create_global_step()
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    first = sess.run(loss)
    for _ in range(200):
        sess.run(train_op)
    last = np.mean([sess.run(loss) for _ in range(8)])
    size = sess.run(user_table.size_tensor())
# A MonitoredTrainingSession with a checkpoint directory (its hook writes the graph and saves).
checkpoints = tempfile.mkdtemp()
with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoints,
                                                 save_summaries_steps=None) as session:
    session.run(train_op)
saved = tf.train.latest_checkpoint(checkpoints)
terminate_config_initializer()
assert last < first, (first, last)
assert saved and os.path.exists(os.path.join(checkpoints, "graph.pbtxt")), os.listdir(checkpoints)
print("trained from the wheel: loss %.3f -> %.3f, %d keys; saved %s" % (first, last, size,
                                                                       os.path.basename(saved)))
"""


def run(command, cwd, **kwargs):
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0 and kwargs.get("check", True):
        sys.exit(
            "failed: %s\n%s\n%s" % (" ".join(command), done.stdout[-3000:], done.stderr[-3000:])
        )
    return done


def find_python(version):
    """The path of CPython `version` ('3.12') here, or None: python3.12 on PATH (unless it is a
    pyenv shim for a version pyenv does not select), else the newest of pyenv's
    ~/.pyenv/versions/3.12.*."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(
        glob.glob(os.path.join(pyenv, "versions", version + ".*", "bin", "python" + version)),
        key=lambda p: [int(x) for x in p.split(os.sep)[-3].split(".") if x.isdigit()],
        reverse=True,
    )
    for path in [shutil.which("python" + version)] + candidates:
        if path is None:
            continue
        done = subprocess.run(
            [path, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and done.stdout.strip() == version:
            return path
    return None


def pip_index(python):
    """The index pip uses when told none (PIP_INDEX_URL, pip's configuration, else its
    default), where the wheel's requirements come from."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    for key in ("install.index-url", "global.index-url"):
        done = run([python, "-m", "pip", "config", "get", key], None, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    return run([python, "-c", code], None).stdout.strip()


def check_wheel_file(wheel):
    """The wheel's name, tags, contents and metadata; returns (TensorFlow it is for, name)."""
    name = os.path.basename(wheel)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        built_for = archive.read("rec_sdk/ops/_rec_sdk_ops.tf_version").decode().strip()
        metadata = archive.read([n for n in names if n.endswith(".dist-info/METADATA")][0])
    for needed in (
        "rec_sdk/ops/_rec_sdk_ops.so",
        "rec_sdk_graph_rewrite/__init__.py",
        "rec_sdk/dynamic_embedding/__init__.py",
    ):
        if needed not in names:
            sys.exit("%s is missing from the wheel" % needed)
    distribution = release.distribution(built_for)
    prefix = "%s-%s-" % (distribution.replace("-", "_"), release.VERSION)
    if not name.startswith(prefix):
        sys.exit(
            "the wheel is not %s %s (TensorFlow %s): %s"
            % (distribution, release.VERSION, built_for, name)
        )
    pythons, abi, platform = name[len(prefix) : -len(".whl")].split("-")
    wanted = set(release.python_tag(built_for).split("."))
    if set(pythons.split(".")) != wanted or abi != "none":
        sys.exit("the wheel's tags %s-%s are not %s-none" % (pythons, abi, sorted(wanted)))
    if not platform.startswith("manylinux_") or not platform.endswith("_x86_64"):
        sys.exit("the wheel's platform tag is not a manylinux one: %s" % platform)
    fields = [line.split(":", 1) for line in metadata.decode().splitlines() if ":" in line]
    required = sorted(v.strip() for k, v in fields if k == "Requires-Dist")
    if required != sorted(release.requirements(built_for)):
        sys.exit(
            "the wheel requires %s, not what TensorFlow %s needs: %s"
            % (required, built_for, release.requirements(built_for))
        )
    requires_python = [v.strip() for k, v in fields if k == "Requires-Python"]
    if requires_python != [release.python_requires(built_for)]:
        sys.exit("the wheel's Requires-Python is %s" % requires_python)
    return built_for, distribution


def install(python, index_url, scratch, distribution, reuse_packages, sdist=False):
    """A fresh venv of `python` with the wheel (or, `sdist`, a wheel pip builds from the sdist)
    installed from the local index; returns the venv's python and folder. Exits unless pip took
    the wheel or sdist from `index_url`."""
    version = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], scratch)
    venv = os.path.join(scratch, "venv%s%s" % (version.stdout.strip(), "-sdist" if sdist else ""))
    vpython = os.path.join(venv, "bin", "python")
    run([python, "-m", "venv", venv], scratch)
    command = [vpython, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if reuse_packages:
        scratch_site = run(
            [vpython, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], scratch
        ).stdout.strip()
        with open(os.path.join(scratch_site, "rec_sdk_reused_packages.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
        # The reused packages hold this checkout's editable install of the same name and
        # version, which pip would take as the requirement already met: install over it, and
        # check the wheel's requirements against the reused packages with `pip check` below.
        command += ["--ignore-installed", "--no-deps"]
    else:
        command += ["--extra-index-url", pip_index(vpython)]
    if sdist:
        # The sdist: pip builds it in an isolated environment with the TensorFlow it is for
        # (build_backend/), Bazel compiling the op library (setup.py's build_op_library).
        command += ["--no-binary", distribution]
    report = os.path.join(venv, "report.json")
    command += ["--index-url", index_url, "--report", report]
    run(command + ["%s==%s" % (distribution, release.VERSION)], scratch, timeout=1800)
    with open(report) as f:
        installed = json.load(f)["install"]
    ours = [i for i in installed if i["metadata"]["name"] == distribution]
    if reuse_packages:
        broken = [
            line
            for line in run(
                [vpython, "-m", "pip", "check"], scratch, check=False
            ).stdout.splitlines()
            if line.lower().startswith(distribution + " ")
        ]
        if broken:
            sys.exit("the reused packages do not meet the wheel's requirements: %s" % broken)
    server = index_url.rsplit("/simple/", 1)[0] + "/"
    kind = ".tar.gz" if sdist else ".whl"
    if len(ours) != 1 or not (
        ours[0]["download_info"]["url"].startswith(server)
        and ours[0]["download_info"]["url"].endswith(kind)
    ):
        sys.exit("pip did not take %s's %s from the local index: %s" % (distribution, kind, ours))
    print(
        "installed %s from %s into a venv of Python %s"
        % (os.path.basename(ours[0]["download_info"]["url"]), index_url, version.stdout.strip())
    )
    return vpython, venv


def check_example(vpython, venv, scratch):
    """rec_sdk imports from the venv and the README example trains; returns rec_sdk's path."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    where = (
        run([vpython, "-c", "import rec_sdk; print(rec_sdk.__file__)"], scratch, env=env)
        .stdout.strip()
        .splitlines()[-1]
    )
    if not where.startswith(venv + os.sep):
        sys.exit("rec_sdk was imported from %s, not from the wheel in %s" % (where, venv))
    out = run([vpython, "-c", EXAMPLE], scratch, env=env)
    print(out.stdout.strip())
    return where


def check_library_alone(vpython, where, scratch):
    """The installed op library loads in a process that has not imported TensorFlow: its
    RUNPATH finds libtensorflow_framework.so.2 in the tensorflow package beside it."""
    library = os.path.join(os.path.dirname(where), "ops", "_rec_sdk_ops.so")
    code = "import ctypes, sys; ctypes.CDLL(%r); assert 'tensorflow' not in sys.modules" % library
    run([vpython, "-c", code], scratch, env=dict(os.environ, PYTHONPATH=""))
    print("the op library loads without TensorFlow imported first (RUNPATH)")


def check_other_tensorflow(vpython, where, built_for, scratch):
    """The same wheel next to another TensorFlow (its version file says so; the other is a
    supported one): `import rec_sdk` fails naming both fixes."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    other = next(
        row.tensorflow
        for row in release.RELEASES.values()
        if release.minor(row.tensorflow) != release.minor(built_for)
    )
    version_file = os.path.join(os.path.dirname(where), "ops", "_rec_sdk_ops.tf_version")
    with open(version_file, "w") as f:
        f.write(other + "\n")
    wrong = run([vpython, "-c", "import rec_sdk"], scratch, env=env, check=False)
    expected = [
        "This rec_sdk wheel (%s %s) needs TensorFlow %s: `%s`"
        % (
            release.distribution(other),
            release.VERSION,
            other,
            release.install_tensorflow_command(other, installed=built_for),
        ),
        "install the rec_sdk wheel for TensorFlow %s: `%s`"
        % (release.minor(built_for), release.install_wheel_command(built_for, replacing=other)),
    ]
    if wrong.returncode == 0 or not all(e in wrong.stderr for e in expected):
        sys.exit(
            "a wheel for another TensorFlow imported, or not with the loader's "
            "message (%s):\n%s" % (expected, wrong.stderr[-2000:])
        )
    print(
        "a wheel for TensorFlow %s next to TensorFlow %s: %s"
        % (other, built_for, wrong.stderr.strip().splitlines()[-1])
    )


def main(dist, reuse_packages=False, pythons=(), sdist=False):
    wheels = glob.glob(os.path.join(dist, "rec_sdk_tf*.whl"))
    sdists = glob.glob(os.path.join(dist, "rec_sdk_tf*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        sys.exit(
            "expected one rec_sdk wheel and one sdist in %s, found %s" % (dist, wheels + sdists)
        )
    wheel = os.path.abspath(wheels[0])
    built_for, distribution = check_wheel_file(wheel)
    this = "%d.%d" % sys.version_info[:2]
    if "all" in pythons:
        pythons = [v for v in release.pythons(built_for) if v != this]
    others = []
    for version in pythons:
        if version not in release.pythons(built_for):
            sys.exit("the wheel for TensorFlow %s is not for Python %s" % (built_for, version))
        path = find_python(version)
        if path is None:
            print("Python %s: not found here (python%s, ~/.pyenv/versions)" % (version, version))
        elif version != this:
            others.append(path)
    with tempfile.TemporaryDirectory(prefix="rec_sdk_wheel_") as scratch:
        folder = os.path.join(scratch, "index")
        local_index.write_index(
            folder,
            [wheel, os.path.abspath(sdists[0])],
            {distribution: release.python_requires(built_for)},
        )
        with local_index.serve(folder) as url:
            index_url = url + "/simple/"
            base = getattr(sys, "_base_executable", sys.executable)
            vpython, venv = install(base, index_url, scratch, distribution, reuse_packages)
            where = check_example(vpython, venv, scratch)
            if not reuse_packages:  # there TensorFlow is not beside rec_sdk
                check_library_alone(vpython, where, scratch)
            check_other_tensorflow(vpython, where, built_for, scratch)
            for python in others:
                vpython, venv = install(python, index_url, scratch, distribution, False)
                check_example(vpython, venv, scratch)
            if sdist:
                started = time.monotonic()
                vpython, venv = install(base, index_url, scratch, distribution, False, sdist=True)
                print("built from the sdist in %.0f s" % (time.monotonic() - started))
                check_example(vpython, venv, scratch)
    print("wheel check passed: %s" % os.path.basename(wheel))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-packages", action="store_true")
    parser.add_argument("--python", action="append", default=[])
    parser.add_argument("--sdist", action="store_true")
    parser.add_argument("dist")
    args = parser.parse_args()
    main(args.dist, reuse_packages=args.reuse_packages, pythons=args.python, sdist=args.sdist)
