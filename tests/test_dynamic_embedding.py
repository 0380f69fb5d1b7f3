"""rec_sdk.dynamic_embedding (TFRA-style API) against NumPy references: variable methods,
sharding over 3 CPU devices with a custom partitioner, sparse lookups, restrict policies,
checkpoints, tf.estimator and parity with TFRA. Training with the optimizer wrapper is in
test_dynamic_embedding_training.py."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tests.helpers import new_session

import rec_sdk.dynamic_embedding as de

DIM = 3


def three_cpus():
    return tf.compat.v1.Session(
        config=tf.compat.v1.ConfigProto(
            device_count={"CPU": 3}, intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
        )
    )


def as_dict(keys, values):
    return {int(k): v.tolist() for k, v in zip(keys, values)}


def i64(x):
    return tf.constant(np.asarray(x, dtype=np.int64))


def f32(x):
    return tf.constant(np.asarray(x, dtype=np.float32))


# --- Variable methods -----------------------------------------------------------------------


def test_lookup_upsert_remove_export_clear_size():
    v = de.Variable(dim=DIM, initializer=-1.0, name="emb")
    rng = np.random.default_rng(0)
    ref = {}
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    upsert, remove = v.upsert(keys, values), v.remove(keys)
    looked, exists = v.lookup(keys, return_exists=True)
    export, size, clear = v.export(), v.size(), v.clear()
    with new_session() as sess:
        for step in range(30):
            k = rng.integers(-20, 20, size=8)
            if step % 3 == 2:
                sess.run(remove, {keys: k})
                for key in k:
                    ref.pop(int(key), None)
            else:
                k = np.unique(k)
                vals = rng.normal(size=(len(k), DIM)).astype(np.float32)
                sess.run(upsert, {keys: k, values: vals})
                ref.update(as_dict(k, vals))
            probe = np.arange(-22, 22)
            got, ex = sess.run([looked, exists], {keys: probe})
            want = np.array([ref.get(int(p), [-1.0] * DIM) for p in probe], np.float32)
            np.testing.assert_allclose(got, want)
            np.testing.assert_array_equal(ex, [int(p) in ref for p in probe])
            assert sess.run(size) == len(ref)
            assert as_dict(*sess.run(export)) == ref
        sess.run(clear)
        assert sess.run(size) == 0
        assert len(sess.run(export)[0]) == 0


def test_keys_of_any_shape_and_values_shape():
    v = de.Variable(dim=DIM, initializer=0.0, devices=["/CPU:0"] * 2)
    up = v.upsert(i64([[1, 2], [3, 4]]), f32(np.arange(12).reshape(2, 2, DIM)))
    scalar = v.lookup(i64(3))
    cube = v.lookup(i64(np.array([1, 2, 3, 4, 5, 6, 7, 8]).reshape(2, 2, 2)))
    assert scalar.shape.as_list() == [DIM]
    assert cube.shape.as_list() == [2, 2, 2, DIM]
    with new_session() as sess:
        sess.run(up)
        np.testing.assert_allclose(sess.run(scalar), [6, 7, 8])
        got = sess.run(cube).reshape(8, DIM)
        want = np.concatenate([np.arange(12).reshape(4, DIM), np.zeros((4, DIM))])
        np.testing.assert_allclose(got, want)


def test_initializers():
    vec = de.Variable(dim=DIM, initializer=np.array([0.1, 0.2, 0.3]), name="vec")
    num = de.Variable(dim=DIM, initializer=2, name="num")
    none = de.Variable(dim=DIM, name="none")
    rnd = de.Variable(
        dim=DIM, initializer=tf.compat.v1.random_normal_initializer(seed=3), name="rnd"
    )
    keys = i64([5, 6, 5])
    fetch = [x.lookup(keys) for x in (vec, num, none, rnd)]
    with new_session() as sess:
        a, b, c, d = sess.run(fetch)
        d2 = sess.run(fetch[3])
    np.testing.assert_allclose(a, [[0.1, 0.2, 0.3]] * 3, rtol=1e-6)
    np.testing.assert_allclose(b, 2.0)
    np.testing.assert_allclose(c, 0.0)
    # Deterministic per key: the same key gives the same values, run after run.
    np.testing.assert_array_equal(d, d2)
    np.testing.assert_array_equal(d[0], d[2])
    assert not np.allclose(d[0], d[1]) and np.std(d) > 0.3
    with pytest.raises(ValueError, match="initializer.*dim=3"):
        de.Variable(dim=DIM, initializer=np.ones(4), name="bad")
    with pytest.raises(ValueError, match="initializer"):
        de.Variable(dim=DIM, initializer=tf.compat.v1.glorot_uniform_initializer(), name="g")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="key-value dtype"):
        de.Variable(key_dtype=tf.float32)
    with pytest.raises(TypeError, match="value_dtype complex64 is not supported"):
        de.Variable(value_dtype=tf.complex64)
    with pytest.raises(ValueError, match=r"dim must be an integer in \[1, \d+\] \(for float64"):
        de.Variable(value_dtype=tf.float64, dim=10**6)
    with pytest.raises(ValueError, match="dim must be"):
        de.Variable(dim=0)
    with pytest.raises(TypeError, match="restrict_policy"):
        de.Variable(restrict_policy="timestamp")
    with pytest.raises(ValueError, match="init_size"):
        de.Variable(init_size=-1)
    v = de.Variable(dim=DIM)
    with pytest.raises(TypeError, match="int64"):
        v.lookup(tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="float32"):
        v.upsert(i64([1]), tf.constant([[1.0] * DIM], tf.float64))
    with pytest.raises(ValueError, match="float32"):  # a ValueError too, as TFRA raises
        v.upsert(i64([1]), tf.constant([[1.0] * DIM], tf.float64))
    with pytest.raises(ValueError, match=r"keys.shape \+ \[dim\] = \[1, 3\], got \[1, 2\]"):
        v.upsert(i64([1]), f32([[1.0, 2.0]]))
    for values in ([1.0] * 6, [[1.0] * 3] * 1, [[1.0] * 3] * 3, [[[1.0] * 3]] * 2):
        # keys [2]: a ValueError when built, and the InvalidArgumentError a run gives
        with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
            v.accum(i64([1, 2]), f32(values), f32(values), [True, False])
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, None)
    upsert = v.upsert(keys, values)
    with new_session() as sess:
        for bad in ([1.0] * 6, [[1.0] * 3] * 1, [[[1.0] * 3]] * 2, [[1.0] * 2] * 2):
            with pytest.raises(
                tf.errors.InvalidArgumentError,
                match=r"Expected shape keys.shape \+ \[dim\] = \[None, 3\]",
            ):
                sess.run(upsert, {keys: [1, 2], values: bad})
        assert sess.run(v.size()) == 0  # nothing written
        sess.run(upsert, {keys: [1, 2], values: [[1.0] * 3] * 2})
        assert sess.run(v.size()) == 2
    with pytest.raises(TypeError, match="int64"):
        v.remove(tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="key_dtype"):
        de.embedding_lookup(v, tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="Variable"):
        de.embedding_lookup(tf.Variable([[1.0]]), i64([0]))
    with pytest.raises(ValueError, match="index"):
        v.size(1)


def test_string_keys_against_int64_keys_and_a_dict(tmp_path):
    """A de.Variable with string keys behaves as one with int64 keys (same rows for key i and
    str(i)) through upsert / lookup / accum / remove / export / clear, training with Adam from
    embedding_lookup and sparse lookups (default_id), slots and the Saver (var_list naming
    the variable included); exports give the strings back."""

    def strs(keys):
        return tf.constant([str(k) for k in keys])

    s_var = de.get_variable("str_keys", tf.string, dim=2, initializer=-1.0, devices=["/CPU:0"] * 2)
    i_var = de.get_variable("int_keys", tf.int64, dim=2, initializer=-1.0)
    ops = {}
    for name, var, conv in (("s", s_var, strs), ("i", i_var, i64)):
        ids = [[1, 2, 1], [7, 2, 9]]
        sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], conv([2, 9, 4]), [3, 2])
        emb = de.embedding_lookup(var, tf.reshape(conv(np.ravel(ids)), [2, 3]), name="e" + name)
        safe = de.safe_embedding_lookup_sparse(
            var, sp, None, combiner="sum", default_id=conv([5])[0]
        )
        loss = tf.reduce_sum(tf.square(emb - 0.5)) + tf.reduce_sum(safe)
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        ops[name] = dict(
            upsert=var.upsert(conv([1, 2, 3]), f32([[1, 1], [2, 2], [3, 3]])),
            accum=var.accum(
                conv([1, 8]), f32([[1, 1], [0, 0]]), f32([[4, 4], [6, 6]]), [True, False]
            ),
            remove=var.remove(conv([3, 99])),
            train=opt.minimize(loss),
            lookup=var.lookup(conv([1, 2, 3, 8]), return_exists=True),
            export=var.export(),
            slots=[s.export() for s in var.get_slot_variables(opt)],
            clear=var.clear(),
            size=var.size(),
        )
    saver = tf.compat.v1.train.Saver()
    chosen = tf.compat.v1.train.Saver([s_var])
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in ("upsert", "accum", "remove", "train", "train"):
            sess.run([ops["s"][step], ops["i"][step]])
        for got, want in zip(sess.run(ops["s"]["lookup"]), sess.run(ops["i"]["lookup"])):
            np.testing.assert_array_equal(got, want)
        s_export, i_export = sess.run([ops["s"]["export"], ops["i"]["export"]])
        got = dict(zip((k.decode() for k in s_export[0]), s_export[1].tolist()))
        want = dict(zip((str(k) for k in i_export[0]), i_export[1].tolist()))
        assert got == want and set(got) == {"1", "2", "4", "5", "7", "8", "9"}
        s_slots, i_slots = sess.run([ops["s"]["slots"], ops["i"]["slots"]])
        for (sk, sv), (ik, iv) in zip(s_slots, i_slots):
            assert dict(zip((k.decode() for k in sk), sv.tolist())) == dict(
                zip((str(k) for k in ik), iv.tolist())
            )
        path = saver.save(sess, str(tmp_path / "all"))
        chosen_path = chosen.save(sess, str(tmp_path / "chosen"))
        sess.run(ops["s"]["clear"])
        assert sess.run(ops["s"]["size"]) == 0
        assert sess.run(ops["s"]["export"])[0].size == 0
        for restoring, from_path in ((saver, path), (chosen, chosen_path)):
            sess.run(ops["s"]["clear"])
            restoring.restore(sess, from_path)
            keys, rows = sess.run(ops["s"]["export"])
            assert dict(zip((k.decode() for k in keys), rows.tolist())) == got
    with pytest.raises(TypeError, match="string keys"):
        s_var.save_to_file_system(str(tmp_path / "files"))
    with pytest.raises(TypeError, match=r"\(string-string\) is not supported"):
        de.Variable(key_dtype=tf.string, value_dtype=tf.string)


def test_int32_keys():
    v = de.Variable(key_dtype=tf.int32, dim=2, initializer=1.0)
    up = v.upsert(tf.constant([7], tf.int32), f32([[3.0, 4.0]]))
    out = v.lookup(tf.constant([7, 8], tf.int32))
    with new_session() as sess:
        sess.run(up)
        np.testing.assert_allclose(sess.run(out), [[3, 4], [1, 1]])


VALUE_DTYPES = [
    tf.float64,
    tf.float16,
    tf.bfloat16,
    tf.int64,
    tf.int32,
    tf.int16,
    tf.int8,
    tf.uint8,
    tf.bool,
]


def _values_of(dtype, n, dim, seed):
    rng = np.random.default_rng(seed)
    if dtype == tf.bool:
        return rng.integers(0, 2, (n, dim)).astype(bool)
    if dtype.is_floating:
        values = rng.normal(size=(n, dim)) * 100
        if dtype == tf.float64:  # values float32 could not hold
            values += 1e-12
        return values.astype(dtype.as_numpy_dtype)
    info = np.iinfo(dtype.as_numpy_dtype)
    return rng.integers(info.min, info.max, (n, dim), dtype=np.int64, endpoint=True).astype(
        dtype.as_numpy_dtype
    )


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [1, 3, 5])
def test_value_dtypes_store_bit_exact_values_with_their_defaults(dtype, dim):
    """Other value dtypes than float32, against a dict: upsert, lookup (missing keys: the
    initializer's value), export, remove, accum, over two shards; values come back bit for
    bit (float64 values float32 cannot hold, the extremes of every integer type)."""
    default = np.ones([dim], dtype.as_numpy_dtype)
    v = de.Variable(
        value_dtype=dtype,
        dim=dim,
        initializer=default[:1],
        devices=["/CPU:0"] * 2,
        name="dtype_%s_%d" % (dtype.name, dim),
    )
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(dtype, [None, dim])
    upsert, remove = v.upsert(keys, values), v.remove(keys)
    looked, exists = v.lookup(keys, return_exists=True)
    export = v.export()
    ref = {}
    with new_session() as sess:
        for step in range(4):
            k = np.unique(np.random.default_rng(step).integers(-10, 10, 6))
            vals = _values_of(dtype, len(k), dim, step)
            sess.run(upsert, {keys: k, values: vals})
            ref.update(zip(k.tolist(), vals))
            sess.run(remove, {keys: k[:1]})
            ref.pop(int(k[0]))
            probe = np.arange(-12, 12)
            got, ex = sess.run([looked, exists], {keys: probe})
            assert got.dtype == dtype.as_numpy_dtype
            want = np.array([ref.get(int(p), default) for p in probe])
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            np.testing.assert_array_equal(ex, [int(p) in ref for p in probe])
        exported_keys, exported = sess.run(export)
        assert sorted(exported_keys.tolist()) == sorted(ref)
        for key, row in zip(exported_keys, exported):
            np.testing.assert_array_equal(row, ref[int(key)])
        if dtype != tf.bool:
            present = sorted(ref)[0]
            sess.run(
                v.accum(
                    i64([present, 100]),
                    np.zeros([2, dim], dtype.as_numpy_dtype),
                    np.ones([2, dim], dtype.as_numpy_dtype),
                    tf.constant([True, False]),
                )
            )
            after = sess.run(v.lookup(i64([present, 100])))
            np.testing.assert_array_equal(after[0], ref[present] + np.ones([dim], after.dtype))
            np.testing.assert_array_equal(after[1], np.ones([dim]))


def test_float64_variable_checkpoint_and_read_only_training_lookup(tmp_path):
    """A float64 variable is saved and restored by the Saver bit for bit; its lookups in a
    training graph read (rec_sdk trains float32 variables only) and give no trainable."""
    v = de.Variable(value_dtype=tf.float64, dim=2, initializer=0.25, name="f64_saved")
    values = np.array([[1 + 1e-12, -2.5], [3e300, 1e-300]])
    up = v.upsert(i64([1, 2]), tf.constant(values))
    emb, trainable = de.embedding_lookup(v, i64([2, 7]), return_trainable=True)
    assert trainable is None and emb.dtype == tf.float64
    tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(up)
        path = saver.save(sess, str(tmp_path / "model"))
        sess.run(v.clear())
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(emb), [values[1], [0.25, 0.25]])


def test_accum_semantics():
    v = de.Variable(dim=2, initializer=0.0)
    setup = v.upsert(i64([1, 2]), f32([[10, 10], [20, 20]]))
    # 1: exists, present -> += new - old; 2: not exists, present -> unchanged;
    # 3: exists, absent -> nothing; 4: not exists, absent -> inserted.
    acc = v.accum(
        i64([1, 2, 3, 4]),
        f32([[1, 1], [0, 0], [0, 0], [0, 0]]),
        f32([[4, 6], [5, 5], [7, 7], [8, 9]]),
        tf.constant([True, False, True, False]),
    )
    with new_session() as sess:
        sess.run(setup)
        sess.run(acc)
        assert as_dict(*sess.run(v.export())) == {1: [13, 15], 2: [20, 20], 4: [8, 9]}


def test_init_size_split_and_environment(monkeypatch):
    v = de.Variable(dim=2, devices=["/CPU:0"] * 4, init_size=1000, name="sized")
    assert [t.device_vocabulary_size for t in v.tables] == [250] * 4
    monkeypatch.setenv("TF_HASHTABLE_INIT_SIZE", "4096")
    w = de.Variable(dim=2, name="env")
    assert w.tables[0].device_vocabulary_size == 4096
    monkeypatch.setenv("TF_HASHTABLE_INIT_SIZE", "lots")
    with pytest.raises(ValueError, match="TF_HASHTABLE_INIT_SIZE"):
        de.Variable(dim=2, name="bad_env")


def test_sharding_over_three_cpu_devices_with_custom_partitioner():
    def by_hundreds(keys, shard_num):
        return tf.cast(tf.math.floormod(keys // 100, shard_num), tf.int32)

    devices = ["/CPU:0", "/CPU:1", "/CPU:2"]
    v = de.Variable(
        dim=DIM, devices=devices, partitioner=by_hundreds, initializer=-1.0, name="sharded"
    )
    assert v.shard_num == 3 and [t.handle.device for t in v.tables] == [
        "/device:CPU:%d" % i for i in range(3)
    ]
    rng = np.random.default_rng(1)
    keys = rng.choice(1000, size=60, replace=False).astype(np.int64)
    vals = rng.normal(size=(60, DIM)).astype(np.float32)
    up = v.upsert(i64(keys.reshape(6, 10)), f32(vals.reshape(6, 10, DIM)))
    probe = np.concatenate([keys[::-1], [1001, 2002]]).astype(np.int64).reshape(2, 31)
    out = v.lookup(i64(probe))
    sizes = [v.size(i) for i in range(3)]
    exported_keys = v.export()[0]
    with three_cpus() as sess:
        sess.run(up)
        ref = as_dict(keys, vals)
        want = np.array([ref.get(int(k), [-1.0] * DIM) for k in probe.reshape(-1)])
        np.testing.assert_allclose(sess.run(out).reshape(-1, DIM), want, rtol=1e-6)
        got_sizes = sess.run(sizes)
        assert got_sizes == [int(np.sum((keys // 100) % 3 == i)) for i in range(3)]
        exported = sess.run(exported_keys)
        # Shard after shard: shard i's keys are all (k // 100) % 3 == i.
        shards = (exported // 100) % 3
        assert list(shards) == sorted(shards)
        assert sess.run(v.size()) == 60


def test_get_variable_reuse():
    with tf.compat.v1.variable_scope("outer"):
        a = de.get_variable("t", dim=2)
        with pytest.raises(ValueError, match="already exists"):
            de.get_variable("t", dim=2)
    with tf.compat.v1.variable_scope("outer", reuse=True):
        assert de.get_variable("t", dim=2) is a
    with tf.compat.v1.variable_scope("outer", reuse=tf.compat.v1.AUTO_REUSE):
        assert de.get_variable("t", dim=2) is a
        b = de.get_variable("u", dim=2)
    assert a.name == "outer/t" and b.name == "outer/u"
    # Two Variables with one name get distinct tables.
    c, d = de.Variable(name="same"), de.Variable(name="same")
    assert c.tables[0].table_name != d.tables[0].table_name


# --- Sparse lookups -------------------------------------------------------------------------


def sparse(indices, values, shape, dtype=tf.int64):
    return tf.SparseTensor(
        np.asarray(indices, np.int64), tf.constant(values, dtype), np.asarray(shape, np.int64)
    )


def np_combine(table, rows, ids, weights, combiner, num_rows, default=None):
    out = np.zeros((num_rows, DIM))
    for r in range(num_rows):
        sel = [i for i, row in enumerate(rows) if row == r]
        if not sel:
            out[r] = table[default] if default is not None else 0.0
            continue
        w = np.array([weights[i] for i in sel]) if weights is not None else np.ones(len(sel))
        s = sum(wi * table[ids[i]] for wi, i in zip(w, sel))
        if combiner == "mean":
            s = s / w.sum()
        elif combiner == "sqrtn":
            s = s / np.sqrt((w * w).sum())
        out[r] = s
    return out


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_lookup_sparse(combiner, weighted):
    v = de.Variable(dim=DIM, initializer=tf.compat.v1.random_uniform_initializer(seed=2))
    rows, ids = [0, 0, 0, 2, 3, 3], [5, 6, 5, 7, 8, 5]
    weights = [1.0, 2.0, 0.5, 3.0, 1.5, 0.25]
    indices = [[r, i] for i, r in enumerate(rows)]
    sp_ids = sparse(indices, ids, [5, 6])
    sp_w = sparse(indices, weights, [5, 6], tf.float32) if weighted else None
    out = de.embedding_lookup_sparse(v, sp_ids, sp_w, combiner=combiner)
    table = v.lookup(i64(np.arange(10)))
    safe = de.safe_embedding_lookup_sparse(v, sp_ids, sp_w, combiner=combiner)
    with new_session() as sess:
        got, tab, got_safe = sess.run([out, table, safe])
    want = np_combine(tab, rows, ids, weights if weighted else None, combiner, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # rows 0..3 (last with ids)
    np.testing.assert_allclose(
        got_safe, np.concatenate([want, np.zeros((1, DIM))]), rtol=1e-5, atol=1e-6
    )


def test_safe_embedding_lookup_sparse_rank3_default_id_and_pruning():
    v = de.Variable(dim=DIM, initializer=tf.compat.v1.random_normal_initializer(seed=4))
    # [2, 2, k]: rows (0,0): ids 1, 2 (weight of 2 is <= 0: pruned for mean); (0,1): empty;
    # (1,0): id 3; (1,1): only a zero-weight id -> empty after pruning.
    indices = [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 0]]
    sp_ids = sparse(indices, [1, 2, 3, 4], [2, 2, 2])
    sp_w = sparse(indices, [2.0, -1.0, 1.0, 0.0], [2, 2, 2], tf.float32)
    with_default = de.safe_embedding_lookup_sparse(
        v, sp_ids, sp_w, default_id=9, name="with_default"
    )
    zeros = de.safe_embedding_lookup_sparse(v, sp_ids, sp_w, name="zeros")
    summed = de.safe_embedding_lookup_sparse(v, sp_ids, sp_w, combiner="sum", name="summed")
    table = v.lookup(i64(np.arange(10)))
    assert zeros.shape.as_list() == [2, 2, DIM]
    with new_session() as sess:
        got_d, got_z, got_s, tab = sess.run([with_default, zeros, summed, table])
    np.testing.assert_allclose(got_d[0, 0], tab[1], rtol=1e-6)
    np.testing.assert_allclose(got_d[0, 1], tab[9], rtol=1e-6)
    np.testing.assert_allclose(got_d[1, 0], tab[3], rtol=1e-6)
    np.testing.assert_allclose(got_d[1, 1], tab[9], rtol=1e-6)
    np.testing.assert_allclose(got_z[0, 1], 0.0)
    np.testing.assert_allclose(got_z[1, 1], 0.0)
    # "sum" keeps non-positive weights.
    np.testing.assert_allclose(got_s[0, 0], 2 * tab[1] - tab[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_s[1, 1], 0.0, atol=1e-7)


def test_sparse_lookup_trains_with_summed_gradients():
    v = de.Variable(dim=2, initializer=1.0)
    sp_ids = sparse([[0, 0], [0, 1], [1, 0]], [4, 4, 6], [2, 2])
    out = de.embedding_lookup_sparse(v, sp_ids, None, combiner="sum")
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(
        tf.reduce_sum(out)
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        assert as_dict(*sess.run(v.export())) == {4: [0.0, 0.0], 6: [0.5, 0.5]}
    with pytest.raises(ValueError, match="combiner"):
        de.embedding_lookup_sparse(v, sp_ids, None, combiner="max")
    with pytest.raises(TypeError, match="SparseTensor"):
        de.embedding_lookup_sparse(v, i64([1]), None)


# --- Restrict policies ----------------------------------------------------------------------


def train_pattern(policy, devices=1):
    """Keys 0..9 (x devices); key k is trained in steps 0..k (k + 1 times) with Adagrad, key
    20 once in the last step; key 30 only upserted. -> (variable, session, ops)."""
    v = de.Variable(dim=2, initializer=0.1, restrict_policy=policy, devices=["/CPU:0"] * devices)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    train = opt.minimize(tf.reduce_sum(tf.square(de.embedding_lookup(v, ids))))
    sess = new_session()
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(v.upsert(i64([30]), f32([[1.0, 1.0]])))
    for step in range(10):
        keys = [k for k in range(10) if k >= step] + ([20] if step == 9 else [])
        # Key k is trained in steps 0..k: k + 1 times, last in step k.
        sess.run(train, {ids: np.array(keys, np.int64)})
    return v, sess, opt


def keys_of(sess, v):
    return sorted(int(k) for k in sess.run(v.export()[0]))


def test_frequency_restrict_policy_keeps_most_trained_keys_and_drops_slots():
    v, sess, opt = train_pattern(de.FrequencyRestrictPolicy)
    assert isinstance(v.restrict_policy, de.FrequencyRestrictPolicy)
    with sess:
        assert len(keys_of(sess, v)) == 12
        sess.run(v.restrict(4, trigger=20))  # 12 keys <= trigger: nothing happens
        assert len(keys_of(sess, v)) == 12
        sess.run(v.restrict(4))
        assert keys_of(sess, v) == [6, 7, 8, 9]
        # A removed key comes back with fresh slots.
        accum = v.get_slot_variables(opt)[0]
        assert accum.name.endswith("/Adagrad/accumulator")
        sess.run(v.upsert(i64([0]), f32([[0.0, 0.0]])))
        np.testing.assert_allclose(sess.run(accum.lookup(i64([0, 9])))[0], 0.1)
        assert sess.run(accum.lookup(i64([9])))[0][0] > 0.1


def test_timestamp_restrict_policy_keeps_most_recent_keys():
    v, sess, _ = train_pattern(de.TimestampRestrictPolicy)
    with sess:
        sess.run(v.restrict(2))
        # Seen in the last step: 9 and 20.
        assert keys_of(sess, v) == [9, 20]


def test_restrict_per_shard_and_without_policy():
    v, sess, _ = train_pattern(de.FrequencyRestrictPolicy, devices=2)
    with sess:
        sess.run(v.restrict(4))
        # int(4 / 2) keys per shard: even keys 8, 6; odd keys 9, 7.
        assert keys_of(sess, v) == [6, 7, 8, 9]
    plain = de.Variable(dim=2, name="plain")
    assert plain.restrict(3) is None
    with pytest.raises(TypeError, match="int"):
        v.restrict(2.5)
    with pytest.raises(ValueError, match="num_reserved"):
        v.restrict(-1)


def test_a_policy_made_after_the_variable_turns_statistics_on():
    """de.FrequencyRestrictPolicy(var) / TimestampRestrictPolicy(var) for a variable created
    without one (TFRA's pattern): its tables start counting then; apply_update records
    seen-now, and restrict by count keeps the keys updated most often since."""
    v = de.Variable(dim=2, devices=["/CPU:0"] * 2, name="late_policy")
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    by_time = de.TimestampRestrictPolicy(v)
    by_count = de.FrequencyRestrictPolicy(v)
    update = by_time.apply_update(ids)
    with new_session() as sess:
        sess.run(update, {ids: [0, 1, 2, 3]})
        for _ in range(2):
            sess.run(update, {ids: [1, 2, 3]})
        sess.run(update, {ids: [2, 3]})
        keys, clocks = sess.run(by_time.status.export())
        clock = dict(zip(keys.tolist(), clocks.tolist()))
        assert clock[0] < clock[1] < clock[2] == clock[3]
        keys, counts = sess.run(by_count.status.export())
        assert dict(zip(keys.tolist(), counts.tolist())) == {0: 1, 1: 3, 2: 4, 3: 4}
        sess.run(by_count.apply_restriction(2))
        assert keys_of(sess, v) == [2, 3]


def test_save_to_and_load_from_file_system(tmp_path, monkeypatch):
    """Key and value files: per shard (TFRA's names), per table, the whole directory into
    another shard count (routed by the partitioner), appended, and the TFRA_SAVED_KV
    environment variable replacing the directory; float64 values bit for bit."""
    keys = np.arange(-6, 14, dtype=np.int64)
    values = np.stack([keys * 1.5 + 1e-12, -keys + 1e-13], axis=1)
    v = de.Variable(dim=2, value_dtype=tf.float64, devices=["/CPU:0"] * 2, name="files")
    three = de.Variable(dim=2, value_dtype=tf.float64, devices=["/CPU:0"] * 3, name="three")
    same = de.Variable(dim=2, value_dtype=tf.float64, devices=["/CPU:0"] * 2, name="files")
    url = "file://" + str(tmp_path / "kv")
    save = v.save_to_file_system(url)
    with new_session() as sess:
        sess.run(v.upsert(keys, values))
        sess.run(same.upsert(i64([100]), tf.constant([[7.0, 7.0]], tf.float64)))
        sess.run(save)
        assert sorted(os.listdir(tmp_path / "kv")) == [
            "files_mht_%dof2_rank0_size1-%s" % (i, kind)
            for i in (1, 2)
            for kind in ("keys", "values")
        ]
        sess.run(three.load_from_file_system(url, load_entire_dir=True))
        assert sess.run([three.size(i) for i in range(3)]) == [7, 7, 6]  # keys mod 3
        np.testing.assert_array_equal(sess.run(three.lookup(keys)), values)
        sess.run(
            same.load_from_file_system(
                url,
                file_name_list=[  # upserts: key 100 stays
                    "files_mht_1of2_rank0_size1",
                    "files_mht_2of2_rank0_size1",
                ],
            )
        )
        want = as_dict(keys, values)
        want[100] = [7.0, 7.0]
        assert as_dict(*sess.run(same.export())) == want
        table = v.tables[0]
        assert sess.run(table.save_to_file_system(str(tmp_path / "t"), file_name="a")) == 10
        assert (
            sess.run(
                table.save_to_file_system(str(tmp_path / "t"), file_name="a", append_to_file=True)
            )
            == 20
        )
        monkeypatch.setenv("TFRA_SAVED_KV", str(tmp_path / "t"))
        fresh = de.Variable(dim=2, value_dtype=tf.float64, name="fresh")
        sess.run(fresh.tables[0].load_from_file_system("/nonexistent", file_name="a"))
        assert sorted(sess.run(fresh.export())[0].tolist()) == list(range(-6, 14, 2))
        with pytest.raises(tf.errors.OpError, match="no saved table 'missing'"):
            sess.run(fresh.tables[0].load_from_file_system("/x", file_name="missing"))


# --- Checkpoints and tf.estimator -----------------------------------------------------------


def test_saver_saves_and_restores_variables_with_slots(tmp_path):
    v = de.Variable(dim=2, initializer=0.5, devices=["/CPU:0"] * 2, name="saved")
    skipped = de.Variable(dim=2, initializer=0.5, checkpoint=False, name="skipped")
    ids = i64([1, 2, 3, 2])
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    loss = tf.reduce_sum(tf.square(de.embedding_lookup(v, ids))) + tf.reduce_sum(
        de.embedding_lookup(skipped, ids, name="s")
    )
    train = opt.minimize(loss)
    m = v.get_slot_variables(opt)[0].lookup(i64([1, 2, 3]))
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        saved = (as_dict(*sess.run(v.export())), sess.run(m))
        path = saver.save(sess, str(tmp_path / "model"))
        for _ in range(2):
            sess.run(train)
        sess.run(v.upsert(i64([99]), f32([[9.0, 9.0]])))
        skipped_after = as_dict(*sess.run(skipped.export()))
        saver.restore(sess, path)
        assert as_dict(*sess.run(v.export())) == saved[0]
        np.testing.assert_array_equal(sess.run(m), saved[1])
        assert as_dict(*sess.run(skipped.export())) == skipped_after  # not in checkpoints
        # Training continues from the restored rows, slots and step count.
        sess.run(train)
    assert not any("skipped" in name for name in os.listdir(tmp_path / "sparse-model"))


@pytest.mark.parametrize("shards", [(2, 3), (3, 1)])
def test_saver_restores_into_another_number_of_shards(tmp_path, shards):
    """A Saver checkpoint of a variable with m shards restores into the same variable with
    n shards: every key (negative ones too) with its row and Adam slots, each in the shard
    the partitioner names."""
    keys = np.arange(-7, 13, dtype=np.int64)
    saved = {}
    for step, count in enumerate(shards):
        with tf.Graph().as_default():
            v = de.Variable(dim=2, devices=["/CPU:0"] * count, name="resharded", initializer=-1.0)
            ids = tf.constant(keys)
            opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
            train = opt.minimize(tf.reduce_sum(de.embedding_lookup(v, ids) ** 2))
            fetch = [v.lookup(ids)] + [s.lookup(ids) for s in v.get_slot_variables(opt)]
            sizes = [v.size(i) for i in range(count)]
            saver = tf.compat.v1.train.Saver()
            with new_session() as sess:
                if step == 0:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    sess.run(train)
                    saved["rows"] = sess.run(fetch)
                    saver.save(sess, str(tmp_path / "model"))
                    continue
                saver.restore(sess, str(tmp_path / "model"))
                for got, want in zip(sess.run(fetch), saved["rows"]):
                    np.testing.assert_array_equal(got, want)
                assert sess.run(sizes) == [
                    int(np.sum(np.mod(keys, count) == i)) for i in range(count)
                ]


@pytest.mark.estimator
def test_estimator_trains_evaluates_and_predicts(tmp_path):
    rng = np.random.default_rng(3)
    users = rng.integers(0, 50, size=512).astype(np.int64)
    labels = (users % 2).astype(np.float32)  # learnable from the id alone

    def input_fn():
        return (
            tf.compat.v1.data.Dataset.from_tensor_slices(({"user": users}, labels))
            .repeat()
            .batch(64)
        )

    def model_fn(features, labels, mode):
        emb = de.get_variable(
            "user_emb", dim=4, initializer=tf.compat.v1.random_normal_initializer(0, 0.1)
        )
        vec = de.embedding_lookup(emb, features["user"], name="user")
        weights = tf.compat.v1.get_variable("w", [4], initializer=tf.ones_initializer())
        logits = tf.reduce_sum(vec * weights, axis=1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
        train = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            train_op=train,
            eval_metric_ops={
                "acc": tf.compat.v1.metrics.accuracy(labels, tf.cast(logits > 0, tf.float32))
            },
        )

    est = tf.estimator.Estimator(
        model_fn,
        model_dir=str(tmp_path),
        config=tf.estimator.RunConfig(
            session_config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
            )
        ),
    )
    est.train(input_fn, steps=150)
    result = est.evaluate(input_fn, steps=4)
    assert result["acc"] > 0.95
    probs = [p["p"] for _, p in zip(range(64), est.predict(lambda: input_fn().take(1)))]
    assert np.mean((np.array(probs) > 0.5) == labels[:64]) > 0.95


# --- Against TFRA 0.7.2 (where installed: make bench installs it) --------------------------


def _run_parity(library):
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfra_parity.py")
    out = subprocess.run(
        [sys.executable, script, library], capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_same_results_as_tfra():
    """lookup / upsert / remove / accum / export / size on 3 shards give identical results,
    and training losses and tables with Adam, Adagrad and SGD agree within float tolerance."""
    import importlib.util

    if importlib.util.find_spec("tensorflow_recommenders_addons") is None:
        pytest.skip("TFRA is not installed (make bench installs tensorflow-recommenders-addons)")
    ours, theirs = _run_parity("rec_sdk"), _run_parity("tfra")
    assert len(ours["semantics"]) == len(theirs["semantics"]) == 20
    for step, (a, b) in enumerate(zip(ours["semantics"], theirs["semantics"])):
        assert a == b, "step %d differs" % step
    for name in ("adam", "adagrad", "sgd"):
        a, b = ours["train_" + name], theirs["train_" + name]
        np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-5, atol=1e-6)
        assert a["export"][0] == b["export"][0]
        np.testing.assert_allclose(a["export"][1], b["export"][1], rtol=1e-4, atol=1e-5)


def test_math_and_data_flow_are_tensorflows_ops_with_gradients():
    data = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    indices, segments = tf.constant([0, 2, 2]), tf.constant([0, 0, 3])
    got = de.math.sparse_segment_sum(data, indices, segments, num_segments=5)
    grad = tf.gradients(tf.reduce_sum(got * 2.0), data)[0]
    sp = tf.SparseTensor([[0, 0], [2, 1]], tf.constant([1.0, 2.0]), [3, 2])
    filled, empty = de.math.sparse_fill_empty_rows(sp, -1.0)
    reshaped = de.math.sparse_reshape(sp, [2, 3])
    parts = de.data_flow.dynamic_partition(tf.constant([10, 20, 30]), tf.constant([1, 0, 1]), 2)
    stitched = de.data_flow.dynamic_stitch([tf.constant([1]), tf.constant([0, 2])], parts)
    with new_session() as sess:
        g, gr, f, e, r, st = sess.run([got, grad, filled, empty, reshaped, stitched])
    np.testing.assert_array_equal(g, [[6, 8], [0, 0], [0, 0], [5, 6], [0, 0]])
    np.testing.assert_array_equal(gr, [[2, 2], [0, 0], [4, 4]])
    np.testing.assert_array_equal(f.values, [1.0, -1.0, 2.0])
    np.testing.assert_array_equal(e, [False, True, False])
    assert list(r.dense_shape) == [2, 3]
    np.testing.assert_array_equal(st, [10, 20, 30])  # stitching the partitions back


def test_kv_creators_map_onto_rec_sdks_table_and_other_back_ends_say_they_are_absent():
    creator = de.CuckooHashTableCreator(saver=de.FileSystemSaver())
    v = de.get_variable("cuckoo", dim=2, kv_creator=creator)
    assert v.kv_creator is creator and isinstance(creator.config, de.CuckooHashTableConfig)
    with pytest.raises(TypeError, match="kv_creator"):
        de.Variable(dim=2, name="bad_creator", kv_creator="cuckoo")
    for name in (
        "RedisTableConfig",
        "RedisTableCreator",
        "HkvHashTableConfig",
        "HkvHashTableCreator",
    ):
        with pytest.raises(NotImplementedError, match="not available in rec_sdk"):
            getattr(de, name)()


@pytest.mark.parametrize("how", ["object", "regex", "rename", "hook"])
def test_warm_start_loads_chosen_variables_from_a_checkpoint(tmp_path, how):
    prefix = str(tmp_path / "ckpt")
    keys, values = list(range(10)), [[float(k)] * 2 for k in range(10)]
    saved_name = "saved_emb" if how == "rename" else "emb"
    with tf.Graph().as_default():
        v = de.get_variable(saved_name, dim=2, devices=["/CPU:0"] * 2)
        dense = tf.compat.v1.get_variable("dense", initializer=1.0)
        with new_session() as sess:
            sess.run([v.upsert(keys, values), dense.initializer])
            assert tf.compat.v1.train.Saver(var_list=[v, dense]).save(sess, prefix) == prefix
            assert (
                tf.compat.v1.train.Saver(var_list=[v]).save(sess, prefix + "_tables")
                == prefix + "_tables"
            )  # tables only: TensorFlow's part is empty
    with tf.Graph().as_default():
        v = de.get_variable("emb", dim=2, devices=["/CPU:0"] * 2)
        other = de.get_variable("other", dim=2)
        chosen = {"object": [v], "regex": ["em.*"], "rename": [v], "hook": [v]}[how]
        renames = {"emb": "saved_emb"} if how == "rename" else None
        looked = v.lookup(keys)
        with new_session() as sess:
            if how == "hook":
                hook = de.WarmStartHook(prefix, chosen)
                hook.begin()
                hook.after_create_session(sess, None)
            else:
                sess.run(de.warm_start(str(tmp_path), chosen, renames))  # a directory works
            np.testing.assert_array_equal(sess.run(looked), values)
            assert sess.run(other.size()) == 0
