"""Regression tests of defects found by hostile use (bad paths, bad timestamps, impossible
reservations); each failed before its fix. The core's own regression tests (cross-key writes,
all-or-nothing upserts and updates) are googletests in tf_ops/core/tests."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from helpers import make_table, new_session
from rec_sdk.core.embedding import sparse_lookup
from rec_sdk.ops import table_ops


def test_timestamps_of_the_wrong_length_are_an_error_naming_both_counts(initialized):
    """Two timestamps for four samples of two ids each used to be spread over the eight ids
    (the count divides them), giving keys other samples' clocks."""
    table = make_table()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    times = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=times,
        access_and_evict_config={"access_threshold": 1, "eviction_threshold": 100},
    )
    batch = np.arange(8, dtype=np.int64).reshape(4, 2)
    with new_session() as sess:
        sess.run(emb, {ids: batch, times: [5, 6, 7, 8]})  # one per sample: fine
        sess.run(emb, {ids: batch, times: [9]})  # one for all: fine
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="sample_times has 2 timestamps for 4 samples"
        ):
            sess.run(emb, {ids: batch, times: [10, 11]})


@pytest.mark.parametrize("which", ["save", "apply_delta", "restore"])
def test_a_checkpoint_path_with_a_nul_byte_is_an_error(initialized, tmp_path, which):
    """The path used to be cut at the NUL byte, so the files went somewhere else."""
    table = make_table()
    path = str(tmp_path / "dir") + "\x00ignored"
    op = {
        "save": lambda: table_ops.save(table.handle, path)[0],
        "apply_delta": lambda: table_ops.apply_delta(table.handle, path),
        "restore": lambda: table_ops.restore(table.handle, [path], 0, 1)[0],
    }[which]()
    with new_session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="must not contain a NUL byte"):
            sess.run(op)
    assert os.listdir(tmp_path) == []


