"""Tests for rec_sdk.core.embedding: create_table's validation, sparse_lookup, and the table
methods (lookup/upsert/remove/clear/export/import_rows)."""
import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.initializer_spec import describe_initializer
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import adagrad, lazy_adam
from rec_sdk.util.initialize import init

from helpers import new_session, sorted_export

DIM = 4


def _const(value=0.5):
    return tf.compat.v1.constant_initializer(value)


_DEFAULT = object()


def _table(name="t", dim=DIM, initializer=_DEFAULT, key_dtype=tf.int64, **kwargs):
    kwargs.setdefault("device_vocabulary_size", 1000)
    return create_table(key_dtype, dim, name,
                        _const() if initializer is _DEFAULT else initializer, **kwargs)


# ---------------------------------------------------------------------------
# create_table validation
# ---------------------------------------------------------------------------


@pytest.fixture
def initialized():
    init(use_dynamic_expansion=False)


@pytest.mark.parametrize("key_dtype", [tf.float32, tf.string, tf.int16, tf.uint64, "float64"])
def test_key_dtype_rejected(initialized, key_dtype):
    with pytest.raises(ValueError, match="key_dtype"):
        _table(key_dtype=key_dtype)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, "int64"])
def test_key_dtype_accepted(initialized, key_dtype):
    table = _table(key_dtype=key_dtype)
    assert table.key_dtype == tf.as_dtype(key_dtype)


@pytest.mark.parametrize("dim", [0, -1, 8193, tf.TensorShape([2, 3]), tf.TensorShape([None]),
                                 tf.TensorShape([0]), "a", 4.0, True])
def test_dim_rejected(initialized, dim):
    with pytest.raises((ValueError, TypeError), match="dim"):
        _table(dim=dim)


@pytest.mark.parametrize("dim,expected", [(1, 1), (8192, 8192), (tf.TensorShape([8]), 8)])
def test_dim_accepted(initialized, dim, expected):
    table = _table(dim=dim)
    assert table.dim == expected
    ids = tf.constant([3, 4], tf.int64)
    emb = sparse_lookup(table, ids)
    assert emb.shape.as_list() == [2, expected]


@pytest.mark.parametrize("name", ["", "a" * 101, "a-b", "a b", "t/x", "é", None, 3])
def test_name_rejected(initialized, name):
    with pytest.raises(ValueError, match="name"):
        _table(name=name)


@pytest.mark.parametrize("name", ["a", "a" * 100, "user_table.v2", "T9", "9", ".x", "_user",
                                  "_"])
def test_name_accepted(initialized, name):
    """Every name of 1-100 characters of [A-Za-z0-9_.] (the documented rule) makes a working
    table, whatever character it starts with."""
    table = _table(name=name)
    assert table.table_name == name
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    with new_session() as sess:
        np.testing.assert_array_equal(sess.run(emb), np.full([2, DIM], 0.5, np.float32))


def test_duplicate_name_in_graph_rejected(initialized):
    _table(name="user")
    with pytest.raises(ValueError, match="name.*user"):
        _table(name="user")
    # Only one table was registered.
    assert len(tf.compat.v1.get_collection(rec_sdk.TABLE_COLLECTION)) == 1


def test_same_name_in_new_graph_accepted(initialized):
    first = _table(name="user")
    with tf.Graph().as_default() as graph:
        second = _table(name="user")
        assert second.graph is graph
    assert first.graph is not second.graph


@pytest.mark.parametrize("param", ["device_vocabulary_size", "host_vocabulary_size",
                                   "ssd_vocabulary_size"])
@pytest.mark.parametrize("value", [10**9 + 1, -1])
def test_vocabulary_size_out_of_range(initialized, param, value):
    kwargs = {"host_vocabulary_size": 10} if param == "ssd_vocabulary_size" else {}
    kwargs[param] = value
    with pytest.raises(ValueError, match=param):
        _table(**kwargs)


def test_vocabulary_size_wrong_type(initialized):
    with pytest.raises(TypeError, match="device_vocabulary_size"):
        _table(device_vocabulary_size=10.0)


def test_ssd_without_host_rejected(initialized):
    with pytest.raises(ValueError, match="ssd_vocabulary_size.*host_vocabulary_size"):
        _table(ssd_vocabulary_size=10, host_vocabulary_size=0)
    _table(name="ok", ssd_vocabulary_size=10, host_vocabulary_size=5)


def test_zero_capacity_rejected_without_expansion(initialized):
    with pytest.raises(ValueError, match="device_vocabulary_size"):
        _table(device_vocabulary_size=0, host_vocabulary_size=0)


@pytest.mark.parametrize("value", [10.5, -10.5, float("nan")])
def test_init_param_rejected(initialized, value):
    with pytest.raises(ValueError, match="init_param"):
        _table(init_param=value)


def test_init_param_wrong_type(initialized):
    with pytest.raises(TypeError, match="init_param"):
        _table(init_param="2")


@pytest.mark.parametrize("make_initializer", [
    lambda: tf.compat.v1.glorot_uniform_initializer(),
    lambda: tf.keras.initializers.GlorotNormal(),
    lambda: tf.compat.v1.constant_initializer([1.0, 2.0, 3.0]),
    lambda: tf.compat.v1.orthogonal_initializer(),
    lambda: "zeros",
    lambda: None,
], ids=["glorot_uniform", "keras_glorot_normal", "constant_array", "orthogonal", "string",
        "none"])
def test_unsupported_initializer_rejected(initialized, make_initializer):
    with pytest.raises(ValueError, match="emb_initializer"):
        _table(initializer=make_initializer())


