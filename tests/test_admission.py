"""Feature admission and eviction through sparse_lookup with tensor ids, against NumPy
reference models: counts with duplicates and faae_coefficient, eval never counts, thresholds
changed between steps, eviction by timestamp and by global step (rows, slots and counts go),
eviction of full tables, EvictHook triggers, table statistics and their summaries, bounded
memory, and every validation error."""

import glob
import os
import resource

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import new_session
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import EvictHook, TableStatsHook, evict_tables, table_summaries
from rec_sdk.optimizers import adagrad, gradient_descent
from rec_sdk.util.initialize import init

DIM = 3


@pytest.fixture
def fixed():
    init(use_dynamic_expansion=False)


def _table(name="t", **kwargs):
    kwargs.setdefault("device_vocabulary_size", 10000)
    return create_table(
        tf.int64, DIM, name, tf.compat.v1.random_uniform_initializer(0.5, 1.0, seed=3), **kwargs
    )


class AdmissionModel:
    """The SDK's admission rule: count += coefficient x occurrences in training lookups; a
    key has a row once count >= threshold (threshold <= 0 or None: at once)."""

    def __init__(self, threshold):
        self.threshold = threshold
        self.count = {}
        self.admitted = set()

    def train(self, ids, coefficient=1):
        keys, occurrences = np.unique(np.asarray(ids).ravel(), return_counts=True)
        for key, occ in zip(keys.tolist(), occurrences.tolist()):
            if key in self.admitted:
                continue
            self.count[key] = self.count.get(key, 0) + coefficient * occ
            if self.threshold is None or self.threshold <= 0 or self.count[key] >= self.threshold:
                self.admitted.add(key)
                del self.count[key]


def _admitted_rows(embeddings, ids):
    """Which ids read a row (non-zero: the initializer draws from [0.5, 1))."""
    return np.abs(embeddings).sum(-1) > 0


@pytest.mark.parametrize("threshold,coefficient", [(3, 1), (4, 2), (0, 1), (1, 3)])
def test_admission_matches_model_with_duplicates(fixed, threshold, coefficient):
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    emb = sparse_lookup(
        table,
        ids,
        is_train=True,
        access_and_evict_config={
            "access_threshold": threshold,
            "eviction_threshold": -1,
            "faae_coefficient": coefficient,
        },
    )
    model = AdmissionModel(threshold)
    rng = np.random.RandomState(0)
    with new_session() as sess:
        for step in range(30):
            batch = rng.randint(0, 12, size=(rng.randint(1, 6), 2))
            model.train(batch, coefficient)
            out = sess.run(emb, {ids: batch})
            expected = np.isin(batch, sorted(model.admitted))
            np.testing.assert_array_equal(
                _admitted_rows(out, batch),
                expected,
                err_msg="step %d batch %s" % (step, batch.tolist()),
            )
            stats = sess.run(table.stats())
            assert stats["size"] == len(model.admitted)
            assert stats["pending"] == len(model.count)


def test_threshold_crossed_inside_one_batch(fixed):
    table = _table()
    emb = sparse_lookup(
        table, tf.constant([5, 5, 5, 6], tf.int64), access_and_evict_config={"access_threshold": 3}
    )
    with new_session() as sess:
        out = sess.run(emb)
    assert (np.abs(out[:3]).sum(-1) > 0).all()  # 5 seen 3 times: admitted at once
    assert np.abs(out[3]).sum() == 0


def test_eval_lookups_never_count_nor_insert(fixed):
    table = _table()
    config = {"access_threshold": 2}
    train = sparse_lookup(
        table,
        tf.constant([1], tf.int64),
        is_train=True,
        name="train",
        access_and_evict_config=config,
    )
    evaluate = sparse_lookup(
        table,
        tf.constant([1, 2], tf.int64),
        is_train=False,
        name="eval",
        access_and_evict_config=config,
    )
    with new_session() as sess:
        for _ in range(5):
            assert np.abs(sess.run(evaluate)).sum() == 0
        stats = sess.run(table.stats())
        assert stats["pending"] == 0 and stats["rejected"] == 0 and stats["size"] == 0
        assert np.abs(sess.run(train)).sum() == 0  # count 1 < 2
        assert np.abs(sess.run(train)).sum() > 0  # count 2: admitted
        out = sess.run(evaluate)
        assert np.abs(out[0]).sum() > 0 and np.abs(out[1]).sum() == 0


