"""tf.estimator with rec_sdk: GraphModifierHook in train, evaluate, predict and
train_and_evaluate (graph-modification and FeatureSpec model_fns), EvictHook in training, and
tables shared across the Estimator's sessions through checkpoints instead of being rebuilt."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from helpers import session_config
from rec_sdk import saver
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup, tables_of_graph
from rec_sdk.examples import estimator_demo
from rec_sdk.graph.modifier import GraphModifierHook, share_tables
from rec_sdk.optimizers import lazy_adam
from rec_sdk.util.initialize import init

pytestmark = pytest.mark.estimator

NO_FILES = "no files were read"


class _StatsAtEnd(tf.compat.v1.train.SessionRunHook):
    """Reads every table's counters when the session ends."""

    def __init__(self):
        self.stats = {}
        self._ops = None

    def begin(self):
        self._ops = {t.table_name: t.stats() for t in tables_of_graph()}

    def end(self, session):
        self.stats = {
            k: {s: int(v) for s, v in d.items()} for k, d in session.run(self._ops).items()
        }


def _config(steps):
    return tf.estimator.RunConfig(
        tf_random_seed=0,
        save_checkpoints_steps=steps // 2,
        log_step_count_steps=None,
        save_summary_steps=steps,
        session_config=session_config(),
    )


def test_train_evaluate_predict_with_graph_modification_and_eviction(tmp_path, caplog):
    """MovieLens-100k: train with GraphModifierHook + EvictHook (admission, 60-day eviction),
    evaluate and predict in new graphs that restore the trained tables; AUC > 0.70."""
    caplog.set_level(logging.INFO)
    stats = _StatsAtEnd()
    # Evictions at steps 150 and 300: one at the last step (400) would run after the final
    # checkpoint (MonitoredTrainingSession runs its CheckpointSaverHook first), so the
    # tables in memory would no longer equal it and evaluation would read the files.
    result = estimator_demo.run(
        str(tmp_path),
        steps=400,
        access_threshold=1,
        eviction_days=60,
        log=lambda line: None,
        config=_config(400),
        extra_train_hooks=[stats],
        evict_step_interval=150,
    )
    assert result["eval"]["global_step"] == 400
    assert result["eval"]["auc"] > 0.70, result
    assert result["predictions"] == 20000
    # Prediction sees the same trained model as evaluation.
    assert abs(result["predict_auc"] - result["eval"]["auc"]) < 0.01, result
    # EvictHook evicted rows during training; admission let keys in.
    for name in ("user", "item"):
        assert stats.stats[name]["evicted"] > 0, stats.stats
        assert stats.stats[name]["admitted"] > stats.stats[name]["evicted"], stats.stats
    # Evaluation and prediction used the training session's tables kept in memory.
    reused = [r.getMessage() for r in caplog.records if NO_FILES in r.getMessage()]
    assert len(reused) == 4, reused  # 2 tables x (evaluate, predict)


def test_train_and_evaluate(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    result = estimator_demo.run(
        str(tmp_path),
        steps=400,
        train_and_evaluate=True,
        log=lambda line: None,
        config=_config(400),
    )
    assert result["eval"]["global_step"] == 400
    assert result["eval"]["auc"] > 0.70, result
    # The evaluations while training (at steps 200 and 400) and the prediction read the
    # training session's tables: no second copy, nothing rebuilt from files.
    reused = [r.getMessage() for r in caplog.records if NO_FILES in r.getMessage()]
    assert len(reused) >= 4, reused


def test_evaluate_without_the_hook_reads_the_files_and_agrees(tmp_path, caplog):
    """The same model_fn evaluated without GraphModifierHook: the lookups dedup inside the
    step and the private tables are restored from the checkpoint files; the metrics equal
    those of the modified graph that used the tables kept in memory."""
    caplog.set_level(logging.INFO)
    result = estimator_demo.run(
        str(tmp_path), steps=100, log=lambda line: None, config=_config(100)
    )
    caplog.clear()
    _, test, _ = estimator_demo.feature_spec_demo.load_inputs()
    init()
    estimator = tf.estimator.Estimator(
        estimator_demo.make_model_fn(), model_dir=str(tmp_path), config=_config(100)
    )
    metrics = estimator.evaluate(estimator_demo.make_input_fn(test, 1000, False))
    assert not any(NO_FILES in r.getMessage() for r in caplog.records)
    assert metrics["auc"] == pytest.approx(result["eval"]["auc"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(result["eval"]["loss"], rel=1e-5)


def test_feature_spec_model_fn_with_the_hook_only_starting_the_pipeline(tmp_path):
    """FeatureSpec mode in an Estimator: the input_fn maps the insert function; the hook
    (modify_graph=False) checks the pipeline; train then evaluate."""
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 30, (512, 2)).astype(np.int64)
    labels = (ids[:, 0] % 2).astype(np.float32)
    spec = FeatureSpec("ids", table_name="t")

    def input_fn(is_training):
        def fn():
            ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "label": labels}).batch(64)
            return ds.map(get_asc_insert_func(tgt_key_specs=[spec], is_training=is_training))

        return fn

    def model_fn(features, labels, mode):
        del labels
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        table = create_table(
            tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
        )
        emb = sparse_lookup(table, spec, is_train=is_train, batch=features)
        logits = tf.reduce_sum(emb, axis=[1, 2])
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=features["label"], logits=logits)
        )
        if not is_train:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = lazy_adam.create_hash_optimizer(learning_rate=0.1).minimize(
            loss, global_step=step
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    init()
    estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path), config=_config(16))
    estimator.train(input_fn(True), steps=1, hooks=[GraphModifierHook(modify_graph=False)])
    before = estimator.evaluate(input_fn(False), hooks=[GraphModifierHook(modify_graph=False)])
    estimator.train(input_fn(True), steps=16, hooks=[GraphModifierHook(modify_graph=False)])
    after = estimator.evaluate(input_fn(False), hooks=[GraphModifierHook(modify_graph=False)])
    assert after["loss"] < before["loss"] - 0.05, (before, after)


