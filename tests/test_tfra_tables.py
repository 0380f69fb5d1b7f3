"""de.Variable.tables: TFRA's table interface over each shard, against what TFRA's
CuckooHashTable does (tensorflow_recommenders_addons/dynamic_embedding/python/ops/
cuckoo_hashtable_ops.py, v0.7.2): size() an int64 tensor placed with the table, export()
(keys, values) of that shard, lookup with dynamic_default_values and return_exists, insert /
remove / clear / accum on that shard alone, `saveable` with `<table op>-keys` / `-values`
specs whose restore imports (replaces the rows). Reference: a dict per shard."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from helpers import new_session

DIM = 2


def _variable(name="tt", key_dtype=tf.int64, **kwargs):
    return de.get_variable(
        name,
        key_dtype=key_dtype,
        dim=DIM,
        devices=["/CPU:0"] * 2,
        initializer=tf.compat.v1.constant_initializer(-1.0),
        **kwargs,
    )


def _rows(keys):
    return np.array([[k, 10 * k] for k in keys], np.float32)


def _as_dict(keys, values):
    return {k: v.tolist() for k, v in zip(keys.tolist(), values)}


def test_each_table_is_its_shard_with_tfras_methods():
    var = _variable()
    keys = np.arange(0, 12, dtype=np.int64)
    shards = [{k: _rows([k])[0].tolist() for k in keys.tolist() if k % 2 == i} for i in range(2)]
    tables = var.tables
    assert [t.name for t in tables] == ["tt_mht_1of2", "tt_mht_2of2"]
    assert tables[0] == var.tables[0] and tables[0] != tables[1]
    assert tables[0].resource_handle is var.shards[0].handle
    assert (tables[0].key_dtype, tables[0].value_dtype) == (tf.int64, tf.float32)
    sizes = [t.size() for t in tables]
    assert all(isinstance(s, tf.Tensor) and s.dtype == tf.int64 and s.shape == [] for s in sizes)
    exports = [t.export() for t in tables]
    probe = tf.constant([0, 1, 2, 99], tf.int64)
    found, exists = tables[0].lookup(probe, return_exists=True)
    defaulted = tables[0].lookup(probe, dynamic_default_values=tf.fill([4, DIM], 7.0))
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(var.upsert(keys, _rows(keys)))
        assert sess.run(sizes) == [6, 6]
        for table_export, want in zip(sess.run(exports), shards):
            assert _as_dict(*table_export) == want
        got, present = sess.run([found, exists])
        # Shard 0 holds the even keys: 1 is shard 1's, 99 nobody's (initial values).
        assert present.tolist() == [True, False, True, False]
        np.testing.assert_array_equal(got, [[0, 0], [-1, -1], [2, 20], [-1, -1]])
        np.testing.assert_array_equal(sess.run(defaulted), [[0, 0], [7, 7], [2, 20], [7, 7]])
        assert sess.run(sizes) == [6, 6]  # lookups insert nothing

        # insert, remove and clear act on that table alone, whatever the partitioner says.
        sess.run(tables[0].insert(tf.constant([101], tf.int64), _rows([101])))
        sess.run(tables[1].remove(tf.constant([1, 3, 4], tf.int64)))
        assert sess.run(sizes) == [7, 4]
        shards[0][101] = _rows([101])[0].tolist()
        del shards[1][1], shards[1][3]
        for table_export, want in zip(sess.run(exports), shards):
            assert _as_dict(*table_export) == want
        sess.run(tables[1].clear())
        assert sess.run(sizes) == [7, 0]


def test_accum_adds_to_stored_keys_and_inserts_absent_ones():
    var = _variable("acc")
    table = var.tables[0]
    keys = tf.constant([0, 2, 4, 6], tf.int64)
    deltas = np.array([[1, 1], [2, 2], [3, 3], [4, 4]], np.float32)
    # 0: stored, exists -> added; 2: stored, not exists -> left; 4: absent, exists -> left;
    # 6: absent, not exists -> inserted.
    accum = table.accum(keys, deltas, tf.constant([True, False, True, False]))
    with new_session() as sess:
        sess.run(table.insert(tf.constant([0, 2], tf.int64), _rows([0, 2])))
        sess.run(accum)
        assert _as_dict(*sess.run(table.export())) == {0: [1, 1], 2: [2, 20], 6: [4, 4]}


def test_remove_takes_a_tensor_of_the_key_dtype():
    table = _variable("rm").tables[0]
    with pytest.raises(TypeError, match="key_dtype"):
        table.remove([1, 2])
    with pytest.raises(TypeError, match="key_dtype"):
        table.remove(tf.constant([1, 2], tf.int32))


def test_saveable_specs_are_the_table_ops_name_and_restore_imports():
    var = _variable("sv")
    table = var.tables[0]
    saveable = table.saveable
    # TFRA's table op name: <the variable's name scope>/<table name>.
    assert [s.name for s in saveable.specs] == ["sv/sv_mht_1of2-keys", "sv/sv_mht_1of2-values"]
    assert saveable.op == table and saveable.name == "sv/sv_mht_1of2"
    assert table.saveable is saveable and var.tables[0].saveable is saveable
    restored = saveable.restore((tf.constant([8, 10], tf.int64), _rows([8, 10])), None)
    with new_session() as sess:
        sess.run(table.insert(tf.constant([0, 2], tf.int64), _rows([0, 2])))
        keys, values = sess.run([s.tensor for s in saveable.specs])
        assert _as_dict(keys, values) == {0: [0, 0], 2: [2, 20]}
        sess.run(restored)  # TFRA's import: the table's rows are replaced
        assert _as_dict(*sess.run(table.export())) == {8: [8, 80], 10: [10, 100]}


def test_a_saver_of_one_table_restores_that_table(tmp_path):
    """TFRA's test_save_restore_only_table: Saver([var._tables[0]]) restores that shard."""
    path = str(tmp_path / "only")
    with tf.Graph().as_default():
        var = _variable("only")
        keys = np.arange(6, dtype=np.int64)
        with new_session() as sess:
            sess.run(var.upsert(keys, _rows(keys)))
            assert tf.compat.v1.train.Saver([var._tables[0]]).save(sess, path) == path
    with tf.Graph().as_default():
        var = _variable("only")
        with new_session() as sess:
            sess.run(var.upsert(tf.constant([0, 1], tf.int64), _rows([5, 5])))
            tf.compat.v1.train.Saver([var._tables[0]]).restore(sess, path)
            assert sess.run([t.size() for t in var.tables]) == [3, 1]
            assert _as_dict(*sess.run(var.tables[0].export())) == {
                k: _rows([k])[0].tolist() for k in (0, 2, 4)
            }