def test_keys_not_admitted_read_the_serving_default(fixed):
    table = _table()
    ids = tf.constant([1, 1, 2], tf.int64)  # 1 is admitted (2 >= 2), 2 is not
    emb = sparse_lookup(
        table, ids, serving_default_value=-7.0, access_and_evict_config={"access_threshold": 2}
    )
    with new_session() as sess:
        out = sess.run(emb)
        keys = sess.run(table.export())[0]
    assert keys.tolist() == [1]
    assert (out[:2] > 0).all()
    np.testing.assert_array_equal(out[2], np.full(DIM, -7.0, np.float32))
    assert table.admission


def test_non_admitted_keys_are_not_trained_reference(fixed):
    """SGD with admission against NumPy: only admitted rows move, by the summed gradient."""
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    weights = tf.compat.v1.placeholder(tf.float32, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
    loss = tf.reduce_sum(emb * weights[:, None])
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(loss)
    initial = table.lookup(tf.constant(np.arange(6), tf.int64), init_missing=True)[0]
    model = AdmissionModel(2)
    rng = np.random.RandomState(1)
    with new_session() as sess:
        reference = dict(enumerate(sess.run(initial)))
        for _ in range(20):
            batch = rng.randint(0, 6, size=4)
            w = rng.rand(4).astype(np.float32)
            model.train(batch)
            sess.run(train, {ids: batch, weights: w})
            for key, wk in zip(batch.tolist(), w.tolist()):
                if key in model.admitted:
                    reference[key] = reference[key] - 0.1 * wk
        keys, values, _ = sess.run(table.export())
    assert sorted(keys.tolist()) == sorted(model.admitted)
    for key, value in zip(keys.tolist(), values):
        np.testing.assert_allclose(value, reference[key], rtol=1e-5, atol=1e-6)


def test_set_access_threshold_between_steps(fixed):
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 1})
    with new_session() as sess:
        assert np.abs(sess.run(emb, {ids: [1]})).sum() > 0
        table.set_access_threshold(3, session=sess)
        assert np.abs(sess.run(emb, {ids: [2]})).sum() == 0
        assert np.abs(sess.run(emb, {ids: [1]})).sum() > 0  # admitted keys stay
        assert np.abs(sess.run(emb, {ids: [2, 2]})).sum() > 0  # 1 + 2 = 3
        sess.run(table.set_access_threshold(-1))
        assert np.abs(sess.run(emb, {ids: [9]})).sum() > 0


# ---------------------------------------------------------------------------
# Eviction
# ---------------------------------------------------------------------------


def test_eviction_by_timestamp_drops_rows_slots_and_counts(fixed):
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    ts = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=ts,
        access_and_evict_config={"access_threshold": 2, "eviction_threshold": 100},
    )
    loss = tf.reduce_sum(emb)
    train = adagrad.create_hash_optimizer(
        learning_rate=0.1, initial_accumulator_value=0.5
    ).minimize(loss)
    evict = table.evict()
    with new_session() as sess:
        initial = dict(
            zip(
                [1, 2, 3],
                sess.run(table.lookup(tf.constant([1, 2, 3], tf.int64), init_missing=True)[0]),
            )
        )
        # Per-sample timestamps: key 1 is seen at 1000 and 1150 (keeps 1150), key 2 at 1000,
        # key 3 (pending, count 1) at 1000; newest is 1150.
        sess.run(train, {ids: [[1, 2], [1, 2], [3, 1]], ts: [1000, 1000, 1000]})
        sess.run(train, {ids: [[1, 1]], ts: [1150]})
        rows, pending = sess.run(evict)
        assert (rows, pending) == (1, 1)  # key 2's row and key 3's count
        keys, values, slots = sess.run(table.export())
        assert keys.tolist() == [1]
        stats = sess.run(table.stats())
        assert stats["evicted"] == 1 and stats["pending"] == 0 and stats["newest_clock"] == 1150
        # Key 2 starts from scratch: count again, initial values, fresh slots.
        out = sess.run(emb, {ids: [[2, 1]], ts: [1160]})
        assert np.abs(out[0, 0]).sum() == 0
        sess.run(train, {ids: [[2, 1]], ts: [1160]})
        keys, values, slots = sess.run(table.export())
        order = np.argsort(keys)
        keys, values, slots = keys[order], values[order], slots[:, order]
        assert keys.tolist() == [1, 2]
        # Its first update from the initial values and accumulator 0.5 + g^2 (g = 1).
        accumulator = 0.5 + 1.0
        np.testing.assert_allclose(slots[0, 1], np.full(DIM, accumulator), rtol=1e-6)
        np.testing.assert_allclose(values[1], initial[2] - 0.1 / np.sqrt(accumulator), rtol=1e-5)


