"""Served models are exact at every version (rec_sdk.serving).

A differential test: a trainer whose tables remove keys, evict them (steps_to_live and
evict_when_full) and write them again, with many keys sharing a home bucket of the served
hash tables, pushes 50+ times; after every applied version each probe key's served row is
compared with a dict of what the training table held at that push (the default for keys it
did not hold), and late replicas catch up with at most two updates to the same rows. Then:
one version per request while updates apply, and the stock-TensorFlow sequence that stores
a key twice in a DenseHashTable.
"""

import os
import shutil
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import new_session
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.serving import (
    Pusher,
    ServedModel,
    UpdateError,
    export_saved_model,
    export_serving_model,
    follow,
    indexed,
    mutable,
    update_files,
)
from rec_sdk.util.initialize import init

DIM = 4
STEPS_DEFAULT = 0.5  # what a key not in the "steps" table serves
# The served sub-tables hash an int64 key to itself: keys equal modulo the bucket count share
# their home bucket (and probe chain).
BUCKETS = mutable.MIN_BUCKETS
POOL = np.concatenate(
    [home + BUCKETS * np.arange(40, dtype=np.int64) for home in (3, 77, 500)]
    + [
        np.array([2**40 + BUCKETS * j for j in range(20)], np.int64),
        np.arange(-30, 30, dtype=np.int64),
    ]
)
NEVER = np.array([9 + BUCKETS * j for j in range(10)] + [2**50], np.int64)


class _Trainer:
    """Two servable tables trained by lazy Adam: "steps" evicts keys unseen for 3 steps (on
    evict()), "full" holds 48 rows and evicts its least recently used when full."""

    def __init__(self):
        init(use_dynamic_expansion=False)
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.tables = {
            "steps": create_table(
                tf.int64,
                DIM,
                "steps",
                tf.compat.v1.random_uniform_initializer(-1, 1, seed=1),
                device_vocabulary_size=4000,
                servable=True,
                steps_to_live=3,
            ),
            "full": create_table(
                tf.int64,
                DIM,
                "full",
                tf.compat.v1.random_uniform_initializer(-1, 1, seed=2),
                device_vocabulary_size=48,
                evict_when_full=True,
                servable=True,
            ),
        }
        self.ids = {
            name: tf.compat.v1.placeholder(tf.int64, [None], name=name + "_ids")
            for name in self.tables
        }
        self.targets = {
            name: tf.compat.v1.placeholder(tf.float32, [None, DIM]) for name in self.tables
        }
        loss = 0.0
        for name, table in self.tables.items():
            emb = sparse_lookup(table, self.ids[name], is_train=True, name=name + "_train")
            loss += tf.reduce_sum(tf.square(emb - self.targets[name]))
        tables = list(self.tables.values())
        self.train = tf.group(
            lazy_adam.create_hash_optimizer(0.1).apply_gradients(
                zip(tf.gradients(loss, tables), tables)
            ),
            tf.compat.v1.assign_add(self.step, 1),
        )
        self.outputs = {
            name: sparse_lookup(
                table,
                self.ids[name],
                is_train=False,
                name=name + "_eval",
                serving_default_value=STEPS_DEFAULT if name == "steps" else None,
            )
            for name, table in self.tables.items()
        }
        self.remove_keys = tf.compat.v1.placeholder(tf.int64, [None])
        self.removes = {name: t.remove(self.remove_keys) for name, t in self.tables.items()}
        self.evict = self.tables["steps"].evict()
        self.exports = {name: t.export()[:2] for name, t in self.tables.items()}
        self.rng = np.random.RandomState(0)

    def round(self, sess):
        """A few steps on a random part of the pool, then removals and evictions."""
        for _ in range(3):
            feed = {}
            for name in self.tables:
                keys = self.rng.choice(POOL, 12, replace=False)
                feed[self.ids[name]] = keys
                feed[self.targets[name]] = self.rng.randn(12, DIM).astype(np.float32)
            sess.run(self.train, feed)
        if self.rng.rand() < 0.6:
            sess.run(self.evict)
        for name in self.tables:
            if self.rng.rand() < 0.5:
                stored = sess.run(self.exports[name])[0]
                if len(stored):
                    gone = self.rng.choice(stored, min(len(stored), 5), replace=False)
                    sess.run(self.removes[name], {self.remove_keys: gone})

    def truth(self, sess):
        """{table: {key: row}} of what the training tables hold."""
        return {
            name: dict(zip(keys.tolist(), rows))
            for name, (keys, rows) in sess.run(self.exports).items()
        }


