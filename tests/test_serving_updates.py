"""Serving updates (rec_sdk.serving): a model exported with export_serving_model serves
exactly what the training graph's evaluation lookups read, after each of several pushes
(rows changed, keys removed and evicted, dense variables); updates apply in place with no torn
row; a killed pusher, a corrupt, truncated or missing update leave the model on its last
good version; a late replica catches up to the same rows; the model holds only stock ops."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from helpers import new_session
from rec_sdk import serving
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam
from rec_sdk.serving import (
    Pusher,
    PushHook,
    ServedModel,
    UpdateError,
    export_serving_model,
    follow,
    mutable,
    update_files,
)
from rec_sdk.util.initialize import init
from tf_serving_standin import TFServingStandIn

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Model:
    """Two servable tables (int64 and int32 keys, one evicting keys unseen for 3 steps) and
    a dense layer, trained by LazyAdam / Adam; `probs` and the embeddings are served."""

    def __init__(self, dim=4, steps_to_live=3):
        init(use_dynamic_expansion=False)
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.users = create_table(
            tf.int64,
            dim,
            "users",
            tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1),
            device_vocabulary_size=2000,
            servable=True,
            steps_to_live=steps_to_live,
        )
        self.items = create_table(
            tf.int32,
            dim,
            "items",
            tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=2),
            device_vocabulary_size=2000,
            servable=True,
        )
        self.user_ids = tf.compat.v1.placeholder(tf.int64, [None], name="user_ids")
        self.item_ids = tf.compat.v1.placeholder(tf.int32, [None, 2], name="item_ids")
        self.w = tf.compat.v1.get_variable(
            "w", [3 * dim, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3)
        )
        probs, _, _ = self._model(True)
        self.labels = tf.compat.v1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(tf.square(probs - self.labels))
        tables = [self.users, self.items]
        self.train = tf.group(
            tf.compat.v1.train.AdamOptimizer(0.05).minimize(
                loss, var_list=[self.w], global_step=self.step
            ),
            lazy_adam.create_hash_optimizer(0.05).apply_gradients(
                zip(tf.gradients(loss, tables), tables)
            ),
        )
        self.probs, self.u, self.i = self._model(False)
        self.inputs = {"user_ids": self.user_ids, "item_ids": self.item_ids}
        self.outputs = {"probs": self.probs, "u": self.u, "i": self.i}
        self.rng = np.random.RandomState(0)

    def _model(self, train):
        suffix = "train" if train else "eval"
        u = sparse_lookup(
            self.users,
            self.user_ids,
            is_train=train,
            name="u_" + suffix,
            serving_default_value=None if train else 0.25,
        )
        i = sparse_lookup(self.items, self.item_ids, is_train=train, name="i_" + suffix)
        x = tf.concat([u, tf.reshape(i, [-1, 2 * u.shape[-1]])], 1)
        return tf.reshape(tf.sigmoid(tf.matmul(x, self.w)), [-1]), u, i

    def run_training(self, sess, steps, users=(0, 60), items=(0, 40)):
        for _ in range(steps):
            sess.run(
                self.train,
                {
                    self.user_ids: self.rng.randint(*users, 16),
                    self.item_ids: self.rng.randint(*items, (16, 2)),
                    self.labels: self.rng.rand(16),
                },
            )

    def queries(self):
        """Every key trained (and some never), with their evaluation outputs."""
        users = np.arange(-5, 130, dtype=np.int64)
        items = np.stack([np.arange(len(users)) % 90, (np.arange(len(users)) * 7) % 90], 1).astype(
            np.int32
        )
        return {"user_ids": users, "item_ids": items}

    def expected(self, sess):
        q = self.queries()
        return sess.run(self.outputs, {self.user_ids: q["user_ids"], self.item_ids: q["item_ids"]})


def _assert_serves(served, model, sess):
    want = model.expected(sess)
    got = served.predict(model.queries())
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def _export(model, sess, root):
    return export_serving_model(
        sess, str(root / "export"), model.inputs, model.outputs, str(root / "push")
    )


def test_pushes_serve_the_training_tables_rows(tmp_path):
    model = _Model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 5)
        exported = _export(model, sess, tmp_path)
        assert exported["rows"] == sess.run(model.users.size_tensor() + model.items.size_tensor())
        pusher = Pusher(str(tmp_path / "push"))
        served = ServedModel(str(tmp_path / "export"))
        ops = {op.type for op in served.graph.get_operations()}
        assert not any(t.startswith("RecSdk") for t in ops), ops
        assert served.version() == (0, exported["chain"])
        _assert_serves(served, model, sess)
        evicted_before = None
        for push in range(1, 5):
            # New users arrive, old ones stop: steps_to_live=3 evicts users 0..59 at push 3.
            users = (0, 60) if push < 3 else (60, 120)
            model.run_training(sess, 4, users=users)
            if push == 3:
                evicted = sess.run(model.users.evict())[0]
                assert evicted > 0
                evicted_before = evicted
            if push == 4:
                sess.run(model.items.remove(tf.constant([1, 2, 3], tf.int32)))
            assert pusher.push(sess) == push
            assert follow(str(tmp_path / "push"), served) == [push]
            _assert_serves(served, model, sess)
        assert evicted_before
        # Evicted users read the lookup's serving default; removed items read zeros.
        got = served.predict(model.queries())
        users = model.queries()["user_ids"]
        np.testing.assert_array_equal(got["u"][(users >= 0) & (users < 10)], 0.25)
        # Nothing changed: no update is published.
        assert pusher.push(sess) is None
        assert pusher.whole_tables == 0
        served.close()


def test_a_push_of_rows_alone_after_a_whole_update_keeps_the_dense_variables(tmp_path):
    """Rows change, the dense variables do not: after a whole update (more new keys than
    base_fraction of the model), the next update carries a few rows and no dense value, and
    the served model keeps its dense values."""
    model = _Model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(str(tmp_path / "push"))
        served = ServedModel(str(tmp_path / "export"))
        many = tf.constant(np.arange(1000, 1600), tf.int64)
        sess.run(model.users.upsert(many, tf.fill([600, 4], 0.125)))
        assert pusher.push(sess) == 1
        assert pusher.whole_updates == 1  # 600 new rows: more than a quarter of the model
        assert follow(str(tmp_path / "push"), served) == [1]
        sess.run(model.users.upsert(tf.constant([7, 1700], tf.int64), tf.fill([2, 4], 0.5)))
        assert pusher.push(sess) == 2
        assert pusher.whole_updates == 1
        assert follow(str(tmp_path / "push"), served) == [2]
        _assert_serves(served, model, sess)
        np.testing.assert_allclose(
            served.predict({"user_ids": np.array([1700]), "item_ids": np.zeros([1, 2], np.int32)})[
                "u"
            ],
            [[0.5] * 4],
        )
        served.close()


@pytest.mark.parametrize(
    "split", [False, pytest.param(True, marks=pytest.mark.once)], ids=["one hash table", "split"]
)
def test_a_late_replica_catches_up_to_the_same_rows(tmp_path, monkeypatch, split):
    if split:  # small tables split as large ones do (over 4..8 hash tables)
        monkeypatch.setattr(mutable, "SPLIT_ROWS", 16)
    model = _Model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(str(tmp_path / "push"))
        early = ServedModel(str(tmp_path / "export"))
        for _ in range(3):
            model.run_training(sess, 3, users=(0, 200))
            pusher.push(sess)
            follow(str(tmp_path / "push"), early)
        late = ServedModel(str(tmp_path / "export"))
        tables = {
            op.name for op in late.graph.get_operations() if op.type == "MutableDenseHashTableV2"
        }
        for name in ("users", "items"):
            parts = [t for t in tables if t.startswith("rec_sdk_served_%s_" % name)]
            assert (4 <= len(parts) <= 8) if split else len(parts) == 1, tables
        assert late.version()[0] == 0
        assert follow(str(tmp_path / "push"), late) == [3]  # updates are cumulative
        q = model.queries()
        a, b = early.predict(q), late.predict(q)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
        _assert_serves(late, model, sess)


_STOCK_LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    export_dir, push_dir, queries, out = sys.argv[1:]
    import os
    sess = tf.compat.v1.Session(graph=tf.Graph())
    with sess.graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
    ops = {op.type for op in sess.graph.get_operations()}
    assert not any(t.startswith("RecSdk") for t in ops), ops
    def run(name, feeds):
        sig = meta.signature_def[name]
        return sess.run({k: v.name for k, v in sig.outputs.items()},
                        {sig.inputs[k].name: v for k, v in feeds.items()})
    for name in sorted(os.listdir(push_dir)):
        if name.isdigit():
            run("apply_update", {"update_dir": os.path.join(push_dir, name)})
    q = np.load(queries)
    np.savez(out, **run("serving_default", {k: q[k] for k in q.files}))
    assert "rec_sdk" not in sys.modules
""")


