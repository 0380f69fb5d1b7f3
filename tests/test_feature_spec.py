"""The FeatureSpec pipeline: FeatureSpec validation, get_asc_insert_func's preprocessing in
tf.data against NumPy, sparse_lookup with FeatureSpecs (shared tables, several lookups, dict
and tuple batches, static and dynamic shape, eval), admission and eviction by timestamp
through the pipeline, and the errors."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import new_session
from rec_sdk.core.asc import helper
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.asc.manager import start_asc_pipeline
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import gradient_descent
from rec_sdk.util.initialize import init

DIM = 4


def _table(name, **kwargs):
    kwargs.setdefault("device_vocabulary_size", 10000)
    return create_table(
        tf.int64, DIM, name, tf.compat.v1.random_uniform_initializer(0.5, 1.0, seed=5), **kwargs
    )


def _iterator(data, specs, is_training=True, batch_size=4):
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch_size)
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset.prefetch(2))
    return iterator, iterator.get_next()


# ---------------------------------------------------------------------------
# FeatureSpec
# ---------------------------------------------------------------------------


def test_feature_spec_defaults():
    spec = FeatureSpec("user")
    assert (
        spec.table_name,
        spec.index_key,
        spec.access_threshold,
        spec.eviction_threshold,
        spec.is_timestamp,
        spec.faae_coefficient,
    ) == ("user", "user", None, None, False, 1)
    spec = FeatureSpec(
        "clicks",
        table_name="user",
        index_key=3,
        access_threshold=-1,
        eviction_threshold=2**31 - 1,
        faae_coefficient=2,
    )
    assert (spec.table_name, spec.index_key) == ("user", 3)
    assert not spec.admission and FeatureSpec("a", access_threshold=0).admission


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"name": ""}, ValueError, "name must be a non-empty string"),
        ({"name": 3}, ValueError, "name must be a non-empty string"),
        ({"table_name": ""}, ValueError, "table_name"),
        ({"index_key": 256}, ValueError, "index_key must be in \\[0, 255\\]"),
        ({"index_key": -1}, ValueError, "index_key"),
        ({"index_key": 1.0}, TypeError, "index_key must be a batch dict key"),
        ({"index_key": True}, TypeError, "index_key"),
        ({"access_threshold": -2}, ValueError, "access_threshold must be in \\[-1, 2147483647\\]"),
        ({"access_threshold": 2**31}, ValueError, "access_threshold"),
        ({"access_threshold": 1, "eviction_threshold": -2}, ValueError, "eviction_threshold"),
        ({"eviction_threshold": 10}, ValueError, "needs an access_threshold"),
        ({"is_timestamp": 1}, TypeError, "is_timestamp"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"faae_coefficient": 0}, ValueError, "faae_coefficient"),
    ],
)
def test_feature_spec_errors(kwargs, error, match):
    kwargs.setdefault("name", "f")
    with pytest.raises(error, match=match):
        FeatureSpec(**kwargs)


# ---------------------------------------------------------------------------
# The insert function
# ---------------------------------------------------------------------------


def test_insert_function_matches_numpy():
    init()
    rng = np.random.RandomState(0)
    user = rng.randint(0, 6, size=(8,)).astype(np.int64)
    clicks = rng.randint(0, 6, size=(8, 3)).astype(np.int32)
    ts = rng.randint(100, 200, size=(8,)).astype(np.int64)
    specs = [
        FeatureSpec("user", access_threshold=2, faae_coefficient=3),
        FeatureSpec("clicks", table_name="user", access_threshold=2),
        FeatureSpec("ts", index_key="timestamp", is_timestamp=True),
    ]
    iterator, batch = _iterator(
        {"user": user, "clicks": clicks, "timestamp": ts}, specs, batch_size=8
    )
    with new_session() as sess:
        sess.run(iterator.initializer)
        out = sess.run(batch)
    unique = out[helper.unique_key("user")]
    assert sorted(unique.tolist()) == sorted(set(user.tolist()) | set(clicks.ravel().tolist()))
    np.testing.assert_array_equal(unique[out[helper.inverse_key(specs[0].name)]], user)
    np.testing.assert_array_equal(unique[out[helper.inverse_key(specs[1].name)]], clicks)
    assert out[helper.inverse_key(specs[1].name)].shape == (8, 3)
    counts = out[helper.counts_key("user")]
    times = out[helper.times_key("user")]
    for k, key in enumerate(unique.tolist()):
        assert counts[k] == 3 * (user == key).sum() + (clicks == key).sum()
        rows = (user == key) | (clicks == key).any(1)
        assert times[k] == ts[rows].max()
    np.testing.assert_array_equal(out["user"], user)  # the batch keeps its features


def test_eval_insert_function_has_no_counts():
    init()
    iterator, batch = _iterator({"a": np.arange(4)}, [FeatureSpec("a")], is_training=False)
    assert helper.unique_key("a") in batch and helper.counts_key("a") not in batch


def test_insert_function_errors():
    init()
    with pytest.raises(ValueError, match="non-empty list of FeatureSpec"):
        get_asc_insert_func(tgt_key_specs=[])
    with pytest.raises(TypeError, match="FeatureSpec objects"):
        get_asc_insert_func(tgt_key_specs=["a"])
    twice = FeatureSpec("a")
    with pytest.raises(ValueError, match="FeatureSpec 'a_[0-9]+' is listed twice"):
        get_asc_insert_func(tgt_key_specs=[twice, twice])
    with pytest.raises(ValueError, match="no FeatureSpec with is_timestamp=True"):
        get_asc_insert_func(
            tgt_key_specs=[FeatureSpec("a", access_threshold=1, eviction_threshold=5)]
        )
    with pytest.raises(ValueError, match="table 'a' has two timestamp specs"):
        get_asc_insert_func(
            tgt_key_specs=[
                FeatureSpec("a"),
                FeatureSpec("t1", is_timestamp=True),
                FeatureSpec("t2", is_timestamp=True),
            ]
        )
    with pytest.raises(ValueError, match="disagree on"):
        get_asc_insert_func(
            tgt_key_specs=[
                FeatureSpec("a", access_threshold=1),
                FeatureSpec("b", table_name="a", access_threshold=2),
            ]
        )
    with pytest.raises(ValueError, match="tgt_key_specs .* or args_index_list"):
        get_asc_insert_func()
    dataset = tf.data.Dataset.from_tensor_slices({"a": np.arange(4)}).batch(2)
    with pytest.raises(KeyError, match="index_key 'b' is not in the batch; its keys are \\['a'\\]"):
        dataset.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("b")]))
    with pytest.raises(
        TypeError, match="ids of FeatureSpec 'a_[0-9]+' .* must be integer .* got string"
    ):
        tf.data.Dataset.from_tensor_slices({"a": np.array([b"1", b"2"])}).map(
            get_asc_insert_func(tgt_key_specs=[FeatureSpec("a")])
        )


# ---------------------------------------------------------------------------
# Lookups
# ---------------------------------------------------------------------------


def test_feature_spec_lookup_equals_tensor_lookup_and_shares_one_probe():
    init()
    user = np.array([1, 2, 1, 3], np.int64)
    clicks = np.array([[2, 2], [5, 1], [7, 7], [1, 9]], np.int64)
    specs = [FeatureSpec("user"), FeatureSpec("clicks", table_name="user")]
    iterator, batch = _iterator({"user": user, "clicks": clicks}, specs)
    table = _table("user")
    a = sparse_lookup(table, specs[0], None, batch=batch, name="user_lookup")
    b = sparse_lookup(table, specs[1], None, batch=batch, name="clicks_lookup")
    assert a.shape.as_list() == [None, DIM] and b.shape.as_list() == [None, 2, DIM]
    probes = [
        op
        for op in tf.compat.v1.get_default_graph().get_operations()
        if op.type in table_ops.ADDRESS_OPS
    ]
    assert len(probes) == 1  # one find_or_insert per table and batch
    assert len(tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)) == 1
    reference = table.lookup(tf.constant(np.arange(10), tf.int64), init_missing=True)[0]
    start_asc_pipeline()
    with new_session() as sess:
        sess.run(iterator.initializer)
        out_a, out_b, ref = sess.run([a, b, reference])
        assert sess.run(table.size_tensor()) == 6
    np.testing.assert_array_equal(out_a, ref[user])
    np.testing.assert_array_equal(out_b, ref[clicks])


def test_feature_spec_training_matches_numpy_sgd():
    """Two features share a table; the summed gradient of each key updates its row once."""
    init()
    user = np.array([1, 2, 1, 3], np.int64)
    clicks = np.array([[2, 2], [5, 1], [7, 7], [1, 9]], np.int64)
    specs = [FeatureSpec("user"), FeatureSpec("clicks", table_name="user")]
    iterator, batch = _iterator({"user": user, "clicks": clicks}, specs)
    table = _table("user")
    a = sparse_lookup(table, specs[0], None, batch=batch)
    b = sparse_lookup(table, specs[1], None, batch=batch, name="clicks_lookup")
    loss = tf.reduce_sum(a * 2.0) + tf.reduce_sum(b)
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(loss)
    reference = table.lookup(tf.constant(np.arange(10), tf.int64), init_missing=True)[0]
    with new_session() as sess:
        ref = sess.run(reference)
        sess.run(iterator.initializer)
        sess.run(train)
        keys, values, _ = sess.run(table.export())
    grad = np.zeros(10)
    np.add.at(grad, user, 2.0)
    np.add.at(grad, clicks.ravel(), 1.0)
    for key, value in zip(keys.tolist(), values):
        np.testing.assert_allclose(value, ref[key] - 0.1 * grad[key], rtol=1e-6)


def test_tuple_batches_with_positions():
    init()
    ids = np.array([[4, 5], [5, 6]], np.int64)
    labels = np.array([1.0, 0.0], np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(2)
    spec = FeatureSpec("ids", index_key=0)
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=[spec]))
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    assert len(batch) == 3 and isinstance(batch[2], dict)  # the pipeline's dict is appended
    table = _table("ids")
    emb = sparse_lookup(table, spec, None, batch=batch)
    reference = table.lookup(tf.constant(np.arange(10), tf.int64), init_missing=True)[0]
    with new_session() as sess:
        sess.run(iterator.initializer)
        out, ref = sess.run([emb, reference])
    np.testing.assert_array_equal(out, ref[ids])


def test_args_index_list_builds_specs_from_flat_positions():
    init()
    data = {"a": np.array([1, 2], np.int64), "b": np.array([3, 4], np.int64)}
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(2)
    dataset = dataset.map(get_asc_insert_func(args_index_list=[1], table_names=["t"]))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with new_session() as sess:
        assert sorted(sess.run(batch[helper.unique_key("t")]).tolist()) == [3, 4]
    with pytest.raises(ValueError, match="table_names of the same length"):
        get_asc_insert_func(args_index_list=[0, 1], table_names=["t"])


def test_eval_lookup_never_inserts():
    init()
    specs = [FeatureSpec("a")]
    train_it, train_batch = _iterator({"a": np.array([1, 2, 3, 4])}, specs)
    eval_it, eval_batch = _iterator({"a": np.array([3, 4, 5, 6])}, specs, is_training=False)
    table = _table("a")
    train = sparse_lookup(table, specs[0], None, batch=train_batch, is_train=True)
    evaluate = sparse_lookup(table, specs[0], None, batch=eval_batch, is_train=False, name="a_eval")
    with new_session() as sess:
        sess.run([train_it.initializer, eval_it.initializer])
        sess.run(train)
        out = sess.run(evaluate)
        assert sess.run(table.size_tensor()) == 4
    assert (out[:2] > 0).all() and (out[2:] == 0).all()


def test_static_shape_send_counts_add_up_and_overflow_is_clear():
    init(use_dynamic=False)
    user = np.array([1, 2, 3, 4], np.int64)
    clicks = np.array([5, 6, 7, 8], np.int64)
    specs = [FeatureSpec("user"), FeatureSpec("clicks", table_name="user")]
    iterator, batch = _iterator({"user": user, "clicks": clicks}, specs)
    table = _table("user")
    with pytest.raises(ValueError, match="sparse_lookup 'user_lookup': send_count is required"):
        sparse_lookup(table, specs[0], None, batch=batch)
    # 8 distinct keys: 5 + 3 fit.
    a = sparse_lookup(table, specs[0], 5, batch=batch)
    b = sparse_lookup(table, specs[1], 3, batch=batch, name="clicks_lookup")
    with new_session() as sess:
        sess.run(iterator.initializer)
        sess.run([a, b])
    tf.compat.v1.reset_default_graph()
    iterator, batch = _iterator({"user": user, "clicks": clicks}, specs)
    table = _table("user")
    a = sparse_lookup(table, specs[0], 4, batch=batch)
    b = sparse_lookup(table, specs[1], 3, batch=batch, name="clicks_lookup")
    with new_session() as sess:
        sess.run(iterator.initializer)
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match="table user: 8 distinct keys in the batch, more than send_count=7",
        ):
            sess.run([a, b])


def test_lookup_errors():
    init()
    specs = [
        FeatureSpec("a"),
        FeatureSpec("t", is_timestamp=True, index_key="ts"),
        FeatureSpec("c", table_name="other"),
    ]
    iterator, batch = _iterator({"a": np.arange(4), "ts": np.arange(4)}, specs[:2])
    table = _table("a")
    with pytest.raises(
        ValueError, match="FeatureSpec 'c_[0-9]+' has table_name='other', not this table's 'a'"
    ):
        sparse_lookup(table, specs[2], None, batch=batch)
    with pytest.raises(ValueError, match="'t_[0-9]+' is a timestamp spec"):
        sparse_lookup(table, specs[1], None, batch=batch)
    with pytest.raises(ValueError, match="FeatureSpec ids need batch="):
        sparse_lookup(table, specs[0], None)
    with pytest.raises(ValueError, match="no preprocessed keys for table 'a'"):
        sparse_lookup(table, specs[0], None, batch={"a": tf.constant([1], tf.int64)})
    with pytest.raises(ValueError, match="'x_[0-9]+' was not among the tgt_key_specs"):
        sparse_lookup(table, FeatureSpec("x", table_name="a"), None, batch=batch)
    with pytest.raises(
        ValueError,
        match="thresholds from FeatureSpec 'a_[0-9]+' \\(access_threshold=None.*says otherwise",
    ):
        sparse_lookup(
            table, specs[0], None, batch=batch, access_and_evict_config={"access_threshold": 1}
        )


def test_start_asc_pipeline_names_unknown_tables():
    init()
    _iterator({"a": np.arange(4)}, [FeatureSpec("a", table_name="missing")])
    _table("a")
    with pytest.raises(
        ValueError, match="names table 'missing', which does not exist; the tables are \\['a'\\]"
    ):
        start_asc_pipeline()


# ---------------------------------------------------------------------------
# Admission and eviction through the pipeline
# ---------------------------------------------------------------------------


def test_pipeline_admission_with_coefficients_and_eviction_by_timestamp():
    init()
    # Step 1 (t=100): user 1 once (x2) and click 1 twice (x1): 4 >= 3, admitted.
    # Step 2 (t=500): user 2 (x2) and click 2 (x1): 3, admitted; click 9: 1, pending.
    # Eviction with threshold 200 at newest 500: key 1 (seen at 100) goes, 9 stays pending.
    data = {
        "user": np.array([1, 2], np.int64),
        "clicks": np.array([[1, 1], [2, 9]], np.int64),
        "timestamp": np.array([100, 500], np.int64),
    }
    specs = [
        FeatureSpec("user", access_threshold=3, eviction_threshold=200, faae_coefficient=2),
        FeatureSpec("clicks", table_name="user", access_threshold=3, eviction_threshold=200),
        FeatureSpec("timestamp", is_timestamp=True),
    ]
    iterator, batch = _iterator(data, specs, batch_size=1)
    table = _table("user")
    emb = sparse_lookup(table, specs[0], None, batch=batch)
    sparse_lookup(table, specs[1], None, batch=batch, name="clicks_lookup")
    assert table.access_threshold == 3 and table.eviction_threshold == 200
    assert table.clock == "timestamp"
    start_asc_pipeline()
    with new_session() as sess:
        sess.run(iterator.initializer)
        assert (sess.run(emb) > 0).all()  # key 1 admitted at once
        assert (sess.run(emb) > 0).all()  # key 2 admitted at once
        stats = sess.run(table.stats())
        assert stats["newest_clock"] == 500 and stats["size"] == 2 and stats["pending"] == 1
        assert sess.run(table.evict()) == (1, 0)
        assert sorted(sess.run(table.export())[0].tolist()) == [2]


def test_int32_table_through_the_pipeline():
    init()
    specs = [FeatureSpec("a")]
    iterator, batch = _iterator({"a": np.array([3, 4, 3, -5], np.int32)}, specs)
    table = create_table(
        tf.int32,
        DIM,
        "a",
        tf.compat.v1.random_uniform_initializer(0.5, 1.0, seed=5),
        device_vocabulary_size=100,
    )
    emb = sparse_lookup(table, specs[0], None, batch=batch)
    reference = table.lookup(tf.constant([3, 4, 3, -5], tf.int32), init_missing=True)[0]
    with new_session() as sess:
        sess.run(iterator.initializer)
        out, ref = sess.run([emb, reference])
        assert sess.run(table.size_tensor()) == 3
    np.testing.assert_array_equal(out, ref)