def test_string_keys_go_through_the_tables_as_strings():
    var = _variable(
        "st",
        key_dtype=tf.string,
    )
    tables = var.tables
    insert = tables[1].insert(tf.constant(["apple", "fig"]), _rows([1, 2]))
    looked_up = tables[1].lookup(tf.constant(["fig", "pear"]))
    with new_session() as sess:
        sess.run(insert)
        keys, values = sess.run(tables[1].export())
        assert _as_dict(np.array([k.decode() for k in keys]), values) == {
            "apple": [1, 10],
            "fig": [2, 20],
        }
        np.testing.assert_array_equal(sess.run(looked_up), [[2, 20], [-1, -1]])
        assert sess.run([t.size() for t in tables]) == [0, 2]


def _trained_graph(name):
    var = de.get_variable(
        name,
        dim=DIM,
        devices=["/CPU:0"] * 3,
        initializer=tf.keras.initializers.RandomNormal(seed=1),
    )
    emb = de.embedding_lookup(var, tf.range(10, dtype=tf.int64))
    loss = tf.reduce_sum(emb * emb)
    return var, de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)


def _trained_checkpoint(path, name, tfra_tensors=True):
    """A de.Variable (3 shards, Adam) trained one step and saved by a Saver of everything;
    -> its rows {key: values}."""
    de.enable_tfra_checkpoint_tensors(tfra_tensors)
    try:
        with tf.Graph().as_default():
            var, step = _trained_graph(name)
            saver = tf.compat.v1.train.Saver(sharded=True)
            with new_session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(step)
                saver.save(sess, path)
                return _as_dict(*sess.run(var.export()))
    finally:
        de.enable_tfra_checkpoint_tensors(True)