def test_eviction_by_steps_to_live(fixed):
    step = tf.compat.v1.train.get_or_create_global_step()
    table = _table(steps_to_live=3)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(
        tf.reduce_sum(emb), global_step=step
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: [1, 2]})  # step 0
        for _ in range(3):
            sess.run(train, {ids: [2]})  # steps 1..3
        # Key 1 last seen at step 0, the newest step is 3: 3 steps old.
        assert sess.run(evict_tables())["t"] == (1, 0)
        keys, _, _ = sess.run(table.export())
        assert keys.tolist() == [2]


def test_full_table_evicts_least_recently_seen(fixed):
    table = _table(device_vocabulary_size=100, evict_when_full=True)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    with new_session() as sess:
        for start in range(0, 100, 10):
            sess.run(emb, {ids: np.arange(start, start + 10)})
        sess.run(emb, {ids: np.arange(0, 5)})  # keys 0-4 are now the most recent
        sess.run(emb, {ids: [500, 501]})
        keys = set(sess.run(table.export())[0].tolist())
        assert {0, 1, 2, 3, 4, 500, 501} <= keys
        # 2 + 1% of 100 rows go, all among the least recently seen (keys 5-9).
        assert len({5, 6, 7, 8, 9} - keys) == 3
        assert set(range(10, 100)) <= keys
        assert len(keys) == 99


def test_full_table_without_eviction_fails_clearly(fixed):
    table = _table(device_vocabulary_size=4)
    emb = sparse_lookup(table, tf.constant(np.arange(10), tf.int64))
    with new_session() as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError, match="'t' is full"):
            sess.run(emb)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _evicting_graph(**table_kwargs):
    step = tf.compat.v1.train.get_or_create_global_step()
    table = _table(**table_kwargs)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(
        tf.reduce_sum(emb), global_step=step
    )
    return table, ids, train


def test_evict_hook_fires_every_n_steps(fixed):
    table, ids, train = _evicting_graph(steps_to_live=2)
    hook = EvictHook(evict_enable=True, evict_step_interval=4, time_fn=FakeClock())
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for step in range(10):
            sess.run(train, {ids: [step]})
    # The global step crosses a multiple of 4 twice (at 4 and 8).
    assert hook.evictions == 2
    # At step 8 (keys 0..7 seen at steps 0..7, newest 7): keys seen at <= 5 went.
    assert hook.last_result["t"][0] >= 2


def test_evict_hook_fires_by_wall_time(fixed):
    _, ids, train = _evicting_graph(steps_to_live=1)
    clock = FakeClock()
    hook = EvictHook(evict_enable=True, evict_time_interval=60, time_fn=clock)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        sess.run(train, {ids: [1]})
        clock.now = 59
        sess.run(train, {ids: [2]})
        assert hook.evictions == 0
        clock.now = 60
        sess.run(train, {ids: [3]})
        assert hook.evictions == 1
        clock.now = 100
        sess.run(train, {ids: [4]})
        assert hook.evictions == 1
        clock.now = 121
        sess.run(train, {ids: [5]})
        assert hook.evictions == 2


def test_evict_hook_disabled_does_nothing(fixed):
    _, ids, train = _evicting_graph(steps_to_live=1)
    hook = EvictHook(evict_enable=False, evict_step_interval=1)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for step in range(3):
            sess.run(train, {ids: [step]})
    assert hook.evictions == 0