def test_value_dtype_rejected(initialized):
    with pytest.raises(ValueError, match="value_dtype"):
        _table(value_dtype=tf.float16)


def test_create_table_registers_in_collection(initialized):
    user = _table(name="user")
    item = _table(name="item")
    assert tf.compat.v1.get_collection(rec_sdk.TABLE_COLLECTION) == [user, item]
    assert user.capacity_rows == 1000
    assert "user" in repr(user)


# ---------------------------------------------------------------------------
# sparse_lookup: shapes and initial values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [[5], [2, 3], [2, 3, 2], [0], [1, 1, 1, 1]])
def test_lookup_output_shape_static(initialized, shape):
    table = _table()
    ids = tf.constant(np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape))
    emb = sparse_lookup(table, ids)
    assert emb.shape.as_list() == shape + [DIM]
    with new_session() as sess:
        value = sess.run(emb)
    assert value.shape == tuple(shape + [DIM])
    np.testing.assert_array_equal(value, np.full(shape + [DIM], 0.5, np.float32))


@pytest.mark.parametrize("placeholder_shape,fed_shape", [
    (None, [3]), (None, [2, 3]), (None, [2, 2, 2]), ([None], [7]), ([None, None], [3, 2]),
    ([2, None, 3], [2, 1, 3]),
])
def test_lookup_output_shape_dynamic(initialized, placeholder_shape, fed_shape):
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, placeholder_shape)
    emb = sparse_lookup(table, ids)
    if placeholder_shape is None:
        assert emb.shape.rank is None
    else:
        assert emb.shape.as_list() == placeholder_shape + [DIM]
    with new_session() as sess:
        value = sess.run(emb, {ids: np.arange(np.prod(fed_shape)).reshape(fed_shape)})
    assert value.shape == tuple(fed_shape + [DIM])


def test_lookup_dim_argument_checked(initialized):
    table = _table()
    ids = tf.constant([1], tf.int64)
    assert sparse_lookup(table, ids, dim=DIM).shape.as_list() == [1, DIM]
    with pytest.raises(ValueError, match="dim"):
        sparse_lookup(table, ids, dim=DIM + 1)


def test_constant_initial_values_and_init_param(initialized):
    plain = _table(name="plain", initializer=_const(0.25))
    scaled = _table(name="scaled", initializer=_const(0.25), init_param=-3.0)
    number = _table(name="number", initializer=2.0, init_param=0.5)
    ones = _table(name="ones", initializer=tf.compat.v1.ones_initializer(), init_param=4.0)
    zeros = _table(name="zeros", initializer=tf.keras.initializers.Zeros())
    ids = tf.constant([[11, 12], [13, 11]], tf.int64)
    outs = [sparse_lookup(t, ids) for t in (plain, scaled, number, ones, zeros)]
    with new_session() as sess:
        values = sess.run(outs)
    for value, expected in zip(values, [0.25, -0.75, 1.0, 4.0, 0.0]):
        np.testing.assert_array_equal(value, np.full([2, 2, DIM], expected, np.float32))


def _truncated_values(seed, keys, name="t", stddev=0.1, mean=0.0, init_param=1.0, dim=16):
    """Initial values of keys for a truncated-normal table, in a graph and session of its own."""
    with tf.Graph().as_default():
        table = _table(name=name, dim=dim, init_param=init_param,
                       initializer=tf.compat.v1.truncated_normal_initializer(
                           mean=mean, stddev=stddev, seed=seed))
        emb = sparse_lookup(table, tf.constant(keys, tf.int64))
        with new_session() as sess:
            return sess.run(emb)


def test_truncated_normal_seeded_reproducible(initialized):
    keys = np.arange(200, dtype=np.int64) * 7919
    first = _truncated_values(5, keys)
    second = _truncated_values(5, keys[::-1].copy())[::-1]  # other insertion order
    np.testing.assert_array_equal(first, second)
    other_seed = _truncated_values(6, keys)
    assert not np.allclose(first, other_seed)
    # Every key gets its own values.
    assert len(np.unique(first[:, 0])) == len(keys)


def test_truncated_normal_within_two_stddev(initialized):
    keys = np.arange(500, dtype=np.int64)
    values = _truncated_values(1, keys, mean=0.3, stddev=0.1)
    assert np.all(np.abs(values - 0.3) <= 0.2 + 1e-6)
    # A truncated normal of stddev 0.1 has a standard deviation of about 0.088.
    assert 0.075 < values.std() < 0.1
    assert abs(values.mean() - 0.3) < 0.01
    scaled = _truncated_values(1, keys, mean=0.3, stddev=0.1, init_param=2.0)
    np.testing.assert_allclose(scaled, 2.0 * values, rtol=1e-6)


def test_default_seed_depends_on_table_name(initialized):
    keys = np.arange(50, dtype=np.int64)

    def values(name):
        with tf.Graph().as_default():
            table = _table(name=name, initializer=tf.compat.v1.random_normal_initializer())
            with new_session() as sess:
                return sess.run(sparse_lookup(table, tf.constant(keys)))

    np.testing.assert_array_equal(values("a"), values("a"))
    assert not np.allclose(values("a"), values("b"))


def test_random_uniform_range(initialized):
    table = _table(initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.25, seed=3))
    emb = sparse_lookup(table, tf.constant(np.arange(1000), tf.int64))
    with new_session() as sess:
        values = sess.run(emb)
    assert values.min() >= -0.5 and values.max() < 0.25
    assert values.min() < -0.45 and values.max() > 0.2