def test_savers_write_tfras_checkpoint_tensors_and_warm_start_recipes_read_them(tmp_path):
    """TFRA's warm-start recipe (its movielens-100k-estimator-with-warmup demo): the spec names
    of `var._tables[i].saveable`, read from the TF checkpoint with restore_v2, imported by
    `saveable.restore`."""
    path = str(tmp_path / "model")
    trained = _trained_checkpoint(path, "ws")
    names = dict(tf.train.list_variables(path))
    assert sum(names["ws/ws_mht_%dof3-keys" % i][0] for i in (1, 2, 3)) == 10
    assert [names["ws/ws_mht_%dof3-values" % i][1] for i in (1, 2, 3)] == [DIM] * 3
    with tf.Graph().as_default():
        var = de.get_variable("ws", dim=DIM, devices=["/CPU:0"] * 3)
        specs = [t.saveable.specs for t in var._tables]
        tensors = tf.raw_ops.RestoreV2(
            prefix=path,
            tensor_names=[s[0].name for s in specs] + [s[1].name for s in specs],
            shape_and_slices=[""] * 6,
            dtypes=[tf.int64] * 3 + [tf.float32] * 3,
        )
        restores = [
            t.saveable.restore((tensors[i], tensors[3 + i]), None)
            for i, t in enumerate(var._tables)
        ]
        with new_session() as sess:
            sess.run(restores)
            assert _as_dict(*sess.run(var.export())) == trained
            assert sum(sess.run([t.size() for t in var.tables])) == 10


def test_tfra_tensors_are_written_only(tmp_path):
    """A Saver restores the rows (and slots) from the table files, never from TFRA's tensors:
    checkpoints written without them restore; with enable_tfra_checkpoint_tensors(False) a
    checkpoint holds none."""
    old = str(tmp_path / "without")
    trained = _trained_checkpoint(old, "wo", tfra_tensors=False)
    assert not [n for n, _ in tf.train.list_variables(old) if "mht" in n]
    with tf.Graph().as_default():
        var, _ = _trained_graph("wo")
        saver = tf.compat.v1.train.Saver()  # writes TFRA's tensors, does not read them
        with new_session() as sess:
            saver.restore(sess, old)
            assert _as_dict(*sess.run(var.export())) == trained
            saver.save(sess, str(tmp_path / "again"))
    assert (
        len([n for n, _ in tf.train.list_variables(str(tmp_path / "again")) if "wo_mht" in n]) == 6
    )
    with pytest.raises(TypeError, match="enabled must be a bool"):
        de.enable_tfra_checkpoint_tensors("no")


def test_optimizers_slot_dicts_list_de_slots_as_tfra_does():
    """TFRA's test_get_slot_variables: tf.compat.v1 optimizers' _slots[slot][trainable key] and
    legacy Keras optimizers' _slots[trainable key][slot] hold the de slots (`.params`: the
    SlotVariable), which optimizer.variables() leaves out (they are no variables)."""
    var = _variable("slotted")
    ids = tf.constant([1, 2, 3], tf.int64)

    def loss(name, tws):
        embed, tw = de.embedding_lookup(var, ids, return_trainable=True, name=name)
        tws[:] = [tw]
        return tf.reduce_sum(embed)

    v1 = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    tws = []
    v1.minimize(loss("g1", tws), var_list=tws)
    names = sorted(s.params.name for slot in ("m", "v") for s in v1._slots[slot].values())
    assert names == [s.name for s in var.get_slot_variables(v1)] and len(names) == 2
    assert [v for v in v1.variables() if not isinstance(v, tf.Variable)] == []
    legacy = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adam(0.1))
    legacy.minimize(lambda: loss("g2", tws), var_list=tws)
    names = sorted(s[n].params.name for s in legacy._slots.values() for n in ("m", "v"))
    assert names == [s.name for s in var.get_slot_variables(legacy)] and len(names) == 2
    with new_session() as sess:
        sess.run(tf.compat.v1.variables_initializer(v1.variables()))


def test_a_table_logs_its_creation_with_its_init_size():
    """TFRA's tables log their creation (its cuckoo test reads `init_size=` on stderr)."""
    script = (
        "import tensorflow as tf, rec_sdk.dynamic_embedding as de\n"
        "v = de.get_variable('logged', tf.int64, tf.int32, initializer=0, dim=8,"
        " init_size=12345)\nprint(int(v.size()))"
    )
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=os.pathsep.join(p for p in sys.path if p)
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    assert "table 'logged_mht_1of1" in result.stderr and "CPU" in result.stderr
    assert "init_size=12345" in result.stderr, result.stderr[-2000:]


