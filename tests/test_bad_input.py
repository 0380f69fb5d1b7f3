"""Bad input across the public API, table-driven: every case expects an exception type and a
message that names the parameter (or the input of a raw op) that is wrong.

A case is (id, call, exception type, pattern): `call` runs after the usual clean setup (a new
graph, rec_sdk not initialised) in a fresh temporary working directory; `pattern` is a regular
expression searched in the message. Raw-op cases build the op and run it in a session, so the
kernel's own check is what answers.
"""

import os
import re

import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from helpers import new_session
from rec_sdk import saver as rec_saver
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import EvictHook, TableStatsHook
from rec_sdk.ops.loader import load_ops
from rec_sdk.optimizers import (
    adagrad,
    adagrad_by_addr,
    ftrl,
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
    lazy_adam_by_addr,
)
from rec_sdk.util import initialize

INVALID = tf.errors.InvalidArgumentError
PRECONDITION = tf.errors.FailedPreconditionError
NOT_FOUND = tf.errors.NotFoundError
ZEROS = tf.compat.v1.zeros_initializer()
MISSING = "no_such_rec_sdk_dir"  # relative: under the test's temporary working directory


@pytest.fixture(autouse=True)
def _in_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _init(**kwargs):
    kwargs.setdefault("use_dynamic_expansion", False)
    initialize.init(**kwargs)


def _table(name="t", dim=4, init_kwargs=None, **kwargs):
    _init(**(init_kwargs or {}))
    kwargs.setdefault("device_vocabulary_size", 100)
    return create_table(tf.int64, dim, name, ZEROS, **kwargs)


def _create(**overrides):
    """create_table with arguments replaced."""
    _init()
    args = dict(
        key_dtype=tf.int64, dim=4, name="t", emb_initializer=ZEROS, device_vocabulary_size=100
    )
    args.update(overrides)
    return create_table(**args)


def _lookup(ids=None, **kwargs):
    table = _table()
    return sparse_lookup(table, tf.constant([1, 2], tf.int64) if ids is None else ids, **kwargs)


def _evicting_lookup(**kwargs):
    return _lookup(
        access_and_evict_config={"access_threshold": 1, "eviction_threshold": 5}, **kwargs
    )


def _ids(dtype=tf.int64, shape=(2,)):
    return tf.zeros(shape, dtype)


def _optimizer(factory, *args, **kwargs):
    _init(use_dynamic_expansion="by_addr" in factory.__name__)
    return factory(*args, **kwargs)


def _run(build):
    """Builds ops with `build()` (after init) and runs them: the kernel answers."""
    _init(use_dynamic_expansion=True)
    fetch = build()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(fetch)


def _raw_table(dim=4, capacity=0, dynamic=True, name="raw", **attrs):
    attrs.setdefault("initializer", "constant")
    return load_ops().rec_sdk_embedding_table(
        table_name=name,
        key_dtype=tf.int64,
        dim=dim,
        dynamic_expansion=dynamic,
        capacity=capacity,
        shared_name=name,
        **attrs,
    )


def _addresses(handle, keys=(1, 2)):
    return load_ops().rec_sdk_table_find_or_insert(
        handle,
        tf.constant(keys, tf.int64),
        tf.zeros([0], tf.int64),
        tf.zeros([0], tf.int64),
        is_train=True,
    )


_OPTIMIZER_ARGS = {
    "rec_sdk_apply_lazy_adam": dict(
        beta1=0.9, beta2=0.999, epsilon=1e-8, step=lambda: tf.constant(1, tf.int64)
    ),
    "rec_sdk_apply_gradient_descent": dict(weight_decay=0.0),
    "rec_sdk_apply_adagrad": dict(initial_accumulator_value=0.1),
    "rec_sdk_apply_momentum": dict(momentum=0.9),
    "rec_sdk_apply_ftrl": dict(
        learning_rate_power=-0.5, l1=0.0, l2=0.0, l2_shrinkage=0.0, initial_accumulator_value=0.1
    ),
}


def _apply(op, grads=None, addresses=None, **overrides):
    """A raw optimizer op on a 4-dim table, its usual arguments overridable."""

    def build():
        handle = _raw_table()
        addr = _addresses(handle) if addresses is None else addresses
        args = {"learning_rate": 0.1}
        args.update({k: v() if callable(v) else v for k, v in _OPTIMIZER_ARGS[op].items()})
        args.update(overrides)
        return getattr(load_ops(), op)(
            handle, addr, tf.ones([2, 4]) if grads is None else grads, **args
        )

    _run(build)


def _table_op(op, *inputs, **attrs):
    def build():
        return getattr(load_ops(), op)(_raw_table(), *inputs, **attrs)

    _run(build)


def _two_optimizers():
    handle = _raw_table()
    first = load_ops().rec_sdk_apply_adagrad(
        handle, _addresses(handle), tf.ones([2, 4]), 0.1, initial_accumulator_value=0.1
    )
    with tf.control_dependencies([first]):
        return load_ops().rec_sdk_apply_momentum(
            handle, _addresses(handle, (3,)), tf.ones([1, 4]), 0.1, 0.9
        )


def _slot_beyond_the_optimizers():
    handle = _raw_table()
    update = load_ops().rec_sdk_apply_adagrad(
        handle, _addresses(handle), tf.ones([2, 4]), 0.1, initial_accumulator_value=0.1
    )
    with tf.control_dependencies([update]):
        return load_ops().rec_sdk_table_lookup(handle, tf.constant([1], tf.int64), dim=4, slot=5)


def _optimizer_minimize(factory, by_address=False):
    table = _table(init_kwargs={"use_dynamic_expansion": by_address})
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    factory().minimize(tf.reduce_sum(emb))


def _de_var(**kwargs):
    kwargs.setdefault("dim", 4)
    kwargs.setdefault("name", "v")
    return de.Variable(**kwargs)


def _var_method(method, *args, **kwargs):
    return getattr(_de_var(), method)(*args, **kwargs)


def _restricting_var():
    return _de_var(restrict_policy=de.TimestampRestrictPolicy)


def _feature_spec_lookup(spec_kwargs=None, lookup_kwargs=None):
    _init()
    table = create_table(tf.int64, 4, "t", ZEROS, device_vocabulary_size=100)
    spec = FeatureSpec("f", table_name="t", **(spec_kwargs or {}))
    dataset = tf.data.Dataset.from_tensors({"f": tf.constant([[1, 2]], tf.int64)})
    dataset = dataset.map(get_asc_insert_func(tgt_key_specs=[spec]))
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return sparse_lookup(table, spec, batch=batch, **(lookup_kwargs or {}))


