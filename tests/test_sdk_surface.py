"""The SDK's public names at their mx_rec paths (rec_sdk for mx_rec), one by one: constants
and enums, the logger, hccl_ops, ConfigInitializer and the initialize functions, the host
pipeline ops (set_threshold against a NumPy admission reference), eos_map, tf_version_adapter,
the lookup collections, FeatureSpec naming, thresholds from FeatureSpecs and configs,
timestamps, Saver directories, padding keys, optimizer learning-rate attributes, and the
errors for what rec_sdk does not have."""

import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
import rec_sdk.util as rec_util
from helpers import new_session
from rec_sdk.constants import constants
from rec_sdk.constants.constants import ApplyGradientsStrategy, BaseEnum
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.distribute.ranks import shards_of
from rec_sdk.graph.modifier import GraphModifierHook
from rec_sdk.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from rec_sdk.util import initialize, log
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.initialize import ConfigInitializer, init
from rec_sdk.util.ops import import_host_pipeline_ops
from rec_sdk.util.tf_version_adapter import hccl_ops as npu_hccl_ops
from rec_sdk.util.tf_version_adapter import npu_ops

DIM = 2


def _table(name="t", **kwargs):
    kwargs.setdefault("device_vocabulary_size", 1000)
    return create_table(tf.int64, DIM, name, tf.compat.v1.constant_initializer(0.5), **kwargs)


# ---- constants ---------------------------------------------------------------------------


def test_collection_names_are_the_ones_rec_sdk_uses():
    assert rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB is constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB
    assert rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET is constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET
    assert rec_sdk.TIMESTAMP_COLLECTION == constants.ASCEND_TIMESTAMP == "ASCEND_TIMESTAMP"
    assert constants.ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS == "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
    assert constants.MULTI_LOOKUP_TIMES == 128 and constants.MAX_INT32 == 2**31 - 1


def test_enums_and_mapping():
    assert ApplyGradientsStrategy.mapping("direct_apply") is ApplyGradientsStrategy.DIRECT_APPLY
    assert (
        ApplyGradientsStrategy.mapping(ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY)
        is ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY
    )
    assert constants.All2allGradientsOp.SUM_GRADIENTS.value == "sum_gradients"
    assert constants.CacheModeEnum.mapping("SSD") is constants.CacheModeEnum.SSD

    class UseMode(BaseEnum):
        TRAIN = "train"
        PREDICT = "predict"

    assert UseMode.mapping("predict") is UseMode.PREDICT
    with pytest.raises(KeyError, match="UseMode has no member with value None.*'train'"):
        UseMode.mapping(None)


def test_apply_gradients_strategy_from_the_environment(monkeypatch):
    monkeypatch.delenv("APPLY_GRADIENTS_STRATEGY", raising=False)
    assert constants.apply_gradients_strategy() is ApplyGradientsStrategy.DIRECT_APPLY
    monkeypatch.setenv("APPLY_GRADIENTS_STRATEGY", "sum_same_id_gradients_and_apply")
    init()
    assert (
        ConfigInitializer.get_instance().apply_gradients_strategy
        is ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY
    )
    initialize.terminate_config_initializer()
    monkeypatch.setenv("APPLY_GRADIENTS_STRATEGY", "bogus")
    with pytest.raises(ValueError, match="APPLY_GRADIENTS_STRATEGY='bogus'"):
        init()


# ---- logger ------------------------------------------------------------------------------


def test_logger_honours_mxrec_log_level(monkeypatch):
    assert log.logger.name == "rec_sdk" and isinstance(log.logger, logging.Logger)
    monkeypatch.setenv("MXREC_LOG_LEVEL", "ERROR")
    try:
        assert log.get_logger().level == logging.ERROR
        monkeypatch.setenv("MXREC_LOG_LEVEL", "DEBUG")
        assert log.get_logger().level == logging.DEBUG
        monkeypatch.setenv("MXREC_LOG_LEVEL", "LOUD")
        with pytest.raises(ValueError, match="MXREC_LOG_LEVEL='LOUD'.*'DEBUG', 'INFO'"):
            log.get_logger()
    finally:
        monkeypatch.delenv("MXREC_LOG_LEVEL")
        log.get_logger()
    assert log.logger.level == logging.INFO
    # One handler however often the logger is configured.
    assert len(log.logger.handlers) == 1