def test_removing_a_string_key_from_a_shard_without_it_keeps_its_string():
    """A key inserted into another shard through its table keeps its string while any shard
    holds it (the string dictionary is the variable's)."""
    var = _variable("strs", key_dtype=tf.string)
    with new_session() as sess:
        sess.run(var.upsert(tf.constant(["a", "b", "c", "d"]), _rows([1, 2, 3, 4])))
        holder = 0 if b"a" in sess.run(var.tables[0].export()[0]).tolist() else 1
        sess.run(var.tables[1 - holder].remove(tf.constant(["a"])))  # not there: ignored
        sess.run(var.tables[1 - holder].insert(tf.constant(["a"]), _rows([9])))  # a copy
        sess.run(var.remove(tf.constant(["a"])))  # from its own shard: the copy lives on
        keys, values = sess.run(var.export())
        assert _as_dict(keys, values) == {
            b"b": [2, 20],
            b"c": [3, 30],
            b"d": [4, 40],
            b"a": [9, 90],
        }
        sess.run(var.tables[1 - holder].remove(tf.constant(["a"])))
        assert sorted(sess.run(var.export())[0].tolist()) == [b"b", b"c", b"d"]


def test_accum_needs_one_exists_flag_per_key():
    var = _variable("acc")
    with pytest.raises(ValueError, match="exists of 'acc' must have the keys' shape"):
        var.accum(
            tf.constant([1, 3], tf.int64),
            tf.zeros([2, DIM]),
            tf.ones([2, DIM]),
            tf.constant([False]),
        )
    flags = tf.compat.v1.placeholder(tf.bool, [None])
    accum = var.tables[0].accum(tf.constant([2, 4], tf.int64), tf.ones([2, DIM]), flags)
    with new_session() as sess:
        with pytest.raises(tf.errors.InvalidArgumentError, match="must have the keys.* shape"):
            sess.run(accum, {flags: [False]})
        assert sess.run(var.size()) == 0
        sess.run(accum, {flags: [False, False]})
        assert sess.run(var.size()) == 2


def test_a_saver_of_de_tables_alone_writes_a_tensorflow_checkpoint(tmp_path):
    """As TFRA's: Saver() of a graph whose only state is de tables (and Saver([var])) writes
    the TF checkpoint (TFRA's tensors) and its state file, and restores."""
    for i, named in enumerate((False, True)):
        directory = str(tmp_path / str(i))
        with tf.Graph().as_default():
            var = _variable("alone")
            keys = np.arange(5, dtype=np.int64)
            saver = tf.compat.v1.train.Saver([var] if named else None)
            with new_session() as sess:
                sess.run(var.upsert(keys, _rows(keys)))
                path = saver.save(sess, directory + "/m")
                assert tf.train.latest_checkpoint(directory) == path
                assert sorted(dict(tf.train.list_variables(path))) == [
                    "alone/alone_mht_%dof2-%s" % (s, w) for s in (1, 2) for w in ("keys", "values")
                ]
                sess.run(var.clear())
                saver.restore(sess, path)
                assert _as_dict(*sess.run(var.export())) == _as_dict(keys, _rows(keys))


def test_the_de_adam_powers_are_the_optimizers_variables():
    var = _variable("powered")
    emb = de.embedding_lookup(var, tf.constant([1, 2], tf.int64), name="pw")
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    step = opt.minimize(tf.reduce_sum(emb))
    assert len([v for v in opt.variables() if "_de_beta" in v.name]) == 2
    with new_session() as sess:
        sess.run(tf.compat.v1.variables_initializer(opt.variables()))
        sess.run(step)


def test_tables_of_a_graph_not_the_default_one():
    for key_dtype in (tf.int64, tf.string):
        graph = tf.Graph()
        with graph.as_default():
            var = _variable("elsewhere", key_dtype=key_dtype)
        for made in (
            var.tables[0].export()[0],
            var.export()[0],
            var.tables[0].saveable.specs[0].tensor,
        ):
            assert made.graph is graph


def test_no_devices_means_the_cpu():
    """TFRA's `devices or default devices`: a script passing devices=[] (no ps tasks)."""
    assert de.get_variable("nodev", dim=DIM, devices=[]).devices == ["/CPU:0"]
