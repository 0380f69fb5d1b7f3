"""Tests for rec_sdk.core.embedding: create_table's validation, sparse_lookup's shapes,
initial values, eval/train behaviour and collections, fixed capacity and dynamic expansion.
The table methods are tested in test_table_methods.py."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import const_initializer as _const
from helpers import make_table as _table
from helpers import new_session
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.util.initialize import init

DIM = 4  # make_table's default


# ---------------------------------------------------------------------------
# create_table validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("key_dtype", [tf.float32, tf.string, tf.int16, tf.uint64, "float64"])
def test_key_dtype_rejected(initialized, key_dtype):
    with pytest.raises(ValueError, match="key_dtype"):
        _table(key_dtype=key_dtype)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, "int64"])
def test_key_dtype_accepted(initialized, key_dtype):
    table = _table(key_dtype=key_dtype)
    assert table.key_dtype == tf.as_dtype(key_dtype)


@pytest.mark.parametrize(
    "dim",
    [
        0,
        -1,
        8193,
        tf.TensorShape([2, 3]),
        tf.TensorShape([None]),
        tf.TensorShape([0]),
        "a",
        4.0,
        True,
    ],
)
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


@pytest.mark.parametrize("name", ["a", "a" * 100, "user_table.v2", "T9", "9", ".x", "_user", "_"])
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


@pytest.mark.parametrize(
    "param", ["device_vocabulary_size", "host_vocabulary_size", "ssd_vocabulary_size"]
)
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


# (Variance scaling, e.g. Glorot, is supported for fixed-capacity tables: test_sdk_programs.)
@pytest.mark.parametrize(
    "make_initializer",
    [
        lambda: tf.compat.v1.constant_initializer([1.0, 2.0, 3.0]),
        lambda: tf.compat.v1.orthogonal_initializer(),
        lambda: "zeros",
        lambda: None,
    ],
    ids=["constant_array", "orthogonal", "string", "none"],
)
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


@pytest.mark.parametrize(
    "placeholder_shape,fed_shape",
    [
        (None, [3]),
        (None, [2, 3]),
        (None, [2, 2, 2]),
        ([None], [7]),
        ([None, None], [3, 2]),
        ([2, None, 3], [2, 1, 3]),
    ],
)
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
        table = _table(
            name=name,
            dim=dim,
            init_param=init_param,
            initializer=tf.compat.v1.truncated_normal_initializer(
                mean=mean, stddev=stddev, seed=seed
            ),
        )
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
        value, size = sess.run([emb, table.size_tensor()])
        assert size == 0
        np.testing.assert_array_equal(value, np.zeros([2, 3, DIM], np.float32))
        assert sess.run(table.size_tensor()) == 0


@pytest.mark.parametrize(
    "default,expected",
    [
        (1.5, [1.5] * DIM),
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
        (np.float32(-2.0), [-2.0] * DIM),
    ],
)
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
        assert sess.run(table.size_tensor()) == 4
        np.testing.assert_array_equal(sess.run(evaluate, {ids: batch1}), trained1)
        # The same key reads the same row wherever it occurs.
        np.testing.assert_array_equal(trained1[0, 0], trained1[1, 1])
        np.testing.assert_array_equal(trained1[0, 1], trained1[0, 2])
        assert not np.array_equal(trained1[0, 0], trained1[0, 1])
        trained2 = sess.run(train, {ids: batch2})
        assert sess.run(table.size_tensor()) == 6  # 8 and 9 are new
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
        assert sess.run(table.size_tensor()) == 2
    np.testing.assert_array_equal(v32, v64)


# int64 ids on an int32 table are cast with a range check: test_sdk_programs.


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


def test_sparse_and_ragged_ids_are_refused_naming_the_lookup(initialized):
    table = _table()
    ragged = tf.ragged.constant([[1, 2], [3]], tf.int64)
    with pytest.raises(TypeError, match="user_ids.*ids must be a dense.*RaggedTensor"):
        sparse_lookup(table, ragged, name="user_ids")
    with pytest.raises(TypeError, match="ids must be a dense.*SparseTensor"):
        sparse_lookup(table, ragged.to_sparse())


def _runs_after(op, before):
    """Whether `before` is among the ops `op` waits for (data and control inputs)."""
    seen, todo = set(), [op]
    while todo:
        x = todo.pop()
        if x is before:
            return True
        if x.name not in seen:
            seen.add(x.name)
            todo.extend(t.op for t in x.inputs)
            todo.extend(x.control_inputs)
    return False


def test_training_lookups_of_a_table_run_in_the_order_they_were_built(initialized):
    """TensorFlow runs independent ops in any order; the order of two training lookups of one
    table shows in what the table keeps (a full table, admission, clocks), so each runs after
    the previous one of the graph. Evaluation lookups and other tables stay independent."""
    table, other = _table(), _table("other")
    ids = tf.constant([1, 2], tf.int64)
    first = sparse_lookup(table, ids, name="first")
    sparse_lookup(other, ids, name="another_table")
    sparse_lookup(table, ids, is_train=False, name="evaluation")
    second = sparse_lookup(table, ids, name="second")
    graph = tf.compat.v1.get_default_graph()
    finds = {
        op.name.split("/")[0]: op
        for op in graph.get_operations()
        if op.type.endswith("FindOrInsertRows")
    }
    assert sorted(finds) == ["another_table", "evaluation", "first", "second"], finds
    assert _runs_after(finds["second"], finds["first"])
    for name in ("another_table", "evaluation"):
        assert not _runs_after(finds[name], finds["first"]), name
        assert not _runs_after(finds["second"], finds[name]), name
    with new_session() as sess:
        a, b = sess.run([first, second])
    np.testing.assert_array_equal(a, b)


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
        e, ln, a = sess.run([emb, local[0], addresses[0]])
    # One row per address (the ids' keys, deduplicated or not), every id's embedding among them.
    assert ln.shape == (len(a), DIM)
    assert -1 not in a
    assert len(set(a.tolist())) == 3  # keys 1, 2 and 5
    by_address = {}
    for address, row in zip(a.tolist(), ln):
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
        assert sess.run(table.capacity_tensor()) == 10
        sess.run(emb, {ids: np.arange(10)})
        assert sess.run(table.size_tensor()) == 10
        # Keys already stored still work on a full table.
        sess.run(emb, {ids: np.arange(10)[::-1]})
        with pytest.raises(tf.errors.ResourceExhaustedError, match=r"small_table.*\b10\b"):
            sess.run(emb, {ids: np.arange(5, 16)})
        assert sess.run(table.size_tensor()) == 10
        # Eval lookups of new keys on a full table are fine.
        evaluate = sparse_lookup(table, ids, is_train=False)
        assert not sess.run(evaluate, {ids: [100]}).any()


def test_fixed_capacity_counts_host_and_ssd(tmp_path):
    """device + host rows in memory, ssd rows on SSD: 12 keys in all, batches of at most 7."""
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        DIM,
        "t",
        _const(),
        device_vocabulary_size=3,
        host_vocabulary_size=4,
        ssd_vocabulary_size=5,
        ssd_data_path=str(tmp_path),
    )
    other = create_table(
        tf.int64,
        DIM,
        "u",
        _const(),
        device_vocabulary_size=3,
        host_vocabulary_size=4,
        ssd_vocabulary_size=5,
        ssd_data_path=str(tmp_path),
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    other_emb = sparse_lookup(other, ids)
    with new_session() as sess:
        with pytest.raises(
            tf.errors.ResourceExhaustedError,
            match=r"'u': a batch holds more keys than the table keeps in memory "
            r"\(7 rows",
        ):
            sess.run(other_emb, {ids: np.arange(8)})
        assert sess.run(table.capacity_tensor()) == 12
        sess.run(emb, {ids: np.arange(6)})
        sess.run(emb, {ids: np.arange(6, 12)})
        stats = sess.run(table.stats())
        assert (stats["size"], stats["hot"], stats["cold"]) == (12, 7, 5)
        with pytest.raises(tf.errors.ResourceExhaustedError, match="'t'.*SSD capacity of 5"):
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
    table = create_table(
        tf.int64,
        8,
        "grow",
        tf.compat.v1.truncated_normal_initializer(seed=2),
        device_vocabulary_size=16,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids)
    evaluate = sparse_lookup(table, ids, is_train=False)
    total, batch = 100_000, 20_000
    keys = np.unique(
        np.random.RandomState(0).randint(-(2**62), 2**62, total + 1000, dtype=np.int64)
    )[:total]
    np.random.RandomState(1).shuffle(keys)
    assert len(keys) == total
    with new_session() as sess:
        assert sess.run(table.capacity_tensor()) >= 16
        first = sess.run(emb, {ids: keys[:batch]})
        for start in range(batch, total, batch):
            sess.run(emb, {ids: keys[start : start + batch]})
        size, capacity = sess.run([table.size_tensor(), table.capacity_tensor()])
        assert size == total
        assert capacity >= total
        np.testing.assert_array_equal(sess.run(evaluate, {ids: keys[:batch]}), first)
        last = sess.run(evaluate, {ids: keys[-5:]})
        assert np.abs(last).sum() > 0