def test_rec_sdk_messages_go_through_the_logger(caplog):
    caplog.set_level(logging.INFO, logger="rec_sdk")
    init(unknown_option=3)
    assert any(r.name == "rec_sdk" and "unknown_option" in r.getMessage() for r in caplog.records)


# ---- ranks -------------------------------------------------------------------------------


def test_hccl_ops_rank_of_one_process():
    assert hccl_ops.get_rank_id() == 0 and hccl_ops.get_rank_size() == 1  # before init too
    assert rec_util.communication.hccl_ops.get_rank_size() == 1
    init()
    assert initialize.get_rank_id() == 0 and initialize.get_rank_size() == 1
    assert ConfigInitializer.get_instance().rank_size == 1
    assert hccl_ops.get_local_rank_size() == 1 and hccl_ops.get_device_id() == 0


def test_init_takes_the_ranks_from_the_cluster(monkeypatch):
    """Without a cluster a process is rank 0 of 1 (other rank options and mpirun are errors);
    with TF_CONFIG its rank is its place among the chief and the workers, and its tables are
    shards placed on its own task (rank 0 also has a handle of every other rank's shard)."""
    with pytest.raises(ValueError, match="rank_size=2, but this process is one of 1 "):
        init(rank_size=2)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_SIZE=4 MPI ranks"):
        init()
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    for index, rank in ((1, 2), (0, 1)):
        monkeypatch.setenv(
            "TF_CONFIG",
            json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        with pytest.raises(ValueError, match="rank_id=0, but this process is rank %d of 3" % rank):
            init(rank_id=0)
        init(rank_size=3)
        assert (hccl_ops.get_rank_id(), hccl_ops.get_rank_size()) == (rank, 3)
        assert (initialize.get_rank_id(), ConfigInitializer.get_instance().rank_size) == (rank, 3)
        with tf.Graph().as_default():
            table = create_table(
                tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=300
            )
            assert table.ranks.rank == rank and list(shards_of(table)) == [rank]
            assert table.handle.device == "/job:worker/replica:0/task:%d/device:CPU:0" % index
            assert table.capacity_rows == 100  # the vocabulary is divided over the ranks
            reduced = npu_hccl_ops.allreduce(tf.constant([1.0]), "sum")
            assert reduced.op.type == "CollectiveReduceV2"
        initialize.terminate_config_initializer()
        assert hccl_ops.get_rank_size() == 1
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                "task": {"type": "chief", "index": 0},
            }
        ),
    )
    init()
    with tf.Graph().as_default():
        table = create_table(
            tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=10
        )
        assert sorted(shards_of(table)) == [0, 1]
        assert shards_of(table)[1].handle.device == "/job:worker/replica:0/task:0/device:CPU:0"
    initialize.terminate_config_initializer()
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": dict(cluster, ps=["127.0.0.1:4"]), "task": {"type": "chief", "index": 0}}
        ),
    )
    init()
    with tf.Graph().as_default(), pytest.raises(ValueError, match="the cluster has ps tasks"):
        create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())


# ---- ConfigInitializer and initialize -----------------------------------------------------


def test_config_initializer():
    with pytest.raises(RuntimeError, match="not initialised"):
        ConfigInitializer.get_instance()
    init(
        train_steps=10,
        eval_steps=2,
        use_dynamic=False,
        use_dynamic_expansion=True,
        if_load=False,
        use_hot=True,
        bind_cpu=False,
        use_lccl=False,
    )
    config = ConfigInitializer.get_instance()
    assert config is initialize.get_config() is rec_util.ConfigInitializer.get_instance()
    assert config.use_static and not config.use_dynamic and config.use_dynamic_expansion
    assert config.train_steps == 10 and config.eval_steps == 2 and config.use_hot
    config.if_load = True
    assert initialize.get_if_load() is True
    initialize.set_if_load(False)
    assert config.if_load is False
    with pytest.raises(TypeError, match="if_load must be a bool"):
        config.if_load = 1
    config.save_steps = 5
    assert initialize.get_save_steps() == 5
    with pytest.raises(ValueError, match="train_steps must be in \\[-1"):
        config.train_steps = -2
    params = config.train_params_config
    assert params.get_training_mode_channel_id(True) == constants.TRAIN_CHANNEL_ID == 0
    assert params.get_training_mode_channel_id(False) == constants.EVAL_CHANNEL_ID == 1
    with pytest.raises(ValueError, match="no training iterator was modified"):
        params.get_initializer(True)
    assert params.is_graph_modify_hook_running is False
    GraphModifierHook()
    assert params.is_graph_modify_hook_running is True
    assert (
        config.host_pipeline_ops is initialize.get_host_pipeline_ops() is import_host_pipeline_ops()
    )