def test_stock_tensorflow_loads_and_applies_updates_without_rec_sdk(tmp_path):
    model = _Model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(str(tmp_path / "push"))
        for _ in range(2):
            model.run_training(sess, 3, users=(0, 200))
            pusher.push(sess)
        want = model.expected(sess)
    np.savez(tmp_path / "q.npz", **model.queries())
    env = dict(os.environ, PYTHONPATH="")
    subprocess.run(
        [
            sys.executable,
            "-c",
            _STOCK_LOADER,
            str(tmp_path / "export"),
            str(tmp_path / "push"),
            str(tmp_path / "q.npz"),
            str(tmp_path / "out.npz"),
        ],
        check=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    got = np.load(tmp_path / "out.npz")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)


def _flip_byte(path, at=3):
    data = bytearray(open(path, "rb").read())
    data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("path", ["step", "cumulative"])
@pytest.mark.parametrize(
    "damage", ["flipped values", "truncated keys", "corrupt manifest", "missing removed file"]
)
def test_a_damaged_update_is_refused_by_name(tmp_path, damage, path):
    """A replica at the previous version applies an update's step files (the changes since
    that version), one further behind its cumulative files: damage in either is refused by
    the file's name and the model keeps its version."""
    model = _Model()
    push_dir = tmp_path / "push"
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(str(push_dir), base_fraction=100)
        served = ServedModel(str(tmp_path / "export"))
        for push in (1, 2):
            model.run_training(sess, 2, users=(0, 200))
            pusher.push(sess)
            if push == 1 or path == "step":
                follow(str(push_dir), served)
        at = served.version()[0]
        before = served.predict(model.queries())
        model.run_training(sess, 2, users=(0, 200))
        pusher.push(sess)
    third = push_dir / "0000000003"
    step = "step." if path == "step" else ""
    named = {
        "flipped values": "table0.%svalues" % step,
        "truncated keys": "table1.%skeys" % step,
        "corrupt manifest": "MANIFEST",
        "missing removed file": "table0.%sremoved" % step,
    }[damage]
    if damage == "flipped values":
        _flip_byte(third / named)
    elif damage == "truncated keys":
        data = open(third / named, "rb").read()
        open(third / named, "wb").write(data[:-8])
    elif damage == "corrupt manifest":
        _flip_byte(third / "MANIFEST", at=40)
    else:
        os.remove(third / named)
    with pytest.raises(UpdateError, match=named):
        follow(str(push_dir), served)
    assert served.version()[0] == at == (2 if path == "step" else 1)
    after = served.predict(model.queries())
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_a_missing_whole_update_is_reported_by_name(tmp_path):
    model = _Model()
    push_dir = tmp_path / "push"
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(str(push_dir), base_fraction=100)
        served = ServedModel(str(tmp_path / "export"))
        model.run_training(sess, 2)
        pusher.push(sess)
        follow(str(push_dir), served)
        model.run_training(sess, 2, users=(0, 200))
        pusher.base_fraction = 1e-9  # update 2 is whole, update 3 builds on it
        pusher.push(sess)
        pusher.base_fraction = 100
        model.run_training(sess, 2, users=(0, 200))
        pusher.push(sess)
    manifests = [
        update_files.read_manifest(str(push_dir / ("%010d" % v) / "MANIFEST")) for v in (2, 3)
    ]
    assert [(m["whole"], m["base"]) for m in manifests] == [(1, 0), (0, 2)]
    shutil.rmtree(push_dir / "0000000002")
    with pytest.raises(UpdateError, match="update 2 .* is missing"):
        follow(str(push_dir), served)
    assert served.version()[0] == 1