# ---------------------------------------------------------------------------
# sparse_lookup: training vs evaluation
# ---------------------------------------------------------------------------


def test_eval_lookup_of_unseen_keys_gives_zeros_and_does_not_insert(initialized):
    table = _table(initializer=_const(0.7))
    ids = tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64)
    emb = sparse_lookup(table, ids, is_train=False)
    with new_session() as sess:
        value, size = sess.run([emb, table.size()])
        assert size == 0
        np.testing.assert_array_equal(value, np.zeros([2, 3, DIM], np.float32))
        assert sess.run(table.size()) == 0


@pytest.mark.parametrize("default,expected", [
    (1.5, [1.5] * DIM),
    ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
    (np.float32(-2.0), [-2.0] * DIM),
])
def test_serving_default_value_for_unseen_keys(initialized, default, expected):
    table = _table(initializer=_const(0.7))
    train_ids = tf.constant([1, 2], tf.int64)
    eval_ids = tf.constant([[1, 9], [2, 10]], tf.int64)
    train = sparse_lookup(table, train_ids)
    evaluate = sparse_lookup(table, eval_ids, is_train=False, serving_default_value=default)
    with new_session() as sess:
        sess.run(train)
        value = sess.run(evaluate)
    expected = np.asarray(expected, np.float32)
    np.testing.assert_allclose(value[0, 0], np.full(DIM, 0.7, np.float32))
    np.testing.assert_allclose(value[1, 0], np.full(DIM, 0.7, np.float32))
    np.testing.assert_allclose(value[0, 1], expected)
    np.testing.assert_allclose(value[1, 1], expected)


def test_train_lookup_inserts_unique_keys_then_eval_reads_them(initialized):
    table = _table(initializer=tf.compat.v1.truncated_normal_initializer(seed=11))
    ids = tf.compat.v1.placeholder(tf.int64, [None, None])
    train = sparse_lookup(table, ids, is_train=True)
    evaluate = sparse_lookup(table, ids, is_train=False)
    batch1 = np.array([[1, 2, 2], [3, 1, 7]])
    batch2 = np.array([[7, 8, 9], [8, 8, 1]])
    with new_session() as sess:
        trained1 = sess.run(train, {ids: batch1})
        assert sess.run(table.size()) == 4
        np.testing.assert_array_equal(sess.run(evaluate, {ids: batch1}), trained1)
        # The same key reads the same row wherever it occurs.
        np.testing.assert_array_equal(trained1[0, 0], trained1[1, 1])
        np.testing.assert_array_equal(trained1[0, 1], trained1[0, 2])
        assert not np.array_equal(trained1[0, 0], trained1[0, 1])
        trained2 = sess.run(train, {ids: batch2})
        assert sess.run(table.size()) == 6  # 8 and 9 are new
        np.testing.assert_array_equal(sess.run(evaluate, {ids: batch2}), trained2)
        np.testing.assert_array_equal(trained2[1, 2], trained1[0, 0])
        values, exists = sess.run(table.lookup(tf.constant([1, 2, 3, 7, 8, 9, 4], tf.int64)))
    assert exists.tolist() == [True] * 6 + [False]
    np.testing.assert_array_equal(values[0], trained1[0, 0])
    np.testing.assert_array_equal(values[6], np.zeros(DIM, np.float32))


def test_int32_ids_on_int64_table(initialized):
    table = _table(initializer=tf.compat.v1.random_normal_initializer(seed=1))
    emb32 = sparse_lookup(table, tf.constant([[5, 6]], tf.int32))
    emb64 = sparse_lookup(table, tf.constant([[5, 6]], tf.int64), is_train=False)
    with new_session() as sess:
        v32 = sess.run(emb32)
        v64 = sess.run(emb64)
        assert sess.run(table.size()) == 2
    np.testing.assert_array_equal(v32, v64)


def test_int64_ids_on_int32_table_rejected(initialized):
    table = _table(key_dtype=tf.int32)
    with pytest.raises(TypeError, match="int32"):
        sparse_lookup(table, tf.constant([1], tf.int64))
    with pytest.raises(TypeError):
        table.lookup(tf.constant([1], tf.int64))


def test_int32_table_roundtrip(initialized):
    table = _table(key_dtype=tf.int32, initializer=_const(1.0))
    emb = sparse_lookup(table, tf.constant([[-3, 2**31 - 1]], tf.int32))
    keys, values, _ = table.export()
    with new_session() as sess:
        sess.run(emb)
        k, v = sess.run([keys, values])
    assert k.dtype == np.int32
    assert sorted(k.tolist()) == [-3, 2**31 - 1]
    np.testing.assert_array_equal(v, np.ones([2, DIM], np.float32))


def test_static_shape_mode_needs_send_count():
    init(use_dynamic=False, use_dynamic_expansion=False)
    table = _table()
    ids = tf.constant([1, 2], tf.int64)
    with pytest.raises(ValueError, match="user_ids.*send_count"):
        sparse_lookup(table, ids, name="user_ids")
    with pytest.raises(ValueError, match="t_lookup.*send_count"):
        sparse_lookup(table, ids)
    with pytest.raises(ValueError, match="send_count"):
        sparse_lookup(table, ids, send_count=0)
    emb = sparse_lookup(table, ids, send_count=2)
    with new_session() as sess:
        assert sess.run(emb).shape == (2, DIM)


