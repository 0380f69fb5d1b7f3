"""Checkpoints of rec_sdk tables through tf.compat.v1.train.Saver: bit-identical continuation
after restore, is_save=False, max_to_keep, MonitoredTrainingSession, corrupted files, crash
safety (a saving child process killed at random points), re-sharding, and NumPy export."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import new_session, sorted_export
from rec_sdk import saver as rec_saver
from rec_sdk.constants.constants import TABLE_COLLECTION
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import adagrad, lazy_adam
from rec_sdk.util.initialize import init, terminate_config_initializer

DIM = 4


def _batches(count, seed):
    rng = np.random.RandomState(seed)
    return [
        (
            rng.randint(0, 40, size=(8, 3)).astype(np.int64),
            np.arange(8, dtype=np.int64) + 1000 * i,
            rng.rand(8).astype(np.float32),
        )
        for i in range(count)
    ]


def _model(optimizer="lazy_adam"):
    """A small model: one table with admission and timestamp eviction, a dense layer, LazyAdam
    (sparse) and Adam (dense). Returns (feeds, loss, train_op, table)."""
    tf.compat.v1.set_random_seed(0)
    step = tf.compat.v1.train.get_or_create_global_step()
    table = create_table(
        tf.int64,
        DIM,
        "t",
        tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3),
        device_vocabulary_size=1000,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    ts = tf.compat.v1.placeholder(tf.int64, [None])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=ts,
        access_and_evict_config={"access_threshold": 2, "eviction_threshold": 5000},
    )
    w = tf.compat.v1.get_variable(
        "w", [3 * DIM, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=4)
    )
    logits = tf.reshape(tf.matmul(tf.reshape(emb, [-1, 3 * DIM]), w), [-1])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    sparse = (
        lazy_adam.create_hash_optimizer(0.05)
        if optimizer == "lazy_adam"
        else adagrad.create_hash_optimizer(0.05)
    )
    tables = [table]
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=[w], global_step=step),
        sparse.apply_gradients(zip(tf.gradients(loss, tables), tables)),
    )
    return (ids, ts, labels), loss, train, table


def _dense_weights():
    return [v for v in tf.compat.v1.global_variables() if v.op.name == "w"]


def _run(sess, feeds, loss, train, batches):
    losses = []
    for ids, ts, y in batches:
        losses.append(sess.run([loss, train], dict(zip(feeds, (ids, ts, y))))[0])
    return losses


def _state(sess, table):
    keys, values, slots = sorted_export(*sess.run(table.export()))
    dense = sess.run(tf.compat.v1.trainable_variables())
    return keys, values, slots, dense, sess.run(table.stats())


def test_restore_continues_bit_identically(tmp_path):
    init()
    batches = _batches(20, seed=1)
    feeds, loss, train, table = _model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        straight = _run(sess, feeds, loss, train, batches)
        expected = _state(sess, table)
    tf.compat.v1.reset_default_graph()

    feeds, loss, train, table = _model()
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        first = _run(sess, feeds, loss, train, batches[:12])
        path = saver.save(sess, str(tmp_path / "model"), global_step=12)
    assert os.path.isdir(str(tmp_path / "sparse-model-12" / "t"))
    assert tf.train.latest_checkpoint(str(tmp_path)) == path
    tf.compat.v1.reset_default_graph()

    feeds, loss, train, table = _model()
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        saver.restore(sess, path)
        second = _run(sess, feeds, loss, train, batches[12:])
        got = _state(sess, table)
    assert first + second == straight
    for a, b in zip(got[:3], expected[:3]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got[3], expected[3]):
        np.testing.assert_array_equal(a, b)
    assert got[4] == expected[4]  # admitted, rejected, evicted, pending, newest clock


def test_is_save_false_tables_are_skipped(tmp_path):
    init()
    kept = create_table(
        tf.int64, DIM, "kept", tf.compat.v1.constant_initializer(1.0), device_vocabulary_size=100
    )
    skipped = create_table(
        tf.int64,
        DIM,
        "skipped",
        tf.compat.v1.constant_initializer(1.0),
        is_save=False,
        device_vocabulary_size=100,
    )
    keys = tf.constant([1, 2], tf.int64)
    upsert = tf.group(
        kept.upsert(keys, tf.fill([2, DIM], 5.0)), skipped.upsert(keys, tf.fill([2, DIM], 5.0))
    )
    tf.Variable(1.0)
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(upsert)
        path = saver.save(sess, str(tmp_path / "m"))
        assert sorted(os.listdir(str(tmp_path / "sparse-m"))) == ["kept"]
    with new_session() as sess:
        saver.restore(sess, path)
        assert sess.run(kept.size_tensor()) == 2 and sess.run(skipped.size_tensor()) == 0


def test_max_to_keep_deletes_table_directories(tmp_path):
    init()
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(1.0), device_vocabulary_size=100
    )
    insert = table.upsert(tf.constant([1], tf.int64), tf.ones([1, DIM]))
    tf.Variable(1.0)
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(insert)
        for step in range(4):
            saver.save(sess, str(tmp_path / "m"), global_step=step)
    sparse = sorted(d for d in os.listdir(str(tmp_path)) if d.startswith("sparse-"))
    assert sparse == ["sparse-m-2", "sparse-m-3"]


def test_monitored_training_session_saves_and_restores(tmp_path):
    init()
    batches = _batches(6, seed=2)
    feeds, loss, train, table = _model()
    export = table.export()
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(tmp_path), save_checkpoint_steps=3, save_summaries_steps=None
    ) as sess:
        _run(sess, feeds, loss, train, batches)
        expected = sorted_export(*sess.run(export))
    assert any(d.startswith("sparse-model.ckpt-") for d in os.listdir(str(tmp_path)))
    tf.compat.v1.reset_default_graph()
    feeds, loss, train, table = _model()
    export = table.export()
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(tmp_path), save_checkpoint_steps=None, save_summaries_steps=None
    ) as sess:
        got = sorted_export(*sess.run(export))
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_corrupted_checkpoint_fails_naming_the_file(tmp_path):
    init()
    batches = _batches(3, seed=3)
    feeds, loss, train, table = _model()
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _run(sess, feeds, loss, train, batches)
        path = saver.save(sess, str(tmp_path / "m"))
    values = tmp_path / "sparse-m" / "t" / "values.bin"
    data = bytearray(values.read_bytes())
    data[3] ^= 0x10
    values.write_bytes(bytes(data))
    with new_session() as sess:
        with pytest.raises(tf.errors.DataLossError, match="values.bin.*corrupted"):
            saver.restore(sess, path)
        assert sess.run(table.size_tensor()) == 0
    (tmp_path / "sparse-m" / "t" / "meta.txt").unlink()
    with new_session() as sess:
        with pytest.raises(tf.errors.NotFoundError, match="meta.txt"):
            saver.restore(sess, path)


def test_restore_without_table_directory_is_a_clear_error(tmp_path):
    init()
    tf.Variable(1.0, name="v")
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        path = saver.save(sess, str(tmp_path / "dense_only"))
    tf.compat.v1.reset_default_graph()
    tf.Variable(1.0, name="v")
    create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(1.0), device_vocabulary_size=100
    )
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        with pytest.raises(tf.errors.NotFoundError, match="sparse-dense_only.*does not exist"):
            saver.restore(sess, path)


def test_restore_into_two_ranks_and_back(tmp_path):
    init()
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.0), device_vocabulary_size=100
    )
    keys = np.arange(-10, 30, dtype=np.int64)
    values = np.repeat(keys[:, None].astype(np.float32), DIM, axis=1)
    fill = table.upsert(keys, values)
    with new_session() as sess:
        sess.run(fill)
        rec_saver.save_tables(sess, str(tmp_path / "one"))
    parts = []
    for rank in range(2):
        with new_session() as sess:
            rows = rec_saver.restore_tables(sess, str(tmp_path / "one"), rank_id=rank, rank_size=2)
            got = sess.run(table.export())[0]
            assert sorted(got.tolist()) == sorted(
                k for k in keys.tolist() if abs(k % 2 if k >= 0 else -((-k) % 2)) == rank
            )
            assert rows["t"] == len(got)
            rec_saver.save_tables(sess, str(tmp_path / ("rank%d" % rank)))
            parts.append(str(tmp_path / ("rank%d" % rank)))
    with new_session() as sess:
        rec_saver.restore_tables(sess, parts)
        got_keys, got_values, _ = sorted_export(*sess.run(table.export()))
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_values, values)


def test_restore_with_another_optimizer_keeps_embeddings(tmp_path):
    init()
    batches = _batches(4, seed=5)
    feeds, loss, train, table = _model("lazy_adam")
    saver = tf.compat.v1.train.Saver(var_list=_dense_weights())
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _run(sess, feeds, loss, train, batches)
        path = saver.save(sess, str(tmp_path / "m"))
        keys, values, _ = sorted_export(*sess.run(table.export()))
    tf.compat.v1.reset_default_graph()
    feeds, loss, train, table = _model("adagrad")
    saver = tf.compat.v1.train.Saver(var_list=_dense_weights())
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.restore(sess, path)
        got_keys, got_values, _ = sorted_export(*sess.run(table.export()))
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_values, values)
        _run(sess, feeds, loss, train, batches[:1])  # Adagrad takes over with fresh slots
        _, _, slots = sess.run(table.export())
        assert slots.shape[0] == 1


def test_npz_export_and_import(tmp_path):
    init()
    batches = _batches(3, seed=6)
    feeds, loss, train, table = _model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _run(sess, feeds, loss, train, batches)
        rows = rec_saver.export_npz(sess, str(tmp_path / "t.npz"))
        expected = sorted_export(*sess.run(table.export()))
    assert rows["t"] == len(expected[0]) > 0
    with np.load(str(tmp_path / "t.npz")) as data:
        assert set(data.files) == {"t/keys", "t/values", "t/slots"}
    with new_session() as sess:
        rec_saver.import_npz(sess, str(tmp_path / "t.npz"))
        got = sorted_export(*sess.run(table.export()))
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    from rec_sdk.core.embedding import create_table
    from rec_sdk.util.initialize import init
    init()
    table = create_table(tf.int64, 16, "t", tf.compat.v1.constant_initializer(0.0),
                         device_vocabulary_size=300000)
    step = tf.compat.v1.get_variable("step", [], tf.int64, tf.zeros_initializer())
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    # After step s the table holds keys [0, 5000 * (s % 40 + 1)) with value s + 1, and the
    # variable `step` is s + 1: a checkpoint's table and dense variable must agree.
    values = tf.cast(tf.fill([tf.size(keys), 16], step + 1), tf.float32)
    advance = tf.group(table.upsert(keys, values))
    with tf.control_dependencies([advance]):
        bump = tf.compat.v1.assign_add(step, 1)
    clear = table.clear()
    saver = tf.compat.v1.train.Saver(max_to_keep=3)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        all_keys = np.arange(200000, dtype=np.int64)
        for s in range(1000):
            sess.run(clear)
            sess.run(bump, {keys: all_keys[:5000 * (s % 40 + 1)]})
            saver.save(sess, sys.argv[1] + "/model", global_step=s)
            print(s, flush=True)
""")


