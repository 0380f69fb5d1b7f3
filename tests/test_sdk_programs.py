"""What the SDK's public model examples (WideDeep, DLRM, DCNv2 `main_mxrec.py`) rely on,
used the way they use it: ids of other dtypes cast where the pipeline inserts them, the
table's size() and capacity() as Python ints, CustomizedOptimizer subclasses, shape-dependent
initializers, and tables in a stock optimizer's compute_gradients. Each test fails without
its behaviour; numbers are checked against NumPy or an int64 / dense-variable twin."""

import math

import numpy as np
import pytest
import tensorflow as tf

from helpers import new_session, sorted_export
from rec_sdk.constants.constants import (
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
)
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
from rec_sdk.optimizers import gradient_descent
from rec_sdk.optimizers.base import CustomizedOptimizer
from rec_sdk.util.initialize import get_initializer, init, terminate_config_initializer
from rec_sdk.util.variable import get_dense_and_sparse_variable

DIM = 4
ROWS = 48


def _records(seed=0):
    """Ids as the examples read them from text: strings, parsed with tf.strings.to_number
    (float32 by default); and the same ids as int64."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, 30, (ROWS, 2)).astype(np.int64) * 1000 + 7
    labels = rng.randint(0, 2, ROWS).astype(np.float32)
    text = np.array([[str(v).encode() for v in row] for row in ids])
    return ids, text, labels


def _train_ids(mode, as_float, steps=6):
    """Trains one table with SGD on the records' ids, given as float32 (to_number) or int64,
    in `mode` ("tensor", "feature_spec" or "modify_graph"); returns the sorted export and
    the losses."""
    ids, text, labels = _records()
    init(use_dynamic=True)
    table = create_table(
        tf.int64,
        DIM,
        "ids_table",
        tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3),
        device_vocabulary_size=1000,
    )
    data = {"ids": text if as_float else ids, "label": labels}

    def parse(batch):
        value = batch["ids"]
        if as_float:
            value = tf.strings.to_number(value)  # float32, as in the examples
            assert value.dtype == tf.float32
        return {"ids": value, "label": batch["label"]}

    dataset = tf.data.Dataset.from_tensor_slices(data).batch(8).map(parse)
    if mode == "feature_spec":
        spec = FeatureSpec("ids", table_name="ids_table")
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=[spec], is_training=True))
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    lookup_ids = spec if mode == "feature_spec" else batch["ids"]
    emb = sparse_lookup(
        table,
        lookup_ids,
        None,
        is_train=True,
        name="ids_lookup",
        modify_graph=mode == "modify_graph",
        batch=batch,
    )
    logits = tf.reduce_sum(emb, axis=[1, 2])
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits)
    )
    train = gradient_descent.create_hash_optimizer(0.5).minimize(loss)
    if mode == "modify_graph":
        modify_graph_and_start_emb_cache()
    export = table.export()
    with new_session() as sess:
        sess.run(get_initializer(True) if mode == "modify_graph" else iterator.initializer)
        losses = [sess.run([train, loss])[1] for _ in range(steps)]
        return sorted_export(*sess.run(export)), losses


@pytest.mark.parametrize("mode", ["tensor", "feature_spec", "modify_graph"])
def test_float_ids_train_as_their_int64_values(mode):
    (keys, values, _), losses = _train_ids(mode, as_float=True)
    terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    (ref_keys, ref_values, _), ref_losses = _train_ids(mode, as_float=False)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert set(keys.tolist()) == set(_records()[0].ravel().tolist())


@pytest.mark.parametrize("bad,shown", [(2.5, "2.5"), (3e19, "3e+19"), (float("nan"), "nan")])
@pytest.mark.parametrize("mode", ["tensor", "feature_spec"])
def test_float_ids_that_are_not_keys_fail_naming_the_lookup_and_value(mode, bad, shown):
    init(use_dynamic=True)
    table = create_table(tf.int64, DIM, "t", 0.0, device_vocabulary_size=100)
    values = np.array([[1.0, bad], [3.0, 4.0]], np.float32)
    if mode == "tensor":
        emb = sparse_lookup(table, tf.constant(values), None, is_train=True, name="clicks")
        where = "ids of sparse_lookup clicks of table t"
        run = emb
    else:
        spec = FeatureSpec("clicks", table_name="t")
        dataset = (
            tf.data.Dataset.from_tensor_slices({"clicks": values})
            .batch(2)
            .map(get_asc_insert_func(tgt_key_specs=[spec], is_training=True))
        )
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        run = sparse_lookup(
            table, spec, None, is_train=True, name="clicks", batch=iterator.get_next()
        )
        where = "ids of FeatureSpec %s (table t)" % spec.name
    with new_session() as sess:
        if mode != "tensor":
            sess.run(iterator.initializer)
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            sess.run(run)
    message = str(error.value)
    assert where in message and "float32" in message and shown in message, message
    assert "whole numbers in [-9223372036854775808, 9223372036854775807]" in message


def test_ids_that_are_not_numbers_are_refused_at_construction():
    init(use_dynamic=True)
    table = create_table(tf.int64, DIM, "t", 0.0, device_vocabulary_size=100)
    with pytest.raises(
        TypeError, match="ids of sparse_lookup 'names' of table 't' must be integer .* got string"
    ):
        sparse_lookup(table, tf.constant(["a"]), None, name="names")


def test_int64_ids_into_an_int32_table_are_range_checked():
    init(use_dynamic=True)
    table = create_table(tf.int32, DIM, "t32", 0.0, device_vocabulary_size=100)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, None, is_train=True, name="wide")
    with new_session() as sess:
        assert sess.run(emb, {ids: [1, 2]}).shape == (2, DIM)
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match="in \\[-2147483648, 2147483647\\]; got.*4294967296",
        ):
            sess.run(emb, {ids: [1, 2**32]})


# ---------------------------------------------------------------------------
# table.size() and table.capacity(): Python ints, as the SDK's
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("expansion", [False, True])
def test_size_and_capacity_are_ints_and_do_not_grow_the_graph(expansion):
    init(use_dynamic=True, use_dynamic_expansion=expansion)
    table = create_table(tf.int64, DIM, "logged", 0.0, device_vocabulary_size=64)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, None, is_train=True, name="logged_lookup")
    assert table.size() == 0  # no session holds the table yet
    graph = tf.compat.v1.get_default_graph()
    with new_session() as sess:
        ops_before = len(graph.get_operations())
        seen = set()
        for step in range(5):
            batch = [step * 3, step * 3 + 1, 2]
            sess.run(emb, {ids: batch})
            seen.update(batch)
            size, capacity = table.size(), table.capacity()
            # What an example logs every step: ints, not tensors.
            assert type(size) is int and type(capacity) is int  # pylint: disable=unidiomatic-typecheck
            assert size == len(seen)
            assert "table size %d" % size == "table size %d" % len(seen)
            assert capacity >= size
            if not expansion:
                assert capacity == 64
        assert len(graph.get_operations()) == ops_before
        # The graph form is still there for graphs.
        assert sess.run(table.size_tensor()) == len(seen)
        assert sess.run(table.capacity_tensor()) == table.capacity()


def test_size_reads_the_table_of_the_newest_session():
    init(use_dynamic=True)
    table = create_table(tf.int64, DIM, "two_sessions", 0.0, device_vocabulary_size=64)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, None, is_train=True, name="lookup")
    first = new_session()
    first.run(emb, {ids: [1, 2, 3]})
    assert table.size() == 3
    with new_session() as second:
        second.run(emb, {ids: [9]})
        assert table.size() == 1
    assert table.size() == 3  # the second session is gone: its table too
    first.close()
    assert table.size() == 0


# ---------------------------------------------------------------------------
# Shape-dependent initializers for fixed-capacity tables
# ---------------------------------------------------------------------------


def _fans(rows, dim, mode):
    return {"fan_in": rows, "fan_out": dim, "fan_avg": (rows + dim) / 2.0}[mode]


@pytest.mark.parametrize(
    "initializer,scale,mode,distribution",
    [
        (tf.compat.v1.variance_scaling_initializer(seed=1), 1.0, "fan_in", "truncated_normal"),
        (
            tf.compat.v1.variance_scaling_initializer(2.0, "fan_out", "uniform", seed=1),
            2.0,
            "fan_out",
            "uniform",
        ),
        (
            tf.compat.v1.variance_scaling_initializer(3.0, "fan_avg", "untruncated_normal", seed=1),
            3.0,
            "fan_avg",
            "untruncated_normal",
        ),
        (tf.compat.v1.glorot_uniform_initializer(seed=2), 1.0, "fan_avg", "uniform"),
        (tf.compat.v1.glorot_normal_initializer(seed=2), 1.0, "fan_avg", "truncated_normal"),
        (tf.keras.initializers.HeNormal(seed=4), 2.0, "fan_in", "truncated_normal"),
        (tf.keras.initializers.HeUniform(seed=4), 2.0, "fan_in", "uniform"),
    ],
)
def test_variance_scaling_rows_follow_the_distribution(initializer, scale, mode, distribution):
    rows, dim = 400, 16
    init(use_dynamic=True)
    table = create_table(tf.int64, dim, "vs", initializer, device_vocabulary_size=rows)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, None, is_train=True, name="vs_lookup")
    keys = np.arange(rows) * 7919 + 11
    with new_session() as sess:
        values = sess.run(emb, {ids: keys})
        again = sess.run(emb, {ids: keys[::-1]})
    np.testing.assert_array_equal(again[::-1], values)  # a key's row is its own
    variance = scale / _fans(rows, dim, mode)
    std = math.sqrt(variance)
    flat = values.ravel()
    n = flat.size
    assert abs(flat.mean()) < 4 * std / math.sqrt(n)
    # The sample variance of n draws is within ~5 standard errors of the distribution's.
    assert abs(flat.var() - variance) < 5 * variance * math.sqrt(2.0 / n), (flat.var(), variance)
    if distribution == "uniform":
        limit = math.sqrt(3 * variance)
        assert flat.min() >= -limit and flat.max() < limit and flat.max() > 0.95 * limit
    elif distribution == "truncated_normal":
        bound = 2 * std / 0.87962566103423978
        assert np.abs(flat).max() <= bound * (1 + 1e-6)
        assert np.abs(flat).max() > 0.9 * bound
    else:
        assert np.abs(flat).max() > 2.2 * std  # not truncated at 2 stddev


def test_variance_scaling_takes_the_rank_slice_shape_and_is_refused_without_a_shape():
    init(use_dynamic=True, use_dynamic_expansion=True)
    with pytest.raises(
        ValueError,
        match="emb_initializer GlorotUniform depends on the table's "
        "shape .* table 'grows' has none",
    ):
        create_table(
            tf.int64,
            DIM,
            "grows",
            tf.compat.v1.glorot_uniform_initializer(),
            device_vocabulary_size=10,
        )


# ---------------------------------------------------------------------------
# CustomizedOptimizer: a user's own sparse optimizer (the SDK's DLRM example writes gradient
# descent with weight decay this way)
# ---------------------------------------------------------------------------


class DecayedGradientDescent(tf.compat.v1.train.GradientDescentOptimizer, CustomizedOptimizer):
    """Written as the SDK's examples write a sparse optimizer: the ref-variable sparse path,
    with tf.gather and scatter_nd_add on the variable."""

    def __init__(self, learning_rate, weight_decay, name="DecayedGD"):
        self.weight_decay = weight_decay
        super()._get_name(name=name)
        super().__init__(learning_rate=learning_rate, name=self.unique_name)

    def initialize_slots(self, var, table_instance):
        return []

    def insert_slot(self, slot, named_slots_key, slot_name):
        return {}

    def get_slot_init_values(self):
        return []

    def _apply_sparse_duplicate_indices(self, grad, var):
        lr = tf.cast(self._learning_rate_tensor, var.dtype.base_dtype)
        value = (grad.values + self.weight_decay * tf.gather(var, grad.indices)) * lr
        return tf.compat.v1.scatter_nd_add(var, tf.expand_dims(grad.indices, 1), -value)

    def _apply_dense(self, grad, var):
        raise NotImplementedError("You are using a wrong type of variable.")


class SlottedAdagrad(tf.compat.v1.train.AdagradOptimizer, CustomizedOptimizer):
    """A customized optimizer with a slot, updated by TensorFlow's own resource kernel."""

    def __init__(self, learning_rate, initial):
        self.initial = initial
        super()._get_name(name="SlottedAdagrad")
        super().__init__(learning_rate, initial_accumulator_value=initial, name=self.unique_name)

    def initialize_slots(self, var, table_instance):
        return [
            {
                "slot": None,
                "named_slot_key": (var.op.graph, var.op.name),
                "slot_name": "accumulator",
                "optimizer": self,
            }
        ]

    def insert_slot(self, slot, named_slots_key, slot_name):
        self._slot_dict(slot_name)[named_slots_key] = slot

    def get_slot_init_values(self):
        return [self.initial]