def test_lookup_argument_checks(initialized):
    table = _table()
    ids = tf.constant([1], tf.int64)
    with pytest.raises(TypeError, match="hash_table"):
        sparse_lookup("t", ids)
    with pytest.raises(TypeError, match="is_train"):
        sparse_lookup(table, ids, is_train=1)
    with pytest.raises(TypeError, match="SparseTensor"):
        sparse_lookup(table, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]))
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="another graph"):
            sparse_lookup(table, tf.constant([1], tf.int64))


@pytest.mark.parametrize("expansion", [False, True])
def test_collections_only_for_training_lookups(expansion):
    init(use_dynamic_expansion=expansion)
    table = _table(initializer=tf.compat.v1.random_normal_initializer(seed=3))
    ids = tf.constant([[1, 2, 1], [2, 2, 5]], tf.int64)
    sparse_lookup(table, ids, is_train=False, name="eval")
    assert tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB) == []
    assert tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET) == []
    sparse_lookup(table, ids, is_train=True, is_grad=False, name="frozen")
    assert tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB) == []
    assert tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET) == []
    emb = sparse_lookup(table, ids, is_train=True, name="train")
    local = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    assert len(local) == 1 and len(addresses) == 1
    assert addresses[0].dtype == tf.int64
    assert local[0].dtype == tf.float32
    assert local[0].shape.rank == 2 and local[0].shape[1] == DIM
    assert addresses[0].shape.rank == 1
    with new_session() as sess:
        e, l, a = sess.run([emb, local[0], addresses[0]])
    # One row per address (the ids' keys, deduplicated or not), every id's embedding among them.
    assert l.shape == (len(a), DIM)
    assert -1 not in a
    assert len(set(a.tolist())) == 3  # keys 1, 2 and 5
    by_address = {}
    for address, row in zip(a.tolist(), l):
        if address in by_address:
            np.testing.assert_array_equal(by_address[address], row)
        by_address[address] = row
    flat = e.reshape(-1, DIM)
    for row in flat:
        assert any(np.array_equal(row, r) for r in by_address.values())
    assert len({tuple(r) for r in flat}) == 3


def test_is_grad_false_stops_gradient(initialized):
    table = _table()
    emb = sparse_lookup(table, tf.constant([1], tf.int64), is_grad=False)
    assert tf.gradients(tf.reduce_sum(emb), table) == [None]
    emb2 = sparse_lookup(table, tf.constant([1], tf.int64))
    grad = tf.gradients(tf.reduce_sum(emb2), table)[0]
    assert isinstance(grad, tf.IndexedSlices)


# ---------------------------------------------------------------------------
# Capacity: fixed tables fill up, dynamic-expansion tables grow
# ---------------------------------------------------------------------------


def test_fixed_capacity_table_full():
    init(use_dynamic_expansion=False)
    table = create_table(tf.int64, DIM, "small_table", _const(), device_vocabulary_size=10)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    with new_session() as sess:
        assert sess.run(table.capacity()) == 10
        sess.run(emb, {ids: np.arange(10)})
        assert sess.run(table.size()) == 10
        # Keys already stored still work on a full table.
        sess.run(emb, {ids: np.arange(10)[::-1]})
        with pytest.raises(tf.errors.ResourceExhaustedError, match=r"small_table.*\b10\b"):
            sess.run(emb, {ids: np.arange(5, 16)})
        assert sess.run(table.size()) == 10
        # Eval lookups of new keys on a full table are fine.
        evaluate = sparse_lookup(table, ids, is_train=False)
        assert not sess.run(evaluate, {ids: [100]}).any()


def test_fixed_capacity_counts_host_and_ssd():
    init(use_dynamic_expansion=False)
    table = create_table(tf.int64, DIM, "t", _const(), device_vocabulary_size=3,
                         host_vocabulary_size=4, ssd_vocabulary_size=5)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    with new_session() as sess:
        assert sess.run(table.capacity()) == 12
        sess.run(emb, {ids: np.arange(12)})
        with pytest.raises(tf.errors.ResourceExhaustedError, match="'t'.*12"):
            sess.run(emb, {ids: [99]})


def test_fixed_capacity_single_batch_of_eleven_keys():
    init(use_dynamic_expansion=False)
    table = create_table(tf.int64, DIM, "ten", _const(), device_vocabulary_size=10)
    emb = sparse_lookup(table, tf.constant(np.arange(11), tf.int64))
    with new_session() as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError, match=r"ten.*\b10\b"):
            sess.run(emb)


def test_dynamic_expansion_grows():
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, 8, "grow", tf.compat.v1.truncated_normal_initializer(seed=2),
                         device_vocabulary_size=16)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    evaluate = sparse_lookup(table, ids, is_train=False)
    total, batch = 100_000, 20_000
    keys = np.unique(np.random.RandomState(0).randint(-2**62, 2**62, total + 1000,
                                                      dtype=np.int64))[:total]
    np.random.RandomState(1).shuffle(keys)
    assert len(keys) == total
    with new_session() as sess:
        assert sess.run(table.capacity()) >= 16
        first = sess.run(emb, {ids: keys[:batch]})
        for start in range(batch, total, batch):
            sess.run(emb, {ids: keys[start:start + batch]})
        size, capacity = sess.run([table.size(), table.capacity()])
        assert size == total
        assert capacity >= total
        np.testing.assert_array_equal(sess.run(evaluate, {ids: keys[:batch]}), first)
        last = sess.run(evaluate, {ids: keys[-5:]})
        assert np.abs(last).sum() > 0


