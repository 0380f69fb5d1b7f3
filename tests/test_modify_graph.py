"""Automatic graph modification in tf.compat.v1.Session scripts: sparse_lookup(modify_graph=True)
+ modify_graph_and_start_emb_cache + get_initializer / get_target_batch.

The reference for every numeric check is the same model without modification (tensor lookups
dedup in the step) or in FeatureSpec mode: graph modification must train identically, only
moving the key work into the input pipeline."""

import os

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import session_config, sorted_export
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.examples import feature_spec_demo
from rec_sdk.graph.modifier import modified_iterators, modify_graph_and_start_emb_cache
from rec_sdk.optimizers import lazy_adam
from rec_sdk.util.initialize import get_initializer, get_target_batch, init
from rec_sdk_graph_rewrite import RewriteError

ROWS = 96


def _data(seed=0):
    rng = np.random.RandomState(seed)
    return {
        "user": rng.randint(0, 40, ROWS).astype(np.int32),
        "items": rng.randint(0, 60, (ROWS, 3)).astype(np.int64),
        "city": rng.choice(np.array([b"paris", b"rome", b"oslo", b"lima"]), ROWS),
        "time": (1000 + np.arange(ROWS) * 10).astype(np.int64),
        "label": rng.randint(0, 2, ROWS).astype(np.float32),
    }


def _model(batch, is_train, modify_graph, tables=None, eviction=False):
    """Two tables; "user" gets a cast + offset id and a hashed string feature (preprocessing
    between get_next and the ids), "item" a [batch, 3] id matrix."""
    if tables is None:
        init_fn = tf.compat.v1.truncated_normal_initializer
        tables = {
            "user": create_table(
                tf.int64, 4, "user", init_fn(stddev=0.1, seed=1), device_vocabulary_size=500
            ),
            "item": create_table(
                tf.int64, 4, "item", init_fn(stddev=0.1, seed=2), device_vocabulary_size=500
            ),
        }
    config = {"access_threshold": 1, "eviction_threshold": 50} if eviction else None
    user_ids = tf.cast(batch["user"], tf.int64) + 1000
    city_ids = tf.strings.to_hash_bucket_fast(batch["city"], 50)
    suffix = "train" if is_train else "eval"
    user = sparse_lookup(
        tables["user"],
        user_ids,
        is_train=is_train,
        modify_graph=modify_graph,
        batch=batch,
        name="user_" + suffix,
        access_and_evict_config=config,
    )
    city = sparse_lookup(
        tables["user"],
        city_ids,
        is_train=is_train,
        modify_graph=modify_graph,
        batch=batch,
        name="city_" + suffix,
        access_and_evict_config=config,
    )
    items = sparse_lookup(
        tables["item"],
        batch["items"],
        is_train=is_train,
        modify_graph=modify_graph,
        batch=batch,
        name="items_" + suffix,
        access_and_evict_config=config,
    )
    logits = tf.reduce_sum((user + city) * tf.reduce_mean(items, axis=1), axis=1)
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits)
    )
    return tables, logits, loss


def _train(modify_graph, one_shot=False, steps=6, eviction=False, old_initializer=False):
    """Losses, the run's executed op names and the tables' sorted exports."""
    init()
    dataset = tf.data.Dataset.from_tensor_slices(_data()).batch(16)
    if one_shot:
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset.repeat())
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()
    if eviction:
        tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, batch["time"])
    tables, _, loss = _model(batch, True, modify_graph, eviction=eviction)
    train_op = lazy_adam.create_hash_optimizer(learning_rate=0.05).minimize(loss)
    if modify_graph:
        modify_graph_and_start_emb_cache()
    exports = {name: t.export() for name, t in tables.items()}
    evict = [t.evict() for t in tables.values()] if eviction else []
    losses, executed, evicted = [], set(), None
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if not one_shot:
            sess.run(
                iterator.initializer
                if old_initializer or not modify_graph
                else get_initializer(True)
            )
        for step in range(steps):
            metadata = tf.compat.v1.RunMetadata()
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            losses.append(sess.run([loss, train_op], options=options, run_metadata=metadata)[0])
            if step == 0:
                executed = {
                    node.node_name
                    for dev in metadata.step_stats.dev_stats
                    for node in dev.node_stats
                }
            if evict and step == steps // 2:
                # Rows whose newest sample time is 50 s older than the newest seen go.
                evicted = sess.run(evict)
        exported = {name: sorted_export(*values) for name, values in sess.run(exports).items()}
    if evict:
        assert sum(rows for rows, _ in evicted) > 0, evicted
    return np.array(losses), executed, exported