def _expected(truth, keys, default):
    return np.stack([truth.get(int(k), np.full([DIM], default, np.float32)) for k in keys])


def _check(served, truth, label):
    probe = np.concatenate([POOL, NEVER])
    got = served.predict({"steps": probe, "full": probe})
    for name, default in (("steps", STEPS_DEFAULT), ("full", 0.0)):
        want = _expected(truth[name], probe, default)
        bad = np.flatnonzero(np.any(got[name] != want, axis=1))
        assert not len(bad), "%s: table %s serves wrong rows for keys %s (got %s, want %s)" % (
            label,
            name,
            probe[bad][:5].tolist(),
            got[name][bad][:2],
            want[bad][:2],
        )


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("indexed, frequent rebuilds", id="indexed"),
        pytest.param("one hash table", id="one-table"),
        pytest.param("split, frequent rebuilds", id="split-rebuilds"),
    ],
)
def test_every_version_serves_exactly_the_trained_rows(tmp_path, monkeypatch, layout):
    pushes = 55
    monkeypatch.setattr(indexed, "LAYOUT", "indexed" if layout.startswith("indexed") else "split")
    if layout.startswith("indexed"):
        monkeypatch.setattr(indexed, "MIN_SPARE", 8)  # new keys soon fill the slots
        monkeypatch.setattr(mutable, "MIN_TOMBSTONES", 2)  # rebuilt after a few removals
    elif layout != "one hash table":
        monkeypatch.setattr(mutable, "SPLIT_ROWS", 16)  # 4..8 hash tables per table
        monkeypatch.setattr(mutable, "MIN_TOMBSTONES", 2)  # rebuilt after a few removals
        pushes = 33  # each update rebuilds several hash tables: 2 s a push
    trainer = _Trainer()
    push_dir = str(tmp_path / "push")
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        trainer.round(sess)
        export_serving_model(sess, str(tmp_path / "export"), trainer.ids, trainer.outputs, push_dir)
        served = ServedModel(str(tmp_path / "export"))
        _check(served, trainer.truth(sess), "the export")
        pusher = Pusher(push_dir, base_fraction=4, keep_secs=0)
        late_applied = []
        for push in range(1, pushes + 1):
            trainer.round(sess)
            assert pusher.push(sess) == push
            truth = trainer.truth(sess)
            assert follow(push_dir, served) == [push]
            _check(served, truth, "version %d" % push)
            if push % 11 == 0:
                late = ServedModel(str(tmp_path / "export"))
                late_applied.append(follow(push_dir, late))
                _check(late, truth, "a replica started at version %d" % push)
                late.close()
        wholes = pusher.whole_updates
        # Retention keeps only what a replica needs: the newest update and its base.
        assert len(update_files.published_versions(push_dir)) <= 2
    assert all(1 <= len(applied) <= 2 for applied in late_applied), late_applied
    assert 1 <= wholes < pushes  # some whole updates, most cumulative ones
    served.close()


def test_a_key_written_after_a_neighbours_removal_then_removed_reads_the_default(tmp_path):
    """TensorFlow's own DenseHashTable stores a key twice in this sequence (an insert stops
    at the deleted marker its removed neighbour left); the served table reads the default."""
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        1,
        "pair",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=10,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(table, ids, is_train=False, name="emb", serving_default_value=-1.0)
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, 1])
    upsert, remove = table.upsert(keys, values), table.remove(keys)
    first, second = 134, 134 + BUCKETS  # one home bucket
    push_dir = str(tmp_path / "push")
    with new_session() as sess:
        sess.run(upsert, {keys: [first, second], values: [[1.0], [2.0]]})
        export_serving_model(sess, str(tmp_path / "export"), {"ids": ids}, {"e": emb}, push_dir)
        served = ServedModel(str(tmp_path / "export"))
        pusher = Pusher(push_dir, base_fraction=100)
        for op, feed in (
            (remove, {keys: [first]}),
            (upsert, {keys: [second], values: [[3.0]]}),
            (remove, {keys: [second]}),
        ):
            sess.run(op, feed)
            pusher.push(sess)
            follow(push_dir, served)
        assert served.predict({"ids": np.array([first, second])})["e"].tolist() == [[-1.0]] * 2