# ---------------------------------------------------------------------------
# Table methods
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("expansion", [False, True])
def test_upsert_lookup_remove_clear(expansion):
    init(use_dynamic_expansion=expansion)
    table = _table(initializer=_const(0.5))
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    upsert = table.upsert(keys, values)
    looked_up = table.lookup(keys)
    looked_up_init = table.lookup(keys, init_missing=True)
    removed = table.remove(keys)
    rows = np.arange(12, dtype=np.float32).reshape(3, DIM)
    with new_session() as sess:
        sess.run(upsert, {keys: [10, 20, 30], values: rows})
        assert sess.run(table.size()) == 3
        v, e = sess.run(looked_up, {keys: [30, 10, 20, 40]})
        np.testing.assert_array_equal(v[:3], rows[[2, 0, 1]])
        np.testing.assert_array_equal(v[3], np.zeros(DIM))
        assert e.tolist() == [True, True, True, False]
        v, e = sess.run(looked_up_init, {keys: [40, 10]})
        np.testing.assert_array_equal(v[0], np.full(DIM, 0.5))
        np.testing.assert_array_equal(v[1], rows[0])
        assert e.tolist() == [False, True]
        assert sess.run(table.size()) == 3  # init_missing does not insert
        # Overwrite: the last value wins.
        sess.run(upsert, {keys: [20], values: -rows[:1]})
        np.testing.assert_array_equal(sess.run(looked_up, {keys: [20]})[0][0], -rows[0])
        assert sess.run(removed, {keys: [10, 10, 99]}) == 1
        assert sess.run(table.size()) == 2
        v, e = sess.run(looked_up, {keys: [10, 20]})
        assert e.tolist() == [False, True]
        np.testing.assert_array_equal(v[0], np.zeros(DIM))
        sess.run(table.clear())
        assert sess.run(table.size()) == 0
        assert not sess.run(looked_up, {keys: [20, 30]})[1].any()
        # The table is usable after clear.
        sess.run(upsert, {keys: [5], values: rows[:1]})
        np.testing.assert_array_equal(sess.run(looked_up, {keys: [5]})[0][0], rows[0])


def test_removed_key_reinserted_starts_from_initializer(initialized):
    table = _table(initializer=tf.compat.v1.truncated_normal_initializer(seed=4))
    ids = tf.constant([1, 2, 3], tf.int64)
    emb = sparse_lookup(table, ids)
    with new_session() as sess:
        initial = sess.run(emb)
        sess.run(table.upsert(tf.constant([2], tf.int64), tf.ones([1, DIM])))
        assert sess.run(table.remove(tf.constant([2], tf.int64))) == 1
        again = sess.run(emb)
    np.testing.assert_array_equal(again, initial)


def test_upsert_wrong_shape_names_table(initialized):
    table = _table(name="shaped")
    op = table.upsert(tf.constant([1, 2], tf.int64), tf.zeros([2, DIM + 1]))
    with new_session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="shaped"):
            sess.run(op)


def test_upsert_into_full_table(initialized):
    table = _table(name="tiny", device_vocabulary_size=2)
    op = table.upsert(tf.constant([1, 2, 3], tf.int64), tf.zeros([3, DIM]))
    with new_session() as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError, match="tiny"):
            sess.run(op)


def test_export_import_roundtrip_without_slots(initialized):
    table = _table(initializer=tf.compat.v1.random_normal_initializer(seed=9))
    emb = sparse_lookup(table, tf.constant([4, 8, 15, 16, 23, 42], tf.int64))
    export = table.export()
    with new_session() as sess:
        sess.run(emb)
        keys, values, slots = sess.run(export)
    assert keys.shape == (6,) and values.shape == (6, DIM) and slots.shape == (0, 6, DIM)
    assert sorted(keys.tolist()) == [4, 8, 15, 16, 23, 42]
    with tf.Graph().as_default():
        fresh = _table(initializer=_const(0.0))
        load = fresh.import_rows(keys, values)
        looked_up = fresh.lookup(tf.constant(keys))
        with new_session() as sess:
            sess.run(load)
            assert sess.run(fresh.size()) == 6
            got, exists = sess.run(looked_up)
    assert exists.all()
    np.testing.assert_array_equal(got, values)


def test_import_replaces_contents(initialized):
    table = _table()
    ids = tf.constant([1, 2, 3], tf.int64)
    emb = sparse_lookup(table, ids)
    load = table.import_rows(tf.constant([7], tf.int64), tf.fill([1, DIM], 3.0))
    with new_session() as sess:
        sess.run(emb)
        sess.run(load)
        assert sess.run(table.size()) == 1
        values, exists = sess.run(table.lookup(tf.constant([1, 7], tf.int64)))
    assert exists.tolist() == [False, True]
    np.testing.assert_array_equal(values[1], np.full(DIM, 3.0))


def _train_and_export(opt_module, make_optimizer, steps):
    """Trains table 't' for `steps` steps; returns (graph pieces, session)."""
    table = _table(initializer=tf.compat.v1.truncated_normal_initializer(seed=21))
    ids = tf.constant([[1, 2, 3], [3, 4, 1]], tf.int64)
    emb = sparse_lookup(table, ids)
    target = tf.constant(np.linspace(-1, 1, 2 * 3 * DIM).reshape(2, 3, DIM), tf.float32)
    loss = tf.reduce_sum(tf.square(emb - target))
    opt = make_optimizer(opt_module)
    train = opt.minimize(loss)
    return table, train