def test_init_option_checks():
    with pytest.raises(TypeError, match="use_hot must be a bool"):
        init(use_hot=1)
    with pytest.raises(ValueError, match="save_delta_checkpoints_secs=60.*timed incremental"):
        init(save_delta_checkpoints_secs=60)
    init(save_delta_checkpoints_secs=None, prefetch_batch_number=1)


def test_clear_channel_is_an_op():
    init()
    with tf.compat.v1.Session() as sess:
        sess.run(initialize.clear_channel(is_train_channel=False))
        sess.run(import_host_pipeline_ops().clear_channel(0))
    with pytest.raises(TypeError, match="is_train_channel must be a bool"):
        initialize.clear_channel(1)
    with pytest.raises(ValueError, match="channel_id must be 0 .* or 1 .*got 2"):
        import_host_pipeline_ops().clear_channel(2)


# ---- host pipeline ops ---------------------------------------------------------------------


def test_set_threshold_changes_admission_at_run_time():
    init()
    table = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(table, ids, access_and_evict_config={"access_threshold": 2})
    new_threshold = tf.compat.v1.placeholder(tf.int32, [None])
    ops = import_host_pipeline_ops()
    set_op = ops.set_threshold(new_threshold, emb_name="t", ids_name="t_lookup")
    # NumPy reference of admission: counts per key, threshold per step.
    counts, admitted = {}, set()
    steps = [([1, 2, 2], 2), ([1, 3], 2), ([3, 4, 4, 4], 5), ([1, 3, 4, 4], 5), ([5], 0)]
    with new_session() as sess:
        current = 2
        for batch, threshold in steps:
            if threshold != current:
                assert sess.run(set_op, {new_threshold: [threshold, 99]}) == 1
                current = threshold
            for key in batch:
                if key not in admitted:
                    counts[key] = counts.get(key, 0) + 1
            for key in set(batch):
                if key not in admitted and counts[key] >= threshold:
                    admitted.add(key)
            out = sess.run(emb, {ids: batch})
            expected = [[0.5] * DIM if k in admitted else [0.0] * DIM for k in batch]
            np.testing.assert_allclose(out, expected)
        assert sess.run(table.size_tensor()) == len(admitted) == 4
        with pytest.raises(tf.errors.InvalidArgumentError, match="threshold must be >= 0"):
            sess.run(set_op, {new_threshold: [-1]})
        huge = tf.compat.v1.placeholder(tf.int64, [])
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="threshold must be in \\[-1, 2147483647\\]"
        ):
            sess.run(table.set_access_threshold(huge), {huge: 2**40})


def test_set_threshold_errors():
    init()
    plain = _table("plain")
    sparse_lookup(plain, tf.constant([1], tf.int64))
    ops = import_host_pipeline_ops()
    with pytest.raises(ValueError, match="emb_name='missing' is not a table.*'plain'"):
        ops.set_threshold(tf.constant(3), emb_name="missing")
    with pytest.raises(ValueError, match="table 'plain' has no feature admission"):
        ops.set_threshold(tf.constant(3), emb_name="plain")
    with pytest.raises(
        ValueError,
        match="ids_name='other' is not a lookup of table 'plain' "
        "\\(its lookups: \\['plain_lookup'\\]\\)",
    ):
        ops.set_threshold(tf.constant(3), emb_name="plain", ids_name="other")
    with pytest.raises(TypeError, match="must be int32"):
        ops.set_threshold(tf.constant(3.0), emb_name="plain")
    with pytest.raises(AttributeError, match="'read_emb_key_v2' belongs to the SDK's NPU"):
        ops.read_emb_key_v2  # noqa: B018  (the access raises)
    with pytest.raises(ValueError, match="so_pkg_name must be None or one of"):
        import_host_pipeline_ops("libother.so")
    assert import_host_pipeline_ops(constants.LIBREC_EOS_OPS_SO) is ops


