"""Tests of a table's methods (lookup/upsert/remove/clear/export/import_rows, initializer
parameters through lookups), tables per session, concurrent use, and what makes two handles
or two admission settings one table."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import const_initializer as _const
from helpers import make_table as _table
from helpers import new_session, sorted_export
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import table_ops
from rec_sdk.optimizers import adagrad, lazy_adam
from rec_sdk.tables.initializer_spec import describe_initializer
from rec_sdk.util.initialize import init

DIM = 4  # make_table's default


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
        assert sess.run(table.size_tensor()) == 3
        v, e = sess.run(looked_up, {keys: [30, 10, 20, 40]})
        np.testing.assert_array_equal(v[:3], rows[[2, 0, 1]])
        np.testing.assert_array_equal(v[3], np.zeros(DIM))
        assert e.tolist() == [True, True, True, False]
        v, e = sess.run(looked_up_init, {keys: [40, 10]})
        np.testing.assert_array_equal(v[0], np.full(DIM, 0.5))
        np.testing.assert_array_equal(v[1], rows[0])
        assert e.tolist() == [False, True]
        assert sess.run(table.size_tensor()) == 3  # init_missing does not insert
        # Overwrite: the last value wins.
        sess.run(upsert, {keys: [20], values: -rows[:1]})
        np.testing.assert_array_equal(sess.run(looked_up, {keys: [20]})[0][0], -rows[0])
        assert sess.run(removed, {keys: [10, 10, 99]}) == 1
        assert sess.run(table.size_tensor()) == 2
        v, e = sess.run(looked_up, {keys: [10, 20]})
        assert e.tolist() == [False, True]
        np.testing.assert_array_equal(v[0], np.zeros(DIM))
        sess.run(table.clear())
        assert sess.run(table.size_tensor()) == 0
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


def _unknown_shape(tensor):
    return tf.compat.v1.placeholder_with_default(tensor, None)


def test_upsert_wrong_shape_names_table(initialized):
    table = _table(name="shaped")
    with pytest.raises(ValueError, match="values of table 'shaped' must have shape"):
        table.upsert(tf.constant([1, 2], tf.int64), tf.zeros([2, DIM + 1]))
    op = table.upsert(tf.constant([1, 2], tf.int64), _unknown_shape(tf.zeros([2, DIM + 1])))
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
            assert sess.run(fresh.size_tensor()) == 6
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
        assert sess.run(table.size_tensor()) == 1
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


@pytest.mark.parametrize(
    "opt_module,make_optimizer,num_slots",
    [
        (lazy_adam, lambda m: m.create_hash_optimizer(learning_rate=0.05), 2),
        (
            adagrad,
            lambda m: m.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.2),
            1,
        ),
    ],
)
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
    make = lambda m: m.create_hash_optimizer(
        learning_rate=0.1,  # noqa: E731
        initial_accumulator_value=0.2,
    )
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
    keys = tf.constant([1, 2], tf.int64)
    with pytest.raises(ValueError, match="values of table 'imported'"):
        table.import_rows(keys, tf.zeros([3, DIM]))
    with pytest.raises(ValueError, match="slots of table 'imported'"):
        table.import_rows(keys, tf.zeros([2, DIM]), tf.zeros([3, DIM + 1]))
    # The kernel checks what the graph could not: shapes unknown when it was built.
    bad_values = table.import_rows(keys, _unknown_shape(tf.zeros([2, DIM + 1])))
    bad_count = table.import_rows(keys, _unknown_shape(tf.zeros([3, DIM])))
    bad_slots = table.import_rows(keys, tf.zeros([2, DIM]), _unknown_shape(tf.zeros([1, 3, DIM])))
    bad_keys = table.import_rows(
        tf.constant([[1, 2]], tf.int64), _unknown_shape(tf.zeros([1, 2, DIM]))
    )
    with new_session() as sess:
        for op in (bad_values, bad_count, bad_slots, bad_keys):
            with pytest.raises(tf.errors.InvalidArgumentError, match="imported"):
                sess.run(op)
        assert sess.run(table.size_tensor()) == 0


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
        assert first.run(table.size_tensor()) == 2
        with new_session() as second:
            assert second.run(table.size_tensor()) == 0


@pytest.mark.parametrize(
    "make_initializer,low,high",
    [
        (lambda: tf.compat.v1.random_uniform_initializer(seed=3), 0.0, 1.0),
        (lambda: tf.compat.v1.random_uniform_initializer(minval=-2.0, seed=3), -2.0, 1.0),
        (lambda: tf.random_uniform_initializer(seed=3), -0.05, 0.05),
        (lambda: tf.keras.initializers.RandomUniform(seed=3), -0.05, 0.05),
    ],
    ids=["v1_default_maxval", "v1_minval_only", "v2_default", "keras_default"],
)
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


@pytest.mark.parametrize(
    "make_initializer,mean,stddev",
    [
        (lambda: tf.compat.v1.truncated_normal_initializer(seed=1), 0.0, 1.0),
        (lambda: tf.keras.initializers.TruncatedNormal(mean=1.0, stddev=0.2, seed=1), 1.0, 0.2),
        (lambda: tf.random_normal_initializer(mean=-1.0, stddev=0.5, seed=1), -1.0, 0.5),
        (lambda: tf.keras.initializers.RandomNormal(seed=1), 0.0, 0.05),
    ],
)
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
        assert sess.run(table.size_tensor()) == 2
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
        assert sess.run(table.size_tensor()) == 4
        with pytest.raises(tf.errors.ResourceExhaustedError, match="reuse"):
            sess.run(emb, {ids: [7]})
        sess.run(table.clear())
        sess.run(emb, {ids: [10, 11, 12, 13]})
        assert sess.run(table.size_tensor()) == 4


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
    universe = np.concatenate([np.arange(3000), rng.randint(-(2**62), 2**62, 500, dtype=np.int64)])
    reference = {}
    with new_session() as sess:
        for _round in range(30):
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
            assert sess.run(table.size_tensor()) == len(reference)
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
            learning_rate=0.1, initial_accumulator_value=0.5
        )
    else:
        make = lambda: adagrad.create_hash_optimizer(  # noqa: E731
            learning_rate=0.1, initial_accumulator_value=0.5
        )

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
        assert sess.run(table.size_tensor()) == 0


def test_lookups_per_table_limited(initialized):
    table = _table()
    ids = tf.constant([1], tf.int64)
    for _ in range(128):
        sparse_lookup(table, ids, is_train=False)
    with pytest.raises(ValueError, match="128"):
        sparse_lookup(table, ids, is_train=False)


def test_static_shape_lookup_rejects_more_distinct_keys_than_send_count():
    init(use_dynamic=False)
    table = create_table(
        tf.int64, 4, "static_t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, send_count=3, name="static_lookup")
    with tf.compat.v1.Session() as sess:
        assert sess.run(emb, {ids: [1, 2, 3, 3, 1]}).shape == (5, 4)
        with pytest.raises(tf.errors.InvalidArgumentError, match="static_lookup.*send_count=3"):
            sess.run(emb, {ids: np.arange(4)})


def test_static_shape_lookup_addresses_are_known_unique():
    from rec_sdk.ops import table_ops

    init(use_dynamic=False)
    table = create_table(
        tf.int64, 4, "static_u", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
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

    init(use_dynamic_expansion=True)
    table = create_table(
        tf.int64,
        8,
        "concurrent",
        tf.compat.v1.random_normal_initializer(seed=3),
        device_vocabulary_size=64,
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, is_train=True)
    loss = tf.reduce_sum(tf.square(emb))
    grads = tf.gradients(loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB))
    from rec_sdk.optimizers import lazy_adam_by_addr

    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
        zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
    )
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
        assert len(np.unique(keys)) == len(keys) == sess.run(table.size_tensor())
        assert slots.shape == (2, len(keys), 8)
        # Eval lookups of stored keys read exactly the stored rows.
        probe = keys[:100]
        np.testing.assert_array_equal(sess.run(eval_emb, {ids: probe}), values[:100])


def test_second_handle_with_another_configuration_is_an_error():
    """Two handle ops of one table name in a session must describe the same table; each
    differing field is named with both values."""
    spec = describe_initializer(tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3), "t")
    first = table_ops.create_table("t", tf.int64, 4, False, capacity=10, initializer=spec)
    same = table_ops.create_table("t", tf.int64, 4, False, capacity=10, initializer=spec)
    other_spec = dict(spec, seed=4)
    other = table_ops.create_table("t", tf.int64, 4, False, capacity=20, initializer=other_spec)
    with new_session() as sess:
        sess.run([first, same])
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match="table 't' already exists with another configuration "
            "\\(existing vs asked for\\): capacity: 10 vs 20; "
            "initializer seed: 3 vs 4\n",
        ):
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
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match="table 't' already has other admission settings \\(existing "
            "vs asked for\\): access_threshold: 2 vs 3; "
            "eviction_threshold: 60 vs -1; every lookup",
        ):
            sess.run(other)
