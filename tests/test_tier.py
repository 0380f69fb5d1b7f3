"""Tables larger than memory (the SSD tier): a tiered table trains bit-identically to an
all-in-memory one through the SDK API and de.Variable, its Saver checkpoints restore both
ways, a process killed in the middle of demotions and compactions restores exactly from its
last checkpoint (and its leftover files are cleaned), and bad sizes or paths are clear
errors."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import new_session, sorted_export
from rec_sdk import dynamic_embedding as de
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import table_summaries
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import adagrad, gradient_descent, lazy_adam
from rec_sdk.util import initialize

HERE = os.path.dirname(os.path.abspath(__file__))
DIM = 8
OPTIMIZERS = {
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05),
    "adagrad": lambda: adagrad.create_hash_optimizer(learning_rate=0.1),
    "sgd": lambda: gradient_descent.create_hash_optimizer(learning_rate=0.1),
}


def _batch(step, size=64, keys=4000):
    rng = np.random.default_rng(step)
    return (rng.zipf(1.15, size) % keys).astype(np.int64)


def _tables(ssd_dir, memory_rows, name="t", ssd_direct_io=False, **kwargs):
    """A tiered table and an all-in-memory twin (same initializer)."""
    init = tf.compat.v1.random_normal_initializer(seed=11)
    tiered = create_table(
        tf.int64,
        DIM,
        name,
        init,
        device_vocabulary_size=memory_rows - 1,
        host_vocabulary_size=1,
        ssd_vocabulary_size=100000,
        ssd_data_path=str(ssd_dir),
        ssd_direct_io=ssd_direct_io,
        **kwargs,
    )
    memory = create_table(
        tf.int64, DIM, name + "_memory", init, device_vocabulary_size=100000, **kwargs
    )
    return tiered, memory


def _state(sess, table):
    """(keys, values, slots, {key: (last seen, count)}), ordered by key."""
    keys, values, slots = sorted_export(*sess.run(table.export()))
    access_keys, last_seen, counts = sess.run(table_ops.export_access(table.handle))
    access = dict(zip(access_keys.tolist(), zip(last_seen.tolist(), counts.tolist())))
    return keys, values, slots, access


def _assert_same(a, b):
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(x, y)
    assert a[3] == b[3], "last-seen clocks or counts differ"


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("admission", [False, True])
def test_a_tiered_table_trains_bit_identically_to_one_in_memory(tmp_path, optimizer, admission):
    initialize.init(use_dynamic_expansion=False)
    tiered, memory = _tables(tmp_path, 100)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    stamps = tf.compat.v1.placeholder(tf.int64, [None])
    config = {"access_threshold": 2, "eviction_threshold": 400} if admission else None
    kwargs = dict(timestamps=stamps, access_and_evict_config=config) if admission else {}
    a = sparse_lookup(tiered, ids, name="a", **kwargs)
    b = sparse_lookup(memory, ids, name="b", **kwargs)
    loss = tf.reduce_sum(tf.square(a - 0.3)) + tf.reduce_sum(tf.square(b - 0.3))
    train = OPTIMIZERS[optimizer]().minimize(loss)
    evict = [tiered.evict(), memory.evict()] if admission else []
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(150):
            keys = _batch(step)
            feed = {ids: keys, stamps: np.full(keys.shape, step * 10)}
            got_a, got_b, _ = sess.run([a, b, train], feed)
            np.testing.assert_array_equal(got_a, got_b)
            if evict and step % 30 == 29:
                sess.run(evict)
        _assert_same(_state(sess, tiered), _state(sess, memory))
        stats, twin = sess.run([tiered.stats(), memory.stats()])
    assert stats["cold"] > 0 and stats["promotions"] > 0 and stats["demotions"] > 0
    assert stats["hot"] <= 100 and stats["hot"] + stats["cold"] == stats["size"]
    for key in ("size", "admitted", "rejected", "evicted", "pending", "newest_clock"):
        assert stats[key] == twin[key], key
    assert twin["cold"] == twin["promotions"] == twin["ssd_file_bytes"] == 0


def test_saver_checkpoints_restore_into_any_tier_sizes(tmp_path):
    """Tiered -> all in memory -> tiered with another budget, then both train on alike."""

    def graph(ssd_dir, memory_rows):
        initialize.terminate_config_initializer()
        tf.compat.v1.reset_default_graph()
        initialize.init(use_dynamic_expansion=False)
        init = tf.compat.v1.random_normal_initializer(seed=11)
        if ssd_dir is None:
            table = create_table(tf.int64, DIM, "t", init, device_vocabulary_size=100000)
        else:
            table = create_table(
                tf.int64,
                DIM,
                "t",
                init,
                device_vocabulary_size=memory_rows,
                host_vocabulary_size=1,
                ssd_vocabulary_size=100000,
                ssd_data_path=str(ssd_dir),
            )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = sparse_lookup(table, ids, name="lookup")
        train = lazy_adam.create_hash_optimizer(learning_rate=0.05).minimize(
            tf.reduce_sum(tf.square(emb - 0.3))
        )
        return table, ids, train, tf.compat.v1.train.Saver()

    def run(table, ids, train, sess, steps):
        for step in steps:
            sess.run(train, {ids: np.unique(_batch(step))})
        return _state(sess, table)

    ssd = tmp_path / "ssd"
    ssd.mkdir()
    table, ids, train, saver = graph(ssd, 80)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saved = run(table, ids, train, sess, range(60))
        assert sess.run(table.stats())["cold"] > 0
        first = saver.save(sess, str(tmp_path / "tiered"))
    table, ids, train, saver = graph(None, None)
    with new_session() as sess:
        saver.restore(sess, first)
        _assert_same(_state(sess, table), saved)
        second = saver.save(sess, str(tmp_path / "memory"))
        expected = run(table, ids, train, sess, range(60, 90))
    table, ids, train, saver = graph(ssd, 150)
    with new_session() as sess:
        saver.restore(sess, second)
        _assert_same(_state(sess, table), saved)
        stats = sess.run(table.stats())
        assert stats["hot"] == 151 and stats["cold"] == stats["size"] - 151
        _assert_same(run(table, ids, train, sess, range(60, 90)), expected)


def test_a_process_killed_mid_training_restores_its_last_checkpoint_exactly(tmp_path):
    """The worker demotes, promotes and compacts on every step; SIGKILL at three moments.
    Each time the newest checkpoint restores (into a tiered table over the same directory,
    whose dead files are removed, and into memory) exactly as a replay of its steps."""
    sys.path.insert(0, HERE)
    import tier_worker  # noqa: E402 (the worker's model, for the replay)

    ssd = tmp_path / "ssd"
    ssd.mkdir()
    for attempt in range(3):
        checkpoints = tmp_path / ("ckpt%d" % attempt)
        checkpoints.mkdir()
        worker = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "tier_worker.py"), str(checkpoints), str(ssd)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            saves = 0
            deadline = time.time() + 120
            while saves < 2 + attempt and time.time() < deadline:
                line = worker.stdout.readline()
                assert line, "the worker stopped"
                saves += line.startswith("saved")
            time.sleep(0.05 * (attempt + 1))
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        leftovers = [f for f in os.listdir(ssd) if f.endswith(".seg")]
        assert leftovers, "the killed worker had segment files"
        latest = tf.train.latest_checkpoint(str(checkpoints))
        for tiered in (True, False):
            initialize.terminate_config_initializer()
            tf.compat.v1.reset_default_graph()
            ids, _, table, step = tier_worker.build(str(ssd) if tiered else None)
            with new_session() as sess:
                tf.compat.v1.train.Saver().restore(sess, latest)
                restored = _state(sess, table)
                global_step = sess.run(step)
            assert not any(f in os.listdir(ssd) for f in leftovers), "dead files were not removed"
        # The replay: the same steps in memory.
        initialize.terminate_config_initializer()
        tf.compat.v1.reset_default_graph()
        ids, train, table, _ = tier_worker.build(None)
        with new_session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for k in range(global_step):
                sess.run(train, {ids: tier_worker.batch(k)})
            _assert_same(restored, _state(sess, table))


def test_dynamic_embedding_variables_take_the_tier_through_kv_creator(tmp_path):
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    init = tf.compat.v1.random_normal_initializer(seed=3)
    tiered = de.get_variable(
        "tiered",
        dim=DIM,
        initializer=init,
        devices=["/CPU:0"] * 2,
        kv_creator=de.TieredTableCreator(memory_rows=120, ssd_path=str(tmp_path)),
    )
    plain = de.get_variable("plain", dim=DIM, initializer=init, devices=["/CPU:0"] * 2)
    a = de.embedding_lookup(tiered, ids, name="a")
    b = de.embedding_lookup(plain, ids, name="b")
    loss = tf.reduce_sum(tf.square(a - 0.3)) + tf.reduce_sum(tf.square(b - 0.3))
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05)).minimize(loss)
    eval_ids = tf.constant(np.arange(0, 4000, 7, dtype=np.int64))
    de.enable_inference_mode()
    try:
        eval_a = de.embedding_lookup(tiered, eval_ids, name="eval_a")
        eval_b = de.embedding_lookup(plain, eval_ids, name="eval_b")
    finally:
        de.enable_train_mode()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(80):
            x, y, _ = sess.run([a, b, train], {ids: np.unique(_batch(step))})
            np.testing.assert_array_equal(x, y)
        promotions = sum(sess.run(t.stats())["promotions"] for t in tiered.shards)
        x, y = sess.run([eval_a, eval_b])
        np.testing.assert_array_equal(x, y)
        # Evaluation lookups read cold rows where they are.
        assert sum(sess.run(t.stats())["promotions"] for t in tiered.shards) == promotions
        for mine, theirs in zip(tiered.shards, plain.shards):
            _assert_same(_state(sess, mine), _state(sess, theirs))
            stats = sess.run(mine.stats())
            assert stats["hot"] <= 60 and stats["cold"] > 0
        assert sess.run(tiered.size()) == sess.run(plain.size())


def test_bad_sizes_and_paths_are_clear_errors(tmp_path):
    initialize.init(use_dynamic_expansion=False)
    init = tf.compat.v1.zeros_initializer()
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="ssd_data_path='.*missing' is not an existing directory"):
        create_table(
            tf.int64,
            4,
            "a",
            init,
            device_vocabulary_size=10,
            host_vocabulary_size=10,
            ssd_vocabulary_size=100,
            ssd_data_path=missing,
        )
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"ssd_data_path\[1\]=.*file' is not an existing"):
        create_table(
            tf.int64,
            4,
            "b",
            init,
            device_vocabulary_size=10,
            host_vocabulary_size=10,
            ssd_vocabulary_size=100,
            ssd_data_path=[str(tmp_path), str(a_file)],
        )
    with pytest.raises(ValueError, match="ssd_vocabulary_size=100 needs host_vocabulary_size"):
        create_table(
            tf.int64,
            4,
            "c",
            init,
            device_vocabulary_size=10,
            ssd_vocabulary_size=100,
            ssd_data_path=str(tmp_path),
        )
    with pytest.raises(ValueError, match="ssd_path='.*missing' is not an existing directory"):
        de.TieredTableCreator(memory_rows=10, ssd_path=missing)
    with pytest.raises(ValueError, match="memory_rows must be in"):
        de.TieredTableCreator(memory_rows=0, ssd_path=str(tmp_path))
    # Without an SSD size, ssd_data_path is not used and not checked (the SDK's default is
    # the working directory).
    create_table(tf.int64, 4, "d", init, device_vocabulary_size=10, ssd_data_path=missing)


def test_an_ssd_tier_full_of_rows_is_an_error_that_keeps_the_table(tmp_path):
    initialize.init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        4,
        "full",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=19,
        host_vocabulary_size=1,
        ssd_vocabulary_size=30,
        ssd_data_path=str(tmp_path),
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, name="lookup")
    with new_session() as sess:
        for first in range(0, 50, 10):
            sess.run(emb, {ids: np.arange(first, first + 10)})
        with pytest.raises(tf.errors.ResourceExhaustedError, match="SSD capacity of 30 rows"):
            sess.run(emb, {ids: np.arange(50, 60)})
        assert sess.run(table.size_tensor()) == 50
        keys, _, _ = sess.run(table.export())
        assert sorted(keys) == list(range(50))


def test_summaries_show_tier_counters_of_tiered_tables_only(tmp_path):
    initialize.init(use_dynamic_expansion=False)
    tiered, memory = _tables(tmp_path, 50)
    names = [op.name for op in table_summaries([tiered, memory], collections=[])]
    assert any("rec_sdk/t/promotions" in n for n in names)
    assert not any("t_memory/promotions" in n for n in names)
    assert any("t_memory/size" in n for n in names)
    assert "memory_rows=50" in repr(tiered)


@pytest.mark.parametrize("direct_io", [False, True])
def test_prefetching_the_next_batch_serves_promotions_from_memory(tmp_path, direct_io):
    """table.prefetch(next ids) in the step of the current batch: the next lookup's rows on
    SSD come from what was read ahead, and training is unchanged (also with O_DIRECT files)."""
    initialize.init(use_dynamic_expansion=False)
    tiered, memory = _tables(tmp_path, 100, ssd_direct_io=direct_io)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    upcoming = tf.compat.v1.placeholder(tf.int64, [None])
    a = sparse_lookup(tiered, ids, name="a")
    b = sparse_lookup(memory, ids, name="b")
    loss = tf.reduce_sum(tf.square(a - 0.3)) + tf.reduce_sum(tf.square(b - 0.3))
    train = lazy_adam.create_hash_optimizer(learning_rate=0.05).minimize(loss)
    with tf.control_dependencies([train]):
        step = tf.identity(tiered.prefetch(upcoming))  # after this step's lookup
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        read = 0
        for k in range(120):
            got_a, got_b, n = sess.run(
                [a, b, step], {ids: np.unique(_batch(k)), upcoming: np.unique(_batch(k + 1))}
            )
            np.testing.assert_array_equal(got_a, got_b)
            read += n
        _assert_same(_state(sess, tiered), _state(sess, memory))
        stats = sess.run(tiered.stats())
        assert sess.run(memory.prefetch(upcoming), {upcoming: [1, 2]}) == 0
    assert read > 0 and stats["prefetch_hits"] > 0
    assert stats["prefetch_hits"] <= stats["promotions"]


def test_the_feature_spec_pipeline_reads_ahead_for_tiered_tables(tmp_path):
    from rec_sdk.core.asc.feature_spec import FeatureSpec
    from rec_sdk.core.asc.helper import get_asc_insert_func

    initialize.init(use_dynamic_expansion=False)
    tiered, memory = _tables(tmp_path, 100)
    data = {
        "a": np.stack([_batch(k, 32) for k in range(200)]).reshape(-1, 4),
        "b": np.stack([_batch(k, 32) for k in range(200)]).reshape(-1, 4),
    }
    specs = [FeatureSpec("a", table_name="t"), FeatureSpec("b", table_name="t_memory")]
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(8)
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(4)).get_next()
    x = sparse_lookup(tiered, specs[0], None, batch=batch, name="x")
    y = sparse_lookup(memory, specs[1], None, batch=batch, name="y")
    loss = tf.reduce_sum(tf.square(x - 0.3)) + tf.reduce_sum(tf.square(y - 0.3))
    train = adagrad.create_hash_optimizer(learning_rate=0.1).minimize(loss)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(100):
            got_x, got_y, _ = sess.run([x, y, train])
            np.testing.assert_array_equal(got_x, got_y)
        _assert_same(_state(sess, tiered), _state(sess, memory))
        stats = sess.run(tiered.stats())
    assert stats["promotions"] > 0 and stats["prefetch_hits"] > 0


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs (a disk that fills up); skipped where this process may not mount."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % done.stderr.strip())
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_full_disk_fails_the_step_cleanly_and_keeps_every_row(small_tmpfs):
    initialize.init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        16,
        "t",
        tf.compat.v1.random_normal_initializer(seed=1),
        device_vocabulary_size=99,
        host_vocabulary_size=1,
        ssd_vocabulary_size=10**6,
        ssd_data_path=str(small_tmpfs),
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, name="lookup")
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(
        tf.reduce_sum(tf.square(emb - 1.0))
    )
    with new_session() as sess:
        first = 0
        with pytest.raises(
            tf.errors.ResourceExhaustedError,
            match=r"cannot move \d+ rows to SSD \(the step fails, no row is "
            r"lost\).*No space left on device",
        ):
            for first in range(0, 10**6, 50):
                before = _state(sess, table)
                sess.run(train, {ids: np.arange(first, first + 50)})
        # Every row held before the failed step is there, unchanged (the failed step's new
        # keys may be in memory: it placed them before it needed the disk).
        after = _state(sess, table)
        kept = dict(zip(after[0].tolist(), after[1]))
        for key, row in zip(before[0].tolist(), before[1]):
            np.testing.assert_array_equal(kept[key], row)
        # The table stays usable: its rows read back (above), the keys in memory still train,
        # and with room on the disk again, so do the keys on it.
        assert sess.run(table.size_tensor()) >= before[0].size > 0
        sess.run(train, {ids: np.arange(first - 50, first)})
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_tmpfs)], check=True)
        sess.run(train, {ids: np.arange(0, 40)})
        assert sess.run(table.stats())["promotions"] > 0


def test_serving_export_and_resharded_restore_hold_rows_of_both_tiers(tmp_path):
    """The serving SavedModel of a tiered table serves its rows on SSD too; a de.Variable of 2
    tiered shards restores into 3 shards all in memory."""
    from rec_sdk.serving import export_saved_model

    initialize.init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        4,
        "served",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=9,
        host_vocabulary_size=1,
        ssd_vocabulary_size=1000,
        ssd_data_path=str(tmp_path),
    )
    keys = np.arange(100, dtype=np.int64)
    values = np.arange(400, dtype=np.float32).reshape(100, 4)
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(table, ids, is_train=False, name="serve")
    with new_session() as sess:
        sess.run(table.upsert(tf.constant(keys), tf.constant(values)))
        assert sess.run(table.stats())["cold"] == 90
        np.testing.assert_array_equal(sess.run(emb, {ids: keys}), values)
        export_saved_model(sess, str(tmp_path / "s"), {"ids": ids}, {"embedding": emb})
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(tmp_path / "s"))
        sig = meta.signature_def["serving_default"]
        served = sess.run(sig.outputs["embedding"].name, {sig.inputs["ids"].name: keys})
    np.testing.assert_array_equal(served, values)

    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    creator = de.TieredTableCreator(memory_rows=20, ssd_path=str(tmp_path))
    v = de.get_variable("v", dim=4, devices=["/CPU:0"] * 2, kv_creator=creator)
    tf.compat.v1.train.get_or_create_global_step()  # a Saver needs one variable
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(v.upsert(tf.constant(keys), tf.constant(values)))
        assert sum(sess.run(t.stats())["cold"] for t in v.shards) == 80
        path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "de"))
    tf.compat.v1.reset_default_graph()
    v = de.get_variable("v", dim=4, devices=["/CPU:0"] * 3)
    tf.compat.v1.train.get_or_create_global_step()
    with new_session() as sess:
        tf.compat.v1.train.Saver().restore(sess, path)
        got_keys, got_values = sess.run(v.export())
    order = np.argsort(got_keys)
    np.testing.assert_array_equal(got_keys[order], keys)
    np.testing.assert_array_equal(got_values[order], values)


def test_a_lookup_reads_rows_from_a_large_cold_tier_without_promoting_them(tmp_path):
    """TableLookup (the served plugin table's read) of keys whose rows went cold: it once
    took a cold entry for a row id and read the chunk directory out of its bounds (a crash
    once the cold records outnumbered the memory rows' chunks)."""
    initialize.init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        4,
        "cold",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=999,
        host_vocabulary_size=1,
        ssd_vocabulary_size=100000,
        ssd_data_path=str(tmp_path),
    )
    keys = np.arange(60000, dtype=np.int64)
    values = np.stack([keys, -keys, keys * 2, keys % 7], 1).astype(np.float32)
    with new_session() as sess:
        sess.run(table.upsert(keys, values))
        assert sess.run(table.stats())["cold"] > 50000
        got, exists = sess.run(table_ops.lookup(table.handle, np.concatenate([keys, [-1]]), dim=4))
        np.testing.assert_array_equal(got[:-1], values)
        assert exists[:-1].all() and not exists[-1]
        assert sess.run(table.stats())["cold"] > 50000  # read, not promoted
