"""What the SDK's public model examples (WideDeep, DLRM, DCNv2 `main_mxrec.py`) rely on,
used the way they use it: ids of other dtypes cast where the pipeline inserts them, the
table's size() and capacity() as Python ints, CustomizedOptimizer subclasses, shape-dependent
initializers, and tables in a stock optimizer's compute_gradients. Each test fails without
its behaviour; numbers are checked against NumPy or an int64 / dense-variable twin."""
import math

import numpy as np
import pytest
import tensorflow as tf

from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
from rec_sdk.optimizers import gradient_descent
from rec_sdk.util.initialize import get_initializer, init, terminate_config_initializer

from helpers import new_session, sorted_export

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
    table = create_table(tf.int64, DIM, "ids_table",
                         tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3),
                         device_vocabulary_size=1000)
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
    emb = sparse_lookup(table, lookup_ids, None, is_train=True, name="ids_lookup",
                        modify_graph=mode == "modify_graph", batch=batch)
    logits = tf.reduce_sum(emb, axis=[1, 2])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                                  logits=logits))
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
        dataset = tf.data.Dataset.from_tensor_slices({"clicks": values}).batch(2).map(
            get_asc_insert_func(tgt_key_specs=[spec], is_training=True))
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        run = sparse_lookup(table, spec, None, is_train=True, name="clicks",
                            batch=iterator.get_next())
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
    with pytest.raises(TypeError, match="ids of sparse_lookup 'names' of table 't' must be "
                                        "integer .* got string"):
        sparse_lookup(table, tf.constant(["a"]), None, name="names")


def test_int64_ids_into_an_int32_table_are_range_checked():
    init(use_dynamic=True)
    table = create_table(tf.int32, DIM, "t32", 0.0, device_vocabulary_size=100)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, None, is_train=True, name="wide")
    with new_session() as sess:
        assert sess.run(emb, {ids: [1, 2]}).shape == (2, DIM)
        with pytest.raises(tf.errors.InvalidArgumentError, match="in \\[-2147483648, "
                                                                 "2147483647\\]; got.*4294967296"):
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


@pytest.mark.parametrize("initializer,scale,mode,distribution", [
    (tf.compat.v1.variance_scaling_initializer(seed=1), 1.0, "fan_in", "truncated_normal"),
    (tf.compat.v1.variance_scaling_initializer(2.0, "fan_out", "uniform", seed=1), 2.0,
     "fan_out", "uniform"),
    (tf.compat.v1.variance_scaling_initializer(3.0, "fan_avg", "untruncated_normal", seed=1),
     3.0, "fan_avg", "untruncated_normal"),
    (tf.compat.v1.glorot_uniform_initializer(seed=2), 1.0, "fan_avg", "uniform"),
    (tf.compat.v1.glorot_normal_initializer(seed=2), 1.0, "fan_avg", "truncated_normal"),
    (tf.keras.initializers.HeNormal(seed=4), 2.0, "fan_in", "truncated_normal"),
    (tf.keras.initializers.HeUniform(seed=4), 2.0, "fan_in", "uniform"),
])
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
    with pytest.raises(ValueError, match="emb_initializer GlorotUniform depends on the table's "
                                         "shape .* table 'grows' has none"):
        create_table(tf.int64, DIM, "grows", tf.compat.v1.glorot_uniform_initializer(),
                     device_vocabulary_size=10)
