"""Every way a program saves a SavedModel of de tables reloads with every row, in a fresh
process, by both loaders: TF1 (SavedModelBuilder, Estimator's export_saved_model) and TF2
(tf.saved_model.save of a tf.Module, Keras model.save), read by
tf.compat.v1.saved_model.loader.load and by tf.saved_model.load; int64, int32 and string
keys; with and without a dense variable, under a scope or not, one or two shards, with or
without a restrict policy (every pair of those four options in 5 cases per key dtype).

tests/savedmodel_matrix_worker.py writes and loads; each writer and each loader is a process
of its own. The rows each case stored are known (rows_of), so a loaded model that serves the
keys' initial values (rows that did not come back) fails, as does one that does not load."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tests import savedmodel_matrix_worker as worker

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "savedmodel_matrix_worker.py")
KINDS = [k for k in worker.KINDS if k != "estimator" or hasattr(tf, "estimator")]
TIMEOUT = 900


def _run(*args):
    result = subprocess.run(
        [sys.executable, WORKER] + list(args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, "%s failed:\n%s" % (
        args,
        result.stdout[-3000:] + result.stderr[-6000:],
    )
    return result.stdout


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """{loader: {case: served rows or "error: ..."}} and the directory of the models."""
    root = str(tmp_path_factory.mktemp("savedmodels"))
    for kind in KINDS:
        _run("write", kind, root)
    loaded = {}
    for loader in ("v1", "v2"):
        (line,) = [x for x in _run("load", loader, root).splitlines() if x.startswith("CASES ")]
        loaded[loader] = json.loads(line[len("CASES ") :])
    return loaded, root


def _expected(case):
    """What a case serves for its probe keys: its rows (times the dense variable), the
    initial value for the key it never stored."""
    _, keys, opts = worker.parse(case)
    scale = worker.DENSE if opts["dense"] else 1.0
    stored = worker.rows_of(worker.KEYS[keys])
    unknown = np.full([1, worker.DIM], worker.INITIAL, np.float32)
    return np.concatenate([stored, unknown]) * scale


@pytest.mark.parametrize("loader", ["v1", "v2"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_savedmodel_reloads_every_row(matrix, kind, loader):
    loaded, root = matrix
    failures = []
    for case in worker.cases(kind):
        with open(os.path.join(root, case + ".json")) as f:
            written = json.load(f)
        if "error" in written:
            failures.append("%s: not saved: %s\n%s" % (case, written["error"], written["trace"]))
            continue
        # The writing process served the rows (the case is what it claims to be) ...
        np.testing.assert_allclose(written["served"], _expected(case), err_msg=case)
        # ... and so does the loaded model.
        got = loaded[loader].get(case, "error: not loaded")
        if isinstance(got, str):
            failures.append("%s: %s" % (case, got))
        elif not np.allclose(got, _expected(case)):
            failures.append("%s: served %s, stored %s" % (case, got, _expected(case).tolist()))
    assert not failures, "\n".join(failures)
