"""SDK-style training scripts (tests/sdk_scripts/) run unmodified in every run mode: they use
the SDK's module paths and names the way its examples do, so each fails when a name is
missing or does nothing. Results are checked against NumPy references of the data."""

import os
import runpy
import sys

import numpy as np
import pytest
import tensorflow as tf

SCRIPTS = os.path.join(os.path.dirname(__file__), "sdk_scripts")
sys.path.insert(0, SCRIPTS)

import little_demo_like as demo  # noqa: E402  (the script's data generator and constants)

_FLAGS = (
    "USE_MODE",
    "USE_MODIFY_GRAPH",
    "USE_DYNAMIC",
    "USE_DYNAMIC_EXPANSION",
    "USE_MULTI_LOOKUP",
    "USE_TIMESTAMP",
    "USE_ONE_SHOT",
    "APPLY_GRADIENTS_STRATEGY",
)


def run_script(name, directory, monkeypatch, **env):
    """Runs tests/sdk_scripts/<name>.py as __main__ in `directory` with `env`; returns its
    RESULTS."""
    for key in _FLAGS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.chdir(directory)
    tf.compat.v1.reset_default_graph()  # each run is a new process in the SDK's run.sh
    return runpy.run_path(os.path.join(SCRIPTS, name + ".py"), run_name="__main__")["RESULTS"]


def training_keys():
    data = demo.make_data(demo.MAX_STEPS, seed=1)
    return data["user_ids"], data["item_ids"]


def expected_admitted(ids_by_step, coefficient, thresholds):
    """Keys holding a row after training: a key's count grows by coefficient x occurrences in
    each step's batch; it is admitted once its count reaches that step's threshold."""
    counts, admitted, sizes = {}, set(), []
    for step, ids in enumerate(ids_by_step):
        keys, occurrences = np.unique(ids, return_counts=True)
        for key, n in zip(keys.tolist(), occurrences.tolist()):
            if key in admitted:
                continue
            counts[key] = counts.get(key, 0) + coefficient * n
            if counts[key] >= thresholds[step]:
                admitted.add(key)
        sizes.append(len(admitted))
    return admitted, sizes


def per_step(ids):
    return [ids[i * demo.BATCH : (i + 1) * demo.BATCH] for i in range(demo.MAX_STEPS)]


def check_training(results):
    users, items = training_keys()
    assert results["steps"] == demo.MAX_STEPS
    assert set(results["tables"]["user_table"][0].tolist()) == set(np.unique(users).tolist())
    assert set(results["tables"]["item_table"][0].tolist()) == set(np.unique(items).tolist())
    losses = np.array(results["train_losses"])
    assert np.isfinite(losses).all()
    assert losses[-10:, 0].mean() < losses[:10, 0].mean()  # the first loss trains
    assert len(results["eval_losses"]) == demo.MAX_STEPS // demo.TRAIN_INTERVAL


MODES = {
    "feature_spec": {},
    "feature_spec_static": {"USE_DYNAMIC": 0},
    "feature_spec_one_shot": {"USE_ONE_SHOT": 1},
    "modify_graph": {"USE_MODIFY_GRAPH": 1},
    "modify_graph_static_one_shot": {"USE_MODIFY_GRAPH": 1, "USE_DYNAMIC": 0, "USE_ONE_SHOT": 1},
    "single_lookup": {"USE_MULTI_LOOKUP": 0},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_little_demo_trains_saves_and_predicts(mode, tmp_path, monkeypatch):
    results = run_script("little_demo_like", tmp_path, monkeypatch, **MODES[mode])
    check_training(results)
    # Saver.save created ./saved-model (it did not exist) with the tables beside the model.
    assert sorted(os.listdir(tmp_path / "saved-model" / "sparse-model-0-40")) == [
        "item_table",
        "user_table",
    ]
    predicted = run_script(
        "little_demo_like", tmp_path, monkeypatch, USE_MODE="predict", **MODES[mode]
    )
    assert predicted["if_load"] is True
    # The restored tables and the evaluation after the last training step agree.
    np.testing.assert_allclose(predicted["eval_losses"][-1], results["eval_losses"][-1], rtol=1e-5)
    for name in ("user_table", "item_table"):
        assert sorted(predicted["tables"][name][0].tolist()) == sorted(
            results["tables"][name][0].tolist()
        )


def _sorted_rows(table):
    keys, values = table
    order = np.argsort(keys)
    return keys[order], values[order]


@pytest.mark.parametrize("modify", [0, 1])
def test_expansion_mode_both_gradient_strategies_train_identically(modify, tmp_path, monkeypatch):
    runs = {}
    for strategy in ("direct_apply", "sum_same_id_gradients_and_apply"):
        directory = tmp_path / strategy
        directory.mkdir()
        runs[strategy] = run_script(
            "little_demo_like",
            directory,
            monkeypatch,
            USE_DYNAMIC_EXPANSION=1,
            USE_MODIFY_GRAPH=modify,
            APPLY_GRADIENTS_STRATEGY=strategy,
        )
        check_training(runs[strategy])
    for name in ("user_table", "item_table"):
        keys_a, rows_a = _sorted_rows(runs["direct_apply"]["tables"][name])
        keys_b, rows_b = _sorted_rows(runs["sum_same_id_gradients_and_apply"]["tables"][name])
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_allclose(rows_a, rows_b, rtol=1e-6, atol=1e-7)


def test_unknown_gradient_strategy_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="APPLY_GRADIENTS_STRATEGY='sum'.*direct_apply"):
        run_script(
            "little_demo_like",
            tmp_path,
            monkeypatch,
            USE_DYNAMIC_EXPANSION=1,
            APPLY_GRADIENTS_STRATEGY="sum",
        )