def test_bounded_memory_with_always_new_keys(fixed):
    """200 steps of 2,000 never-seen keys each, admission at 2 (so every key stays pending)
    and eviction after 5 steps every 10 steps: rows and pending counts stay bounded."""
    step = tf.compat.v1.train.get_or_create_global_step()
    table = _table(steps_to_live=5, device_vocabulary_size=100000)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(
        tf.reduce_sum(emb), global_step=step
    )
    hook = EvictHook(evict_enable=True, evict_step_interval=10)
    stats = table.stats()
    peak_pending = peak_size = 0
    rss_before = None
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for i in range(200):
            # Half the keys repeat once within the batch (admitted at once), half are new.
            fresh = np.arange(i * 2000, (i + 1) * 2000, dtype=np.int64)
            batch = np.concatenate([fresh, fresh[:1000]])
            sess.run(train, {ids: batch})
            values = sess.run(stats)
            peak_pending = max(peak_pending, values["pending"])
            peak_size = max(peak_size, values["size"])
            if i == 49:
                rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Between evictions at most 10 + 5 steps of keys survive.
    assert peak_size <= 16 * 1000
    assert peak_pending <= 16 * 1000
    assert hook.evictions in (19, 20)  # crossings of multiples of 10 in 200 steps
    # Without eviction 150 more steps would add 150k rows and 150k counts (> 30 MB); with it
    # the resident set grows by less than 20 MB (ru_maxrss is in KiB).
    assert rss_after - rss_before < 20 * 1024


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def test_stats_count_admitted_rejected_evicted(fixed):
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    ts = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=ts,
        access_and_evict_config={"access_threshold": 2, "eviction_threshold": 10},
    )
    with new_session() as sess:
        sess.run(emb, {ids: [1, 1, 2, 3], ts: [0, 0, 0, 0]})
        sess.run(emb, {ids: [2], ts: [20]})
        sess.run(table.evict())
        stats = sess.run(table.stats())
    assert stats == {
        "size": 1,
        "capacity": 10000,
        "admitted": 2,
        "rejected": 2,
        "evicted": 1,
        "pending": 0,
        "newest_clock": 20,
        "hot": 1,
        "cold": 0,
        "promotions": 0,
        "demotions": 0,
        "ssd_bytes_read": 0,
        "ssd_bytes_written": 0,
        "ssd_file_bytes": 0,
        "prefetch_hits": 0,
    }