def test_an_impossible_reservation_fails_cleanly_and_the_process_stays_usable():
    """A fixed table of 10**9 rows of dim 8192 used to map chunks until the process hit
    vm.max_map_count and leave it there: later tables, threads and NumPy arrays then failed.
    Run in a child process, which must report the error and go on working."""
    script = textwrap.dedent("""
        import threading
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        from rec_sdk.core.embedding import create_table, sparse_lookup
        from rec_sdk.util.initialize import init

        def mappings():
            with open("/proc/self/maps") as f:
                return sum(1 for _ in f)

        init(use_dynamic_expansion=False)
        huge = create_table(tf.int64, 8192, "huge", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=10**9)
        small = create_table(tf.int64, 4, "small", tf.compat.v1.ones_initializer(),
                             device_vocabulary_size=100)
        emb = sparse_lookup(small, tf.constant([1, 2], tf.int64))
        with tf.compat.v1.Session() as sess:
            before = mappings()
            try:
                sess.run(huge.size_tensor())
                print("NO ERROR")
            except tf.errors.ResourceExhaustedError as e:
                print("ERROR", [l for l in e.message.splitlines() if "cannot reserve" in l][0])
            assert mappings() < before + 100, (before, mappings())
            print("SMALL", sess.run(emb).sum())
        arrays = [np.ones(1 << 16) for _ in range(200)]
        threads = [threading.Thread(target=lambda: None) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("USABLE", len(arrays))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "ERROR table 'huge': cannot reserve 1000000000 rows of dim 8192" in out, out
    assert "bytes in" in out and ("vm.max_map_count" in out or "TiB" in out), out
    assert "SMALL 8.0" in out and "USABLE 200" in out, out


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _saved_model(tmp_path):
    """A graph with one trained table, its Saver and session."""
    table = make_table()
    emb = sparse_lookup(table, tf.constant([1, 2, 3], tf.int64))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.assign_add(step, 1, name="step").op
    with tf.control_dependencies([emb]):
        train = tf.group(train)
    saver = tf.compat.v1.train.Saver()
    sess = new_session()
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train)
    return saver, sess, str(tmp_path / "model")


def test_saves_and_restores_remove_temporary_directories_of_dead_writers(initialized, tmp_path):
    """A save killed part-way left sparse-<ckpt>.tmp-<pid>-<nonce>/ forever: only a later
    save to the same name removed it, and the next save has a new global step."""
    saver, sess, prefix = _saved_model(tmp_path)
    dead = tmp_path / ("sparse-model-100.tmp-%d-0123abcd" % _dead_pid())
    live = tmp_path / ("sparse-model-300.tmp-%d-0123abcd" % os.getpid())
    aside = tmp_path / ("sparse-model-50.old-%d-0123abcd" % _dead_pid())
    unrelated = tmp_path / "notes.tmp-1-0123abcd.txt"
    for path in (dead, live, aside):
        (path / "t").mkdir(parents=True)
    unrelated.write_text("kept")
    with sess:
        path = saver.save(sess, prefix, global_step=200)
        assert not dead.exists()  # its writer is gone
        assert live.exists()  # a live writer's is never touched
        assert aside.exists()  # sparse-model-50 does not exist: the aside copy is all there is
        (tmp_path / "sparse-model-50").mkdir()
        dead2 = tmp_path / ("sparse-model-200.tmp-%d-0123abcd" % _dead_pid())
        (dead2 / "t").mkdir(parents=True)
        saver.restore(sess, path)
        assert not dead2.exists() and not aside.exists()
        assert live.exists() and unrelated.exists()


def test_a_failed_tensorflow_save_leaves_no_orphan_tables(initialized, tmp_path):
    """When TensorFlow's part of a save fails (a full disk), the tables already written for
    that checkpoint used to stay behind; the previous checkpoint stays restorable."""
    saver, sess, prefix = _saved_model(tmp_path)
    with sess:
        first = saver.save(sess, prefix, global_step=1)
        # A directory where TensorFlow's index file must go makes its save fail.
        os.mkdir(prefix + "-2.index")
        with pytest.raises(tf.errors.OpError):
            saver.save(sess, prefix, global_step=2)
        assert not os.path.exists(tmp_path / "sparse-model-2")
        assert os.path.isdir(tmp_path / "sparse-model-1")
        saver.restore(sess, first)


def test_a_failed_tensorflow_save_does_not_break_the_delta_chain(tmp_path):
    """A Saver.save whose TensorFlow part failed had committed its table save: the next
    delta followed a checkpoint that was then deleted, and restoring full + deltas failed."""
    from rec_sdk import saver as rec_saver
    from rec_sdk.util import initialize

    initialize.init(use_dynamic_expansion=True, enable_incremental_checkpoint=True)
    table = make_table(initializer=tf.compat.v1.zeros_initializer())
    tf.compat.v1.get_variable("v", [4])
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    upsert = table.upsert(keys, tf.ones([tf.size(keys), 4]))
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(upsert, {keys: [1]})
        rec_saver.save_tables(sess, str(tmp_path / "full"))
        sess.run(upsert, {keys: [2]})
        rec_saver.save_tables(sess, str(tmp_path / "d1"), delta=True)
        os.mkdir(tmp_path / "model-2.index")  # TensorFlow's part of the next save fails
        with pytest.raises(tf.errors.OpError):
            saver.save(sess, str(tmp_path / "model"), global_step=2)
        sess.run(upsert, {keys: [3]})
        rec_saver.save_tables(sess, str(tmp_path / "d2"), delta=True)
    tf.compat.v1.reset_default_graph()
    initialize.terminate_config_initializer()
    initialize.init(use_dynamic_expansion=True, enable_incremental_checkpoint=True)
    table = make_table(initializer=tf.compat.v1.zeros_initializer())
    with new_session() as sess:
        rec_saver.restore_tables(
            sess, str(tmp_path / "full"), deltas=[str(tmp_path / "d1"), str(tmp_path / "d2")]
        )
        assert sorted(sess.run(table.export())[0]) == [1, 2, 3]


def test_raw_optimizer_ops_sum_the_gradients_of_duplicate_addresses(initialized):
    """1,000 SGD updates of one row in one call used to apply fewer than 1,000 (the rows
    raced); the kernel now sums duplicates first, so the row moves by exactly 1,000."""
    from rec_sdk.ops.loader import load_ops

    table = make_table(initializer=tf.compat.v1.zeros_initializer())
    emb = sparse_lookup(table, tf.constant([7, 8], tf.int64))
    addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")[0]
    repeated = tf.concat([tf.fill([1000], addresses[0]), addresses[1:]], 0)
    grads = tf.ones([1001, 4])
    update = load_ops().rec_sdk_apply_gradient_descent(table.handle, repeated, grads, 1.0, 0.0)
    with new_session() as sess:
        sess.run(emb)
        sess.run(update)
        values, _ = sess.run(table.lookup(tf.constant([7, 8], tf.int64)))
    np.testing.assert_array_equal(values, [[-1000.0] * 4, [-1.0] * 4])
