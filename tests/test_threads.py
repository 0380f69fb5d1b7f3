"""The same training gives the same tables whatever the intra-op threads: tests/threads_worker.py
(five tables: plain, admission with eviction by steps, evict_when_full, bfloat16 rows, an SSD
tier) trains 100 steps with 1, 2 and 8 threads, each in its own process (TensorFlow sizes its
pools once per process), and every table's keys, rows, optimizer slots, last-seen clocks,
access counts and counters must be equal bit for bit."""

import os
import subprocess
import sys

import numpy as np
import pytest
from tests.rank_runs import run_ranks
from tests.test_distribute import _env, _rank_cluster

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "threads_worker.py")


def _load(path):
    with np.load(path) as f:
        return {name: f[name] for name in f.files}


def _train(threads, tmp_path):
    out = tmp_path / ("threads%d.npz" % threads)
    ssd = tmp_path / ("ssd%d" % threads)
    ssd.mkdir()
    done = subprocess.run(
        [sys.executable, WORKER, str(threads), str(out), str(ssd)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _load(out)


def _train_ranks(threads, tmp_path, ranks=2):
    """Each rank's saved shards after training as `ranks` ranks with `threads` threads each."""
    cluster, tasks = _rank_cluster(ranks)
    out = tmp_path / ("ranks%d-{rank}.npz" % threads)
    runs = []
    for job, index in tasks:
        ssd = tmp_path / ("ssd%d-%d" % (threads, index))
        ssd.mkdir()
        runs.append(([WORKER, threads, out, ssd], _env(cluster, job, index)))
    for rank, (code, text) in enumerate(run_ranks(runs, timeout=600)):
        assert code == 0, "rank %d exited with %s:\n%s" % (rank, code, text[-3000:])
    return [_load(str(out).replace("{rank}", str(r))) for r in range(ranks)]


def _assert_equal(runs):
    one = runs[1]
    for threads in (2, 8):
        other = runs[threads]
        assert sorted(other) == sorted(one)
        for name in sorted(one):
            np.testing.assert_array_equal(
                other[name], one[name], err_msg="%s with %d threads" % (name, threads)
            )


@pytest.mark.once
def test_tables_are_the_same_with_1_2_and_8_threads(tmp_path):
    runs = {threads: _train(threads, tmp_path) for threads in (1, 2, 8)}
    one = runs[1]
    # The workload reaches what it is meant to: rejections, evictions, a full table, SSD.
    assert len(one["plain/keys"]) > 10000
    assert len(one["full/keys"]) <= 3000
    _assert_equal(runs)


@pytest.mark.once
def test_shards_over_two_ranks_are_the_same_with_1_2_and_8_threads(tmp_path):
    runs = {threads: _train_ranks(threads, tmp_path) for threads in (1, 2, 8)}
    for rank in range(2):
        shard = runs[1][rank]
        assert len(shard["plain/keys"]) > 5000, rank
        _assert_equal({threads: runs[threads][rank] for threads in runs})
