"""Converting a plain model's tf.Variable embedding tables into rec_sdk tables:
graph_rewrite.find_embedding_variables and DropVariableUpdates on tiny hand-built graphs, and
rec_sdk.graph.convert.DynamicEmbeddingHook on a model written without rec_sdk (structure after
begin(), numerics against a hand-written rec_sdk model, checkpoints through
MonitoredTrainingSession and tf.estimator, skipped variables)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from helpers import new_session, session_config
from rec_sdk import saver as rec_saver
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.graph.convert import DynamicEmbeddingHook, converted_variables
from rec_sdk.optimizers import gradient_descent, gradient_descent_by_addr, lazy_adam_by_addr
from rec_sdk.util import initialize
from rec_sdk_graph_rewrite import DropVariableUpdates, RewriteError, find_embedding_variables

ROWS, DIM = 50, 4
STEPS = 6


def _uniform(seed=1):
    return tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=seed)


def _batches(count, seed=0, key_range=10 * ROWS):
    """Ids drawn from 10x the rows, so that many collide under % ROWS."""
    rng = np.random.RandomState(seed)
    return [
        (
            rng.randint(0, key_range, size=(8, 2)).astype(np.int64),
            rng.randint(0, key_range, size=(8, 3)).astype(np.int64),
            rng.randint(0, 2, size=8).astype(np.float32),
        )
        for _ in range(count)
    ]


def _dense_head(user, item, labels):
    x = tf.concat([tf.reshape(user, [-1, 2 * DIM]), tf.reshape(item, [-1, 3 * DIM])], 1)
    w0 = np.random.RandomState(7).uniform(-0.3, 0.3, size=(5 * DIM, 1)).astype(np.float32)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(w0))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.reshape(tf.matmul(x, w) + b, [-1])
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def _plain_model(dense_read=False):
    """A model written without rec_sdk: two embedding variables read with the hashing trick,
    a dense layer, sigmoid loss, Adam with a global step. With dense_read, the item table is
    also L2-regularised (a dense read)."""
    user_ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="user_ids")
    item_ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="item_ids")
    labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
    user_table = tf.compat.v1.get_variable("user_emb", [ROWS, DIM], initializer=_uniform(1))
    item_table = tf.compat.v1.get_variable("item_emb", [ROWS, DIM], initializer=_uniform(2))
    user = tf.nn.embedding_lookup(user_table, user_ids % ROWS)
    item = tf.nn.embedding_lookup(item_table, item_ids % ROWS)
    loss = _dense_head(user, item, labels)
    if dense_read:
        loss = loss + 1e-3 * tf.nn.l2_loss(item_table)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    return {
        "feeds": (user_ids, item_ids, labels),
        "loss": loss,
        "train": train,
        "user": user,
        "item": item,
        "tables": (user_table, item_table),
    }


def _feed(model, batch):
    return dict(zip(model["feeds"], batch))


def _monitored(hooks, checkpoint_dir=None):
    return tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=checkpoint_dir,
        hooks=hooks,
        config=session_config(),
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        save_checkpoint_steps=None,
        save_checkpoint_secs=None if checkpoint_dir is None else 3600,
    )


def _read(sess, variable_name):
    """The variable's value through the read op the variable itself made (no new ops)."""
    return sess.run(variable_name + "/Read/ReadVariableOp:0")


# ---------------------------------------------------------------------------
# Analysis on tiny graphs
# ---------------------------------------------------------------------------


def _tiny(build):
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def()