def test_stats_hook_and_summaries_write_scalars(fixed, tmp_path):
    step = tf.compat.v1.train.get_or_create_global_step()
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(
        tf.reduce_sum(emb), global_step=step
    )
    summaries = table_summaries()
    assert len(summaries) == 6
    hook = TableStatsHook(output_dir=str(tmp_path), every_n_steps=2)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for i in range(4):
            sess.run(train, {ids: [i, i, 100 + i]})
    values = {}
    for path in glob.glob(os.path.join(str(tmp_path), "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(value.simple_value)
    # Steps 2 and 4, read while or after the step runs.
    assert values["rec_sdk_stats/t/size"] in ([1.0, 3.0], [2.0, 4.0], [1.0, 4.0], [2.0, 3.0])
    assert len(values["rec_sdk_stats/t/pending"]) == 2
    assert set(values) == {
        "rec_sdk_stats/t/%s" % k
        for k in ("size", "capacity", "admitted", "rejected", "evicted", "pending")
    }


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,error,match",
    [
        ({"access_threshold": -2}, ValueError, "access_threshold must be in \\[-1"),
        ({"access_threshold": 2**31}, ValueError, "access_threshold"),
        ({"access_threshold": 1.5}, TypeError, "access_threshold"),
        ({"eviction_threshold": 5}, ValueError, "needs an access_threshold"),
        ({"access_threshold": 1, "eviction_threshold": -3}, ValueError, "eviction_threshold"),
        ({"access_threshold": 1, "faae_coefficient": 0}, ValueError, "faae_coefficient"),
        ({"access_threshold": 1, "treshold": 1}, ValueError, "unknown keys \\['treshold'\\]"),
        ([1, 2], TypeError, "must be a dict"),
    ],
)
def test_access_and_evict_config_errors(fixed, config, error, match):
    with pytest.raises(error, match=match):
        sparse_lookup(_table(), tf.constant([1], tf.int64), access_and_evict_config=config)


def test_lookups_of_one_table_must_agree(fixed):
    table = _table()
    ids = tf.constant([1], tf.int64)
    sparse_lookup(table, ids, name="a", access_and_evict_config={"access_threshold": 2})
    with pytest.raises(ValueError, match=r"'a' before it.*disagree on.*\(2, -1\), \(3, -1\)"):
        sparse_lookup(table, ids, name="b", access_and_evict_config={"access_threshold": 3})
    sparse_lookup(table, ids, name="c", access_and_evict_config={"access_threshold": 2})
    sparse_lookup(table, ids, name="d")  # no config: counts with the table's settings


def test_thresholds_travel_once_as_attributes_of_the_configure_op(fixed):
    """FeatureSpec or access_and_evict_config -> one TableConfigureAdmission op per table,
    created with the thresholds as attributes; every training find_or_insert and evict takes
    the table through it (a data dependency), eval lookups do not."""
    table = _table()
    ids = tf.constant([[1, 2]], tf.int64)
    config = {"access_threshold": 2, "eviction_threshold": 50}
    sparse_lookup(
        table, ids, name="a", access_and_evict_config=config, timestamps=tf.constant([7], tf.int64)
    )
    sparse_lookup(
        table, ids, name="b", access_and_evict_config=config, timestamps=tf.constant([7], tf.int64)
    )
    sparse_lookup(table, ids, name="eval", is_train=False)
    table.evict()
    graph = tf.compat.v1.get_default_graph()
    configure = [op for op in graph.get_operations() if op.type == "RecSdk>TableConfigureAdmission"]
    assert len(configure) == 1
    assert configure[0].get_attr("access_threshold") == 2
    assert configure[0].get_attr("eviction_threshold") == 50
    assert configure[0].inputs[0] is table.handle
    assert "access_threshold" not in table.handle.op.node_def.attr
    readers = {
        op.name: op.inputs[0]
        for op in graph.get_operations()
        if op.type
        in ("RecSdk>TableFindOrInsert", "RecSdk>TableFindOrInsertRows", "RecSdk>TableEvict")
    }
    assert readers["a/find_or_insert"] is configure[0].outputs[0]
    assert readers["b/find_or_insert"] is configure[0].outputs[0]
    assert readers["eval/find_or_insert"] is table.handle
    assert sum(1 for v in readers.values() if v is configure[0].outputs[0]) == 3


def test_thresholds_after_an_op_that_reads_them_are_an_error(fixed):
    table = _table()
    table.evict()
    with pytest.raises(
        ValueError,
        match="got its thresholds \\(access_threshold=-1, "
        "eviction_threshold=-1\\) when evict\\(\\) was built",
    ):
        sparse_lookup(
            table,
            tf.constant([1], tf.int64),
            name="late",
            access_and_evict_config={"access_threshold": 2},
        )


def test_admission_after_an_uncounted_training_lookup_is_an_error(fixed):
    table = _table()
    sparse_lookup(table, tf.constant([1], tf.int64), name="plain")
    with pytest.raises(ValueError, match="\\['plain'\\] were built without it"):
        sparse_lookup(
            table,
            tf.constant([1], tf.int64),
            name="counted",
            access_and_evict_config={"access_threshold": 2},
        )


def test_eviction_threshold_needs_timestamps(fixed):
    with pytest.raises(ValueError, match="timestamps=.*ASCEND_TIMESTAMP"):
        sparse_lookup(
            _table(),
            tf.constant([1], tf.int64),
            access_and_evict_config={"access_threshold": -1, "eviction_threshold": 10},
        )


def test_timestamps_from_the_collection(fixed):
    ts = tf.constant([7, 9], tf.int64)
    tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, ts)
    table = _table()
    emb = sparse_lookup(
        table,
        tf.constant([[1], [2]], tf.int64),
        access_and_evict_config={"access_threshold": -1, "eviction_threshold": 10},
    )
    with new_session() as sess:
        sess.run(emb)
        assert sess.run(table.stats())["newest_clock"] == 9


def test_steps_to_live_errors(fixed):
    with pytest.raises(ValueError, match="steps_to_live must be in"):
        _table(steps_to_live=0)
    table = _table(name="a", steps_to_live=5)
    with pytest.raises(ValueError, match="needs a global step"):
        sparse_lookup(table, tf.constant([1], tf.int64))
    tf.compat.v1.train.get_or_create_global_step()
    with pytest.raises(ValueError, match="cannot also take eviction_threshold"):
        sparse_lookup(
            table,
            tf.constant([1], tf.int64),
            timestamps=tf.constant([1], tf.int64),
            access_and_evict_config={"access_threshold": -1, "eviction_threshold": 3},
        )


def test_evict_when_full_needs_fixed_capacity():
    init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match="evict_when_full=True is for fixed-capacity"):
        _table(evict_when_full=True)


def test_set_access_threshold_errors(fixed):
    table = _table()
    with pytest.raises(ValueError, match="has no feature admission"):
        table.set_access_threshold(3)
    sparse_lookup(
        table, tf.constant([1], tf.int64), access_and_evict_config={"access_threshold": 1}
    )
    with pytest.raises(ValueError, match="threshold must be in \\[-1"):
        table.set_access_threshold(-5)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"evict_enable": 1}, TypeError, "evict_enable"),
        ({"evict_time_interval": 0}, ValueError, "evict_time_interval"),
        ({"evict_step_interval": 0}, ValueError, "evict_step_interval"),
        ({"evict_step_interval": 2.5}, TypeError, "evict_step_interval"),
    ],
)
def test_evict_hook_argument_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        EvictHook(**kwargs)