def test_killed_save_leaves_previous_checkpoint_restorable(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    rng = np.random.RandomState(7)
    for attempt in range(4):
        ckpt_dir = tmp_path / ("run%d" % attempt)
        ckpt_dir.mkdir()
        child = subprocess.Popen(
            [sys.executable, str(script), str(ckpt_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        # Wait for a few saves, then kill at a random moment (likely inside a save).
        seen = 0
        while seen < 3 + attempt:
            line = child.stdout.readline()
            assert line, "the child died"
            seen += 1
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        latest = tf.train.latest_checkpoint(str(ckpt_dir))
        assert latest is not None
        tf.compat.v1.reset_default_graph()
        terminate_config_initializer()
        init()
        table = create_table(
            tf.int64, 16, "t", tf.compat.v1.constant_initializer(0.0), device_vocabulary_size=300000
        )
        step = tf.compat.v1.get_variable("step", [], tf.int64, tf.zeros_initializer())
        saver = tf.compat.v1.train.Saver()
        with new_session() as sess:
            saver.restore(sess, latest)
            s = sess.run(step)
            keys, values, _ = sess.run(table.export())
        # The table has exactly the rows of the step the dense variable says.
        assert len(keys) == 5000 * ((s - 1) % 40 + 1)
        assert np.all(values == s)
        leftovers = [d for d in os.listdir(str(ckpt_dir)) if ".tmp-" in d]
        # A killed save may leave its temporary directory behind, never a half-written
        # table directory under the checkpoint's name.
        assert all(d.startswith("sparse-model-") for d in leftovers)


@pytest.mark.estimator
def test_estimator_evaluate_sees_trained_tables(tmp_path):
    """Estimator.train writes checkpoints with the tables; evaluate and predict (new graphs,
    new sessions) restore them."""
    init()
    ids = np.arange(64, dtype=np.int64).reshape(32, 2)
    labels = (ids.sum(1) % 2).astype(np.float32)

    def model_fn(features, labels, mode):
        table = create_table(
            tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.0), device_vocabulary_size=1000
        )
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        emb = sparse_lookup(table, features["ids"], is_train=is_train)
        logits = tf.reduce_sum(emb, axis=[1, 2])
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        metrics = {"size": tf.compat.v1.metrics.mean(tf.cast(table.size_tensor(), tf.float32))}
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
        step = tf.compat.v1.train.get_global_step()
        train_op = lazy_adam.create_hash_optimizer(0.1).minimize(loss, global_step=step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(8)

    estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
    before = estimator.train(input_fn, steps=4).evaluate(input_fn)
    assert before["size"] == 64  # the evaluation graph restored all trained rows
    predictions = [p["logits"] for p in estimator.predict(input_fn)]
    assert np.abs(predictions).sum() > 0  # trained embeddings, not zeros
    estimator.train(input_fn, steps=4)
    after = estimator.evaluate(input_fn)
    assert after["loss"] < before["loss"]


def test_delta_checkpoints_equal_a_full_save(tmp_path):
    """Full save, then deltas (with admission, eviction and optimizer updates in between):
    the full checkpoint plus its deltas restores exactly what a full save of the end state
    restores."""
    init(enable_incremental_checkpoint=True)
    batches = _batches(15, seed=8)
    feeds, loss, train, table = _model()
    assert table.track_changes
    evict = table.evict()
    export = table.export()
    stats = table.stats()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _run(sess, feeds, loss, train, batches[:5])
        rec_saver.save_tables(sess, str(tmp_path / "full"))
        _run(sess, feeds, loss, train, batches[5:10])
        sess.run(evict)
        rows = rec_saver.save_tables(sess, str(tmp_path / "delta1"), delta=True)
        assert 0 < rows["t"] <= sess.run(table.size_tensor())
        _run(sess, feeds, loss, train, batches[10:])
        rec_saver.save_tables(sess, str(tmp_path / "delta2"), delta=True)
        rec_saver.save_tables(sess, str(tmp_path / "full_end"))
        expected = sorted_export(*sess.run(export)), sess.run(stats)
    for source in (
        {
            "directories": str(tmp_path / "full"),
            "deltas": [str(tmp_path / "delta1"), str(tmp_path / "delta2")],
        },
        {"directories": str(tmp_path / "full_end")},
    ):
        with new_session() as sess:
            rec_saver.restore_tables(sess, **source)
            got = sorted_export(*sess.run(export)), sess.run(stats)
        for a, b in zip(got[0], expected[0]):
            np.testing.assert_array_equal(a, b)
        assert got[1] == expected[1]


def test_delta_needs_incremental_checkpoints(tmp_path):
    init()
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.0), device_vocabulary_size=10
    )
    with new_session() as sess:
        sess.run(table.size_tensor())
        with pytest.raises(tf.errors.FailedPreconditionError, match="does not track changes"):
            rec_saver.save_tables(sess, str(tmp_path / "d"), delta=True)


def test_warm_start_saver_and_meta_graph_and_delta_rank_errors(tmp_path):
    """Warm-starting chosen variables keeps the tables; a graph loaded by import_meta_graph
    (no table objects) restores its tables from the checkpoint, trains on and saves again."""
    init()
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
    dense_saver = tf.compat.v1.train.Saver([w])
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        path = dense_saver.save(sess, str(tmp_path / "dense"))
    tf.compat.v1.reset_default_graph()
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.0), device_vocabulary_size=10
    )
    insert = table.upsert(tf.constant([3], tf.int64), tf.ones([1, DIM]))
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(insert)
        # Warm-starting chosen variables from a checkpoint without tables keeps the tables.
        tf.compat.v1.train.Saver([w]).restore(sess, path)
        assert sess.run(table.size_tensor()) == 1
        np.testing.assert_array_equal(sess.run(w), [1.0, 1.0])
        with pytest.raises(ValueError, match="deltas apply to one full checkpoint"):
            rec_saver.restore_tables(sess, str(tmp_path / "x"), rank_size=2, deltas=["d"])
        sess.run(table.upsert(tf.constant([5, 6], tf.int64), tf.fill([2, DIM], 2.0)))
        size_name = table.size_tensor().name
        full = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "full"))
    tf.compat.v1.reset_default_graph()
    saver = tf.compat.v1.train.import_meta_graph(full + ".meta")
    graph = tf.compat.v1.get_default_graph()
    with new_session() as sess:
        assert sess.run(size_name) == 0
        saver.restore(sess, full)
        np.testing.assert_array_equal(sess.run(tf.compat.v1.global_variables()[0]), [1.0, 1.0])
        imported = tf.compat.v1.get_collection(TABLE_COLLECTION)
        assert [(t.table_name, t.dim, t.key_dtype, t.is_save) for t in imported] == [
            ("t", DIM, tf.int64, True)
        ]
        export = table_ops.export(imported[0].handle, tf.int64, DIM)
        graph.finalize()  # the imported tables' objects add no op
        saved = sorted_export(*sess.run(export))
        assert saved[0].tolist() == [3, 5, 6]
        np.testing.assert_array_equal(saved[1], [[1.0] * DIM, [2.0] * DIM, [2.0] * DIM])
        again = saver.save(sess, str(tmp_path / "again"))
    with new_session(graph) as sess:
        assert sess.run(size_name) == 0
        saver.restore(sess, again)
        for got, want in zip(sorted_export(*sess.run(export)), saved):
            np.testing.assert_array_equal(got, want)