def test_finds_hashing_trick_keys_gradient_and_updates():
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")
        raw = tf.compat.v1.placeholder(tf.int32, [None], name="raw")
        hashed = tf.compat.v1.get_variable("hashed", [10, 4], initializer=_uniform())
        plain = tf.compat.v1.get_variable("plain", [10, 4], initializer=_uniform())
        e1 = tf.nn.embedding_lookup(hashed, ids % 10, name="hashed_lookup")
        e2 = tf.nn.embedding_lookup(plain, tf.cast(raw % 7, tf.int64), name="plain_lookup")
        loss = tf.reduce_sum(e1) + tf.reduce_sum(e2 * e2)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)

    found = find_embedding_variables(_tiny(build))
    assert found.skipped == []
    by_name = found.by_name()
    hashed, plain = by_name["hashed"], by_name["plain"]
    assert (hashed.rows, hashed.dim, hashed.dtype) == (10, 4, "float32")
    gather = hashed.gathers[0]
    assert (gather.op, gather.kind, gather.ids, gather.keys, gather.modulus) == (
        "hashed_lookup",
        "ResourceGather",
        "mod:0",
        "ids:0",
        10,
    )
    assert gather.gradient_op == "gradients/hashed_lookup_grad/Reshape"
    assert gather.trains and hashed.trained
    assert hashed.updates == ["GradientDescent/update_hashed/ResourceScatterAdd"]
    assert hashed.initializer == "hashed/Assign"
    assert hashed.initial_value == pytest.approx(
        {"kind": "random_uniform", "minval": -0.1, "maxval": 0.1}
    )
    # x % 7 into 10 rows (through an integer cast) is hashing too: the keys are x.
    assert (plain.gathers[0].keys, plain.gathers[0].modulus) == ("raw:0", 7)


def test_gradient_tensor_is_the_gradient_of_the_gather_output():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        table = tf.compat.v1.get_variable("t", [10, 4], initializer=_uniform())
        gathered = tf.gather(table.value(), ids)  # GatherV2(ReadVariableOp)
        loss = tf.reduce_sum(tf.square(gathered))
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        expected = tf.gradients(loss, gathered)[0]
    found = find_embedding_variables(graph.as_graph_def())
    gather = found.by_name()["t"].gathers[0]
    assert gather.kind == "GatherV2" and gather.read_op == "ReadVariableOp"
    assert (gather.keys, gather.modulus) == ("ids:0", None)
    assert found.by_name()["t"].updates == ["Adagrad/update_t/ResourceSparseApplyAdagrad"]
    with new_session(graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = {ids: [1, 3, 1]}
        got, want = sess.run([gather.gradient, expected], feed)
    np.testing.assert_allclose(got, want)


def test_no_gradient_and_no_hashing():
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        table = tf.compat.v1.get_variable(
            "t", [10, 4], initializer=tf.compat.v1.truncated_normal_initializer(0.5, 0.25)
        )
        tf.nn.embedding_lookup(table, ids % 11)  # a modulus above the rows is not hashing
        for name, init in (
            ("zeros", tf.compat.v1.zeros_initializer()),
            ("big", tf.compat.v1.constant_initializer(0.5)),
            ("normal", tf.compat.v1.random_normal_initializer(0.0, 2.0)),
        ):
            var = tf.compat.v1.get_variable(name, [2000, 2], initializer=init)
            tf.nn.embedding_lookup(var, ids)

    found = find_embedding_variables(_tiny(build)).by_name()
    gather = found["t"].gathers[0]
    assert (gather.keys, gather.modulus, gather.gradient_op, gather.trains) == (
        "mod:0",
        None,
        None,
        False,
    )
    assert not found["t"].trained and found["t"].updates == []
    assert found["t"].initial_value == pytest.approx(
        {"kind": "truncated_normal", "mean": 0.5, "stddev": 0.25}
    )
    assert found["zeros"].initial_value == {"kind": "constant", "value": 0.0}
    assert found["big"].initial_value == {"kind": "constant", "value": 0.5}
    assert found["normal"].initial_value == {"kind": "random_normal", "mean": 0.0, "stddev": 2.0}


def test_skipped_variables_name_the_reason():
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        dense = tf.compat.v1.get_variable("dense", [10, 4], initializer=_uniform())
        tf.nn.embedding_lookup(dense, ids)
        tf.matmul(dense, tf.ones([4, 1]), name="uses_values")
        wide = tf.compat.v1.get_variable("wide", [10, 4], dtype=tf.float64)
        tf.nn.embedding_lookup(wide, ids)
        cube = tf.compat.v1.get_variable("cube", [10, 4, 2])
        tf.nn.embedding_lookup(cube, ids)
        ref = tf.compat.v1.Variable(tf.zeros([10, 4]), name="ref", use_resource=False)
        tf.gather(ref, ids)
        tf.compat.v1.get_variable("never_gathered", [10, 4])

    found = find_embedding_variables(_tiny(build))
    assert list(found) == []
    reasons = {s.name: s.reason for s in found.skipped}
    assert sorted(reasons) == ["cube", "dense", "ref", "wide"]
    assert reasons["dense"] == "read densely by op 'uses_values' (MatMul)"
    assert "float64" in reasons["wide"]
    assert "[10, 4, 2]" in reasons["cube"]
    assert "reference variable" in reasons["ref"]


def test_shared_variable_static_shapes_and_updates_without_gather_gradient():
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [4, 2], name="ids")
        history = tf.compat.v1.placeholder(tf.int32, [4, 3], name="history")
        shared = tf.compat.v1.get_variable("shared", [10, 4], initializer=_uniform())
        a = tf.nn.embedding_lookup(shared, ids % 10, name="target")
        b = tf.nn.embedding_lookup(shared, history, name="history_lookup")
        loss = tf.reduce_sum(a) * tf.reduce_sum(b)
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        other = tf.compat.v1.get_variable("other", [10, 4], initializer=_uniform())
        tf.nn.embedding_lookup(other, ids)  # not in the loss: no gradient
        tf.group(other.assign_add(tf.ones([10, 4])), name="manual_update")

    found = find_embedding_variables(_tiny(build))
    shared = found.by_name()["shared"]
    # With static shapes TF folds the gradient's Size into a Const; it is still found.
    assert [(g.op, g.keys, g.modulus, g.trains) for g in shared.gathers] == [
        ("history_lookup", "history:0", None, True),
        ("target", "ids:0", 10, True),
    ]
    assert [s.name for s in found.skipped] == ["other"]
    assert "is updated (AssignAddVariableOp) but the gradient of none" in found.skipped[0].reason