def test_evict_hook_step_interval_needs_global_step(fixed):
    table = _table(name="a")
    sparse_lookup(
        table,
        tf.constant([1], tf.int64),
        timestamps=tf.constant([1], tf.int64),
        access_and_evict_config={"access_threshold": -1, "eviction_threshold": 3},
    )
    hook = EvictHook(evict_enable=True, evict_step_interval=3)
    with pytest.raises(ValueError, match="needs a global step"):
        hook.begin()


@pytest.mark.estimator
def test_evict_hook_in_estimator_training(tmp_path):
    """EvictHook as a training hook of tf.estimator.Estimator: the tables of the Estimator's
    graph are found in begin() and evicted every 5 global steps."""
    init(use_dynamic_expansion=False)
    found = {}

    def model_fn(features, labels, mode):
        table = _table(steps_to_live=2)
        emb = sparse_lookup(
            table,
            features["ids"],
            is_train=mode == tf.estimator.ModeKeys.TRAIN,
            access_and_evict_config={"access_threshold": 1},
        )
        logits = tf.reduce_sum(emb, axis=[1, 2])
        loss = tf.reduce_mean(tf.square(logits - labels))
        step = tf.compat.v1.train.get_global_step()
        sparse = gradient_descent.create_hash_optimizer(learning_rate=0.01)
        train_op = sparse.minimize(loss, global_step=step)
        found["stats"] = table.stats()
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def input_fn():
        # Every step brings 4 new keys: old ones age out.
        ids = np.arange(200, dtype=np.int64).reshape(50, 4, 1)
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, np.ones(50, np.float32))).batch(1)

    class StatsAtEnd(tf.compat.v1.train.SessionRunHook):
        def end(self, session):
            found["values"] = session.run(found["stats"])

    hook = EvictHook(evict_enable=True, evict_step_interval=5)
    estimator = tf.estimator.Estimator(
        model_fn,
        model_dir=str(tmp_path),
        config=tf.estimator.RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None),
    )
    estimator.train(input_fn, hooks=[hook, StatsAtEnd()], steps=20)
    assert hook.evictions in (3, 4)  # global step crosses 5, 10, 15 (and 20)
    assert found["values"]["evicted"] > 0
    # Keys of at most the last 5 + 2 steps remain.
    assert found["values"]["size"] <= 4 * 8


def test_kernels_reject_negative_counts_and_weights(fixed):
    from rec_sdk.ops import table_ops

    table = _table()
    keys = tf.constant([1, 2], tf.int64)
    bad = table_ops.find_or_insert(table.handle, keys, True, counts=tf.constant([1, -3], tf.int64))
    wrong_size = table_ops.find_or_insert(
        table.handle, keys, True, counts=tf.constant([1, 1, 1], tf.int64)
    )
    stats = table_ops.key_access_stats(
        tf.constant([0, 1], tf.int32), 2, tf.constant([1, -1], tf.int64)
    )
    bad_samples = table_ops.key_access_stats(
        tf.constant([0, 1, 0], tf.int32), 2, 1, tf.constant([5, 6], tf.int64)
    )
    with new_session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="counts .* must be >= 0, got -3"):
            sess.run(bad)
        with pytest.raises(tf.errors.InvalidArgumentError, match="must have 2 elements"):
            sess.run(wrong_size)
        with pytest.raises(tf.errors.InvalidArgumentError, match="weights must be >= 0"):
            sess.run(stats)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="sample_times has 2 timestamps for 3 samples"
        ):
            sess.run(bad_samples)
        assert sess.run(table.size_tensor()) == 0  # nothing was inserted by the failed calls


def test_eviction_after_a_lookup_without_timestamps_is_an_error(fixed):
    table = _table()
    sparse_lookup(table, tf.constant([1], tf.int64), name="plain")
    with pytest.raises(ValueError, match="admission or eviction here.*\\['plain'\\]"):
        sparse_lookup(
            table,
            tf.constant([1], tf.int64),
            name="timed",
            timestamps=tf.constant([1], tf.int64),
            access_and_evict_config={"access_threshold": -1, "eviction_threshold": 5},
        )