@pytest.mark.parametrize("modify", [0, 1])
def test_admission_with_a_run_time_threshold_change(modify, tmp_path, monkeypatch):
    results = run_script(
        "little_demo_like", tmp_path, monkeypatch, USE_TIMESTAMP=1, USE_MODIFY_GRAPH=modify
    )
    assert results["set_threshold"] == 1
    users, items = training_keys()
    change = demo.TRAIN_INTERVAL // 2  # set_threshold runs after this step
    user_thresholds = [demo.ACCESS_THRESHOLD] * change + [demo.NEW_THRESHOLD] * (
        demo.MAX_STEPS - change
    )
    # The user table is looked up 1 + MULTI_LOOKUP_TIMES times per step, coefficient 1 each.
    user_admitted, user_sizes = expected_admitted(
        per_step(users), 1 + demo.MULTI_LOOKUP_TIMES, user_thresholds
    )
    item_admitted, item_sizes = expected_admitted(
        per_step(items), 4, [demo.ACCESS_THRESHOLD] * demo.MAX_STEPS
    )
    assert set(results["tables"]["user_table"][0].tolist()) == user_admitted
    assert set(results["tables"]["item_table"][0].tolist()) == item_admitted
    sizes = np.array(results["table_sizes"])
    np.testing.assert_array_equal(sizes[:, 0], user_sizes)
    np.testing.assert_array_equal(sizes[:, 1], item_sizes)
    # The raised threshold held keys back: without it more user keys would have rows.
    without, _ = expected_admitted(
        per_step(users), 1 + demo.MULTI_LOOKUP_TIMES, [demo.ACCESS_THRESHOLD] * demo.MAX_STEPS
    )
    assert len(user_admitted) < len(without)


def run_estimator(tmp_path, monkeypatch, run_mode, **env):
    return run_script(
        "estimator_like",
        tmp_path,
        monkeypatch,
        RUN_MODE=run_mode,
        MODEL_DIR=str(tmp_path / "model"),
        **env,
    )


ESTIMATOR_MODES = {
    "feature_spec": {},
    "modify_graph": {"USE_MODIFY_GRAPH": 1},
    "modify_graph_static_one_shot": {"USE_MODIFY_GRAPH": 1, "USE_DYNAMIC": 0, "USE_ONE_SHOT": 1},
    "feature_spec_expansion": {"USE_DYNAMIC_EXPANSION": 1},
}


@pytest.mark.estimator
@pytest.mark.parametrize("mode", sorted(ESTIMATOR_MODES))
def test_estimator_train_evaluate_predict(mode, tmp_path, monkeypatch):
    env = ESTIMATOR_MODES[mode]
    run_estimator(tmp_path, monkeypatch, "train", **env)
    evaluated = run_estimator(tmp_path, monkeypatch, "evaluate", **env)
    assert evaluated["eval"]["global_step"] == 30 and np.isfinite(evaluated["eval"]["loss"])
    predicted = run_estimator(tmp_path, monkeypatch, "predict", **env)
    assert len(predicted["predictions"]) == 4 * 32
    # train_and_evaluate in a fresh model_dir trains and evaluates identically.
    (tmp_path / "tae").mkdir()
    both = run_estimator(tmp_path / "tae", monkeypatch, "train_and_evaluate", **env)
    assert both["eval"]["global_step"] == 30
    np.testing.assert_allclose(both["eval"]["loss"], evaluated["eval"]["loss"], rtol=1e-5)


@pytest.mark.estimator
@pytest.mark.parametrize("modify", [0, 1])
def test_estimator_admission_and_eviction_with_evict_hook(modify, tmp_path, monkeypatch):
    results = run_estimator(
        tmp_path, monkeypatch, "train", USE_TIMESTAMP=1, USE_MODIFY_GRAPH=modify
    )
    ((evictions, last),) = results["evictions"]
    # Batch timestamps advance 10 s per step and keys unseen for 50 s are evicted: with the
    # hook firing at global steps 10, 20 and 30, every firing finds such keys.
    assert evictions == 3
    assert last["user_table"][0] > 0 and last["item_table"][0] > 0
    evaluated = run_estimator(
        tmp_path, monkeypatch, "evaluate", USE_TIMESTAMP=1, USE_MODIFY_GRAPH=modify
    )
    assert np.isfinite(evaluated["eval"]["loss"])


@pytest.mark.estimator
def test_estimator_with_the_slicer_hooks(tmp_path, monkeypatch):
    runs = {}
    for name, env in (
        ("sliced_and_modified", {"USE_MODIFY_GRAPH": 1}),
        ("sliced", {}),
        ("neither", {"NO_SLICER_HOOKS": 1}),
    ):
        (tmp_path / name).mkdir()
        runs[name] = run_estimator(
            tmp_path / name, monkeypatch, "train_and_evaluate", ENABLE_SLICER_TEST=1, **env
        )
    # Training: the orphan user ids and the StringToNumber output moved into the pipeline;
    # evaluation hooks did the same in the evaluation graph.
    assert runs["sliced_and_modified"]["sliced"] == [1, 1, 1, 1]
    assert runs["sliced"]["sliced"] == [1, 1, 1, 1] and runs["neither"]["sliced"] == []
    # Moving the key preprocessing (and modifying the graph) trains exactly as in the step.
    losses = [runs[name]["eval"]["loss"] for name in ("sliced_and_modified", "sliced")]
    np.testing.assert_allclose(losses, runs["neither"]["eval"]["loss"], rtol=1e-5)