def _assert_same_training(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    for name in a[2]:
        for x, y in zip(a[2][name], b[2][name]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("one_shot", [False, True])
def test_modified_graph_trains_exactly_like_the_unmodified_one(one_shot):
    plain = _train(modify_graph=False, one_shot=one_shot)
    tf.compat.v1.reset_default_graph()
    rec_sdk.util.initialize.terminate_config_initializer()
    modified = _train(modify_graph=True, one_shot=one_shot)
    _assert_same_training(plain, modified)
    # The step no longer deduplicates ids nor reads the old iterator: the lookups' own
    # UniqueKeys ops and the old get_next are gone from the executed ops; the pipeline's
    # shared find_or_insert runs instead of the lookups' own.
    assert any(n.startswith("user_train/unique") for n in plain[1])
    assert not any(
        n.startswith(
            (
                "user_train/unique",
                "city_train/unique",
                "items_train/unique",
                "user_train/find_or_insert",
            )
        )
        for n in modified[1]
    )
    assert "IteratorGetNext" not in modified[1]
    assert any(
        "rec_sdk_modified_IteratorGetNext" in n and n.endswith("find_or_insert")
        for n in modified[1]
    )


def test_running_the_old_initializer_also_starts_the_new_iterator():
    reference = _train(modify_graph=True)
    tf.compat.v1.reset_default_graph()
    rec_sdk.util.initialize.terminate_config_initializer()
    _assert_same_training(reference, _train(modify_graph=True, old_initializer=True))


def test_modified_graph_with_admission_and_eviction_by_timestamps():
    plain = _train(modify_graph=False, eviction=True, steps=6)
    tf.compat.v1.reset_default_graph()
    rec_sdk.util.initialize.terminate_config_initializer()
    modified = _train(modify_graph=True, eviction=True, steps=6)
    _assert_same_training(plain, modified)


@pytest.mark.parametrize(
    "options",
    [{}, {"access_threshold": 2, "eviction_threshold": 30 * 86400}, {"use_dynamic": False}],
)
def test_feature_spec_mode_and_modify_graph_mode_train_identically(options):
    """The MovieLens model of the FeatureSpec example written both ways: same losses at every
    step, same evaluations, same table contents (embeddings and LazyAdam slots) and counters."""
    runs = []
    for modify_graph in (False, True):
        with tf.Graph().as_default():
            runs.append(
                feature_spec_demo.run(
                    steps=40,
                    eval_every=20,
                    modify_graph=modify_graph,
                    export_tables=True,
                    log=lambda line: None,
                    session_config=session_config(),
                    **options,
                )
            )
    spec, modified = runs
    assert spec["losses"] == modified["losses"]
    assert spec["history"] == modified["history"]
    assert spec["tables"] == modified["tables"]
    for name in spec["exported"]:
        for x, y in zip(spec["exported"][name], modified["exported"][name]):
            np.testing.assert_array_equal(x, y)


def test_train_and_eval_iterators_in_one_graph_and_get_target_batch():
    init()
    data = _data()
    train_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(16)
    )
    eval_it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(32)
    )
    train_batch, eval_batch = train_it.get_next(), eval_it.get_next()
    tables, _, loss = _model(train_batch, True, True)
    _, eval_logits, eval_loss = _model(eval_batch, False, True, tables=tables)
    train_op = lazy_adam.create_hash_optimizer(learning_rate=0.05).minimize(loss)
    with pytest.raises(ValueError, match="no training iterator was modified"):
        get_initializer(True)
    modify_graph_and_start_emb_cache()
    modify_graph_and_start_emb_cache()  # a second call finds nothing new
    assert [m.is_training for m in modified_iterators()] == [True, False]
    new_eval = get_target_batch(False)
    assert set(new_eval) == set(eval_batch)
    assert all(new_eval[k] is not eval_batch[k] for k in eval_batch)
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), get_initializer(True)])
        sizes = []
        for _ in range(3):
            sess.run(train_op)
            # Evaluation between training steps: a full pass, then training goes on.
            sess.run(get_initializer(False))
            labels, logits, _ = sess.run([new_eval["label"], eval_logits, eval_loss])
            np.testing.assert_array_equal(labels, data["label"][:32])
            assert logits.shape == (32,)
            sizes.append(sess.run(tables["item"].size_tensor()))
        # Evaluation inserts nothing: the item table holds exactly the trained batches' keys.
        expected = [len(np.unique(data["items"][: 16 * (i + 1)])) for i in range(3)]
        assert sizes == expected


def test_dump_graph_writes_each_pass_and_the_insert_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    init()
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(_data()).batch(16)
    )
    _model(it.get_next(), True, True)
    modify_graph_and_start_emb_cache(dump_graph=True)
    dumped = sorted(
        os.path.relpath(os.path.join(d, f), "rec_sdk_dump")
        for d, _, files in os.walk("rec_sdk_dump")
        for f in files
    )
    assert "modify_graph_0/reroute_inputs_before.pbtxt" in dumped
    assert "modify_graph_0/reroute_inputs_after.pbtxt" in dumped
    assert "modify_graph_0/add_control_inputs_after.pbtxt" in dumped
    assert any(f.startswith("insert_func_") for f in dumped)