def _two_lookup_model(expansion, steps_ids):
    """One table, two lookups per step (duplicates inside and across them); the loss is
    sum(emb_a * wa) + sum(emb_b * wb), so each id's gradient is its weight row."""
    init(use_dynamic=True, use_dynamic_expansion=expansion)
    table = create_table(
        tf.int64, DIM, "custom", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=64
    )
    ids_a = tf.compat.v1.placeholder(tf.int64, [None])
    ids_b = tf.compat.v1.placeholder(tf.int64, [None])
    emb_a = sparse_lookup(table, ids_a, None, is_train=True, name="a")
    emb_b = sparse_lookup(table, ids_b, None, is_train=True, name="b")
    wa = np.arange(1, DIM + 1, dtype=np.float32) / 10
    wb = -np.arange(DIM, dtype=np.float32) / 20
    loss = tf.reduce_sum(emb_a * wa) + tf.reduce_sum(emb_b * wb)
    return table, ids_a, ids_b, wa, wb, loss


STEPS = [([1, 2, 2, 5], [2, 7]), ([5, 5, 9], [1, 9, 9]), ([3], [3, 3, 2])]


def _reference(update, slots_initial=None):
    """NumPy: rows start at 0.5; per step each unique key's gradient is the sum of its
    occurrences' weight rows; `update(row, grad, slot)` -> (row, slot)."""
    wa = np.arange(1, DIM + 1, dtype=np.float32) / 10
    wb = -np.arange(DIM, dtype=np.float32) / 20
    rows, slots = {}, {}
    for ids_a, ids_b in STEPS:
        grads = {}
        for ids, w in ((ids_a, wa), (ids_b, wb)):
            for key in ids:
                grads[key] = grads.get(key, np.zeros(DIM, np.float32)) + w
        for key, grad in grads.items():
            row = rows.get(key, np.full(DIM, 0.5, np.float32))
            slot = slots.get(key, np.full(DIM, slots_initial or 0.0, np.float32))
            rows[key], slots[key] = update(row, grad, slot)
    return rows, slots