def _saver_restore(path):
    _table()
    saver = tf.compat.v1.train.Saver([tf.compat.v1.train.get_or_create_global_step()])
    with new_session() as sess:
        saver.restore(sess, path)


def _save_tables(directory="ckpt", **kwargs):
    _table()
    with new_session() as sess:
        rec_saver.save_tables(sess, directory, **kwargs)


def _save_over(make):
    """save_tables into a directory that `make()` prepared."""
    make()
    _save_tables("existing")


def _not_a_checkpoint():
    os.makedirs("existing/notes")
    with open("existing/notes/readme.txt", "w") as f:
        f.write("precious")


def _a_file():
    with open("existing", "w") as f:
        f.write("precious")


def _restore_tables(directories, **kwargs):
    _table()
    with new_session() as sess:
        rec_saver.restore_tables(sess, directories, **kwargs)


def _with_session(call):
    """call(sess) on a graph with one table."""
    _table()
    with new_session() as sess:
        call(sess)


def _two_lookups(first, second):
    table = _table()
    sparse_lookup(table, _ids(), name="l1", access_and_evict_config=first)
    sparse_lookup(table, _ids(), name="l2", access_and_evict_config=second)


def _lookup_in_another_graph():
    table = _table()
    with tf.Graph().as_default():
        sparse_lookup(table, _ids())


def _sparse_ids():
    return tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])


