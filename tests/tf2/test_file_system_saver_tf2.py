"""TFRA's FileSystemSaver with Keras (de.keras.file_system): processes that each hold their
own tables save them as key and value files with the model (Model.save, save_weights) or with
var.save_to_file_system, and Model.load_weights gives each process the keys of its rank, for
any number of processes. Several "processes" are models built one after another here, against
a dict of every key."""

import os

import numpy as np
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk.base.tf_compat import keras

KEYS = np.arange(30, dtype=np.int64)


def _model(size, rank):
    keras.backend.clear_session()
    ids = keras.layers.Input(shape=(1,), dtype=tf.int64)
    saver = de.FileSystemSaver(proc_size=size, proc_rank=rank)
    out = de.keras.layers.Embedding(
        1, initializer=0.0, name="fs_emb", kv_creator=de.CuckooHashTableCreator(saver=saver)
    )(ids)
    plain = de.keras.layers.Embedding(1, initializer=0.0, name="plain_emb")(ids)
    return keras.Model(ids, tf.concat([out, plain], 1))


def _table(model, name="fs_emb"):
    keys, values = model.get_layer(name).params.export()
    return dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))


def _save_from_3_processes(path, save):
    """Process r of 3 holds keys r*10 .. r*10+9 (value = key); process 0 saves the model."""
    de_dir = os.path.join(path, "variables", "TFRADynamicEmbedding")
    for rank in range(3):
        model = _model(3, rank)
        mine = KEYS[rank * 10 : (rank + 1) * 10]
        model.get_layer("fs_emb").params.upsert(mine, mine[:, None].astype(np.float32))
        if rank == 0:
            model.get_layer("plain_emb").params.upsert(mine, -mine[:, None].astype(np.float32))
            save(model)
        else:
            model.get_layer("fs_emb").params.save_to_file_system(
                de_dir, proc_size=3, proc_rank=rank
            )


def test_each_process_loads_its_ranks_keys_for_any_process_count(tmp_path):
    path = str(tmp_path / "saved")
    _save_from_3_processes(path, lambda model: model.save(path))
    for size in (3, 5, 1):
        loaded = {}
        for rank in range(size):
            model = _model(size, rank)
            model.load_weights(path).expect_partial()
            table = _table(model)
            assert all(key % size == rank for key in table), (size, rank, sorted(table))
            loaded.update(table)
            # A variable without the saver restores the checkpoint's tensors (rank 0's).
            assert _table(model, "plain_emb") == {k: -float(k) for k in range(10)}
        assert loaded == {k: float(k) for k in KEYS.tolist()}


def test_save_weights_writes_the_files_beside_the_checkpoint(tmp_path):
    prefix = str(tmp_path / "weights" / "ckpt")
    model = _model(1, 0)
    model.get_layer("fs_emb").params.upsert(KEYS, KEYS[:, None].astype(np.float32))
    model.save_weights(prefix)
    assert model.get_layer("fs_emb").params.saved_files(
        str(tmp_path / "weights" / "TFRADynamicEmbedding")
    )
    fresh = _model(1, 0)
    fresh.load_weights(prefix)
    assert _table(fresh) == {k: float(k) for k in KEYS.tolist()}