def _table_graph(share, ids=(1, 2, 3), access_threshold=None):
    """A graph with one table, a train op on a fixed batch, and a Saver."""
    graph = tf.Graph()
    with graph.as_default():
        table = create_table(
            tf.int64, 4, "shared", tf.compat.v1.ones_initializer(), device_vocabulary_size=100
        )
        config = None if access_threshold is None else {"access_threshold": access_threshold}
        emb = sparse_lookup(
            table,
            tf.constant(ids, tf.int64),
            is_train=share != "reader",
            access_and_evict_config=config,
        )
        train = None
        if share != "reader":
            step = tf.compat.v1.train.get_or_create_global_step()
            train = lazy_adam.create_hash_optimizer(learning_rate=0.1).minimize(
                tf.reduce_sum(emb), global_step=step
            )
        if share:
            share_tables(graph)
        export = table.export()
        tf.compat.v1.train.get_or_create_global_step()
        return graph, train, export, tf.compat.v1.train.Saver()


def _values(sess, export):
    keys, values, _ = sess.run(export)
    return values[np.argsort(keys)]


def test_sharing_rules_between_live_sessions(tmp_path):
    """A reader restoring the checkpoint a live trainer holds uses its table (no files, sees
    its later updates); a second trainer, or a graph that did not opt in, gets its own copy."""
    init()
    path = str(tmp_path / "ckpt")
    g1, train1, export1, saver1 = _table_graph("trainer")
    s1 = tf.compat.v1.Session(graph=g1, config=session_config())
    with g1.as_default():
        s1.run(tf.compat.v1.global_variables_initializer())
    s1.run(train1)
    saved = saver1.save(s1, path)
    trained = _values(s1, export1)

    g2, _, export2, saver2 = _table_graph("reader")
    g3, train3, export3, saver3 = _table_graph("trainer")
    g4, train4, export4, saver4 = _table_graph("")
    with (
        tf.compat.v1.Session(graph=g2, config=session_config()) as s2,
        tf.compat.v1.Session(graph=g3, config=session_config()) as s3,
        tf.compat.v1.Session(graph=g4, config=session_config()) as s4,
    ):
        for s, sv in ((s2, saver2), (s3, saver3), (s4, saver4)):
            sv.restore(s, saved)
        for s, e in ((s2, export2), (s3, export3), (s4, export4)):
            np.testing.assert_array_equal(_values(s, e), trained)
        for _ in range(3):
            s3.run(train3)
            s4.run(train4)
        # The trainers trained their own copies; the reader reads the first trainer's table.
        np.testing.assert_array_equal(_values(s1, export1), trained)
        s1.run(train1)
        np.testing.assert_array_equal(_values(s2, export2), _values(s1, export1))
        assert not np.array_equal(_values(s2, export2), trained)
        np.testing.assert_array_equal(_values(s3, export3), _values(s4, export4))
        assert not np.array_equal(_values(s3, export3), _values(s1, export1))
    s1.close()