CASES = [
    # ---- init --------------------------------------------------------------------------
    ("init max_steps str", lambda: _init(max_steps="10"), TypeError, "max_steps"),
    ("init max_steps < -1", lambda: _init(max_steps=-2), ValueError, "max_steps"),
    ("init train_steps float", lambda: _init(train_steps=1.5), TypeError, "train_steps"),
    ("init eval_steps huge", lambda: _init(eval_steps=2**40), ValueError, "eval_steps"),
    ("init save_steps bool", lambda: _init(save_steps=True), TypeError, "save_steps"),
    (
        "init all steps 0",
        lambda: _init(max_steps=0, train_steps=0, eval_steps=0),
        ValueError,
        "max_steps, train_steps and eval_steps",
    ),
    ("init use_dynamic int", lambda: _init(use_dynamic=1), TypeError, "use_dynamic"),
    (
        "init use_dynamic_expansion str",
        lambda: _init(use_dynamic_expansion="yes"),
        TypeError,
        "use_dynamic_expansion",
    ),
    ("init bind_cpu int", lambda: _init(bind_cpu=1), TypeError, "bind_cpu"),
    ("init use_hot str", lambda: _init(use_hot="on"), TypeError, "use_hot"),
    ("init rank_id 1", lambda: _init(rank_id=1), ValueError, "rank_id"),
    ("init rank_size 2", lambda: _init(rank_size=2), ValueError, "rank_size"),
    ("init twice", lambda: (_init(), _init()), RuntimeError, "init"),
    ("init if_load str", lambda: _init(if_load="no"), TypeError, "if_load"),
    # ---- create_table --------------------------------------------------------------------
    ("create key_dtype float", lambda: _create(key_dtype=tf.float32), ValueError, "key_dtype"),
    ("create key_dtype str", lambda: _create(key_dtype="int16"), ValueError, "key_dtype"),
    ("create key_dtype string", lambda: _create(key_dtype=tf.string), ValueError, "key_dtype"),
    ("create dim 0", lambda: _create(dim=0), ValueError, "dim"),
    ("create dim negative", lambda: _create(dim=-3), ValueError, "dim"),
    ("create dim too large", lambda: _create(dim=8193), ValueError, "dim"),
    ("create dim float", lambda: _create(dim=4.0), TypeError, "dim"),
    ("create dim bool", lambda: _create(dim=True), TypeError, "dim"),
    ("create dim rank-2 shape", lambda: _create(dim=tf.TensorShape([2, 2])), ValueError, "dim"),
    ("create dim unknown shape", lambda: _create(dim=tf.TensorShape([None])), ValueError, "dim"),
    ("create name empty", lambda: _create(name=""), ValueError, "name"),
    ("create name slash", lambda: _create(name="a/b"), ValueError, "name"),
    ("create name too long", lambda: _create(name="x" * 101), ValueError, "name"),
    ("create name int", lambda: _create(name=7), ValueError, "name"),
    (
        "create name taken",
        lambda: (_create(), create_table(tf.int64, 4, "t", ZEROS)),
        ValueError,
        "name 't'",
    ),
    (
        "create initializer None",
        lambda: _create(emb_initializer=None),
        ValueError,
        "emb_initializer",
    ),
    (
        "create initializer str",
        lambda: _create(emb_initializer="zeros"),
        (TypeError, ValueError),
        "initializer",
    ),
    (
        "create initializer orthogonal",
        lambda: _create(emb_initializer=tf.compat.v1.orthogonal_initializer()),
        (TypeError, ValueError),
        "initializer",
    ),
    (
        "create device_vocabulary_size negative",
        lambda: _create(device_vocabulary_size=-1),
        ValueError,
        "device_vocabulary_size",
    ),
    (
        "create device_vocabulary_size float",
        lambda: _create(device_vocabulary_size=1e3),
        TypeError,
        "device_vocabulary_size",
    ),
    (
        "create device_vocabulary_size huge",
        lambda: _create(device_vocabulary_size=10**10),
        ValueError,
        "device_vocabulary_size",
    ),
    (
        "create host_vocabulary_size negative",
        lambda: _create(host_vocabulary_size=-5),
        ValueError,
        "host_vocabulary_size",
    ),
    (
        "create ssd_vocabulary_size negative",
        lambda: _create(ssd_vocabulary_size=-5),
        ValueError,
        "ssd_vocabulary_size",
    ),
    (
        "create ssd without host",
        lambda: _create(ssd_vocabulary_size=10),
        ValueError,
        "ssd_vocabulary_size",
    ),
    ("create ssd_data_path int", lambda: _create(ssd_data_path=5), TypeError, "ssd_data_path"),
    (
        "create ssd_data_path list of ints",
        lambda: _create(ssd_data_path=[1, 2]),
        TypeError,
        "ssd_data_path",
    ),
    ("create is_save str", lambda: _create(is_save="yes"), TypeError, "is_save"),
    ("create init_param too large", lambda: _create(init_param=11.0), ValueError, "init_param"),
    ("create init_param str", lambda: _create(init_param="1"), TypeError, "init_param"),
    (
        "create value_dtype float64",
        lambda: _create(value_dtype=tf.float64),
        ValueError,
        "value_dtype",
    ),
    ("create steps_to_live 0", lambda: _create(steps_to_live=0), ValueError, "steps_to_live"),
    ("create steps_to_live float", lambda: _create(steps_to_live=2.5), TypeError, "steps_to_live"),
    (
        "create evict_when_full int",
        lambda: _create(evict_when_full=1),
        TypeError,
        "evict_when_full",
    ),
    (
        "create evict_when_full with expansion",
        lambda: (
            _init(use_dynamic_expansion=True),
            create_table(tf.int64, 4, "t", ZEROS, evict_when_full=True),
        ),
        ValueError,
        "evict_when_full",
    ),
    (
        "create zero capacity",
        lambda: _create(device_vocabulary_size=0),
        ValueError,
        "device_vocabulary_size",
    ),
    ("create unknown keyword", lambda: _create(colour="red"), TypeError, "colour"),
    ("create is_dp str", lambda: _create(is_dp="no"), TypeError, "is_dp"),
    (
        "create all2all_gradients_op bad",
        lambda: _create(all2all_gradients_op="avg"),
        ValueError,
        "all2all_gradients_op",
    ),
    ("create mode bad", lambda: _create(mode="HBM"), ValueError, "mode"),
    ("create shard_num 0", lambda: _create(shard_num=0), ValueError, "shard_num"),
    ("create enable_merge int", lambda: _create(enable_merge=0), TypeError, "enable_merge"),
    (
        "create hashtable_threshold negative",
        lambda: _create(hashtable_threshold=-1),
        ValueError,
        "hashtable_threshold",
    ),
    (
        "create optimizer_list not a list",
        lambda: _create(optimizer_list="adam"),
        TypeError,
        "optimizer_list",
    ),
    (
        "create padding_keys without mask",
        lambda: _create(padding_keys=[0]),
        ValueError,
        "padding_keys",
    ),
    (
        "create padding_keys_mask without keys",
        lambda: _create(padding_keys_mask=True),
        ValueError,
        "padding_keys",
    ),
    (
        "create padding_keys float",
        lambda: _create(padding_keys=[0.5], padding_keys_mask=True, padding_keys_len=4),
        TypeError,
        "padding_keys",
    ),
    (
        "create padding_keys_len 0",
        lambda: _create(padding_keys=[0], padding_keys_mask=True, padding_keys_len=0),
        ValueError,
        "padding_keys_len",
    ),
    (
        "create padding_keys without len",
        lambda: _create(padding_keys=[0], padding_keys_mask=True),
        ValueError,
        "padding_keys_len",
    ),
    ("create before init", lambda: create_table(tf.int64, 4, "t", ZEROS), RuntimeError, "init"),
    # ---- sparse_lookup -----------------------------------------------------------------
    (
        "lookup table not a table",
        lambda: (_init(), sparse_lookup("t", _ids())),
        TypeError,
        "hash_table",
    ),
    # (Float ids are cast with a check, as the SDK's pipeline does: test_sdk_programs.)
    ("lookup ids string", lambda: _lookup(ids=tf.constant(["a"])), TypeError, "ids"),
    ("lookup ids sparse", lambda: _lookup(ids=_sparse_ids()), TypeError, "ids"),
    ("lookup ids bool", lambda: _lookup(ids=tf.constant([True])), TypeError, "ids"),
    ("lookup send_count 0", lambda: _lookup(send_count=0), ValueError, "send_count"),
    ("lookup send_count str", lambda: _lookup(send_count="8"), TypeError, "send_count"),
    (
        "lookup send_count missing in static mode",
        lambda: (
            _init(use_dynamic=False),
            sparse_lookup(create_table(tf.int64, 4, "t", ZEROS, device_vocabulary_size=9), _ids()),
        ),
        ValueError,
        "send_count",
    ),
    ("lookup is_train str", lambda: _lookup(is_train="yes"), TypeError, "is_train"),
    ("lookup modify_graph int", lambda: _lookup(modify_graph=1), TypeError, "modify_graph"),
    ("lookup is_grad None", lambda: _lookup(is_grad=None), TypeError, "is_grad"),
    ("lookup name empty", lambda: _lookup(name=""), ValueError, "name"),
    ("lookup name int", lambda: _lookup(name=3), ValueError, "name"),
    ("lookup dim mismatch", lambda: _lookup(dim=8), ValueError, "dim"),
    ("lookup dim 0", lambda: _lookup(dim=0), ValueError, "dim"),
    ("lookup unknown keyword", lambda: _lookup(combiner="sum"), TypeError, "combiner"),
    (
        "lookup access_and_evict_config list",
        lambda: _lookup(access_and_evict_config=[1]),
        TypeError,
        "access_and_evict_config",
    ),
    (
        "lookup access_and_evict_config unknown key",
        lambda: _lookup(access_and_evict_config={"threshold": 1}),
        ValueError,
        "access_and_evict_config",
    ),
    (
        "lookup access_threshold -2",
        lambda: _lookup(access_and_evict_config={"access_threshold": -2}),
        ValueError,
        "access_threshold",
    ),
    (
        "lookup access_threshold str",
        lambda: _lookup(access_and_evict_config={"access_threshold": "2"}),
        TypeError,
        "access_threshold",
    ),
    (
        "lookup eviction_threshold without access",
        lambda: _lookup(access_and_evict_config={"eviction_threshold": 5}),
        ValueError,
        "access_threshold",
    ),
    (
        "lookup eviction_threshold -3",
        lambda: _lookup(access_and_evict_config={"access_threshold": 1, "eviction_threshold": -3}),
        ValueError,
        "eviction_threshold",
    ),
    (
        "lookup faae_coefficient 0",
        lambda: _lookup(access_and_evict_config={"access_threshold": 1, "faae_coefficient": 0}),
        ValueError,
        "faae_coefficient",
    ),
    (
        "lookup serving_default_value wrong size",
        lambda: _lookup(is_train=False, serving_default_value=[1.0, 2.0]),
        ValueError,
        "serving_default_value",
    ),
    (
        "lookup serving_default_value str",
        lambda: _lookup(is_train=False, serving_default_value="zero"),
        TypeError,
        "serving_default_value",
    ),
    (
        "lookup serving_default_value string tensor",
        lambda: _lookup(is_train=False, serving_default_value=tf.constant("0")),
        TypeError,
        "serving_default_value",
    ),
    (
        "lookup timestamps float",
        lambda: _evicting_lookup(timestamps=tf.constant([1.0, 2.0])),
        TypeError,
        "timestamps",
    ),
    (
        "lookup timestamps rank 2",
        lambda: _evicting_lookup(timestamps=tf.zeros([2, 2], tf.int64)),
        ValueError,
        "timestamps",
    ),
    ("lookup eviction without timestamps", lambda: _evicting_lookup(), ValueError, "timestamp"),
    (
        "lookup thresholds disagree",
        lambda: _two_lookups({"access_threshold": 1}, {"access_threshold": 2}),
        ValueError,
        "access_threshold",
    ),
    ("lookup table of another graph", _lookup_in_another_graph, ValueError, "another graph"),
    # ---- FeatureSpec and get_asc_insert_func --------------------------------------------
    ("spec name empty", lambda: FeatureSpec(""), ValueError, "name"),
    ("spec name int", lambda: FeatureSpec(3), ValueError, "name"),
    ("spec table_name empty", lambda: FeatureSpec("f", table_name=""), ValueError, "table_name"),
    ("spec index_key float", lambda: FeatureSpec("f", index_key=1.5), TypeError, "index_key"),
    ("spec index_key bool", lambda: FeatureSpec("f", index_key=True), TypeError, "index_key"),
    ("spec index_key 256", lambda: FeatureSpec("f", index_key=256), ValueError, "index_key"),
    (
        "spec access_threshold -2",
        lambda: FeatureSpec("f", access_threshold=-2),
        ValueError,
        "access_threshold",
    ),
    (
        "spec access_threshold str",
        lambda: FeatureSpec("f", access_threshold="1"),
        TypeError,
        "access_threshold",
    ),
    (
        "spec eviction_threshold without access",
        lambda: FeatureSpec("f", eviction_threshold=10),
        ValueError,
        "access_threshold",
    ),
    (
        "spec eviction_threshold huge",
        lambda: FeatureSpec("f", access_threshold=1, eviction_threshold=2**31),
        ValueError,
        "eviction_threshold",
    ),
    ("spec is_timestamp int", lambda: FeatureSpec("f", is_timestamp=1), TypeError, "is_timestamp"),
    (
        "spec faae_coefficient 0",
        lambda: FeatureSpec("f", faae_coefficient=0),
        ValueError,
        "faae_coefficient",
    ),
    (
        "spec faae_coefficient float",
        lambda: FeatureSpec("f", faae_coefficient=1.5),
        TypeError,
        "faae_coefficient",
    ),
    ("insert func nothing", lambda: get_asc_insert_func(), ValueError, "tgt_key_specs"),
    (
        "insert func is_training str",
        lambda: get_asc_insert_func(tgt_key_specs=[FeatureSpec("f")], is_training="yes"),
        TypeError,
        "is_training",
    ),
    (
        "insert func dump_graph int",
        lambda: get_asc_insert_func(tgt_key_specs=[FeatureSpec("f")], dump_graph=1),
        TypeError,
        "dump_graph",
    ),
    (
        "insert func specs not specs",
        lambda: get_asc_insert_func(tgt_key_specs=["f"]),
        TypeError,
        "tgt_key_specs",
    ),
    (
        "insert func empty specs",
        lambda: get_asc_insert_func(tgt_key_specs=[]),
        ValueError,
        "tgt_key_specs",
    ),
    (
        "insert func two timestamps",
        lambda: get_asc_insert_func(
            tgt_key_specs=[
                FeatureSpec("f"),
                FeatureSpec("ts", table_name="f", is_timestamp=True),
                FeatureSpec("ts2", table_name="f", is_timestamp=True),
            ]
        ),
        ValueError,
        "timestamp",
    ),
    (
        "spec lookup without batch",
        lambda: (
            _init(),
            sparse_lookup(create_table(tf.int64, 4, "t", ZEROS), FeatureSpec("f", table_name="t")),
        ),
        ValueError,
        "batch",
    ),
    (
        "spec lookup of another table",
        lambda: (
            _init(),
            sparse_lookup(
                create_table(tf.int64, 4, "t", ZEROS), FeatureSpec("f", table_name="u"), batch={}
            ),
        ),
        ValueError,
        "table_name",
    ),
    (
        "spec lookup config disagrees",
        lambda: _feature_spec_lookup(
            spec_kwargs={"access_threshold": 1},
            lookup_kwargs={"access_and_evict_config": {"access_threshold": 3}},
        ),
        ValueError,
        "access_threshold",
    ),
    # ---- optimizers ----------------------------------------------------------------------
    (
        "sgd learning_rate negative",
        lambda: _optimizer(gradient_descent.create_hash_optimizer, -0.1),
        ValueError,
        "learning_rate",
    ),
    (
        "sgd learning_rate str",
        lambda: _optimizer(gradient_descent.create_hash_optimizer, "0.1"),
        TypeError,
        "learning_rate",
    ),
    (
        "sgd weight_decay negative",
        lambda: _optimizer(gradient_descent.create_hash_optimizer, 0.1, weight_decay=-1.0),
        ValueError,
        "weight_decay",
    ),
    (
        "sgd name empty",
        lambda: _optimizer(gradient_descent.create_hash_optimizer, 0.1, name=""),
        ValueError,
        "name",
    ),
    (
        "sgd by_addr learning_rate nan",
        lambda: _optimizer(gradient_descent_by_addr.create_hash_optimizer_by_addr, float("nan")),
        ValueError,
        "learning_rate",
    ),
    (
        "adam learning_rate negative",
        lambda: _optimizer(lazy_adam.create_hash_optimizer, -1.0),
        ValueError,
        "learning_rate",
    ),
    (
        "adam beta1 1",
        lambda: _optimizer(lazy_adam.create_hash_optimizer, beta1=1.0),
        ValueError,
        "beta1",
    ),
    (
        "adam beta2 negative",
        lambda: _optimizer(lazy_adam.create_hash_optimizer, beta2=-0.1),
        ValueError,
        "beta2",
    ),
    (
        "adam epsilon 0",
        lambda: _optimizer(lazy_adam.create_hash_optimizer, epsilon=0.0),
        ValueError,
        "epsilon",
    ),
    (
        "adam epsilon str",
        lambda: _optimizer(lazy_adam.create_hash_optimizer, epsilon="1e-8"),
        TypeError,
        "epsilon",
    ),
    (
        "adam by_address beta1 2",
        lambda: _optimizer(lazy_adam_by_addr.create_hash_optimizer_by_address, beta1=2.0),
        ValueError,
        "beta1",
    ),
    (
        "adagrad initial_accumulator_value negative",
        lambda: _optimizer(adagrad.create_hash_optimizer, initial_accumulator_value=-1.0),
        ValueError,
        "initial_accumulator_value",
    ),
    (
        "adagrad learning_rate inf",
        lambda: _optimizer(adagrad.create_hash_optimizer, learning_rate=float("inf")),
        ValueError,
        "learning_rate",
    ),
    (
        "adagrad by_address initial_accumulator_value str",
        lambda: _optimizer(
            adagrad_by_addr.create_hash_optimizer_by_address, initial_accumulator_value="a"
        ),
        TypeError,
        "initial_accumulator_value",
    ),
    (
        "ftrl learning_rate_power positive",
        lambda: _optimizer(ftrl.create_hash_optimizer, 0.1, learning_rate_power=0.5),
        ValueError,
        "learning_rate_power",
    ),
    (
        "ftrl l1 negative",
        lambda: _optimizer(ftrl.create_hash_optimizer, 0.1, l1_regularization_strength=-1.0),
        ValueError,
        "l1",
    ),
    (
        "ftrl l2 negative",
        lambda: _optimizer(ftrl.create_hash_optimizer, 0.1, l2_regularization_strength=-1.0),
        ValueError,
        "l2",
    ),
    (
        "ftrl initial_accumulator_value negative",
        lambda: _optimizer(ftrl.create_hash_optimizer, 0.1, initial_accumulator_value=-0.1),
        ValueError,
        "initial_accumulator_value",
    ),
    (
        "ftrl unknown keyword",
        lambda: _optimizer(ftrl.create_hash_optimizer, 0.1, beta=1.0),
        TypeError,
        "beta",
    ),
    (
        "plain optimizer on an expanding table",
        lambda: _optimizer_minimize(lazy_adam.create_hash_optimizer, by_address=True),
        ValueError,
        "by_addr",
    ),
    (
        "by-address optimizer on a fixed table",
        lambda: _optimizer_minimize(lazy_adam_by_addr.create_hash_optimizer_by_address),
        ValueError,
        "by_addr",
    ),
    (
        "apply_gradients not pairs",
        lambda: _optimizer(lazy_adam.create_hash_optimizer).apply_gradients([1, 2]),
        (TypeError, ValueError),
        "grads_and_vars",
    ),
    # ---- EvictHook and TableStatsHook ---------------------------------------------------
    ("EvictHook evict_enable int", lambda: EvictHook(evict_enable=1), TypeError, "evict_enable"),
    (
        "EvictHook interval 0",
        lambda: EvictHook(evict_enable=True, evict_time_interval=0),
        ValueError,
        "evict_time_interval",
    ),
    (
        "EvictHook interval str",
        lambda: EvictHook(evict_enable=True, evict_time_interval="1"),
        TypeError,
        "evict_time_interval",
    ),
    (
        "EvictHook evict_step_interval 0",
        lambda: EvictHook(evict_enable=True, evict_step_interval=0),
        ValueError,
        "evict_step_interval",
    ),
    (
        "TableStatsHook every_n_steps 0",
        lambda: TableStatsHook(output_dir="stats", every_n_steps=0),
        ValueError,
        "every_n_steps",
    ),
    ("TableStatsHook without a place to write", lambda: TableStatsHook(), ValueError, "output_dir"),
    # ---- Saver and save/restore_tables ---------------------------------------------------
    (
        "Saver restore missing checkpoint",
        lambda: _saver_restore(os.path.abspath(MISSING)),
        (ValueError, NOT_FOUND),
        MISSING,
    ),
    ("Saver restore None", lambda: _saver_restore(None), ValueError, "save_path|None"),
    ("save_tables directory int", lambda: _save_tables(directory=5), TypeError, "directory"),
    ("save_tables directory empty", lambda: _save_tables(directory=""), ValueError, "directory"),
    (
        "save_tables directory with NUL",
        lambda: _save_tables(directory="a\0b"),
        ValueError,
        "directory",
    ),
    (
        "save_tables over a directory that is not a checkpoint",
        lambda: _save_over(_not_a_checkpoint),
        ValueError,
        "directory .*not a rec_sdk checkpoint",
    ),
    (
        "save_tables over a file",
        lambda: _save_over(_a_file),
        ValueError,
        "directory .*not a directory",
    ),
    ("save_tables tables not tables", lambda: _save_tables(tables=["t"]), TypeError, "tables"),
    ("save_tables delta str", lambda: _save_tables(delta="yes"), TypeError, "delta"),
    (
        "save_tables delta of an untracked table",
        lambda: _save_tables(delta=True),
        PRECONDITION,
        "track",
    ),
    ("restore_tables missing directory", lambda: _restore_tables([MISSING]), NOT_FOUND, MISSING),
    ("restore_tables directories int", lambda: _restore_tables(7), TypeError, "directories"),
    (
        "restore_tables rank_size 0",
        lambda: _restore_tables(["."], rank_id=0, rank_size=0),
        ValueError,
        "rank_size",
    ),
    (
        "restore_tables rank_id out of range",
        lambda: _restore_tables(["."], rank_id=3, rank_size=2),
        ValueError,
        "rank_id",
    ),
    (
        "restore_tables deltas over ranks",
        lambda: _restore_tables([".", "."], rank_id=0, rank_size=2, deltas=["d"]),
        ValueError,
        "deltas",
    ),
    (
        "export_npz path int",
        lambda: _with_session(lambda s: rec_saver.export_npz(s, 5)),
        TypeError,
        "path",
    ),
    (
        "import_npz missing file",
        lambda: _with_session(lambda s: rec_saver.import_npz(s, MISSING + ".npz")),
        (OSError, ValueError),
        MISSING,
    ),
    # ---- table methods -------------------------------------------------------------------
    ("table lookup bool keys", lambda: _table().lookup(tf.constant([True])), TypeError, "keys"),
    ("table lookup string keys", lambda: _table().lookup(tf.constant(["a"])), TypeError, "keys"),
    (
        "table upsert wrong dim",
        lambda: _table().upsert(tf.constant([1], tf.int64), tf.zeros([1, 3])),
        ValueError,
        "values",
    ),
    (
        "table upsert int values",
        lambda: _table().upsert(tf.constant([1], tf.int64), tf.zeros([1, 4], tf.int32)),
        TypeError,
        "values",
    ),
    (
        "table upsert count mismatch",
        lambda: _table().upsert(tf.constant([1, 2], tf.int64), tf.zeros([3, 4])),
        ValueError,
        "values",
    ),
    ("table remove bool keys", lambda: _table().remove(tf.constant([True])), TypeError, "keys"),
    (
        "table import slots wrong shape",
        lambda: _table().import_rows(
            tf.constant([1], tf.int64), tf.zeros([1, 4]), slots=tf.zeros([1, 4])
        ),
        ValueError,
        "slots",
    ),
    (
        "table set_access_threshold -2",
        lambda: _table().set_access_threshold(-2),
        ValueError,
        "threshold",
    ),
    (
        "table set_access_threshold str",
        lambda: _table().set_access_threshold("1"),
        TypeError,
        "threshold",
    ),
    # ---- dynamic_embedding ---------------------------------------------------------------
    ("de key_dtype float", lambda: _de_var(key_dtype=tf.float32), TypeError, "key_dtype"),
    ("de key_dtype bogus", lambda: _de_var(key_dtype="bogus"), TypeError, "key_dtype"),
    ("de value_dtype complex", lambda: _de_var(value_dtype=tf.complex64), TypeError, "value_dtype"),
    (
        "de string values of string keys",
        lambda: _de_var(key_dtype=tf.string, value_dtype=tf.string),
        TypeError,
        "string values take",
    ),
    ("de dim 0", lambda: _de_var(dim=0), ValueError, "dim"),
    ("de dim float", lambda: _de_var(dim=2.0), ValueError, "dim"),
    ("de dim too large", lambda: _de_var(dim=10**6), ValueError, "dim"),
    ("de devices none in list", lambda: _de_var(devices=[None]), ValueError, "devices"),
    ("de devices ints", lambda: _de_var(devices=[0]), ValueError, "devices"),
    ("de partitioner not callable", lambda: _de_var(partitioner=3), TypeError, "partitioner"),
    ("de init_size negative", lambda: _de_var(init_size=-1), ValueError, "init_size"),
    ("de init_size str", lambda: _de_var(init_size="9"), ValueError, "init_size"),
    ("de trainable str", lambda: _de_var(trainable="yes"), TypeError, "trainable"),
    ("de checkpoint int", lambda: _de_var(checkpoint=2), TypeError, "checkpoint"),
    (
        "de restrict_policy bogus",
        lambda: _de_var(restrict_policy=int),
        (TypeError, ValueError),
        "restrict_policy",
    ),
    (
        "de initializer str",
        lambda: _de_var(initializer="zeros"),
        (TypeError, ValueError),
        "initializer",
    ),
    (
        "de initializer wrong length",
        lambda: _de_var(initializer=[1.0, 2.0]),
        ValueError,
        "initializer",
    ),
    ("de name empty", lambda: _de_var(name=""), ValueError, "name"),
    ("de get_variable name empty", lambda: de.get_variable("", dim=4), ValueError, "name"),
    (
        "de get_variable twice",
        lambda: (de.get_variable("g", dim=4), de.get_variable("g", dim=4)),
        ValueError,
        "g",
    ),
    ("de lookup float keys", lambda: _var_method("lookup", tf.constant([1.0])), TypeError, "keys"),
    (
        "de upsert wrong dim",
        lambda: _var_method("upsert", tf.constant([1], tf.int64), tf.zeros([1, 3])),
        ValueError,
        "values",
    ),
    (
        "de upsert float64 values",
        lambda: _var_method("upsert", tf.constant([1], tf.int64), tf.zeros([1, 4], tf.float64)),
        TypeError,
        "values",
    ),
    ("de remove string keys", lambda: _var_method("remove", tf.constant(["k"])), TypeError, "keys"),
    (
        "de accum exists wrong dtype",
        lambda: _var_method(
            "accum",
            tf.constant([1], tf.int64),
            tf.zeros([1, 4]),
            tf.zeros([1, 4]),
            tf.constant([1]),
        ),
        TypeError,
        "exists",
    ),
    ("de size index out of range", lambda: _var_method("size", index=3), ValueError, "index"),
    (
        "de restrict num_reserved negative",
        lambda: _restricting_var().restrict(-1),
        ValueError,
        "num_reserved",
    ),
    ("de bp_v2 str", lambda: _de_var(bp_v2="no"), TypeError, "bp_v2"),
    (
        "de get_trainable_by_name int",
        lambda: _var_method("get_trainable_by_name", 5),
        (TypeError, ValueError),
        "name",
    ),
    (
        "de embedding_lookup params not a Variable",
        lambda: de.embedding_lookup(tf.zeros([2, 2]), _ids()),
        TypeError,
        "params",
    ),
    (
        "de embedding_lookup float ids",
        lambda: de.embedding_lookup(_de_var(), tf.constant([1.0])),
        TypeError,
        "ids",
    ),
    (
        "de embedding_lookup max_norm negative",
        lambda: de.embedding_lookup(_de_var(), _ids(), max_norm=-1.0),
        ValueError,
        "max_norm",
    ),
    (
        "de embedding_lookup_sparse combiner",
        lambda: de.embedding_lookup_sparse(_de_var(), _sparse_ids(), None, combiner="max"),
        ValueError,
        "combiner",
    ),
    (
        "de embedding_lookup_sparse dense ids",
        lambda: de.embedding_lookup_sparse(_de_var(), _ids(), None),
        TypeError,
        "sp_ids",
    ),
    (
        "de safe_embedding_lookup_sparse dense ids",
        lambda: de.safe_embedding_lookup_sparse(_de_var(), _ids()),
        TypeError,
        "sparse_ids",
    ),
    (
        "de optimizer not an optimizer",
        lambda: de.DynamicEmbeddingOptimizer(3),
        TypeError,
        "optimizer|self",
    ),
    # ---- raw ops: the kernels' own checks ------------------------------------------------
    (
        "raw find_or_insert counts of another length",
        lambda: _table_op(
            "rec_sdk_table_find_or_insert",
            tf.constant([1, 2], tf.int64),
            tf.ones([3], tf.int64),
            tf.zeros([0], tf.int64),
            is_train=True,
        ),
        INVALID,
        "counts",
    ),
    (
        "raw find_or_insert times of another length",
        lambda: _table_op(
            "rec_sdk_table_find_or_insert",
            tf.constant([1, 2], tf.int64),
            tf.zeros([0], tf.int64),
            tf.ones([3], tf.int64),
            is_train=True,
        ),
        INVALID,
        "times",
    ),
    (
        "raw find_or_insert negative counts",
        lambda: _table_op(
            "rec_sdk_table_find_or_insert",
            tf.constant([1, 2], tf.int64),
            tf.constant([1, -1], tf.int64),
            tf.zeros([0], tf.int64),
            is_train=True,
        ),
        INVALID,
        "counts",
    ),
    (
        "raw find_or_insert int32 keys into int64 table",
        lambda: _table_op(
            "rec_sdk_table_find_or_insert",
            tf.constant([1, 2], tf.int32),
            tf.zeros([0], tf.int64),
            tf.zeros([0], tf.int64),
            is_train=True,
        ),
        INVALID,
        "key",
    ),
    (
        "raw gather dim mismatch",
        lambda: _run(
            lambda: (lambda h: load_ops().rec_sdk_table_gather(h, _addresses(h), dim=8))(
                _raw_table()
            )
        ),
        INVALID,
        "dim",
    ),
    (
        "raw gather garbage address",
        lambda: _table_op("rec_sdk_table_gather", tf.constant([12345678901], tf.int64), dim=4),
        INVALID,
        "address",
    ),
    (
        "raw lookup dim mismatch",
        lambda: _table_op("rec_sdk_table_lookup", tf.constant([1], tf.int64), dim=3),
        INVALID,
        "dim",
    ),
    (
        "raw lookup slot beyond the optimizer's",
        lambda: _run(_slot_beyond_the_optimizers),
        INVALID,
        "slot",
    ),
    (
        "raw upsert rows of another count",
        lambda: _table_op("rec_sdk_table_upsert", tf.constant([1, 2], tf.int64), tf.zeros([3, 4])),
        INVALID,
        "values",
    ),
    (
        "raw upsert rows of another dim",
        lambda: _table_op("rec_sdk_table_upsert", tf.constant([1], tf.int64), tf.zeros([1, 5])),
        INVALID,
        "values",
    ),
    (
        "raw import slots of another shape",
        lambda: _table_op(
            "rec_sdk_table_import",
            tf.constant([1], tf.int64),
            tf.zeros([1, 4]),
            tf.zeros([1, 2, 4]),
        ),
        INVALID,
        "slots",
    ),
    (
        "raw restrict negative num_reserved",
        lambda: _table_op("rec_sdk_table_restrict", tf.constant(-1, tf.int64), by="last_seen"),
        INVALID,
        "num_reserved",
    ),
    (
        "raw restrict by count without track_access",
        lambda: _table_op("rec_sdk_table_restrict", tf.constant(1, tf.int64), by="count"),
        (INVALID, PRECONDITION),
        "track_access",
    ),
    (
        "raw set_access_threshold -5",
        lambda: _table_op("rec_sdk_table_set_access_threshold", tf.constant(-5, tf.int64)),
        INVALID,
        "threshold",
    ),
    (
        "raw save directory with NUL",
        lambda: _table_op("rec_sdk_table_save", tf.constant("a\0b"), tf.constant(False)),
        INVALID,
        "NUL",
    ),
    (
        "raw save into an existing directory",
        lambda: _table_op("rec_sdk_table_save", tf.constant(os.getcwd()), tf.constant(False)),
        (INVALID, tf.errors.AlreadyExistsError),
        "exists",
    ),
    (
        "raw save delta of an untracked table",
        lambda: _table_op("rec_sdk_table_save", tf.constant("never"), tf.constant(True)),
        (INVALID, PRECONDITION),
        "track",
    ),
    (
        "raw commit unknown save id",
        lambda: _table_op("rec_sdk_table_commit_save", tf.constant(99, tf.int64)),
        (INVALID, PRECONDITION),
        "save",
    ),
    (
        "raw restore rank_size 0",
        lambda: _table_op(
            "rec_sdk_table_restore",
            tf.constant(["."]),
            tf.constant(0, tf.int64),
            tf.constant(0, tf.int64),
        ),
        INVALID,
        "rank_size",
    ),
    (
        "raw restore rank_id negative",
        lambda: _table_op(
            "rec_sdk_table_restore",
            tf.constant(["."]),
            tf.constant(-1, tf.int64),
            tf.constant(2, tf.int64),
        ),
        INVALID,
        "rank_id",
    ),
    (
        "raw restore missing directory",
        lambda: _table_op(
            "rec_sdk_table_restore",
            tf.constant([MISSING]),
            tf.constant(0, tf.int64),
            tf.constant(1, tf.int64),
        ),
        (INVALID, NOT_FOUND),
        MISSING,
    ),
    (
        "raw apply_delta missing directory",
        lambda: _table_op("rec_sdk_table_apply_delta", tf.constant(MISSING)),
        (INVALID, NOT_FOUND),
        MISSING,
    ),
    ("raw table dim above max_dim", lambda: _run(lambda: _raw_table(dim=9000)), INVALID, "dim"),
    (
        "raw table unknown initializer",
        lambda: _run(lambda: _raw_table(initializer="glorot")),
        INVALID,
        "initializer",
    ),
    (
        "raw table fixed without capacity",
        lambda: _run(lambda: _raw_table(dynamic=False, capacity=0)),
        INVALID,
        "capacity",
    ),
    (
        "raw table init_values of another length",
        lambda: _run(lambda: _raw_table(init_values=[1.0, 2.0])),
        INVALID,
        "init_values",
    ),
    (
        "raw key_access_stats inverse out of range",
        lambda: _run(
            lambda: load_ops().rec_sdk_key_access_stats(
                tf.constant([0, 5]), tf.constant(2), tf.ones([], tf.int64), tf.zeros([0], tf.int64)
            )
        ),
        INVALID,
        "inverse",
    ),
    (
        "raw key_access_stats weights of another length",
        lambda: _run(
            lambda: load_ops().rec_sdk_key_access_stats(
                tf.constant([0, 1]), tf.constant(2), tf.ones([3], tf.int64), tf.zeros([0], tf.int64)
            )
        ),
        INVALID,
        "weights",
    ),
    (
        "raw key_access_stats timestamps of another length",
        lambda: _run(
            lambda: load_ops().rec_sdk_key_access_stats(
                tf.constant([0, 1, 1]),
                tf.constant(2),
                tf.ones([], tf.int64),
                tf.ones([2], tf.int64),
            )
        ),
        INVALID,
        "sample_times|timestamps",
    ),
    (
        "raw gather_rows_by_index index out of range",
        lambda: _run(
            lambda: load_ops().rec_sdk_gather_rows_by_index(tf.zeros([2, 4]), tf.constant([0, 2]))
        ),
        INVALID,
        "index",
    ),
    (
        "raw sum_rows_by_index index out of range",
        lambda: _run(
            lambda: load_ops().rec_sdk_sum_rows_by_index(
                tf.zeros([2, 4]), tf.constant([0, 7]), tf.constant(3)
            )
        ),
        INVALID,
        "index",
    ),
    (
        "raw sum_rows_by_index negative num_rows",
        lambda: _run(
            lambda: load_ops().rec_sdk_sum_rows_by_index(
                tf.zeros([2, 4]), tf.constant([0, 0]), tf.constant(-1)
            )
        ),
        INVALID,
        "num_rows",
    ),
    (
        "raw unique_keys matrix",
        lambda: _run(
            lambda: load_ops().rec_sdk_unique_keys(
                tf.compat.v1.placeholder_with_default(tf.zeros([2, 2], tf.int64), None)
            )
        ),
        INVALID,
        "keys",
    ),
    (
        "raw sgd grads of another count",
        lambda: _apply("rec_sdk_apply_gradient_descent", grads=tf.ones([3, 4])),
        INVALID,
        "grads",
    ),
    (
        "raw sgd grads of another dim",
        lambda: _apply("rec_sdk_apply_gradient_descent", grads=tf.ones([2, 5])),
        INVALID,
        "grads",
    ),
    (
        "raw sgd learning_rate vector",
        lambda: _apply("rec_sdk_apply_gradient_descent", learning_rate=tf.ones([2])),
        INVALID,
        "learning_rate",
    ),
    (
        "raw sgd garbage address",
        lambda: _apply(
            "rec_sdk_apply_gradient_descent", addresses=tf.constant([987654321, 5], tf.int64)
        ),
        INVALID,
        "address",
    ),
    (
        "raw adam step 0",
        lambda: _apply("rec_sdk_apply_lazy_adam", step=tf.constant(0, tf.int64)),
        INVALID,
        "step",
    ),
    ("raw adam beta1 1.5", lambda: _apply("rec_sdk_apply_lazy_adam", beta1=1.5), INVALID, "beta1"),
    (
        "raw adam epsilon negative",
        lambda: _apply("rec_sdk_apply_lazy_adam", epsilon=-1.0),
        INVALID,
        "epsilon",
    ),
    (
        "raw adam learning_rate nan",
        lambda: _apply("rec_sdk_apply_lazy_adam", learning_rate=float("nan")),
        INVALID,
        "learning_rate",
    ),
    (
        "raw adagrad initial accumulator negative",
        lambda: _apply("rec_sdk_apply_adagrad", initial_accumulator_value=-1.0),
        INVALID,
        "initial_accumulator_value",
    ),
    (
        "raw momentum negative momentum",
        lambda: _apply("rec_sdk_apply_momentum", momentum=-0.5),
        INVALID,
        "momentum",
    ),
    (
        "raw ftrl positive learning_rate_power",
        lambda: _apply("rec_sdk_apply_ftrl", learning_rate_power=0.5),
        INVALID,
        "learning_rate_power",
    ),
    ("raw ftrl negative l1", lambda: _apply("rec_sdk_apply_ftrl", l1=-1.0), INVALID, "l1"),
    ("raw ftrl negative l2", lambda: _apply("rec_sdk_apply_ftrl", l2=-1.0), INVALID, "l2"),
    (
        "raw ftrl negative l2_shrinkage",
        lambda: _apply("rec_sdk_apply_ftrl", l2_shrinkage=-1.0),
        INVALID,
        "l2_shrinkage",
    ),
    (
        "raw read_rows slot_initial_values NaN",
        lambda: _table_op(
            "rec_sdk_table_read_rows",
            tf.constant([-1], tf.int64),
            slot_optimizer="Own",
            slot_initial_values=[float("nan")],
        ),
        INVALID,
        "slot_initial_values",
    ),
    (
        "raw read_rows garbage address",
        lambda: _table_op(
            "rec_sdk_table_read_rows",
            tf.constant([987654321], tf.int64),
            slot_optimizer="Own",
            slot_initial_values=[0.0],
        ),
        INVALID,
        "address",
    ),
    (
        "raw write_rows values of another shape",
        lambda: _table_op(
            "rec_sdk_table_write_rows",
            tf.constant([-1], tf.int64),
            tf.zeros([1, 5]),
            tf.zeros([1, 1, 4]),
            slot_optimizer="Own",
            slot_initial_values=[0.0],
        ),
        INVALID,
        "values",
    ),
    (
        "raw write_rows slots of another count",
        lambda: _table_op(
            "rec_sdk_table_write_rows",
            tf.constant([-1], tf.int64),
            tf.zeros([1, 4]),
            tf.zeros([2, 1, 4]),
            slot_optimizer="Own",
            slot_initial_values=[0.0],
        ),
        INVALID,
        "slots",
    ),
    (
        "raw second optimizer on a bound table",
        lambda: _run(_two_optimizers),
        (INVALID, PRECONDITION),
        "optimizer",
    ),
]


def test_there_are_at_least_150_cases_with_distinct_ids():
    ids = [case[0] for case in CASES]
    assert len(ids) >= 150, len(ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    "call,error,pattern", [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_bad_input_is_an_error_naming_the_parameter(call, error, pattern):
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert re.search(pattern, message), "%r does not name %r" % (message, pattern)


def test_a_save_over_a_directory_that_is_not_a_checkpoint_deletes_nothing():
    with pytest.raises(ValueError):
        _save_over(_not_a_checkpoint)
    with open("existing/notes/readme.txt") as f:
        assert f.read() == "precious"
    assert sorted(os.listdir(".")) == ["existing"]