@pytest.mark.parametrize("plugin", [False, True], ids=["stock", "plugin"])
def test_readers_never_see_a_torn_row_while_updates_apply(tmp_path, plugin):
    init(use_dynamic_expansion=False)
    dim, rows = 64, 20000
    table = create_table(
        tf.int64,
        dim,
        "wide",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=rows,
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(table, ids, is_train=False, name="emb")
    keys = np.arange(rows, dtype=np.int64)
    value = tf.compat.v1.placeholder(tf.float32, [])
    fill = table.upsert(keys, tf.fill([rows, dim], value))
    with new_session() as sess:
        sess.run(fill, {value: 0.0})
        export_serving_model(
            sess,
            str(tmp_path / "export"),
            {"ids": ids},
            {"e": emb},
            str(tmp_path / "push"),
            plugin=plugin,
        )
        pusher = Pusher(str(tmp_path / "push"))
        for v in range(1, 7):
            sess.run(fill, {value: float(v)})
            pusher.push(sess)
    served = ServedModel(str(tmp_path / "export"))
    stop, torn, reads, seen = threading.Event(), [], [0], set()

    def reader():
        while not stop.is_set():
            got = served.predict({"ids": keys[::7]})["e"]
            spread = got.max(axis=1) - got.min(axis=1)
            if spread.max() != 0:
                torn.append(got[spread != 0][0])
            seen.update(np.unique(got[:, 0]).tolist())
            reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 7):
            assert served.apply(update_files.update_dir(str(tmp_path / "push"), v)) == v
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not torn, torn[:2]
    assert reads[0] > 5 and len(seen) > 2  # the reads ran while versions changed
    np.testing.assert_array_equal(served.predict({"ids": keys})["e"], 6.0)