def _check_rows(table, sess, expected):
    keys, values, _ = sess.run(table.export())
    got = dict(zip(keys.tolist(), values))
    assert sorted(got) == sorted(expected)
    for key, row in expected.items():
        np.testing.assert_allclose(got[key], row, rtol=1e-5, err_msg="key %d" % key)


@pytest.mark.parametrize("flow", ["by_table", "by_address"])
def test_customized_optimizer_trains_tables_like_numpy(flow):
    lr, decay = 0.1, 0.01
    expansion = flow == "by_address"
    table, ids_a, ids_b, _, _, loss = _two_lookup_model(expansion, STEPS)
    opt = DecayedGradientDescent(lr, decay)
    assert opt.get_name() == opt.unique_name and opt.unique_name.startswith("DecayedGD_")
    if flow == "by_table":
        dense, sparse = get_dense_and_sparse_variable()
        assert sparse == [table] and not dense
        grads = tf.gradients(loss, sparse)
        train = opt.apply_gradients(zip(grads, sparse))
    else:
        local = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        train = opt.apply_gradients(zip(tf.gradients(loss, local), addresses))
    expected, _ = _reference(lambda w, g, s: (w - lr * (g + decay * w), s))
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for a, b in STEPS:
            sess.run(train, {ids_a: a, ids_b: b})
        _check_rows(table, sess, expected)


