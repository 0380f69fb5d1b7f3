"""Serving of tables sharded over ranks (rec_sdk.serving.rank_parts): rank 0 exports and
pushes, each rank writing the rows it owns; the served model, loaded by stock TensorFlow,
equals one process's export of the same training at every version.

tests/distribute/serving_rank_worker.py trains two tables over 2 or 3 ranks (processes on
127.0.0.1, free ports, always stopped) and in one process on the global batch; both export
(updatable and frozen) and push after every step, with evictions between pushes."""

import os

import numpy as np
import pytest
from tensorflow.core.protobuf import saved_model_pb2
from tests.test_distribute import _env, _rank_cluster, _run_together

from rec_sdk.serving import ServedModel, follow, update_files

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distribute", "serving_rank_worker.py")
DIMS = (4, 8)
DEFAULT = -0.5
TOL = 1e-3  # ranks and one process: the same training up to float rounding
PROBE = np.arange(-12, 70, dtype=np.int64).reshape(-1, 2)


def _train(out, ranks, *args):
    """Runs the worker as `ranks` ranks, and as one process on their global batch (into
    out + "-local"), at once."""
    cluster, tasks = _rank_cluster(ranks)
    local = _env({}, "worker", 0)
    local.pop("TF_CONFIG")
    _run_together(
        [([WORKER, out] + list(args), _env(cluster, job, index)) for job, index in tasks]
        + [([WORKER, out + "-local", "--local", str(ranks)] + list(args), local)]
    )


def _expected_rows(rows, t):
    """The rows every probe key must read from table t of a version: its row, or the
    default for keys the table does not hold."""
    stored = dict(zip(rows["keys%d" % t].tolist(), rows["values%d" % t]))
    default = np.full([DIMS[t]], DEFAULT, np.float32)
    return np.stack([np.stack([stored.get(k, default) for k in pair]) for pair in PROBE.tolist()])


def _stock_ops_only(export_dir):
    model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        model.ParseFromString(f.read())
    ops = {node.op for graph in model.meta_graphs for node in graph.graph_def.node}
    ops |= {
        node.op
        for graph in model.meta_graphs
        for function in graph.graph_def.library.function
        for node in function.node_def
    }
    assert not [op for op in ops if op.startswith("RecSdk")], sorted(ops)


@pytest.mark.parametrize("ranks,base_fraction", [(2, 0.7), (3, 3.0)])
def test_tables_over_ranks_serve_as_one_process_at_every_version(ranks, base_fraction, tmp_path):
    """After the export and after each of 8 pushes (cumulative updates with their step
    files, and whole ones, tables' files written by every rank, evictions between pushes;
    one process trains and pushes the ranks' global batch beside them), a model loaded
    from the ranks' export and brought to that version serves for every probe key the row
    one process's tables held then (the default for keys it did not hold), and the same
    predictions as one process's served model; a model applying only the newest update (a
    late replica) serves the same; the frozen export serves the export's version."""
    out = str(tmp_path / ("ranks%d" % ranks))
    _train(out, ranks, "--base-fraction", str(base_fraction))
    one_process = out + "-local"
    for path in ("export", "frozen"):
        _stock_ops_only(os.path.join(out, path))
        assets = os.listdir(os.path.join(out, path, "assets"))
        assert {name.split(".rank")[1][0] for name in assets} == {str(r) for r in range(ranks)}
    push = os.path.join(out, "push")
    versions = update_files.published_versions(push)
    assert versions == update_files.published_versions(os.path.join(one_process, "push"))
    assert len(versions) == 8
    manifests = [update_files.read_manifest(update_files.manifest_path(push, v)) for v in versions]
    assert all(m["table_ranks"] == [ranks, ranks] for m in manifests)
    assert any(m["step_parent"] >= 0 for m in manifests)  # cumulative updates with steps
    # A small base_fraction makes some pushes whole updates (every rank's whole shard: the
    # keys evicted are those it leaves out), else every push is cumulative and carries the
    # evicted keys.
    assert any(m["whole"] for m in manifests) == (base_fraction < 1)
    assert base_fraction < 1 or any(m["table_removed"][0] for m in manifests)
    feeds = {"ids%d" % t: PROBE for t in range(len(DIMS))}
    served = ServedModel(os.path.join(out, "export"))
    reference = ServedModel(os.path.join(one_process, "export"))
    frozen = ServedModel(os.path.join(out, "frozen"))
    try:
        for version in [0] + versions:
            if version:
                assert served.apply(update_files.update_dir(push, version)) == version
                reference.apply(update_files.update_dir(os.path.join(one_process, "push"), version))
            got, want = served.predict(feeds), reference.predict(feeds)
            trained = np.load(os.path.join(out, "rows-%d.npz" % version))
            local = np.load(os.path.join(one_process, "rows-%d.npz" % version))
            for t in range(len(DIMS)):
                # Exactly the ranks' rows of that version; one process trained the same
                # keys (rows equal up to the order in which gradients were summed).
                expected = _expected_rows(trained, t)
                np.testing.assert_array_equal(
                    got["rows%d" % t], expected, err_msg="version %d" % version
                )
                np.testing.assert_array_equal(
                    np.all(expected == DEFAULT, -1), np.all(_expected_rows(local, t) == DEFAULT, -1)
                )
                np.testing.assert_allclose(
                    got["rows%d" % t], want["rows%d" % t], rtol=TOL, atol=TOL
                )
            np.testing.assert_allclose(got["p"], want["p"], rtol=TOL, atol=TOL)
            if version == 0:
                cold = frozen.predict(feeds)
                for key, value in got.items():
                    np.testing.assert_array_equal(cold[key], value)
        late = ServedModel(os.path.join(out, "export"))
        try:
            applied = follow(push, late)
            assert len(applied) <= 2 and applied[-1] == versions[-1]
            for key, value in late.predict(feeds).items():
                np.testing.assert_array_equal(value, got[key])
        finally:
            late.close()
    finally:
        for model in (served, reference, frozen):
            model.close()