def _worker(root, mode, **kwargs):
    return subprocess.Popen(
        [sys.executable, os.path.join(_ROOT, "tests", "serving_pusher_worker.py"), str(root), mode],
        cwd=str(root),
        **kwargs,
    )


def test_a_pusher_killed_mid_write_leaves_the_last_good_version(tmp_path):
    first = _worker(tmp_path, "first")
    try:
        deadline = time.time() + 240
        while not (tmp_path / "stalled").exists():
            assert first.poll() is None, "the trainer exited before its third push"
            assert time.time() < deadline
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(60)
    push_dir = str(tmp_path / "push")
    assert update_files.published_versions(push_dir) == [1, 2]
    assert any(name.startswith(".tmp-") for name in os.listdir(push_dir))
    served = ServedModel(str(tmp_path / "export"))
    assert follow(push_dir, served) == [2]
    # A new trainer (other rows: another process, as after a restart) completes the chain
    # with its whole tables.
    second = _worker(tmp_path, "second", stdout=subprocess.PIPE, text=True)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0
    assert "whole tables: 1" in out
    assert follow(push_dir, served) == [3]
    assert not any(name.startswith(".tmp-") for name in os.listdir(push_dir))  # cleaned up
    expected = np.load(tmp_path / "expected.npz")
    got = served.predict({"ids": expected["ids"]})
    np.testing.assert_allclose(got["p"], expected["p"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["e"], expected["e"], rtol=1e-6, atol=1e-7)


def test_push_hook_pushes_from_a_monitored_session(tmp_path):
    model = _Model()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 2)
        _export(model, sess, tmp_path)
    # A new session has new tables (as an Estimator's train() restoring a checkpoint): the
    # first push sends both whole, the later ones only changes.
    hook = PushHook(str(tmp_path / "push"), every_steps=3)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for _ in range(7):
            model.run_training(sess, 1)
        hook.pusher.wait()
        assert update_files.published_versions(str(tmp_path / "push")) == [1, 2]
        expected = model.expected(sess)
    assert update_files.published_versions(str(tmp_path / "push")) == [1, 2, 3]
    assert hook.pusher.whole_tables == 2 and hook.pusher.failures == 0
    served = ServedModel(str(tmp_path / "export"))
    assert follow(str(tmp_path / "push"), served) == [3]
    got = served.predict(model.queries())
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7)


def test_pushes_of_a_table_on_the_ssd_tier_carry_its_cold_rows(tmp_path):
    """Rows that moved to the SSD tier keep their change marks: a push sends the cold rows
    changed since the last push, and only those."""
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        4,
        "tiered",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=9,
        host_vocabulary_size=1,
        ssd_vocabulary_size=1000,
        ssd_data_path=str(tmp_path),
        servable=True,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = sparse_lookup(table, ids, is_train=False, name="serve")
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, 4])
    upsert = table.upsert(keys, values)
    all_keys = np.arange(100, dtype=np.int64)
    with new_session() as sess:
        sess.run(upsert, {keys: all_keys, values: np.ones([100, 4], np.float32)})
        export_serving_model(
            sess, str(tmp_path / "export"), {"ids": ids}, {"e": emb}, str(tmp_path / "push")
        )
        pusher = Pusher(str(tmp_path / "push"), base_fraction=10)
        served = ServedModel(str(tmp_path / "export"))
        changed = np.array([3, 50, 97], np.int64)  # cold rows come back to memory
        sess.run(upsert, {keys: changed, values: np.full([3, 4], 2.0, np.float32)})
        sess.run(upsert, {keys: np.arange(200, 240), values: np.full([40, 4], 3.0, np.float32)})
        assert sess.run(table.stats())["cold"] > 80
        pusher.push(sess)
        manifest = update_files.read_manifest(
            os.path.join(update_files.update_dir(str(tmp_path / "push"), 1), "MANIFEST")
        )
        assert manifest["table_rows"] == [43] and manifest["table_replace"] == [0]
        follow(str(tmp_path / "push"), served)
        q = np.arange(250, dtype=np.int64)
        np.testing.assert_array_equal(served.predict({"ids": q})["e"], sess.run(emb, {ids: q}))


