"""The graph_rewrite pass framework: purity, invariant checks, dumps, and RerouteInputs on
tiny hand-built graphs (structure after the rewrite, and numeric outputs)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from rec_sdk.base.live_graph import update_live_graph
from rec_sdk_graph_rewrite import (
    AddControlInputs,
    RerouteInputs,
    RewriteError,
    check_graph,
    extract_subgraph,
    iterator_source,
    run_passes,
    trace_to_iterator,
)


def _graph():
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None], name="a")
        b = tf.constant([10.0, 20.0], name="b")
        c = tf.identity(a * 2.0, name="c")
        tf.add(c, a, name="out")
        tf.cast(a, tf.int32, name="as_int")
        del b
    return g.as_graph_def()


def _run(graph_def, fetch, feed=None):
    with tf.Graph().as_default() as g:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run(fetch, feed)


def test_reroute_moves_every_consumer_and_keeps_the_input_unchanged(tmp_path):
    graph_def = _graph()
    before = graph_def.SerializeToString()
    result = RerouteInputs({"a:0": "b:0"})(graph_def, dump_dir=str(tmp_path))
    assert graph_def.SerializeToString() == before  # the input is never mutated
    assert result.modified and len(result.matches) == 3  # mul, add, cast read "a"
    consumers = [n.name for n in result.graph_def.node if "a" in n.input]
    assert consumers == []
    np.testing.assert_allclose(_run(result.graph_def, "out:0"), [30.0, 60.0])
    assert sorted(os.listdir(str(tmp_path))) == [
        "reroute_inputs_after.pbtxt",
        "reroute_inputs_before.pbtxt",
    ]
    # The original graph still computes from the placeholder.
    np.testing.assert_allclose(_run(graph_def, "out:0", {"a:0": [1.0, 2.0]}), [3.0, 6.0])


def test_reroute_without_consumers_is_not_modified():
    result = RerouteInputs({"out:0": "b:0"})(_graph())
    assert not result.modified and result.matches == []


def test_reroute_rejects_dtype_mismatch_missing_tensor_and_cycles():
    with pytest.raises(RewriteError, match="dtype.*a:0 \\(float32\\) -> as_int:0 \\(int32\\)"):
        RerouteInputs({"a:0": "as_int:0"})(_graph())
    with pytest.raises(RewriteError, match="does not exist"):
        RerouteInputs({"a:0": "nope:0"})(_graph())
    with pytest.raises(RewriteError, match="cycle"):
        RerouteInputs({"a:0": "c:0"})(_graph())


def test_check_graph_names_broken_nodes():
    graph_def = _graph()
    bad = tf.compat.v1.GraphDef()
    bad.CopyFrom(graph_def)
    next(n for n in bad.node if n.name == "out").input[0] = "missing"
    with pytest.raises(RewriteError, match="do not exist.*missing"):
        check_graph(bad)
    dup = tf.compat.v1.GraphDef()
    dup.CopyFrom(graph_def)
    dup.node.add().CopyFrom(dup.node[0])
    with pytest.raises(RewriteError, match="share this name.*a"):
        check_graph(dup)


def test_run_passes_chains_results():
    # There and back again: consumers of a move to b, then consumers of b (now including
    # them) move to a.
    final, results = run_passes(
        _graph(), [RerouteInputs({"a:0": "b:0"}), RerouteInputs({"b:0": "a:0"})]
    )
    assert [r.modified for r in results] == [True, True]
    np.testing.assert_allclose(_run(final, "out:0", {"a:0": [1.0, 2.0]}), [3.0, 6.0])


def test_reroute_moves_control_inputs_and_add_control_inputs():
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [], name="a")
        first = tf.no_op(name="first")
        second = tf.no_op(name="second")
        with tf.control_dependencies([first]):
            tf.identity(a, name="out")
        tf.no_op(name="target")
        del second
    result = RerouteInputs({}, {"first": "second"})(g.as_graph_def())
    out = next(n for n in result.graph_def.node if n.name == "out")
    assert list(out.input) == ["a", "^second"]
    added = AddControlInputs({"target": ["first", "second"]})(result.graph_def)
    target = next(n for n in added.graph_def.node if n.name == "target")
    assert list(target.input) == ["^first", "^second"]
    again = AddControlInputs({"target": ["first"]})(added.graph_def)
    assert not again.modified  # already there
    with pytest.raises(RewriteError, match="do not exist.*nope"):
        AddControlInputs({"target": ["nope"]})(g.as_graph_def())
    with pytest.raises(RewriteError, match="control_mapping do not exist"):
        RerouteInputs({}, {"first": "nope"})(g.as_graph_def())


def test_update_live_graph_applies_a_pass_result_to_the_running_graph():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant([1.0, 2.0], name="a")
        tf.constant([10.0, 20.0], name="b")  # an op of the graph the pass must keep
        out = tf.identity(a * 2.0, name="out")
        marker = tf.Variable(0.0, name="marker")
        bump = marker.assign_add(1.0, name="bump").op
        gate = tf.no_op(name="gate")
    final, _ = run_passes(
        g.as_graph_def(), [RerouteInputs({"a:0": "b:0"}), AddControlInputs({"gate": [bump.name]})]
    )
    assert update_live_graph(g, final) == 2
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(marker.initializer)
        np.testing.assert_allclose(sess.run(out), [20.0, 40.0])  # the same Python tensor
        sess.run(gate)
        assert sess.run(marker) == 1.0
    assert update_live_graph(g, final) == 0  # nothing left to change
    extra = tf.compat.v1.GraphDef()
    extra.CopyFrom(final)
    extra.node.add().CopyFrom(final.node[0])
    extra.node[-1].name = "new_node"
    with pytest.raises(RewriteError, match="adds or drops ops.*new_node"):
        update_live_graph(g, extra)
    g.finalize()
    with pytest.raises(RewriteError, match="finalized"):
        update_live_graph(g, final)


def _iterator_graph(one_shot=False):
    g = tf.Graph()
    with g.as_default():
        ds = tf.data.Dataset.from_tensor_slices(
            {
                "ids": np.arange(8, dtype=np.int32).reshape(4, 2),
                "name": np.array([b"a", b"b", b"c", b"d"]),
            }
        ).batch(2)
        if one_shot:
            it = tf.compat.v1.data.make_one_shot_iterator(ds)
        else:
            it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = it.get_next()
        ids = tf.reshape(tf.cast(batch["ids"], tf.int64) * 3, [-1], name="ids")
        hashed = tf.strings.to_hash_bucket_fast(batch["name"], 100, name="hashed")
        mixed = tf.add(ids[:2], hashed, name="mixed")
        noisy = tf.add(ids, tf.random.uniform([], 0, 2, tf.int64), name="noisy")
        fed = tf.compat.v1.placeholder(tf.int64, [None], name="fed")
        tf.add(fed, 1, name="from_feed")
        del mixed, noisy
    return g


def test_trace_to_iterator_finds_the_preprocessing_and_rejects_what_cannot_be_replayed():
    g = _iterator_graph()
    graph_def = g.as_graph_def()
    trace = trace_to_iterator(graph_def, "ids:0", "ids")
    assert trace.get_next == "IteratorGetNext" and trace.outputs == [0]
    assert {"Cast", "mul", "ids"} <= set(trace.nodes) and "IteratorGetNext" not in trace.nodes
    mixed = trace_to_iterator(graph_def, "mixed:0")
    assert mixed.outputs == [0, 1] and "hashed" in mixed.nodes
    direct = trace_to_iterator(graph_def, "IteratorGetNext:1")
    assert direct.nodes == [] and direct.outputs == [1]
    with pytest.raises(RewriteError, match="stateful op.*RandomUniform"):
        trace_to_iterator(graph_def, "noisy:0", "ids of lookup x")
    with pytest.raises(RewriteError, match="placeholder 'fed'.*feed_dict"):
        trace_to_iterator(graph_def, "from_feed:0")
    # The replayed subgraph computes what the original does.
    sub = extract_subgraph(graph_def, trace.nodes)
    assert all(not i.startswith("^") for n in sub.node for i in n.input)
    with tf.Graph().as_default():
        values = tf.constant([[1, 2], [3, 4]], tf.int32)
        (out,) = tf.compat.v1.import_graph_def(
            sub, input_map={"IteratorGetNext:0": values}, return_elements=["ids:0"], name="replay"
        )
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(out), [3, 6, 9, 12])


def test_iterator_source_kinds():
    graph_def = _iterator_graph().as_graph_def()
    source = iterator_source(graph_def, "IteratorGetNext")
    assert source.kind == "initializable" and source.initializer == "MakeIterator"
    assert len(source.output_types) == 2
    one_shot = iterator_source(_iterator_graph(one_shot=True).as_graph_def(), "IteratorGetNext")
    assert one_shot.kind == "one_shot" and one_shot.factory
    g = tf.Graph()
    with g.as_default():
        a = tf.data.Dataset.range(3).batch(1)
        it = tf.compat.v1.data.Iterator.from_structure(
            tf.compat.v1.data.get_output_types(a), tf.compat.v1.data.get_output_shapes(a)
        )
        it.make_initializer(a)
        it.make_initializer(tf.data.Dataset.range(5).batch(1))
        it.get_next()
        handle = tf.compat.v1.placeholder(tf.string, [])
        feedable = tf.compat.v1.data.Iterator.from_string_handle(
            handle, tf.compat.v1.data.get_output_types(a), tf.compat.v1.data.get_output_shapes(a)
        )
        feedable.get_next(name="feedable_next")
    with pytest.raises(RewriteError, match="reinitializable over 2 datasets"):
        iterator_source(g.as_graph_def(), "IteratorGetNext")
    with pytest.raises(RewriteError, match="IteratorFromStringHandle"):
        iterator_source(g.as_graph_def(), "feedable_next")
