"""The demo behind `make demo`: it trains to a useful AUC on MovieLens-100k in both table
modes, and runs on a user's Criteo-format file."""

import numpy as np

from rec_sdk.examples import data, demo


def test_movielens_demo_learns_in_fixed_capacity_mode():
    results = demo.main(["--epochs", "1"])
    assert results["test_auc"] > 0.72, results


def test_movielens_demo_learns_in_expansion_mode():
    results = demo.main(["--epochs", "1", "--expansion"])
    assert results["test_auc"] > 0.72, results


def test_criteo_file_demo_runs_and_learns_a_planted_signal(tmp_path):
    rng = np.random.default_rng(0)
    n = 6000
    categorical = rng.integers(0, 50, size=(n, 26))
    # The label depends on the first categorical field only: a model that trains its
    # embeddings separates it well.
    label = (categorical[:, 0] % 2 == 0).astype(np.int64)
    flip = rng.random(n) < 0.1
    label = np.where(flip, 1 - label, label)
    dense = rng.integers(0, 100, size=(n, 13))
    hex_fields = [["%08x" % v for v in row] for row in categorical]
    path = str(tmp_path / "toy_criteo.tsv")
    data.write_criteo_tsv(path, label, dense, hex_fields)
    results = demo.main(
        ["--data", path, "--epochs", "3", "--batch-size", "128", "--learning-rate", "0.01"]
    )
    assert results["test_auc"] > 0.8, results