@pytest.mark.parametrize("opt_module,make_optimizer,num_slots", [
    (lazy_adam, lambda m: m.create_hash_optimizer(learning_rate=0.05), 2),
    (adagrad, lambda m: m.create_hash_optimizer(learning_rate=0.1,
                                                initial_accumulator_value=0.2), 1),
])
def test_export_import_roundtrip_with_slots(initialized, opt_module, make_optimizer, num_slots):
    table, train = _train_and_export(opt_module, make_optimizer, steps=3)
    export = table.export()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        keys, values, slots = sorted_export(*sess.run(export))
    assert slots.shape == (num_slots, 4, DIM)
    assert np.abs(slots).min() > 0  # every stored row was trained
    with tf.Graph().as_default():
        fresh = _table(initializer=_const(0.0))
        load = fresh.import_rows(keys, values, slots)
        export2 = fresh.export()
        with new_session() as sess:
            sess.run(load)
            got = sorted_export(*sess.run(export2))
    for a, b in zip(got, (keys, values, slots)):
        np.testing.assert_array_equal(a, b)


def test_imported_slots_drive_further_training(initialized):
    """Training continued after export/import in a fresh session matches training continued in
    the original session (the optimizer uses the imported slots, not fresh ones)."""
    make = lambda m: m.create_hash_optimizer(learning_rate=0.1,  # noqa: E731
                                             initial_accumulator_value=0.2)
    table, train = _train_and_export(adagrad, make, steps=3)
    export = table.export()
    with new_session() as sess:
        for _ in range(3):
            sess.run(train)
        saved = sess.run(export)
        for _ in range(2):
            sess.run(train)
        expected = sorted_export(*sess.run(export))
    with tf.Graph().as_default():
        fresh, train2 = _train_and_export(adagrad, make, steps=0)
        load = fresh.import_rows(*saved)
        export2 = fresh.export()
        with new_session() as sess:
            sess.run(load)
            for _ in range(2):
                sess.run(train2)
            got = sorted_export(*sess.run(export2))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_import_wrong_shape_names_table(initialized):
    table = _table(name="imported")
    bad_values = table.import_rows(tf.constant([1, 2], tf.int64), tf.zeros([2, DIM + 1]))
    bad_count = table.import_rows(tf.constant([1, 2], tf.int64), tf.zeros([3, DIM]))
    bad_slots = table.import_rows(tf.constant([1, 2], tf.int64), tf.zeros([2, DIM]),
                                  tf.zeros([1, 3, DIM]))
    bad_keys = table.import_rows(tf.constant([[1, 2]], tf.int64), tf.zeros([1, 2, DIM]))
    with new_session() as sess:
        for op in (bad_values, bad_count, bad_slots, bad_keys):
            with pytest.raises(tf.errors.InvalidArgumentError, match="imported"):
                sess.run(op)
        assert sess.run(table.size()) == 0


def test_import_too_many_rows_into_fixed_table(initialized):
    table = _table(name="small", device_vocabulary_size=2)
    op = table.import_rows(tf.constant([1, 2, 3], tf.int64), tf.zeros([3, DIM]))
    with new_session() as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError, match="small"):
            sess.run(op)


def test_tables_are_per_session(initialized):
    table = _table(initializer=_const(1.0))
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    with new_session() as first:
        first.run(emb)
        assert first.run(table.size()) == 2
        with new_session() as second:
            assert second.run(table.size()) == 0


@pytest.mark.parametrize("make_initializer,low,high", [
    (lambda: tf.compat.v1.random_uniform_initializer(seed=3), 0.0, 1.0),
    (lambda: tf.compat.v1.random_uniform_initializer(minval=-2.0, seed=3), -2.0, 1.0),
    (lambda: tf.random_uniform_initializer(seed=3), -0.05, 0.05),
    (lambda: tf.keras.initializers.RandomUniform(seed=3), -0.05, 0.05),
], ids=["v1_default_maxval", "v1_minval_only", "v2_default", "keras_default"])
def test_random_uniform_default_bounds(initialized, make_initializer, low, high):
    """Initializers with their default bounds work as in TensorFlow: tf.compat.v1's
    random_uniform_initializer has maxval=None, which TensorFlow reads as 1.0 for floats."""
    table = _table(initializer=make_initializer())
    emb = sparse_lookup(table, tf.constant(np.arange(500), tf.int64))
    with new_session() as sess:
        values = sess.run(emb)
    width = high - low
    assert values.min() >= low and values.max() < high
    assert values.min() < low + 0.05 * width and values.max() > high - 0.05 * width


@pytest.mark.parametrize("make_initializer,mean,stddev", [
    (lambda: tf.compat.v1.truncated_normal_initializer(seed=1), 0.0, 1.0),
    (lambda: tf.keras.initializers.TruncatedNormal(mean=1.0, stddev=0.2, seed=1), 1.0, 0.2),
    (lambda: tf.random_normal_initializer(mean=-1.0, stddev=0.5, seed=1), -1.0, 0.5),
    (lambda: tf.keras.initializers.RandomNormal(seed=1), 0.0, 0.05),
])
def test_normal_initializer_parameters(initialized, make_initializer, mean, stddev):
    table = _table(dim=16, initializer=make_initializer())
    emb = sparse_lookup(table, tf.constant(np.arange(500), tf.int64))
    with new_session() as sess:
        values = sess.run(emb)
    assert abs(values.mean() - mean) < 0.05 * stddev + 1e-3
    assert 0.8 * stddev < values.std() < 1.1 * stddev


def test_lookup_init_missing_matches_inserted_values(initialized):
    table = _table(initializer=tf.compat.v1.truncated_normal_initializer(seed=8), init_param=3.0)
    keys = tf.constant([5, -1, 2**40], tf.int64)
    before = table.lookup(keys, init_missing=True)
    emb = sparse_lookup(table, keys)
    with new_session() as sess:
        values, exists = sess.run(before)
        assert not exists.any()
        np.testing.assert_array_equal(sess.run(emb), values)