@pytest.mark.estimator
def test_estimator_trains_exports_and_pushes(tmp_path):
    """tf.estimator: export from the latest checkpoint, then train() with a PushHook; the
    served model follows to what the estimator predicts."""
    init(use_dynamic_expansion=False)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 40, (256, 2)).astype(np.int64)
    labels = (ids[:, 0] % 2).astype(np.float32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(32)

    def model_fn(features, labels, mode):
        table = create_table(
            tf.int64,
            4,
            "est",
            tf.compat.v1.zeros_initializer(),
            device_vocabulary_size=100,
            servable=True,
        )
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        emb = sparse_lookup(table, features["ids"], is_train=is_train, name="emb")
        w = tf.compat.v1.get_variable("w", [4, 1])
        logits = tf.reshape(tf.matmul(tf.reduce_sum(emb, 1), w), [-1])
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.group(
            tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, var_list=[w], global_step=step),
            lazy_adam.create_hash_optimizer(0.1).minimize(loss),
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def serving_input_receiver_fn():
        ph = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ph}, {"ids": ph})

    estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(input_fn, steps=3)
    push_dir = str(tmp_path / "push")
    serving.export_estimator_serving_model(
        estimator, serving_input_receiver_fn, str(tmp_path / "export"), push_dir
    )
    served = ServedModel(str(tmp_path / "export"))
    hook = PushHook(push_dir, every_steps=2)
    estimator.train(input_fn, steps=5, hooks=[hook])
    assert follow(push_dir, served) == [3]
    probe = np.array([[1, 2], [3, 39], [50, 60]], np.int64)
    expected = [
        p["logit"]
        for p in estimator.predict(
            lambda: tf.data.Dataset.from_tensor_slices({"ids": probe}).batch(3)
        )
    ]
    np.testing.assert_allclose(
        served.predict({"ids": probe})["logit"], expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("tier", [False, True], ids=["in memory", "ssd tier"])
def test_plugin_mode_serves_and_updates_rec_sdk_tables(tmp_path, tier):
    """plugin=True: the SavedModel keeps each table in a rec_sdk table (with 30 rows in
    memory and the others on an SSD tier), filled by streaming its assets; updates apply
    the same way and the served rows equal the training table's."""
    model = _Model()
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 5)
        export_serving_model(
            sess,
            str(tmp_path / "export"),
            model.inputs,
            model.outputs,
            str(tmp_path / "push"),
            plugin=True,
            memory_rows=30 if tier else None,
            ssd_path=str(ssd) if tier else None,
        )
        served = ServedModel(str(tmp_path / "export"))
        ops = {op.type for op in served.graph.get_operations()}
        assert "RecSdk>EmbeddingTable" in ops and "MutableDenseHashTableV2" not in ops
        _assert_serves(served, model, sess)
        pusher = Pusher(str(tmp_path / "push"))
        for push in (1, 2):
            model.run_training(sess, 3, users=(0, 200))
            sess.run(model.items.remove(tf.constant([1, 2], tf.int32)))
            pusher.push(sess)
            assert follow(str(tmp_path / "push"), served) == [push]
            _assert_serves(served, model, sess)
        if tier:
            assert os.listdir(ssd)  # rows went to the SSD tier