@pytest.mark.parametrize("flow", ["by_table", "by_address"])
def test_customized_optimizer_slots_live_in_the_table(flow):
    lr, initial = 0.2, 0.1
    table, ids_a, ids_b, _, _, loss = _two_lookup_model(flow == "by_address", STEPS)
    opt = SlottedAdagrad(lr, initial)
    if flow == "by_table":
        train = opt.apply_gradients(
            zip(tf.gradients(loss, [table]), [table]),
            global_step=tf.compat.v1.train.get_or_create_global_step(),
        )
    else:
        train = opt.apply_gradients(
            zip(
                tf.gradients(loss, tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)),
                tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET),
            )
        )

    def adagrad(w, g, acc):
        acc = acc + g * g
        return w - lr * g / np.sqrt(acc), acc

    expected, accumulators = _reference(adagrad, initial)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for a, b in STEPS:
            sess.run(train, {ids_a: a, ids_b: b})
        _check_rows(table, sess, expected)
        keys, _, slots = sess.run(table.export())
        assert slots.shape == (1, len(keys), DIM)
        for key, acc in zip(keys.tolist(), slots[0]):
            np.testing.assert_allclose(acc, accumulators[key], rtol=1e-5)


def test_customized_optimizer_slot_counts_must_agree():
    table, ids_a, _, _, _, loss = _two_lookup_model(False, STEPS)
    del ids_a
    opt = SlottedAdagrad(0.1, 0.1)
    opt.get_slot_init_values = lambda: [0.1, 0.2]
    with pytest.raises(
        ValueError,
        match="gives 2 initial values but initialize_slots\\(\\) names 1 slots \\(accumulator\\)",
    ):
        opt.apply_gradients(zip(tf.gradients(loss, [table]), [table]))


