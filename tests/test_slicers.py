"""The slicer hooks (rec_sdk.graph.hooks): key preprocessing of tensor lookups moves into the
input pipeline, training gives the same tables as without the hooks, orphan lookups become
traceable for graph modification, and what cannot move stays with a warning."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk_graph_rewrite as graph_rewrite
from helpers import new_session
from rec_sdk.core.embedding import create_table, sparse_lookup, tables_of_graph
from rec_sdk.graph import LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
from rec_sdk.optimizers import gradient_descent
from rec_sdk.util.initialize import get_initializer, init, terminate_config_initializer

DIM, STEPS = 3, 4


def _iterator(one_shot):
    rng = np.random.RandomState(0)
    data = {
        "ids": rng.randint(0, 50, size=(STEPS * 4, 3)).astype(np.int64),
        "label": rng.rand(STEPS * 4).astype(np.float32),
    }
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(4)
    if one_shot:
        return None, tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator, iterator.get_next()


def _train(ids_fn, hooks=(), modify=False, one_shot=False):
    """Builds a model on ids_fn(batch), runs the hooks' begin() (and graph modification),
    trains STEPS steps; returns (the table's sorted keys and rows, the graph)."""
    tf.compat.v1.reset_default_graph()
    graph = tf.compat.v1.get_default_graph()
    init()
    try:
        iterator, batch = _iterator(one_shot)
        table = create_table(
            tf.int64,
            DIM,
            "t",
            tf.compat.v1.random_uniform_initializer(0, 1, seed=2),
            device_vocabulary_size=1000,
        )
        emb = sparse_lookup(table, ids_fn(batch), modify_graph=modify)
        loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb, [1, 2]) - batch["label"]))
        train = gradient_descent.create_hash_optimizer(learning_rate=0.05).apply_gradients(
            zip(tf.gradients(loss, [table]), [table])
        )
        for hook in hooks:
            hook.begin()
        if modify:
            modify_graph_and_start_emb_cache()
        with new_session() as sess:
            if iterator is not None:
                sess.run(get_initializer(True) if modify else iterator.initializer)
            for _ in range(STEPS):
                sess.run(train)
            keys, values, _ = sess.run(table.export())
    finally:
        terminate_config_initializer()
        tf.compat.v1.reset_default_graph()
    order = np.argsort(keys)
    return (keys[order], values[order]), graph


def _string_ids(batch):
    return tf.strings.to_number(tf.strings.as_string(batch["ids"] + 1), out_type=tf.int64)


@pytest.mark.parametrize("one_shot", [False, True])
@pytest.mark.parametrize("modify", [False, True])
def test_lookup_subgraph_slicer_moves_string_parsing(modify, one_shot):
    expected, _ = _train(_string_ids, modify=modify, one_shot=one_shot)
    hook = LookupSubgraphSlicerHook(op_types=["StringToNumber"])
    got, graph = _train(_string_ids, hooks=[hook], modify=modify, one_shot=one_shot)
    assert hook.moved == 1
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    # The step no longer parses strings: the lookup's ids come straight from a get_next.
    record = tables_of_graph(graph)[0].lookups.tensor[0]
    assert record["ids"].op.type == "IteratorGetNext"
    assert not any(
        consumer
        for op in graph.get_operations()
        if op.type == "StringToNumber"
        for consumer in op.outputs[0].consumers()
    )


def _float_string_ids(batch):
    """tf.strings.to_number's default: float32 ids (the SDK casts them where it inserts)."""
    ids = tf.strings.to_number(tf.strings.as_string(batch["ids"] + 1))
    assert ids.dtype == tf.float32
    return ids


@pytest.mark.parametrize("modify", [False, True])
def test_slicer_moves_float_ids_and_they_train_as_their_int64_values(modify):
    expected, _ = _train(_string_ids, modify=modify)
    hook = LookupSubgraphSlicerHook(op_types=["StringToNumber"])
    got, graph = _train(_float_string_ids, hooks=[hook], modify=modify)
    assert hook.moved == 1
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    assert not any(
        consumer
        for op in graph.get_operations()
        if op.type == "StringToNumber"
        for consumer in op.outputs[0].consumers()
    )


def _orphan_ids(batch):
    del batch
    return tf.constant([[1, 2, 2], [3, 4, 5], [1, 1, 9], [6, 7, 8]], tf.int64) + 1 - 1


@pytest.mark.parametrize("one_shot", [False, True])
def test_orphan_lookup_keys_join_the_pipeline(one_shot):
    expected, _ = _train(_orphan_ids, one_shot=one_shot)
    with pytest.raises(graph_rewrite.RewriteError, match="not computed from an iterator"):
        _train(_orphan_ids, modify=True, one_shot=one_shot)
    hook = OrphanLookupKeySlicerHook()
    got, graph = _train(_orphan_ids, hooks=[hook], modify=True, one_shot=one_shot)
    assert hook.moved == 1
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    del graph


def test_orphan_with_several_iterators_is_ambiguous():
    init()
    _iterator(False)
    _iterator(False)
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    sparse_lookup(table, _orphan_ids(None))
    with pytest.raises(graph_rewrite.RewriteError, match="cannot tell which input pipeline"):
        OrphanLookupKeySlicerHook().begin()


def test_ops_that_cannot_move_stay_with_a_warning(caplog):
    init()
    _, batch = _iterator(False)
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    noise = tf.random.uniform([4, 3], 0, 5, dtype=tf.int64, seed=1)  # stateful
    sparse_lookup(table, batch["ids"] + noise)
    hook = LookupSubgraphSlicerHook(op_types=["RandomUniformInt", "AddV2"])
    hook.begin()
    assert hook.moved == 0
    assert any(
        "stays in the training step" in r.getMessage() and "stateful" in r.getMessage()
        for r in caplog.records
    )


def test_hook_arguments():
    with pytest.raises(ValueError, match="op_types must be a non-empty list"):
        LookupSubgraphSlicerHook(op_types=[])
    with pytest.raises(ValueError, match="op_types must be a non-empty list"):
        LookupSubgraphSlicerHook(op_types="StringToNumber")
    with pytest.raises(TypeError, match="full_graph must be a tf.Graph"):
        OrphanLookupKeySlicerHook(full_graph="g")


def test_acg_push_ops_hook_moves_string_ops_and_marked_ops():
    from rec_sdk.graph.acg_push_ops import ACGPushOpsToDatasetHook  # the SDK's older path

    def marked_ids(batch):
        return tf.math.multiply(_string_ids(batch), 2, name="ACG_PUSH_NODE_scale")

    expected, _ = _train(marked_ids)
    hook = ACGPushOpsToDatasetHook(dump_graph=True)
    got, graph = _train(marked_ids, hooks=[hook])
    assert hook.moved == 1  # the marked op's output (StringToNumber moved with it)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    assert tables_of_graph(graph)[0].lookups.tensor[0]["ids"].op.type == "IteratorGetNext"


def test_slicer_after_graph_modification_is_an_error():
    init()
    iterator, batch = _iterator(False)
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=100
    )
    sparse_lookup(table, _string_ids(batch), modify_graph=True)
    modify_graph_and_start_emb_cache()
    graph = tf.compat.v1.get_default_graph()
    # The SDK's hook bookkeeping: the modification's initializer is in its collection.
    assert graph.get_collection("ASCEND_CUTTING_POINT_INITIALIZER") == [get_initializer(True)]
    del iterator
    with pytest.raises(graph_rewrite.RewriteError, match="list them before GraphModifierHook"):
        LookupSubgraphSlicerHook(op_types=["StringToNumber"]).begin()