def test_return_timestamp_in_a_dataset():
    ops = import_host_pipeline_ops()
    dataset = tf.data.Dataset.range(3).map(lambda x: {"x": x, "timestamp": ops.return_timestamp(x)})
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    before = int(time.time())
    with new_session() as sess:
        stamps = [sess.run(batch)["timestamp"] for _ in range(3)]
    assert all(before <= s <= int(time.time()) for s in stamps)


def test_eos_map_ends_each_channel_after_its_steps():
    librec = import_host_pipeline_ops(constants.LIBREC_EOS_OPS_SO)

    def values(dataset):
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        out = []
        with new_session() as sess:
            while True:
                try:
                    out.append(int(sess.run(batch)))
                except tf.errors.OutOfRangeError:
                    return out

    data = tf.data.Dataset.range(6)
    assert values(data.eos_map(librec, 0, 4, 2)) == [0, 1, 2, 3]
    assert values(data.eos_map(librec, 1, 4, 2)) == [0, 1]
    assert values(data.eos_map(librec, 0)) == list(range(6))
    with pytest.raises(TypeError, match="librec must come from"):
        data.eos_map(object(), 0)
    with pytest.raises(ValueError, match="channel_id must be 0"):
        data.eos_map(librec, 3)


def test_tf_version_adapter():
    x = tf.constant([1.0, 2.0])
    with new_session() as sess:
        np.testing.assert_allclose(sess.run(npu_hccl_ops.allreduce(x, "sum")), [1.0, 2.0])
        np.testing.assert_allclose(sess.run(npu_ops.dropout(x, keep_prob=1.0)), [1.0, 2.0])
        kept = sess.run(npu_ops.dropout(tf.ones([1000]), keep_prob=0.5, seed=1))
    assert set(np.unique(kept).tolist()) <= {0.0, 2.0} and 300 < (kept > 0).sum() < 700
    with pytest.raises(ValueError, match="reduction must be one of"):
        npu_hccl_ops.allreduce(x, "mean")


# ---- lookups -----------------------------------------------------------------------------


def test_unique_keys_collection_parallels_the_lookup_collections():
    init(use_dynamic_expansion=True)
    table = _table()
    ids = tf.constant([[3, 1], [3, 3]], tf.int64)
    sparse_lookup(table, ids, name="a")
    sparse_lookup(table, ids, is_train=False, name="eval")  # evaluation registers nothing
    sparse_lookup(table, ids, is_grad=False, name="frozen")  # no gradient: nothing
    embs = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    offsets = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    unique = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
    assert len(embs) == len(offsets) == len(unique) == 1
    entrance = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ENTRANCE)
    assert len(entrance) == 3
    with new_session() as sess:
        rows, addresses, keys = sess.run([embs[0], offsets[0], unique[0]])
    assert rows.shape == (2, DIM) and len(set(keys.tolist())) == 2
    np.testing.assert_array_equal(addresses, keys)


def test_same_name_feature_specs_are_distinct_lookups():
    init()
    specs = [FeatureSpec("user_ids", table_name="user"), FeatureSpec("user_ids", table_name="user")]
    assert specs[0].name != specs[1].name and specs[0].name.startswith("user_ids_")
    assert specs[0].index_key == specs[1].index_key == "user_ids"
    data = {"user_ids": np.array([[1, 2], [2, 5]], np.int64)}
    dataset = tf.data.Dataset.from_tensors(data).map(get_asc_insert_func(tgt_key_specs=specs))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    table = create_table(
        tf.int64, DIM, "user", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=100
    )
    a = sparse_lookup(table, specs[0], batch=batch, name="first")
    b = sparse_lookup(table, specs[1], batch=batch, name="second")
    with new_session() as sess:
        out_a, out_b = sess.run([a, b])
        assert sess.run(table.size_tensor()) == 3
    assert out_a.shape == out_b.shape == (2, 2, DIM)


