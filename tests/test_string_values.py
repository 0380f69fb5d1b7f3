"""de.Variables of string values (TFRA's [int64, string]) in graph mode, against a dict:
upsert / remove / lookup (with and without return_exists) / export / size / clear over 3
shards; a Saver's round trip through TFRA's checkpoint tensors; bad input. Eagerly and
tf.train.Checkpoint: tests/tf2/test_dynamic_embedding_tf2.py."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from helpers import new_session

DIM = 3


def _row(key):
    return ["k%d_%d" % (key, j) for j in range(DIM)]


def _variable(name, key_dtype=tf.int64, **kwargs):
    return de.get_variable(
        name,
        key_dtype=key_dtype,
        value_dtype=tf.string,
        dim=DIM,
        devices=["/CPU:0"] * 3,
        initializer="none",
        **kwargs,
    )


def _replay(run, var, key_dtype):
    """Random upserts and removes, each checked against a dict."""
    rng = np.random.RandomState(0)
    reference = {}
    for _ in range(6):
        keys = np.unique(rng.randint(-20, 20, 12)).astype(key_dtype.as_numpy_dtype)
        run(var.upsert(keys, np.array([_row(k) for k in keys])))
        reference.update({int(k): _row(k) for k in keys})
        removed = rng.randint(-20, 20, 5).astype(key_dtype.as_numpy_dtype)
        run(var.remove(tf.constant(removed)))
        for k in removed:
            reference.pop(int(k), None)
        assert run(var.size()) == len(reference)
        probe = np.arange(-22, 22).astype(key_dtype.as_numpy_dtype).reshape([4, 11])
        values, exists = run(var.lookup(probe, return_exists=True))
        assert values.shape == (4, 11, DIM)
        for k, v, e in zip(probe.ravel(), values.reshape([-1, DIM]), exists.ravel()):
            assert bool(e) == (int(k) in reference)
            assert [x.decode() for x in v] == reference.get(int(k), ["none"] * DIM)
        keys, values = run(var.export())
        assert {int(k): [x.decode() for x in v] for k, v in zip(keys, values)} == reference
        assert sum(run(t.size()) for t in var.tables) == len(reference)
    return reference


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
def test_string_values_behave_as_a_dict_in_a_graph(key_dtype):
    with tf.Graph().as_default():
        var = _variable("sv_graph", key_dtype)
        assert isinstance(var, de.Variable) and var.value_dtype == tf.string
        with new_session() as sess:
            _replay(sess.run, var, key_dtype)
            sess.run(var.clear())
            assert sess.run(var.size()) == 0


def test_a_saver_restores_string_values_from_tfras_tensors(tmp_path):
    path = str(tmp_path / "model")
    with tf.Graph().as_default():
        var = _variable("sv_saved")
        with new_session() as sess:
            reference = _replay(sess.run, var, tf.int64)
            tf.compat.v1.train.Saver().save(sess, path)
    names = [n for n, _ in tf.train.list_variables(path)]
    assert "sv_saved/sv_saved_mht_1of3-keys" in names
    with tf.Graph().as_default():
        var = _variable("sv_saved")
        with new_session() as sess:
            tf.compat.v1.train.Saver().restore(sess, path)
            keys, values = sess.run(var.export())
    assert {int(k): [x.decode() for x in v] for k, v in zip(keys, values)} == reference


def test_bad_string_variables_are_refused():
    with pytest.raises(TypeError, match="string values take tf.int64 or tf.int32 keys"):
        de.Variable(key_dtype=tf.string, value_dtype=tf.string, name="sv_bad1")
    with pytest.raises(ValueError, match="must be a string or 1 or 3"):
        de.Variable(value_dtype=tf.string, dim=DIM, initializer=["a", "b"], name="sv_bad2")
    with pytest.raises(TypeError, match="must be a string or an array of strings"):
        de.Variable(value_dtype=tf.string, initializer=tf.zeros_initializer(), name="sv_bad3")
    var = de.Variable(value_dtype=tf.string, dim=DIM, name="sv_bad4")
    with pytest.raises(TypeError, match="not embedded or trained"):
        de.embedding_lookup(var, tf.constant([1], tf.int64))
    with pytest.raises(TypeError, match="cannot be added"):
        var.accum([1], [["a"] * DIM], [["b"] * DIM], [True])
    with pytest.raises(ValueError, match="must be string \\(the value_dtype\\)"):
        var.upsert(tf.constant([1], tf.int64), tf.zeros([1, DIM]))


def test_string_tables_have_tfras_table_interface(tmp_path):
    var = _variable("sv_tables")
    table = var.tables[0]
    assert table.name == "sv_tables_mht_1of3" and table.value_dtype == tf.string
    with new_session() as sess:
        sess.run(table.insert(tf.constant([3, 6], tf.int64), np.array([_row(3), _row(6)])))
        values, exists = sess.run(table.lookup(tf.constant([3, 4], tf.int64), return_exists=True))
        assert exists.tolist() == [True, False]
        assert [x.decode() for x in values[1]] == ["none"] * DIM
        given = sess.run(
            table.lookup(tf.constant([4], tf.int64), dynamic_default_values=[["x"] * DIM])
        )
        assert [x.decode() for x in given[0]] == ["x"] * DIM
        assert [s.name for s in table.saveable.specs] == [
            "sv_tables/sv_tables_mht_1of3-keys",
            "sv_tables/sv_tables_mht_1of3-values",
        ]
        sess.run(table.saveable.restore((tf.constant([9], tf.int64), tf.constant([_row(9)])), None))
        assert sess.run(table.export())[0].tolist() == [9]
        sess.run(table.clear())
        assert sess.run(table.size()) == 0
    with pytest.raises(TypeError, match="key and value files cannot hold"):
        var.save_to_file_system(str(tmp_path))
    with pytest.raises(ValueError, match="values of 'sv_tables' must be strings"):
        var.upsert([1, 2], [[1.0] * DIM, [2.0] * DIM])