def _two_variable_graph():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        emb = tf.compat.v1.get_variable("emb", [10, 4], initializer=_uniform())
        w = tf.compat.v1.get_variable("w", [4, 1], initializer=_uniform(3))
        out = tf.matmul(tf.nn.embedding_lookup(emb, ids % 10), w)
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(out), name="train")
        tf.compat.v1.global_variables_initializer()
    return graph.as_graph_def()


def _run_train(graph_def):
    """(emb before, emb after, w before, w after) of one step of graph_def's train op."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with new_session(graph) as sess:
            sess.run("init")
            before = sess.run(["emb/Read/ReadVariableOp:0", "w/Read/ReadVariableOp:0"])
            sess.run("train", {"ids:0": [1, 12, 5]})
            after = sess.run(["emb/Read/ReadVariableOp:0", "w/Read/ReadVariableOp:0"])
    return before[0], after[0], before[1], after[1]


def test_drop_variable_updates_structure_and_effect(tmp_path):
    graph_def = _two_variable_graph()
    original = graph_def.SerializeToString()
    result = DropVariableUpdates(["emb:0"], train_ops=["train"])(graph_def, dump_dir=str(tmp_path))
    assert graph_def.SerializeToString() == original  # the input is never mutated
    assert result.modified
    # The per-variable group leaves the train op's group and Adam's beta-power updates.
    assert sorted(m[2] for m in result.matches) == [
        "train",
        "train/ReadVariableOp",
        "train/ReadVariableOp_2",
    ]
    assert {m[1] for m in result.matches} == {"train/update_emb/group_deps"}
    nodes = {n.name: n for n in result.graph_def.node}
    assert "^train/update_emb/group_deps" not in nodes["train"].input
    assert "^train/update_w/ResourceApplyAdam" in nodes["train"].input
    assert set(os.listdir(str(tmp_path))) == {
        "drop_variable_updates_before.pbtxt",
        "drop_variable_updates_after.pbtxt",
    }
    emb0, emb1, w0, w1 = _run_train(result.graph_def)
    np.testing.assert_array_equal(emb0, emb1)  # the dense update no longer runs
    assert np.abs(w1 - w0).max() > 0  # the other variable still trains
    emb0, emb1, _, _ = _run_train(graph_def)
    assert np.abs(emb1 - emb0).max() > 0
    # Without train ops: every op that ran the update stops running it.
    result = DropVariableUpdates("emb")(graph_def)
    emb0, emb1, w0, w1 = _run_train(result.graph_def)
    np.testing.assert_array_equal(emb0, emb1)
    assert np.abs(w1 - w0).max() > 0
    # Nothing to do for a variable without updates.
    assert not DropVariableUpdates(["emb"], train_ops=["init"])(graph_def).modified


def test_drop_variable_updates_errors():
    graph_def = _two_variable_graph()
    with pytest.raises(RewriteError, match="do not exist.*nope"):
        DropVariableUpdates(["nope"])(graph_def)
    with pytest.raises(RewriteError, match="not variables.*ids \\(Placeholder\\)"):
        DropVariableUpdates(["ids"])(graph_def)
    with pytest.raises(RewriteError, match="train ops do not exist.*missing_op"):
        DropVariableUpdates(["emb"], train_ops=["missing_op"])(graph_def)

    # A reference variable's update feeding the train op by data cannot be dropped.
    graph = tf.Graph()
    with graph.as_default():
        ref = tf.compat.v1.Variable(tf.zeros([3, 2]), name="ref", use_resource=False)
        w = tf.compat.v1.get_variable("w", [])
        updated = tf.reduce_sum(
            ref.assign_sub(tf.ones([3, 2]), name="ref_update"), name="after_update"
        )
        with tf.control_dependencies([w.assign_add(1.0).op]):
            tf.add(updated, 1.0, name="uses_update")
    with pytest.raises(RewriteError, match="data edges.*ref_update -> after_update"):
        DropVariableUpdates(["ref"], train_ops=["uses_update"])(graph.as_graph_def())
    # A resource variable's read after its update keeps running, without the update.
    graph = tf.Graph()
    with graph.as_default():
        emb = tf.compat.v1.get_variable("emb", [3, 2])
        w = tf.compat.v1.get_variable("w", [])
        updated = tf.reduce_sum(emb.assign_sub(tf.ones([3, 2])), name="after_update")
        with tf.control_dependencies([w.assign_add(1.0).op]):
            tf.add(updated, 1.0, name="uses_update")
    result = DropVariableUpdates(["emb"], train_ops=["uses_update"])(graph.as_graph_def())
    assert [m[1] for m in result.matches] == ["AssignSubVariableOp"]
    graph = tf.Graph()
    with graph.as_default():
        emb = tf.compat.v1.get_variable("emb", [3, 2])
        emb.assign_sub(tf.ones([3, 2]), read_value=False, name="direct")
    with pytest.raises(RewriteError, match="itself an update of variable 'emb'"):
        DropVariableUpdates(["emb"], train_ops=["direct"])(graph.as_graph_def())


# ---------------------------------------------------------------------------
# DynamicEmbeddingHook
# ---------------------------------------------------------------------------


def test_hook_structure_collisions_and_untouched_variables():
    model = _plain_model()
    hook = DynamicEmbeddingHook()
    batches = _batches(STEPS)
    graph = tf.compat.v1.get_default_graph()
    with _monitored([hook]) as sess:
        conversion = hook.conversion
        assert [c.name for c in conversion.converted] == ["user_emb", "item_emb"]
        assert conversion.skipped == [] and conversion.train_ops == ["Adam"]
        assert initialize.get_use_dynamic_expansion()  # the hook initialised rec_sdk
        for converted in conversion.converted:
            assert converted.trained and list(converted.hashed.values()) == [ROWS]
            assert converted.table.capacity_rows is None  # dynamic expansion
            for gather in converted.lookups:
                assert graph.get_operation_by_name(gather).outputs[0].consumers() == []
        assert set(converted_variables(graph)) == {"user_emb", "item_emb"}
        # Keys that collide under % ROWS read different rows.
        probe = {model["feeds"][0]: [[3, 3 + ROWS]], model["feeds"][1]: [[4, 4 + ROWS, 4]]}
        user, item = sess.run([model["user"], model["item"]], probe)
        assert np.abs(user[0, 0] - user[0, 1]).max() > 1e-3
        assert np.abs(item[0, 0] - item[0, 1]).max() > 1e-3
        np.testing.assert_array_equal(item[0, 0], item[0, 2])
        trained_keys = {model["feeds"][0]: batches[0][0]}
        user_before = sess.run(model["user"], trained_keys)
        dense_before = [_read(sess, "user_emb"), _read(sess, "item_emb"), _read(sess, "w")]
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        for batch in batches:
            sess.run(model["train"], _feed(model, batch), options=options, run_metadata=metadata)
        ran = {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}
        assert not any(
            n.startswith(("Adam/update_user_emb/", "Adam/update_item_emb/")) for n in ran
        )
        assert "Adam/update_w/ResourceApplyAdam" in ran
        assert any(n.endswith("RecSdk>ApplyLazyAdam") for n in ran)
        assert not any(
            n.startswith(("embedding_lookup", "gradients/embedding_lookup")) for n in ran
        )
        # The old variables keep their values; the dense layer and the tables train.
        np.testing.assert_array_equal(_read(sess, "user_emb"), dense_before[0])
        np.testing.assert_array_equal(_read(sess, "item_emb"), dense_before[1])
        assert np.abs(_read(sess, "w") - dense_before[2]).max() > 0
        assert np.abs(sess.run(model["user"], trained_keys) - user_before).min() > 0


def _handwritten_losses(batches):
    """The same model written with rec_sdk by hand: create_table + sparse_lookup, Adam on the
    dense layer, LazyAdam (by address) on the tables."""
    initialize.init(use_dynamic_expansion=True)
    user_ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    item_ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    tables = [
        create_table(tf.int64, DIM, "user_emb", _uniform(), device_vocabulary_size=ROWS),
        create_table(tf.int64, DIM, "item_emb", _uniform(), device_vocabulary_size=ROWS),
    ]
    user = sparse_lookup(tables[0], user_ids, is_train=True)
    item = sparse_lookup(tables[1], item_ids, is_train=True)
    loss = _dense_head(user, item, labels)
    step = tf.compat.v1.train.get_or_create_global_step()
    dense = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
        loss, global_step=step, var_list=tf.compat.v1.trainable_variables()
    )
    embs = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB")
    addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")
    sparse = lazy_adam_by_addr.create_hash_optimizer_by_address(0.001).apply_gradients(
        zip(tf.gradients(loss, embs), addresses)
    )
    train = tf.group(dense, sparse)
    losses = []
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in batches:
            losses.append(
                sess.run([loss, train], dict(zip((user_ids, item_ids, labels), batch)))[0]
            )
    return losses


def test_hook_matches_a_handwritten_rec_sdk_model():
    batches = _batches(STEPS, seed=3)
    model = _plain_model()
    hook = DynamicEmbeddingHook(emb_initializer=_uniform())
    with _monitored([hook]) as sess:
        converted = [sess.run([model["loss"], model["train"]], _feed(model, b))[0] for b in batches]
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    expected = _handwritten_losses(batches)
    np.testing.assert_allclose(converted, expected, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(converted, 6))) > 1  # it trains


def test_monitored_session_checkpoints_the_converted_tables(tmp_path):
    batches = _batches(4, seed=5)
    ckpt = str(tmp_path / "ckpt")

    def session_losses(count):
        model = _plain_model()
        with _monitored([DynamicEmbeddingHook()], checkpoint_dir=ckpt) as sess:
            losses = [
                sess.run([model["loss"], model["train"]], _feed(model, b))[0]
                for b in batches[:count]
            ]
            probe = sess.run(model["loss"], _feed(model, batches[0]))
            step = sess.run(tf.compat.v1.train.get_global_step())
        return losses, probe, step

    _, probe, step = session_losses(3)
    assert step == 3
    saved = sorted(d for d in os.listdir(ckpt) if d.startswith("sparse-"))
    assert "sparse-model.ckpt-3" in saved  # beside the step-0 save on session creation
    assert sorted(os.listdir(os.path.join(ckpt, "sparse-model.ckpt-3"))) == ["item_emb", "user_emb"]
    # A new graph and session restore the tables: the same loss on a seen batch.
    tf.compat.v1.reset_default_graph()
    _, restored_probe, restored_step = session_losses(0)
    assert restored_step == 3
    np.testing.assert_allclose(restored_probe, probe, rtol=1e-6)


def test_dense_read_variable_is_skipped_and_still_trains():
    model = _plain_model(dense_read=True)
    hook = DynamicEmbeddingHook()
    with _monitored([hook]) as sess:
        conversion = hook.conversion
        assert [c.name for c in conversion.converted] == ["user_emb"]
        assert [s.name for s in conversion.skipped] == ["item_emb"]
        assert "read densely by op 'L2Loss' (L2Loss)" in conversion.skipped[0].reason
        before = _read(sess, "item_emb"), _read(sess, "user_emb")
        for batch in _batches(2):
            sess.run(model["train"], _feed(model, batch))
        assert np.abs(_read(sess, "item_emb") - before[0]).max() > 0
        np.testing.assert_array_equal(_read(sess, "user_emb"), before[1])


def _variable(name):
    return [v for v in tf.compat.v1.global_variables() if v.op.name == name][0]


def test_chosen_variables_errors_and_dumps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _plain_model(dense_read=True)
    with pytest.raises(RewriteError, match="item_emb: read densely by op 'L2Loss'"):
        DynamicEmbeddingHook(variables=["item_emb"]).begin()
    with pytest.raises(RewriteError, match="w: not a resource variable read through gathers"):
        DynamicEmbeddingHook(variables=["w"]).begin()
    hook = DynamicEmbeddingHook(variables=[_variable("user_emb")], dump_graph=True)
    hook.begin()
    assert [c.name for c in hook.conversion.converted] == ["user_emb"]
    dumps = os.listdir(str(tmp_path / "rec_sdk_dump"))
    assert len(dumps) == 1
    assert sorted(os.listdir(str(tmp_path / "rec_sdk_dump" / dumps[0]))) == [
        "add_control_inputs_after.pbtxt",
        "add_control_inputs_before.pbtxt",
        "drop_variable_updates_after.pbtxt",
        "drop_variable_updates_before.pbtxt",
        "reroute_inputs_after.pbtxt",
        "reroute_inputs_before.pbtxt",
    ]
    # A second conversion of the same graph leaves converted variables alone.
    again = DynamicEmbeddingHook()
    again.begin()
    assert again.conversion.converted == [] and again.conversion.update is None
    with pytest.raises(TypeError, match="optimizer must be"):
        DynamicEmbeddingHook(optimizer="adam")


def test_fixed_capacity_tables_gather_v2_and_gradient_descent():
    """A process initialised with fixed-capacity tables: capacity_factor x rows rows, a plain
    optimizer given as a callable; the variable is read with tf.gather(var.value(), ids) and
    trained by GradientDescent."""
    initialize.init(use_dynamic_expansion=False)
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    table = tf.compat.v1.get_variable("emb", [ROWS, DIM], initializer=_uniform())
    logits = tf.reduce_sum(tf.gather(table.value(), ids), 1)
    loss = tf.reduce_mean(tf.square(logits - labels))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()
    )
    hook = DynamicEmbeddingHook(
        optimizer=lambda: gradient_descent.create_hash_optimizer(0.5), capacity_factor=2
    )
    keys = np.arange(8, dtype=np.int64) * 1000  # far beyond the variable's rows
    with _monitored([hook]) as sess:
        converted = hook.conversion.converted[0]
        assert converted.table.capacity_rows == 2 * ROWS
        assert converted.hashed == {"GatherV2": None}
        losses = [sess.run([loss, train], {ids: keys, labels: np.ones(8)})[0] for _ in range(5)]
        assert losses[-1] < losses[0] * 0.5
    tf.compat.v1.reset_default_graph()
    _plain_model()
    hook = DynamicEmbeddingHook(
        optimizer=lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1)
    )
    with pytest.raises(ValueError, match="use create_hash_optimizer"):
        hook.begin()


@pytest.mark.estimator
def test_estimator_train_then_evaluate_restores_the_tables(tmp_path):
    ids = np.random.RandomState(4).randint(0, 10 * ROWS, size=(32, 2)).astype(np.int64)
    labels = (ids.sum(1) % 2).astype(np.float32)

    def model_fn(features, labels, mode):
        table = tf.compat.v1.get_variable("emb", [ROWS, DIM], initializer=_uniform())
        emb = tf.nn.embedding_lookup(table, features["ids"] % ROWS)
        logits = tf.reduce_sum(emb, [1, 2])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(
                mode,
                loss=loss,
                eval_metric_ops={"emb_sum": tf.compat.v1.metrics.mean(tf.reduce_sum(emb))},
            )
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step()
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(8)

    estimator = tf.estimator.Estimator(
        model_fn,
        model_dir=str(tmp_path),
        config=tf.estimator.RunConfig(session_config=session_config()),
    )
    train_hook = DynamicEmbeddingHook(
        optimizer=lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.5, 0.0)
    )
    estimator.train(input_fn, steps=4, hooks=[train_hook])
    assert train_hook.conversion.converted[0].trained
    eval_hook = DynamicEmbeddingHook()
    metrics = estimator.evaluate(input_fn, hooks=[eval_hook])
    assert not eval_hook.conversion.converted[0].trained  # evaluation lookups insert nothing
    # The same sums from the checkpoint's tables read directly.
    checkpoint = tf.train.latest_checkpoint(str(tmp_path))
    tf.compat.v1.reset_default_graph()
    table = create_table(tf.int64, DIM, "emb", 0.0, device_vocabulary_size=ROWS)
    values, exists = table.lookup(tf.constant(ids))
    with new_session() as sess:
        rec_saver.restore_tables(sess, rec_saver.sparse_dir(checkpoint))
        values, exists = sess.run([values, exists])
    assert exists.all()
    expected = np.mean([values[i : i + 8].sum() for i in range(0, 32, 8)])
    assert abs(expected) > 1e-3
    np.testing.assert_allclose(metrics["emb_sum"], expected, rtol=1e-5)
    # Trained, not the initial values.
    assert metrics["loss"] < np.log(2.0) + 0.1


def test_graph_rewrite_exports():
    for name in (
        "DropVariableUpdates",
        "find_embedding_variables",
        "EmbeddingVariable",
        "SkippedVariable",
        "GatherRead",
        "EmbeddingVariables",
    ):
        assert name in graph_rewrite.__all__ and hasattr(graph_rewrite, name)