def test_a_saver_var_list_naming_tables_saves_and_restores_those_tables(tmp_path):
    import rec_sdk.dynamic_embedding as de
    from rec_sdk.util import initialize

    initialize.init(use_dynamic_expansion=True)

    def build():
        v0 = tf.compat.v1.get_variable("v0", initializer=10.0)
        kept = de.Variable(dim=1, name="kept", initializer=-1.0)
        left_out = de.Variable(dim=1, name="left_out", initializer=-1.0)
        return v0, kept, left_out

    keys = [0, 1, 2]
    v0, kept, left_out = build()
    saver = tf.compat.v1.train.Saver(var_list=[v0, kept])
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(
            [kept.upsert(keys, [[0.0], [1.0], [2.0]]), left_out.upsert(keys, [[5.0], [5.0], [5.0]])]
        )
        path = saver.save(sess, str(tmp_path / "model"))
    assert sorted(os.listdir(tmp_path / "sparse-model")) == ["kept_mht_1of1"]
    tf.compat.v1.reset_default_graph()
    v0, kept, left_out = build()
    saver = tf.compat.v1.train.Saver(var_list=[v0, kept])
    with new_session() as sess:
        sess.run(left_out.upsert([7], [[7.0]]))
        saver.restore(sess, path)
        assert sess.run(v0) == 10.0
        np.testing.assert_array_equal(sess.run(kept.lookup(keys)), [[0.0], [1.0], [2.0]])
        assert sess.run(left_out.size()) == 1  # not in the var_list: untouched
