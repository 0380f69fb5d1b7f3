"""Runs tests/tf2 (eager, tf.function, Keras) in a pytest process of its own: this process is
in graph mode for good (conftest.py)."""

import os
import subprocess
import sys

TF2_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf2")


def test_tf2_suite():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--confcutdir",
            TF2_DIR,
            TF2_DIR,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-20000:]
    # The summary line (TensorFlow may log after it, e.g. at interpreter exit).
    summary = [line for line in result.stdout.splitlines() if " passed" in line]
    assert summary and " failed" not in summary[-1], result.stdout[-2000:]
