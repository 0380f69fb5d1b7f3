"""The quick subset of the stress suite (tests/stress/run.py --quick), so that CI runs it."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.once
def test_quick_stress_suite_passes():
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "stress", "run.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "FAIL" not in result.stdout, result.stdout