def _watch_once(push_dir, server):
    """python -m rec_sdk.serving.follow --once: (return code, the versions it applied or
    None, stderr)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.serving.follow",
            "--push_dir",
            push_dir,
            "--server",
            server,
            "--once",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    lines = out.stdout.strip().splitlines()
    applied = json.loads(lines[-1])["applied"] if out.returncode == 0 and lines else None
    return out.returncode, applied, out.stderr


@pytest.mark.parametrize("api", ["rest", "grpc"])
def test_the_watcher_drives_tf_serving_through_its_predict_api(tmp_path, api):
    """python -m rec_sdk.serving.follow --once against a server that keeps TensorFlow
    Serving's rules (tests/tf_serving_standin.py): it starts without a warning, applies the
    chain, then refuses a corrupt update by name; every signature answers through REST and
    gRPC Predict as TF Serving implements them."""
    model = _Model()
    push_dir = str(tmp_path / "push")
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 3)
        _export(model, sess, tmp_path)
        pusher = Pusher(push_dir)
        for _ in range(2):
            model.run_training(sess, 2, users=(0, 200))
            pusher.push(sess)
        with TFServingStandIn(str(tmp_path / "export"), name="ranker") as server:
            url = server.rest_url if api == "rest" else "grpc://%s/ranker" % server.grpc_target
            code, applied, err = _watch_once(push_dir, url)
            assert code == 0, err[-3000:]
            assert "Warning" not in err, err[-3000:]
            assert applied == [2]
            q = model.queries()
            want = model.expected(sess)
            rest = serving.RestModel(server.rest_url)
            got = rest.predict(q)
            grpc_model = serving.GrpcModel(server.grpc_target, "ranker")
            got_grpc = grpc_model.predict(q)
            for name in want:
                np.testing.assert_allclose(
                    np.asarray(got[name], np.float32),
                    want[name],
                    rtol=1e-6,
                    atol=1e-7,
                    err_msg=name,
                )
                np.testing.assert_allclose(
                    got_grpc[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name
                )
            assert rest.version() == grpc_model.version() == (2, pusher.chain)
            model.run_training(sess, 2, users=(0, 200))
            pusher.push(sess)
            # The server is at version 2: it reads update 3's step files.
            _flip_byte(os.path.join(update_files.update_dir(push_dir, 3), "table1.step.values"))
            code, _, err = _watch_once(push_dir, url)
            assert code == 1
            assert "0000000003/table1.step.values" in err
            assert rest.version()[0] == 2
            grpc_model.close()


def test_a_de_variable_in_graph_mode_is_served_and_updated(tmp_path):
    """The TFRA-style flow in a Session: a servable de.Variable of 2 shards looked up with
    de.embedding_lookup (max_norm 1.0) and trained by DynamicEmbeddingOptimizer(Adam); the
    served model follows the pushes (missing keys read the constant initializer, as in
    training)."""
    var = de.get_variable(
        "served_de", dim=4, devices=["/CPU:0"] * 2, initializer=0.5, servable=True
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
    w = tf.compat.v1.get_variable("w", [8, 1])
    emb = de.embedding_lookup(var, ids, max_norm=1.0, name="lookup")
    logits = tf.reshape(tf.matmul(tf.reshape(emb, [-1, 8]), w), [-1])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    loss = tf.reduce_mean(tf.square(tf.sigmoid(logits) - labels))
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)
    rng = np.random.RandomState(0)
    probe = {ids: np.array([[1, 2], [3, 150], [500, 7]], np.int64)}
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())

        def steps(n):
            for _ in range(n):
                sess.run(train, {ids: rng.randint(0, 160, (16, 2)), labels: rng.rand(16)})

        steps(3)
        export_serving_model(
            sess, str(tmp_path / "export"), {"ids": ids}, {"logits": logits}, str(tmp_path / "push")
        )
        served = ServedModel(str(tmp_path / "export"))
        pusher = Pusher(str(tmp_path / "push"))
        for push in (1, 2):
            steps(3)
            assert pusher.push(sess) == push
            assert follow(str(tmp_path / "push"), served) == [push]
            np.testing.assert_allclose(
                served.predict({"ids": probe[ids]})["logits"],
                sess.run(logits, probe),
                rtol=1e-5,
                atol=1e-6,
            )


def test_a_failed_push_in_a_hook_is_logged_and_training_goes_on(tmp_path, monkeypatch, caplog):
    model = _Model()
    push_dir = str(tmp_path / "push")
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        model.run_training(sess, 2)
        _export(model, sess, tmp_path)
    write = update_files.write_update
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return write(*args, **kwargs)

    monkeypatch.setattr(update_files, "write_update", failing_once)
    hook = PushHook(push_dir, every_steps=2)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        for _ in range(8):
            model.run_training(sess, 1)
        expected = model.expected(sess)
    assert hook.pusher.failures == 1
    assert "No space left on device" in caplog.text
    # The push after the failure sent the tables whole: the chain is exact.
    served = ServedModel(str(tmp_path / "export"))
    follow(push_dir, served)
    got = served.predict(model.queries())
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7)