def test_upsert_duplicate_keys_last_value_wins(initialized):
    table = _table()
    rows = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM)
    op = table.upsert(tf.constant([7, 8, 7, 7], tf.int64), rows)
    with new_session() as sess:
        sess.run(op)
        assert sess.run(table.size()) == 2
        values, _ = sess.run(table.lookup(tf.constant([7, 8], tf.int64)))
    np.testing.assert_array_equal(values, rows[[3, 1]])


def test_fixed_capacity_reuses_removed_rows(initialized):
    table = _table(name="reuse", device_vocabulary_size=4)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    remove = table.remove(ids)
    with new_session() as sess:
        sess.run(emb, {ids: [1, 2, 3, 4]})
        assert sess.run(remove, {ids: [2, 3]}) == 2
        sess.run(emb, {ids: [5, 6]})  # the two free rows
        assert sess.run(table.size()) == 4
        with pytest.raises(tf.errors.ResourceExhaustedError, match="reuse"):
            sess.run(emb, {ids: [7]})
        sess.run(table.clear())
        sess.run(emb, {ids: [10, 11, 12, 13]})
        assert sess.run(table.size()) == 4


@pytest.mark.parametrize("expansion", [False, True])
def test_random_operations_match_a_dict(expansion):
    """Many interleaved upserts, removes and lookups over a small key range (lots of hash
    collisions, deletions inside probe runs) agree with a Python dict."""
    init(use_dynamic_expansion=expansion)
    table = _table(dim=2, device_vocabulary_size=4000 if not expansion else 16)
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, 2])
    upsert = table.upsert(keys, values)
    remove = table.remove(keys)
    looked_up = table.lookup(keys)
    rng = np.random.RandomState(5)
    universe = np.concatenate([np.arange(3000), rng.randint(-2**62, 2**62, 500, dtype=np.int64)])
    reference = {}
    with new_session() as sess:
        for round_ in range(30):
            batch = rng.choice(universe, 300, replace=False)
            if rng.rand() < 0.6:
                vals = rng.normal(size=(len(batch), 2)).astype(np.float32)
                sess.run(upsert, {keys: batch, values: vals})
                reference.update(zip(batch.tolist(), vals))
            else:
                removed = sess.run(remove, {keys: batch})
                assert removed == sum(1 for k in batch.tolist() if k in reference)
                for k in batch.tolist():
                    reference.pop(k, None)
            assert sess.run(table.size()) == len(reference)
        got, exists = sess.run(looked_up, {keys: universe})
        exported_keys, exported_values, _ = sess.run(table.export())
    for i, k in enumerate(universe.tolist()):
        assert exists[i] == (k in reference), k
        if k in reference:
            np.testing.assert_array_equal(got[i], reference[k])
    assert sorted(exported_keys.tolist()) == sorted(reference)
    for k, v in zip(exported_keys.tolist(), exported_values):
        np.testing.assert_array_equal(v, reference[k])


@pytest.mark.parametrize("expansion", [False, True])
def test_imported_slots_then_new_keys(expansion):
    """After restoring a trained table (values and slots) into a fresh session, training
    continues exactly as it would have in the original session, also for keys first seen after
    the restore: their slots start from the optimizer's initial values."""
    init(use_dynamic_expansion=expansion)
    if expansion:
        from rec_sdk.optimizers import adagrad_by_addr
        make = lambda: adagrad_by_addr.create_hash_optimizer_by_address(  # noqa: E731
            learning_rate=0.1, initial_accumulator_value=0.5)
    else:
        make = lambda: adagrad.create_hash_optimizer(  # noqa: E731
            learning_rate=0.1, initial_accumulator_value=0.5)

    def build():
        table = _table(initializer=tf.compat.v1.truncated_normal_initializer(seed=21))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = sparse_lookup(table, ids)
        loss = tf.reduce_sum(tf.square(emb - 1.0))
        return table, ids, make().minimize(loss)

    old_batch, new_batch = [1, 2, 3], [2, 3, 4, 5]  # 4 and 5 are new after the restore
    table, ids, train = build()
    with new_session() as sess:
        sess.run(train, {ids: old_batch})
        saved = sess.run(table.export())
        sess.run(train, {ids: new_batch})
        expected = sorted_export(*sess.run(table.export()))
    with tf.Graph().as_default():
        fresh, ids2, train2 = build()
        load = fresh.import_rows(*saved)
        with new_session() as sess:
            sess.run(load)
            sess.run(train2, {ids2: new_batch})
            got = sorted_export(*sess.run(fresh.export()))
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-6, err_msg="slots")
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, err_msg="values")


def test_table_methods_accept_any_key_shape(initialized):
    table = _table(initializer=_const(0.5))
    keys = tf.constant([[1, 2], [3, 1]], tf.int64)
    values = tf.reshape(tf.range(16, dtype=tf.float32), [2, 2, DIM])
    looked_up = table.lookup(keys)
    with new_session() as sess:
        sess.run(table.upsert(keys[:1], values[:1]))
        v, e = sess.run(looked_up)
        assert v.shape == (2, 2, DIM) and e.shape == (2, 2)
        assert e.tolist() == [[True, True], [False, True]]
        np.testing.assert_array_equal(v[1, 1], v[0, 0])
        np.testing.assert_array_equal(v[1, 0], np.zeros(DIM))
        assert sess.run(table.remove(keys)) == 2
        assert sess.run(table.size()) == 0


