"""de.Variables of string values eagerly, against a dict, and through tf.train.Checkpoint
into another number of shards and a SavedModel (graph mode: tests/test_string_values.py)."""

import numpy as np
import tensorflow as tf

import rec_sdk.dynamic_embedding as de

DIM = 2


def _row(key):
    return ["k%d_%d" % (key, j) for j in range(DIM)]


def _as_dict(keys, values):
    return {int(k): [x.decode() for x in v] for k, v in zip(keys.numpy(), values.numpy())}


def test_string_values_eagerly_against_a_dict():
    var = de.Variable(
        value_dtype=tf.string, dim=DIM, devices=["/CPU:0"] * 3, initializer="?", name="sv_eager"
    )
    rng = np.random.RandomState(1)
    reference = {}
    for _ in range(5):
        keys = np.unique(rng.randint(0, 30, 10)).astype(np.int64)
        var.upsert(keys, np.array([_row(k) for k in keys]))
        reference.update({int(k): _row(k) for k in keys})
        removed = rng.randint(0, 30, 4).astype(np.int64)
        var.remove(tf.constant(removed))
        for k in removed:
            reference.pop(int(k), None)
        probe = np.arange(0, 32, dtype=np.int64)
        values, exists = var.lookup(probe, return_exists=True)
        assert exists.numpy().tolist() == [int(k) in reference for k in probe]
        assert [[x.decode() for x in v] for v in values.numpy()] == [
            reference.get(int(k), ["?"] * DIM) for k in probe
        ]
        assert _as_dict(*var.export()) == reference
        assert int(var.size()) == len(reference)


def test_string_values_through_a_checkpoint_and_a_saved_model(tmp_path):
    var = de.Variable(value_dtype=tf.string, dim=DIM, devices=["/CPU:0"] * 3, name="sv_ck")
    var.upsert(tf.constant([1, 2, 3], tf.int64), np.array([_row(k) for k in (1, 2, 3)]))
    path = tf.train.Checkpoint(v=var).write(str(tmp_path / "ck"))
    other = de.Variable(value_dtype=tf.string, dim=DIM, devices=["/CPU:0"] * 2, name="sv_ck2")
    other.upsert(tf.constant([9], tf.int64), np.array([_row(9)]))
    tf.train.Checkpoint(v=other).read(path).assert_consumed()
    assert _as_dict(*other.export()) == {k: _row(k) for k in (1, 2, 3)}

    module = tf.Module()
    module.var = other
    module.read = tf.function(
        lambda keys: other.lookup(keys), input_signature=[tf.TensorSpec([None], tf.int64)]
    )
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    got = loaded.read(tf.constant([2, 3, 4], tf.int64)).numpy()
    assert [[x.decode() for x in v] for v in got] == [_row(2), _row(3), [""] * DIM]