def test_feature_spec_lookup_with_access_and_evict_config():
    init()
    spec = FeatureSpec("a", access_threshold=2, faae_coefficient=1)
    dataset = tf.data.Dataset.from_tensors({"a": np.array([1, 1, 2], np.int64)}).map(
        get_asc_insert_func(tgt_key_specs=[spec])
    )
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    table = _table("a")
    # The SDK's precedence: the spec's thresholds; a config saying the same is accepted.
    emb = sparse_lookup(
        table,
        spec,
        batch=batch,
        access_and_evict_config={"access_threshold": 2, "faae_coefficient": 1},
    )
    with new_session() as sess:
        np.testing.assert_allclose(sess.run(emb), [[0.5] * DIM, [0.5] * DIM, [0.0] * DIM])
    with pytest.raises(ValueError, match="access_and_evict_config=.*says otherwise"):
        sparse_lookup(table, spec, batch=batch, access_and_evict_config={"access_threshold": 5})
    # None and -1 both mean "off"; keys the config leaves out are the spec's.
    plain = FeatureSpec("b", faae_coefficient=4)
    dataset = tf.data.Dataset.from_tensors({"b": np.array([1], np.int64)}).map(
        get_asc_insert_func(tgt_key_specs=[plain])
    )
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    sparse_lookup(
        _table("b"),
        plain,
        batch=batch,
        access_and_evict_config={"access_threshold": -1, "eviction_threshold": None},
    )


def test_timestamp_added_twice_and_one_per_iterator():
    init()
    table = _table(device_vocabulary_size=100)
    iterators = []
    for start in (100, 500):
        data = {"ids": np.array([[1], [2]], np.int64), "ts": np.array([start, start + 1])}
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensors(data)
        ).get_next()
        tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, batch["ts"])
        tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, batch["ts"])
        iterators.append(batch)
    config = {"access_threshold": -1, "eviction_threshold": 50}
    first = sparse_lookup(table, iterators[0]["ids"], access_and_evict_config=config)
    with new_session() as sess:
        sess.run(first)
        assert sess.run(table.stats()["newest_clock"]) == 101  # the first iterator's
    second = sparse_lookup(table, iterators[1]["ids"], access_and_evict_config=config)
    with new_session() as sess:
        sess.run(second)
        assert sess.run(table.stats()["newest_clock"]) == 501
    unstamped = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensors({"ids": np.array([[4]], np.int64)})
    ).get_next()
    with pytest.raises(
        ValueError,
        match="needs per-sample timestamps.*iterator the ids come from: \\['IteratorGetNext_2'\\]",
    ):
        sparse_lookup(table, unstamped["ids"], access_and_evict_config=config)


def test_lookup_and_table_option_errors():
    init()
    with pytest.raises(
        TypeError, match="create_table\\(\\) got unexpected keyword arguments \\['colour'\\]"
    ):
        _table(colour=1)
    with pytest.raises(
        ValueError, match="all2all_gradients_op: All2allGradientsOp has no member with value 'mean'"
    ):
        _table(all2all_gradients_op="mean")
    table = _table(
        is_dp=False,
        all2all_gradients_op="sum_gradients",
        shard_num=1,
        mode="ASC",
        apply_gradients_strategy="direct_apply",
        optimizer_list=[],
        enable_merge=False,
        fusion_optimizer_var=True,
        hashtable_threshold=0,
    )
    with pytest.raises(
        TypeError, match="sparse_lookup\\(\\) got unexpected keyword arguments \\['colour'\\]"
    ):
        sparse_lookup(table, tf.constant([1], tf.int64), colour=1)


# ---- checkpoints ---------------------------------------------------------------------------


def test_saver_creates_a_missing_directory(tmp_path):
    init()
    table = _table()
    emb = sparse_lookup(table, tf.constant([4, 5], tf.int64))
    tf.compat.v1.Variable(1.0, name="w")
    saver = tf.compat.v1.train.Saver()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(emb)
        path = saver.save(sess, str(tmp_path / "new" / "deeper" / "model"), global_step=3)
    assert (tmp_path / "new" / "deeper" / "sparse-model-3" / "t").is_dir()
    with new_session() as sess:
        saver.restore(sess, path)
        assert sess.run(table.size_tensor()) == 2