def test_a_table_kept_after_its_session_stands_in_for_the_files_until_it_changes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    init()
    path = str(tmp_path / "ckpt")
    g1, train1, export1, saver1 = _table_graph("trainer")
    with tf.compat.v1.Session(graph=g1, config=session_config()) as s1:
        with g1.as_default():
            s1.run(tf.compat.v1.global_variables_initializer())
        s1.run(train1)
        saved = saver1.save(s1, path)
        trained = _values(s1, export1)
    # The session is gone; its table, equal to the checkpoint, was kept. Corrupting the files
    # shows that a sharing graph restores without reading them, a private one does read them.
    values_file = saver.sparse_dir(saved) + "/shared/values.bin"
    with open(values_file, "r+b") as f:
        f.write(b"\xff" * 16)
    g2, _, export2, saver2 = _table_graph("reader")
    with tf.compat.v1.Session(graph=g2, config=session_config()) as s2:
        saver2.restore(s2, saved)
        np.testing.assert_array_equal(_values(s2, export2), trained)
    assert any(NO_FILES in r.getMessage() for r in caplog.records)
    g3, _, _, saver3 = _table_graph("")
    with tf.compat.v1.Session(graph=g3, config=session_config()) as s3:
        with pytest.raises(tf.errors.DataLossError, match="values"):
            saver3.restore(s3, saved)
    # A trainer that adopts the kept table and changes it: the table no longer equals the
    # checkpoint, so the next restore must read the (corrupted) files and fails.
    g4, train4, _, saver4 = _table_graph("trainer")
    with tf.compat.v1.Session(graph=g4, config=session_config()) as s4:
        saver4.restore(s4, saved)
        s4.run(train4)
    g5, _, _, saver5 = _table_graph("reader")
    with tf.compat.v1.Session(graph=g5, config=session_config()) as s5:
        with pytest.raises(tf.errors.DataLossError, match="values"):
            saver5.restore(s5, saved)


def test_a_reader_never_changes_the_table_it_shares(tmp_path):
    """A reader that follows a live trainer's table and then restores a newer checkpoint from
    files restores into a table of its own (the trainer keeps its later training); writes
    into the shared table from a reader graph are refused."""
    init()
    g1, train1, export1, saver1 = _table_graph("trainer")
    g2, _, export2, saver2 = _table_graph("reader")
    with g2.as_default():
        upsert = tables_of_graph()[0].upsert(tf.constant([9], tf.int64), tf.ones([1, 4]))
    with (
        tf.compat.v1.Session(graph=g1, config=session_config()) as s1,
        tf.compat.v1.Session(graph=g2, config=session_config()) as s2,
    ):
        with g1.as_default():
            s1.run(tf.compat.v1.global_variables_initializer())
        s1.run(train1)
        first = saver1.save(s1, str(tmp_path / "a"), global_step=1)
        saver2.restore(s2, first)  # follows the trainer's table
        with pytest.raises(tf.errors.FailedPreconditionError, match="cannot be changed here"):
            s2.run(upsert)
        s1.run(train1)
        second = saver1.save(s1, str(tmp_path / "a"), global_step=2)
        at_second = _values(s1, export1)
        s1.run(train1)
        s1.run(train1)
        trained = _values(s1, export1)
        # The trainer moved on since `second`: the reader reads `second` from the files.
        saver2.restore(s2, second)
        np.testing.assert_array_equal(_values(s2, export2), at_second)
        np.testing.assert_array_equal(_values(s1, export1), trained)
        s2.run(upsert)  # its own table now
        np.testing.assert_array_equal(_values(s1, export1), trained)


def test_a_trainer_taking_over_a_kept_table_brings_its_own_thresholds(tmp_path, caplog):
    """Thresholds belong to the graph's lookups, not to the checkpoint: a new training graph
    with another access_threshold adopts the table kept from the last session (no files read)
    and trains it with its own threshold, as a private graph restoring the files does."""
    caplog.set_level(logging.INFO)
    init()
    path = str(tmp_path / "ckpt")
    g1, train1, _, saver1 = _table_graph("trainer", access_threshold=1)
    with tf.compat.v1.Session(graph=g1, config=session_config()) as s1:
        with g1.as_default():
            s1.run(tf.compat.v1.global_variables_initializer())
        s1.run(train1)
        saved = saver1.save(s1, path)
    for share in ("trainer", ""):
        caplog.clear()
        # Key 7 appears once per step: with threshold 3 it gets a row at the third step.
        g2, train2, export2, saver2 = _table_graph(share, ids=(1, 2, 3, 7), access_threshold=3)
        with tf.compat.v1.Session(graph=g2, config=session_config()) as s2:
            saver2.restore(s2, saved)
            assert any(NO_FILES in r.getMessage() for r in caplog.records) == (share != "")
            for step in range(3):
                s2.run(train2)
                keys = set(s2.run(export2)[0].tolist())
                assert keys == ({1, 2, 3, 7} if step == 2 else {1, 2, 3}), (share, step, keys)
