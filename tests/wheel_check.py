"""The wheel from `make wheel`, checked as a user gets it (`make wheel-test`, part of
`make test`): installed with pip into a scratch venv (TensorFlow and the other requirements
from PyPI), used from a directory outside the source tree. Checks that its metadata pins the
TensorFlow the op library was built for (rec_sdk.base.release's requirements) and its version names
that TensorFlow (0.1.0+tf2.18), that the README example trains from it and a
MonitoredTrainingSession saves a checkpoint, and that a wheel for another TensorFlow fails at
`import rec_sdk` with the pip commands that fix it.

Usage: python tests/wheel_check.py [--reuse-packages] DIST_DIR

--reuse-packages (`make smoke`): the scratch venv sees this Python's installed packages (a
path in a .pth file), so pip checks the wheel's requirements against them instead of
installing TensorFlow again; the wheel itself is still installed by pip and imported from the
scratch venv.
"""

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile


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


def main(dist, reuse_packages=False):
    wheels = glob.glob(os.path.join(dist, "rec_sdk-*.whl"))
    if len(wheels) != 1:
        sys.exit("expected one rec_sdk wheel in %s, found %s" % (dist, wheels))
    wheel = os.path.abspath(wheels[0])
    name = os.path.basename(wheel)
    if name.endswith("-any.whl") or "linux" not in name:
        sys.exit("the wheel is not tagged for this platform: %s" % name)
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
    version = release.wheel_version(built_for)
    if not name.startswith("rec_sdk-%s-" % version):
        sys.exit("the wheel's version is not %s (TensorFlow %s): %s" % (version, built_for, name))
    required = sorted(
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    )
    if required != sorted(release.requirements(built_for)):
        sys.exit(
            "the wheel requires %s, not what TensorFlow %s needs: %s"
            % (required, built_for, release.requirements(built_for))
        )
    with tempfile.TemporaryDirectory(prefix="rec_sdk_wheel_") as scratch:
        venv = os.path.join(scratch, "venv")
        python = os.path.join(venv, "bin", "python")
        run(["python3", "-m", "venv", venv], scratch)
        if reuse_packages:
            scratch_site = run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], scratch
            ).stdout.strip()
            with open(os.path.join(scratch_site, "rec_sdk_reused_packages.pth"), "w") as f:
                f.write(sysconfig.get_paths()["purelib"] + "\n")
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel], scratch)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
        where = (
            run([python, "-c", "import rec_sdk; print(rec_sdk.__file__)"], scratch, env=env)
            .stdout.strip()
            .splitlines()[-1]
        )
        if not where.startswith(venv + os.sep):
            sys.exit("rec_sdk was imported from %s, not from the wheel in %s" % (where, venv))
        out = run([python, "-c", EXAMPLE], scratch, env=env)
        print(out.stdout.strip())
        # The same wheel next to another TensorFlow: its version file says so. The other is
        # a supported one, so the message names both fixes.
        other = next(
            row.tensorflow
            for row in release.RELEASES.values()
            if release.minor(row.tensorflow) != release.minor(built_for)
        )
        version_file = os.path.join(os.path.dirname(where), "ops", "_rec_sdk_ops.tf_version")
        with open(version_file, "w") as f:
            f.write(other + "\n")
        wrong = run([python, "-c", "import rec_sdk"], scratch, env=env, check=False)
        expected = [
            "This rec_sdk wheel (%s) needs TensorFlow %s: `%s`"
            % (release.wheel_version(other), other, release.install_tensorflow_command(other)),
            "install the rec_sdk wheel for TensorFlow %s: `%s`"
            % (release.minor(built_for), release.install_wheel_command(built_for)),
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
    print("wheel check passed: %s" % name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-packages", action="store_true")
    parser.add_argument("dist")
    args = parser.parse_args()
    main(args.dist, reuse_packages=args.reuse_packages)