# ---- padding keys ------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd": lambda: gradient_descent.create_hash_optimizer(learning_rate=0.1),
    "adagrad": lambda: adagrad.create_hash_optimizer(learning_rate=0.1),
    "ftrl": lambda: ftrl.create_hash_optimizer(learning_rate=0.1),
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(learning_rate=0.1),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("by_address", [False, True])
def test_padding_keys_are_looked_up_but_never_trained(optimizer, by_address):
    init(use_dynamic=False)
    table = _table(padding_keys=[0, -1], padding_keys_mask=True, padding_keys_len=16)
    ids = tf.constant([[7, 0], [8, -1]], tf.int64)
    emb = sparse_lookup(table, ids, send_count=1)  # replaced by padding_keys_len
    loss = tf.reduce_sum(emb)
    opt = OPTIMIZERS[optimizer]()
    if by_address:  # the SDK's by-address flow over the lookup collections
        embs = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        train = opt.apply_gradients(zip(tf.gradients(loss, embs), addresses))
    else:
        train = opt.apply_gradients(zip(tf.gradients(loss, [table]), [table]))
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_allclose(sess.run(emb), np.full((2, 2, DIM), 0.5))
        for _ in range(2):
            sess.run(train)
        values, _ = sess.run(table.lookup(tf.constant([7, 8, 0, -1], tf.int64)))
    np.testing.assert_allclose(values[2:], np.full((2, DIM), 0.5))  # padding rows unchanged
    assert (np.abs(values[:2] - 0.5) > 1e-3).all()  # the others trained


def test_padding_key_checks():
    init()
    with pytest.raises(ValueError, match="padding_keys=\\[3\\] needs padding_keys_mask=True"):
        _table("u", padding_keys=[3])
    with pytest.raises(ValueError, match="needs padding_keys_len"):
        _table("u", padding_keys=3, padding_keys_mask=True)
    with pytest.raises(ValueError, match="padding_keys_mask=True needs padding_keys"):
        _table("u", padding_keys_mask=True)
    with pytest.raises(ValueError, match="padding_keys must be in"):
        _table("u", padding_keys=[2**64], padding_keys_mask=True, padding_keys_len=4)


# ---- optimizers ----------------------------------------------------------------------------


def test_sparse_optimizers_are_tf_optimizers_with_a_scalable_learning_rate():
    init()
    from tensorflow.python.training import optimizer  # pylint: disable=import-outside-toplevel

    adam = lazy_adam.create_hash_optimizer(learning_rate=0.01)
    sgd = gradient_descent.create_hash_optimizer(learning_rate=0.5)
    assert isinstance(adam, optimizer.Optimizer) and isinstance(sgd, optimizer.Optimizer)
    assert adam._lr == 0.01 and sgd._learning_rate == 0.5  # pylint: disable=protected-access
    # A loss-scaling wrapper divides the learning rate and multiplies the loss.
    sgd._learning_rate = sgd._learning_rate / tf.constant(4.0)  # pylint: disable=protected-access
    table = _table()
    emb = sparse_lookup(table, tf.constant([1], tf.int64))
    loss = tf.reduce_sum(emb) * 4.0
    train = sgd.apply_gradients(zip(tf.gradients(loss, [table]), [table]))
    with new_session() as sess:
        sess.run(train)
        values, _ = sess.run(table.lookup(tf.constant([1], tf.int64)))
    np.testing.assert_allclose(values, [[0.5 - 0.5] * DIM], atol=1e-7)


def test_importing_rec_sdk_gives_the_sdk_surface():
    """As importing mx_rec: `import rec_sdk` alone adds Dataset.eos_map and makes
    rec_sdk.util (init, ...) and the logger's SDK path available."""
    code = (
        "import tensorflow as tf\n"
        "import rec_sdk\n"
        "assert hasattr(tf.data.Dataset, 'eos_map')\n"
        "assert callable(rec_sdk.util.initialize.init)\n"
        "from rec_sdk.util.log import LEVELS, LOGGER_NAME, get_logger, logger\n"
        "assert get_logger() is logger and LOGGER_NAME == 'rec_sdk'\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