@pytest.mark.parametrize("layout", ["indexed", "split"])
def test_each_request_reads_one_version_while_updates_apply(tmp_path, monkeypatch, layout):
    """Version v sets every row to v and the dense scale to v: a response whose rows differ,
    or whose scaled output is not rows * rows, mixed two versions."""
    monkeypatch.setattr(indexed, "LAYOUT", layout)
    monkeypatch.setattr(mutable, "SPLIT_ROWS", 16)  # split: over 4..8 hash tables
    init(use_dynamic_expansion=False)
    rows = 4000
    table = create_table(
        tf.int64,
        8,
        "wide",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=rows,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    scale = tf.compat.v1.get_variable("scale", [], initializer=tf.compat.v1.ones_initializer())
    emb = sparse_lookup(table, ids, is_train=False, name="emb")
    scaled = emb * scale
    keys = np.arange(rows, dtype=np.int64)
    value = tf.compat.v1.placeholder(tf.float32, [])
    fill = tf.group(table.upsert(keys, tf.fill([rows, 8], value)), scale.assign(value))
    push_dir = str(tmp_path / "push")
    versions = 8
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(fill, {value: 1.0})
        export_serving_model(
            sess, str(tmp_path / "export"), {"ids": ids}, {"e": emb, "p": scaled}, push_dir
        )
        pusher = Pusher(push_dir, base_fraction=1e-9)  # every update whole and self-contained
        for v in range(2, versions + 2):
            sess.run(fill, {value: float(v)})
            pusher.push(sess)
    served = ServedModel(str(tmp_path / "export"))
    # A refused update changes nothing, not even the lock's sequence number (left odd, every
    # later update would run with it even, unseen by requests).
    sequence = _sequence_of(served)
    bad = str(tmp_path / "bad")
    shutil.copytree(update_files.update_dir(push_dir, 1), bad)
    for name in os.listdir(bad):
        if name.startswith("table") and os.path.getsize(os.path.join(bad, name)):
            with open(os.path.join(bad, name), "r+b") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([last[0] ^ 1]))
    for attempt in (bad, bad, update_files.update_dir(push_dir, 1)):
        if attempt != bad:
            assert served.apply(attempt) == 1
        with pytest.raises(UpdateError):
            served.apply(attempt)
    assert sequence() == 2, "a refused update moved the sequence number to %d" % sequence()
    stop, mixed, seen = threading.Event(), [], set()

    def reader():
        while not stop.is_set():
            got = served.predict({"ids": keys[::3]})
            v = got["e"][0, 0]
            if np.any(got["e"] != v) or np.any(got["p"] != v * v):
                mixed.append((np.unique(got["e"]).tolist(), np.unique(got["p"]).tolist()))
            seen.add(float(v))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for v in range(2, versions + 1):
            assert served.apply(update_files.update_dir(push_dir, v)) == v
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not mixed, mixed[:3]
    assert len(seen) > 2  # the reads ran while versions changed
    np.testing.assert_array_equal(served.predict({"ids": keys[:2]})["p"], (versions + 1.0) ** 2)


def _sequence_of(served):
    """A function reading the sequence number of a loaded model's lock (apply.ModelLock)."""
    handle = [
        op
        for op in served.graph.get_operations()
        if op.type == "VarHandleOp" and op.name.endswith("_sequence")
    ][0].outputs[0]
    with served.graph.as_default():
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64)
    return lambda: int(served.sess.run(read))


