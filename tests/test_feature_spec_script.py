"""The FeatureSpec-mode training script (rec_sdk.examples.feature_spec_demo) end to end on
MovieLens-100k: FeatureSpecs with two features per table and a timestamp spec,
get_asc_insert_func in tf.data, start_asc_pipeline, a Session loop with periodic evaluation.
It must reach a test AUC above 0.70 with dynamic and with static shapes, and fill its tables
with exactly the keys it trained on."""

import numpy as np
import pytest
import tensorflow as tf

from helpers import session_config
from rec_sdk.examples import data, feature_spec_demo
from rec_sdk.util import initialize

STEPS, BATCH, EVAL_EVERY = 600, 256, 200  # about 1.9 epochs of the 80,000 training rows


@pytest.fixture(scope="module")
def expected():
    """Distinct keys of each table in the training split, and its newest timestamp, computed
    from the raw data (the example splits with test_fraction=0.2 and seed 0)."""
    raw, vocab = data.load_movielens_100k()
    train, _ = data.train_test_split(raw, test_fraction=0.2, seed=0)
    user_keys = sum(
        len(np.unique(train[f])) for f in ("user_id", "occupation", "zip", "age", "gender")
    )
    genres = train["genres"]
    item_keys = (
        len(np.unique(train["item_id"]))
        + len(np.unique(genres[genres >= 0]))
        + int((genres < 0).any())
    )  # -1 pads the genre lists: one more key
    # Every user, occupation, zip, age and gender appears in the training split.
    assert user_keys == sum(vocab[f] for f in ("user_id", "occupation", "zip", "age", "gender"))
    newest = np.sort(train["timestamp"])
    return {
        "user": user_keys,
        "item": item_keys,
        # A run of about one epoch sees the newest timestamp, or one of the 100 newest.
        "newest_timestamps": (int(newest[-100]), int(newest[-1])),
    }


_RUNS = {}


def _run(use_dynamic):
    """The script's results, once per mode (a graph of their own: a test may run both)."""
    if use_dynamic not in _RUNS:
        lines = []
        with tf.Graph().as_default():
            _RUNS[use_dynamic] = feature_spec_demo.run(
                steps=STEPS,
                batch_size=BATCH,
                use_dynamic=use_dynamic,
                eval_every=EVAL_EVERY,
                seed=0,
                log=lines.append,
                session_config=session_config(),
            )
        _RUNS[use_dynamic]["log"] = lines
    return _RUNS[use_dynamic]


def _check_full_run(results, expected):
    assert not initialize.is_initialized()  # terminate_config_initializer ran
    assert results["train_steps"] == STEPS
    assert results["test_auc"] > 0.70, results
    assert np.isfinite(results["test_loss"]) and results["test_loss"] < 0.65, results
    assert [step for step, _, _ in results["history"]] == [200, 400, 600]
    assert results["history"][-1][1] == results["test_auc"]
    assert any(line.startswith("final") for line in results["log"])
    assert set(results["tables"]) == {"user", "item"}
    for name in ("user", "item"):
        stats = results["tables"][name]
        # Nearly two epochs: every key of the training split got a row, once.
        assert stats["size"] == expected[name] > 0, (name, stats)
        assert stats["capacity"] == 5000
        assert stats["admitted"] == stats["size"]
        assert stats["rejected"] == stats["pending"] == stats["evicted"] == 0


def test_feature_spec_script_learns_with_dynamic_shapes(expected):
    _check_full_run(_run(True), expected)


def test_feature_spec_script_learns_with_static_shapes(expected):
    results = _run(False)
    _check_full_run(results, expected)


def test_static_shapes_train_like_dynamic_shapes():
    """Static shape only bounds each step's distinct keys (send_count); the updates are the
    same, so the evaluations agree."""
    dynamic, static = _run(True), _run(False)
    np.testing.assert_allclose(
        [h[1:] for h in static["history"]], [h[1:] for h in dynamic["history"]], atol=2e-3
    )


def test_feature_spec_script_with_admission_and_timestamps(expected):
    """access_threshold=3: a key gets a row on its third occurrence in training. The
    timestamp spec feeds every table's clock (the eviction threshold needs it)."""
    results = feature_spec_demo.run(
        steps=300,
        batch_size=BATCH,
        eval_every=0,
        access_threshold=3,
        eviction_threshold=30 * 86400,
        log=lambda line: None,
        session_config=session_config(),
    )
    assert results["train_steps"] == 300
    assert results["test_auc"] > 0.70, results
    assert len(results["history"]) == 1
    for name in ("user", "item"):
        stats = results["tables"][name]
        assert 0 < stats["size"] <= expected[name], (name, stats)
        assert stats["admitted"] == stats["size"]
        assert stats["rejected"] > 0, (name, stats)
        assert stats["evicted"] == 0  # eviction runs only when asked (EvictHook)
        low, high = expected["newest_timestamps"]
        assert low <= stats["newest_clock"] <= high, (name, stats)
    # Items rated once or twice are still below the threshold.
    assert results["tables"]["item"]["size"] < expected["item"]
    assert results["tables"]["item"]["pending"] > 0


def test_command_line():
    results = feature_spec_demo.main(["--steps", "20", "--eval-every", "10", "--static"])
    assert results["train_steps"] == 20
    assert [step for step, _, _ in results["history"]] == [10, 20]
    assert not initialize.is_initialized()