def test_lookups_per_table_limited(initialized):
    table = _table()
    ids = tf.constant([1], tf.int64)
    for _ in range(128):
        sparse_lookup(table, ids, is_train=False)
    with pytest.raises(ValueError, match="128"):
        sparse_lookup(table, ids, is_train=False)


def test_static_shape_lookup_rejects_more_distinct_keys_than_send_count():
    init(use_dynamic=False)
    table = create_table(tf.int64, 4, "static_t", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=100)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, send_count=3, name="static_lookup")
    with tf.compat.v1.Session() as sess:
        assert sess.run(emb, {ids: [1, 2, 3, 3, 1]}).shape == (5, 4)
        with pytest.raises(tf.errors.InvalidArgumentError, match="static_lookup.*send_count=3"):
            sess.run(emb, {ids: np.arange(4)})



def test_static_shape_lookup_addresses_are_known_unique():
    from rec_sdk.ops import table_ops
    init(use_dynamic=False)
    table = create_table(tf.int64, 4, "static_u", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=100)
    sparse_lookup(table, tf.constant([1, 1, 2], tf.int64), send_count=8)
    addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)[0]
    assert table_ops.addresses_are_unique(addresses)


def test_malformed_op_inputs_are_errors_not_crashes():
    from rec_sdk.ops.loader import load_ops
    init()
    table = create_table(tf.int64, 4, "malformed", tf.compat.v1.zeros_initializer())
    ops = load_ops()
    with tf.compat.v1.Session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="malformed"):
            sess.run(ops.rec_sdk_table_export(table.handle, key_dtype=tf.int32, dim=4))
        with pytest.raises(tf.errors.InvalidArgumentError, match="malformed"):
            sess.run(ops.rec_sdk_table_export(table.handle, key_dtype=tf.int64, dim=7))
        with pytest.raises(tf.errors.InvalidArgumentError, match="columns"):
            sess.run(ops.rec_sdk_sum_rows_by_index(tf.zeros([2, 0]), tf.constant([0, 0]), 1))
        with pytest.raises(tf.errors.InvalidArgumentError, match="not in"):
            sess.run(ops.rec_sdk_sum_rows_by_index(tf.ones([2, 3]), tf.constant([0, 5]), 2))


def test_concurrent_session_runs_share_a_table_safely():
    """Several Python threads train and look up through one session at once (the table's batch
    operations run concurrently): no errors, every key stored once, eval reads trained rows."""
    import threading

    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, 8, "concurrent", tf.compat.v1.random_normal_initializer(seed=3),
                         device_vocabulary_size=64)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, is_train=True)
    loss = tf.reduce_sum(tf.square(emb))
    grads = tf.gradients(loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB))
    from rec_sdk.optimizers import lazy_adam_by_addr
    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
        zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)))
    eval_emb = sparse_lookup(table, ids, is_train=False, name="concurrent_eval")
    errors = []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())

        def worker(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    sess.run(train, {ids: rng.integers(0, 5000, size=512)})
                    sess.run(eval_emb, {ids: rng.integers(0, 5000, size=256)})
            except Exception as e:  # collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        keys, values, slots = sess.run(table.export())
        assert len(np.unique(keys)) == len(keys) == sess.run(table.size())
        assert slots.shape == (2, len(keys), 8)
        # Eval lookups of stored keys read exactly the stored rows.
        probe = keys[:100]
        np.testing.assert_array_equal(sess.run(eval_emb, {ids: probe}), values[:100])


def test_second_handle_with_another_configuration_is_an_error():
    """Two handle ops of one table name in a session must describe the same table; each
    differing field is named with both values."""
    spec = describe_initializer(tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3),
                                "t")
    first = table_ops.create_table("t", tf.int64, 4, False, capacity=10, initializer=spec)
    same = table_ops.create_table("t", tf.int64, 4, False, capacity=10, initializer=spec)
    other_spec = dict(spec, seed=4)
    other = table_ops.create_table("t", tf.int64, 4, False, capacity=20,
                                   initializer=other_spec)
    with new_session() as sess:
        sess.run([first, same])
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="table 't' already exists with another configuration "
                                 "\\(existing vs asked for\\): capacity: 10 vs 20; "
                                 "initializer seed: 3 vs 4\n"):
            sess.run(other)


def test_admission_settings_are_set_once_and_another_setting_is_an_error():
    """Thresholds reach the table through its configure op (an attribute set when the op is
    built): the first run sets them, running it again keeps a threshold changed at run time,
    and a configure op with other thresholds fails naming each one with both values."""
    spec = describe_initializer(tf.compat.v1.zeros_initializer(), "t")
    handle = table_ops.create_table("t", tf.int64, 4, True, capacity=0, initializer=spec)
    configured = table_ops.configure_admission(handle, 2, 60)
    other = table_ops.configure_admission(handle, 3, -1)
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    find = table_ops.find_or_insert(configured, keys, True, times=tf.constant([5], tf.int64))
    lower = table_ops.set_access_threshold(configured, 1)
    with new_session() as sess:
        assert (sess.run(find, {keys: [7]}) == -1).all()  # count 1 < 2: not admitted
        sess.run(lower)
        sess.run(configured)  # the same settings again: the threshold stays 1
        assert (sess.run(find, {keys: [8]}) >= 0).all()
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="table 't' already has other admission settings \\(existing "
                                 "vs asked for\\): access_threshold: 2 vs 3; "
                                 "eviction_threshold: 60 vs -1; every lookup"):
            sess.run(other)