def _small_model(tmp_path):
    """One servable table (dim 4) and a dense scale; returns (ids, outputs, write op, its
    feeds' placeholders, remove op)."""
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        4,
        "items",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=5000,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    scale = tf.compat.v1.get_variable("scale", [], initializer=tf.compat.v1.ones_initializer())
    emb = sparse_lookup(table, ids, is_train=False, name="emb")
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, 4])
    write = tf.group(table.upsert(keys, values), scale.assign_add(1.0))
    return ids, {"e": emb, "p": emb * scale}, write, keys, values, table.remove(keys)


@pytest.mark.once
def test_a_replica_started_after_1000_pushes_equals_one_that_followed_them(tmp_path):
    ids, outputs, write, keys, values, remove = _small_model(tmp_path)
    push_dir = str(tmp_path / "push")
    rng = np.random.RandomState(3)
    probe = np.arange(-5, 2100, dtype=np.int64)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(write, {keys: np.arange(1000), values: rng.randn(1000, 4)})
        export_serving_model(sess, str(tmp_path / "export"), {"ids": ids}, outputs, push_dir)
        early = ServedModel(str(tmp_path / "export"))
        pusher = Pusher(push_dir, keep_secs=0)
        for push in range(1, 1001):
            written = rng.randint(0, 2000, 3)
            sess.run(write, {keys: written, values: rng.randn(3, 4)})
            sess.run(remove, {keys: rng.randint(0, 2000, 1)})
            assert pusher.push(sess) == push
            assert follow(push_dir, early) == [push]
        want = sess.run(outputs, {ids: probe})
    kept = update_files.published_versions(push_dir)
    assert len(kept) <= 2 and kept[-1] == 1000  # the newest and the whole update it builds on
    assert pusher.whole_updates >= 2
    late = ServedModel(str(tmp_path / "export"))
    applied = follow(push_dir, late)
    assert 1 <= len(applied) <= 2 and applied[-1] == 1000
    for model in (early, late):
        got = model.predict({"ids": probe})
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_retention_never_breaks_a_replica_behind_by_less_than_its_window(tmp_path):
    ids, outputs, write, keys, values, _ = _small_model(tmp_path)
    push_dir = str(tmp_path / "push")
    window = 2.0
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(write, {keys: np.arange(100), values: np.ones([100, 4])})
        export_serving_model(sess, str(tmp_path / "export"), {"ids": ids}, outputs, push_dir)
        replica = ServedModel(str(tmp_path / "export"))
        pusher = Pusher(push_dir, keep_secs=window, base_fraction=1e-9)  # every update whole

        def push(n):
            for _ in range(n):
                sess.run(write, {keys: [1], values: np.ones([1, 4])})
                pusher.push(sess)

        push(1)
        # The replica picks update 1 to apply; pushes go on for less than the window.
        picked = update_files.update_dir(push_dir, update_files.published_versions(push_dir)[-1])
        started = time.time()
        push(5)
        assert time.time() - started < window
        assert replica.apply(picked) == 1  # still there
        time.sleep(window)
        push(1)  # retires the updates older than the window
        assert update_files.published_versions(push_dir) == [7]
        assert follow(push_dir, replica) == [7]  # one that is behind catches up all the same
        np.testing.assert_array_equal(
            replica.predict({"ids": np.arange(100)})["p"],
            sess.run(outputs["p"], {ids: np.arange(100)}),
        )


def test_a_tensor_serving_default_is_served_by_both_exports(tmp_path):
    """sparse_lookup takes serving_default_value as a float tensor: the exports serve its
    value (they once failed: a tensor of another graph, or not convertible to NumPy)."""
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        2,
        "t",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=100,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(
        table, ids, is_train=False, name="l", serving_default_value=tf.constant([3.0, -3.0])
    )
    with new_session() as sess:
        sess.run(table.upsert(np.array([1, 2], np.int64), tf.constant([[1.0, 1.0], [2.0, 2.0]])))
        export_serving_model(
            sess, str(tmp_path / "updatable"), {"ids": ids}, {"e": emb}, str(tmp_path / "push")
        )
        export_saved_model(sess, str(tmp_path / "frozen"), {"ids": ids}, {"e": emb})
    for kind in ("updatable", "frozen"):
        got = ServedModel(str(tmp_path / kind)).predict({"ids": np.array([1, 9])})["e"]
        assert got.tolist() == [[1.0, 1.0], [3.0, -3.0]], kind
