"""The graph_rewrite pass framework: purity, invariant checks, dumps, and RerouteInputs on
tiny hand-built graphs (structure after the rewrite, and numeric outputs)."""
import os

import numpy as np
import pytest
import tensorflow as tf

from graph_rewrite import RerouteInputs, RewriteError, check_graph, run_passes


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
    assert sorted(os.listdir(str(tmp_path))) == ["reroute_inputs_after.pbtxt",
                                                 "reroute_inputs_before.pbtxt"]
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
    final, results = run_passes(_graph(), [RerouteInputs({"a:0": "b:0"}),
                                           RerouteInputs({"b:0": "a:0"})])
    assert [r.modified for r in results] == [True, True]
    np.testing.assert_allclose(_run(final, "out:0", {"a:0": [1.0, 2.0]}), [3.0, 6.0])