def _lookup_on(ids):
    table = create_table(
        tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    return sparse_lookup(table, ids, modify_graph=True, name="lookup")


def test_unsupported_inputs_are_clear_errors():
    init()
    _lookup_on(tf.compat.v1.placeholder(tf.int64, [None], name="ids_feed"))
    with pytest.raises(RewriteError, match="placeholder 'ids_feed'.*feed_dict"):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    ds = tf.data.Dataset.range(10).batch(2)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    _lookup_on(it.get_next() + tf.random.uniform([], 0, 3, tf.int64))
    with pytest.raises(RewriteError, match="stateful op.*RandomUniform"):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    ds = tf.data.Dataset.range(10).batch(2)
    it = tf.compat.v1.data.Iterator.from_structure(
        tf.compat.v1.data.get_output_types(ds), tf.compat.v1.data.get_output_shapes(ds)
    )
    it.make_initializer(ds)
    it.make_initializer(ds.skip(1))
    _lookup_on(it.get_next())
    with pytest.raises(RewriteError, match="reinitializable over 2 datasets"):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    a = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10).batch(2)).get_next()
    b = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10).batch(2)).get_next()
    _lookup_on(a + b)
    with pytest.raises(RewriteError, match="several iterators"):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    batch = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10).batch(2)).get_next()
    table = create_table(
        tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    sparse_lookup(table, batch, modify_graph=True, is_train=True, name="train")
    sparse_lookup(table, batch, modify_graph=True, is_train=False, name="eval")
    with pytest.raises(
        RewriteError, match="both training lookups.*'train'.*evaluation lookups.*'eval'"
    ):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    batch = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensors(tf.sparse.from_dense(tf.constant([[1, 0]], tf.int64)))
    ).get_next()
    _lookup_on(tf.sparse.to_dense(batch))
    with pytest.raises(RewriteError, match="sparse or ragged"):
        modify_graph_and_start_emb_cache()

    tf.compat.v1.reset_default_graph()
    _lookup_on(
        tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(10).batch(2)).get_next()
    )
    tf.compat.v1.get_default_graph().finalize()
    with pytest.raises(RewriteError, match="finalized"):
        modify_graph_and_start_emb_cache()

    with pytest.raises(TypeError, match="full_graph must be a tf.Graph"):
        modify_graph_and_start_emb_cache(full_graph="graph")
    with pytest.raises(TypeError, match="dump_graph must be a bool"):
        modify_graph_and_start_emb_cache(dump_graph="yes")


def test_without_modify_graph_lookups_nothing_is_rewritten():
    init()
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(_data()).batch(16)
    )
    _model(it.get_next(), True, modify_graph=False)
    ops_before = len(tf.compat.v1.get_default_graph().get_operations())
    modify_graph_and_start_emb_cache()
    assert len(tf.compat.v1.get_default_graph().get_operations()) == ops_before
    assert modified_iterators() == []


def test_optimizer_built_after_the_modification_trains_the_same():
    """The by-address collections name the shared rows after modification (once per table and
    batch), so an optimizer built afterwards trains exactly as one built before."""
    reference = _train(modify_graph=True)
    tf.compat.v1.reset_default_graph()
    rec_sdk.util.initialize.terminate_config_initializer()
    init(use_dynamic_expansion=True)
    it = tf.compat.v1.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices(_data()).batch(16)
    )
    tables, _, loss = _model(it.get_next(), True, True)
    modify_graph_and_start_emb_cache()
    embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    assert len(embs) == len(addresses) == 2  # one per table
    grads = tf.gradients(loss, embs)
    assert all(g is not None for g in grads)
    from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address

    train_op = create_hash_optimizer_by_address(0.05).apply_gradients(zip(grads, addresses))
    exports = {name: t.export() for name, t in tables.items()}
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), get_initializer(True)])
        losses = [sess.run([loss, train_op])[0] for _ in range(6)]
        exported = {name: sorted_export(*v) for name, v in sess.run(exports).items()}
    np.testing.assert_array_equal(np.array(losses), reference[0])
    for name in exported:
        for x, y in zip(exported[name], reference[2][name]):
            np.testing.assert_array_equal(x, y)


def test_lookups_added_to_a_modified_iterator_are_an_error():
    init()
    batch = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(_data()).batch(16)
    ).get_next()
    _model(batch, True, True)
    modify_graph_and_start_emb_cache()
    table = create_table(
        tf.int64, 4, "late", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    sparse_lookup(table, batch["items"], modify_graph=True, name="late_lookup")
    with pytest.raises(RewriteError, match="already modified by an earlier call.*late_lookup"):
        modify_graph_and_start_emb_cache()