def test_the_sdk_optimizers_are_customized_optimizers_with_unique_names():
    init(use_dynamic=True)
    first = gradient_descent.create_hash_optimizer(0.1, name="shared")
    second = gradient_descent.create_hash_optimizer(0.1, name="shared")
    assert isinstance(first, CustomizedOptimizer)
    assert isinstance(first, tf.compat.v1.train.Optimizer)
    assert (first.base_name, second.base_name) == ("shared", "shared")
    number = int(first.unique_name.rsplit("_", 1)[1])
    assert second.unique_name == "shared_%d" % (number + 1)
    assert first.get_slot_init_values() == [] and first.initialize_slots(None, None) == []


# ---------------------------------------------------------------------------
# Tables in a stock optimizer's compute_gradients (the DLRM example's mixed var_list)
# ---------------------------------------------------------------------------


def test_stock_compute_gradients_takes_tables_in_a_mixed_var_list():
    table, ids_a, ids_b, _, _, loss = _two_lookup_model(False, STEPS)
    weight = tf.compat.v1.get_variable("dense_w", initializer=tf.constant(2.0))
    loss = loss * weight
    dense, sparse = get_dense_and_sparse_variable()
    assert dense == [weight] and sparse == [table]
    dense_opt = tf.compat.v1.train.AdamOptimizer(0.01)
    grads = dense_opt.compute_gradients(loss, var_list=dense + sparse)
    assert [v for _, v in grads] == [weight, table]
    reference = tf.gradients(loss, dense + sparse)
    table_grad = grads[-1][0]
    assert isinstance(table_grad, tf.IndexedSlices)
    # The DLRM example's use: dense pairs to the dense optimizer, the table's to the sparse.
    train = tf.group(
        dense_opt.apply_gradients(grads[:-1]),
        gradient_descent.create_hash_optimizer(0.1).apply_gradients([(table_grad, table)]),
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = {ids_a: STEPS[0][0], ids_b: STEPS[0][1]}
        got, want = sess.run([[g for g, _ in grads], reference], feed)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1].indices, want[1].indices)
        np.testing.assert_array_equal(got[1].values, want[1].values)
        sess.run(train, feed)
    with pytest.raises(
        TypeError,
        match="GradientDescentOptimizer.apply_gradients got rec_sdk "
        "table "
        "'custom'.*CustomizedOptimizer",
    ):
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(grads)
