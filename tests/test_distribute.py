"""rec_sdk.distribute: a de.Variable sharded over ps tasks of TensorFlow's gRPC runtime
(processes on 127.0.0.1, free ports, always stopped) trains exactly as the same shards in
one process; a task without rec_sdk's library gives a clear error; TF_CONFIG parsing."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.distribute as dist
from rec_sdk import saver
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.distribute import server as server_main
from rec_sdk.distribute.launch import free_ports, local_cluster
from rec_sdk.ops.loader import (
    RankLostError,
    explain_lost_rank,
    explain_missing_library,
    explain_restarted_task,
)
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.initialize import init, terminate_config_initializer

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distribute", "de_worker.py")
ASYNC_WORKER = os.path.join(HERE, "distribute", "async_worker.py")
RECOVER_WORKER = os.path.join(HERE, "distribute", "recover_worker.py")
ALLREDUCE_WORKER = os.path.join(HERE, "distribute", "allreduce_worker.py")
RANK_WORKER = os.path.join(HERE, "distribute", "rank_worker.py")
ESTIMATOR_RANK_WORKER = os.path.join(HERE, "distribute", "estimator_rank_worker.py")
BARE_SERVER = (
    "import json, os, tensorflow as tf; c = json.loads(os.environ['TF_CONFIG']); "
    "s = tf.distribute.Server(c['cluster'], job_name='ps', "
    "task_index=c['task']['index']); print('rec_sdk server', flush=True); s.join()"
)
# TFRA's recipe for a ps task, with the import renamed.
TFRA_RECIPE_SERVER = "import rec_sdk.dynamic_embedding as de; " + BARE_SERVER


def _env(cluster, job, index):
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
    )
    return env


def _wait_serving(process, timeout=60):
    """Waits for a server process's "rec_sdk server" line."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            line = process.stdout.readline()
            if "rec_sdk server" in line:
                return
            if not line and process.poll() is not None:
                break
    raise AssertionError("a ps task did not start (exit code %r)" % process.poll())


def _start_ps(cluster, index):
    process = subprocess.Popen(
        [sys.executable, "-m", "rec_sdk.distribute.server"],
        env=_env(cluster, "ps", index),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    _wait_serving(process)
    return process


@contextlib.contextmanager
def ps_cluster(num_ps=2, bare=(), recipe=(), num_workers=1):
    """Starts num_ps ps tasks (python -m rec_sdk.distribute.server; the indices in `bare` run
    a bare tf.distribute.Server, those in `recipe` TFRA's ps recipe: import the module, then
    a bare server) and num_workers worker slots; yields the cluster dict. The processes are killed
    on exit, also when the test fails."""
    cluster = local_cluster(num_ps, num_workers)
    commands = [
        (
            "ps",
            i,
            [sys.executable, "-c", BARE_SERVER]
            if i in bare
            else [sys.executable, "-c", TFRA_RECIPE_SERVER]
            if i in recipe
            else [sys.executable, "-m", "rec_sdk.distribute.server"],
        )
        for i in range(num_ps)
    ]
    with _servers(cluster, commands):
        yield cluster


@contextlib.contextmanager
def _servers(cluster, commands):
    """Starts the server processes [(job, index, command)] of `cluster`, waits until each
    serves, and yields them; they are killed on exit, also when the test fails."""
    processes = []
    try:
        for job, index, command in commands:
            processes.append(
                subprocess.Popen(
                    command,
                    env=_env(cluster, job, index),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        for process in processes:
            _wait_serving(process)
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()


def _run_together(runs, timeout=300):
    """Runs the scripts [(argv after python, env)] at once; each must succeed. They are
    killed when one fails or the time is up; the failure shows the output of every one (a
    rank that exits leaves the others waiting in a collective: its output says why)."""
    workers = [
        subprocess.Popen(
            [sys.executable] + [str(a) for a in argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv, env in runs
    ]
    outputs = [[] for _ in workers]
    readers = [
        threading.Thread(target=lambda w=w, out=out: out.extend(w.stdout), daemon=True)
        for w, out in zip(workers, outputs)
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    timed_out = True
    try:
        while time.monotonic() < deadline:
            codes = [w.poll() for w in workers]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                timed_out = False
                break
            time.sleep(0.2)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait()
        for reader in readers:
            reader.join(30)
    report = "\n".join(
        "--- worker %d (exit %s):\n%s" % (i, w.returncode, "".join(out)[-3000:])
        for i, (w, out) in enumerate(zip(workers, outputs))
    )
    assert not timed_out, "workers still running after %d s\n%s" % (timeout, report)
    assert all(w.returncode == 0 for w in workers), report


def _run_worker(cluster, out, *args):
    command = [sys.executable, WORKER, str(out)] + [str(a) for a in args]
    return subprocess.run(
        command,
        env=_env(cluster, "worker", 0),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def test_de_variable_on_two_ps_tasks_trains_as_two_local_shards(tmp_path):
    """2 ps x 1 worker, 50 fixed batches of a de.Variable with Adam and a restrict policy's
    statistics: rows, slots, counts and clocks are bit-identical to the same two shards in
    one process, and shard i holds exactly the keys with key % 2 == i, as TFRA's recipe
    `sess.run([t.size() for t in var.tables])` says. ps task 1 is started as TFRA's recipe
    does (import the module, bare tf.distribute.Server)."""
    with ps_cluster(recipe=(1,)) as cluster:
        remote = _run_worker(cluster, tmp_path / "remote.npz")
    assert remote.returncode == 0, remote.stdout[-3000:]
    local = _run_worker(cluster, tmp_path / "local.npz", "--local", 2)
    assert local.returncode == 0, local.stdout[-3000:]
    got, want = np.load(tmp_path / "remote.npz"), np.load(tmp_path / "local.npz")
    assert sorted(got.files) == sorted(want.files)
    assert got["devices"].tolist() == dist.ps_devices(tf.train.ClusterSpec(cluster))
    for name in set(want.files) - {"devices"}:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for i in range(2):
        assert got["keys%d" % i].size > 100
        assert got["sizes"][i] == got["keys%d" % i].size  # sess.run([t.size() ... tables])
        assert np.all(np.mod(got["keys%d" % i], 2) == i)
        assert got["slots%d" % i].shape[0] == 2  # Adam's m and v in the rows


def _merged(exports):
    """One variable's rows, slots and statistics from an export of any number of shards,
    ordered by key."""
    shards = sorted({int(n[4:]) for n in exports.files if n.startswith("keys")})
    keys = np.concatenate([exports["keys%d" % i] for i in shards])
    order = np.argsort(keys)
    return {
        "keys": keys[order],
        "rows": np.concatenate([exports["rows%d" % i] for i in shards])[order],
        "slots": np.concatenate([exports["slots%d" % i] for i in shards], 1)[:, order],
        "counts": np.concatenate([exports["counts%d" % i] for i in shards])[order],
    }


def test_saver_checkpoint_of_two_ps_restores_into_three_ps_and_into_one_process(tmp_path):
    """Each ps task saves its own shard (Saver, atomically, beside the TF checkpoint); the
    checkpoint restores into 3 ps tasks and into 1 local shard: the same keys, rows, Adam
    slots and access counts, each key on its shard of the new layout."""
    with ps_cluster(2) as cluster:
        saved = _run_worker(cluster, tmp_path / "saved.npz", "--save", tmp_path / "ckpt")
    assert saved.returncode == 0, saved.stdout[-3000:]
    with ps_cluster(3) as cluster:
        three = _run_worker(cluster, tmp_path / "three.npz", "--restore", tmp_path / "ckpt")
    assert three.returncode == 0, three.stdout[-3000:]
    one = _run_worker(cluster, tmp_path / "one.npz", "--local", 1, "--restore", tmp_path / "ckpt")
    assert one.returncode == 0, one.stdout[-3000:]
    want = _merged(np.load(tmp_path / "saved.npz"))
    got3 = np.load(tmp_path / "three.npz")
    assert got3["devices"].tolist() == dist.ps_devices(tf.train.ClusterSpec(cluster))
    for i in range(3):
        assert np.all(np.mod(got3["keys%d" % i], 3) == i)
    for got in (_merged(got3), _merged(np.load(tmp_path / "one.npz"))):
        for name, array in want.items():
            np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_two_asynchronous_workers_with_a_restricting_and_saving_chief(tmp_path):
    """TFRA's recipe, 2 ps x 2 workers training at once (MonitoredTrainingSession, dense
    variables by replica_device_setter, Adagrad), the chief restricting the variable and
    saving checkpoints meanwhile: every step of both workers runs, and the ps tasks hold
    exactly the union of the keys both trained; the chief's checkpoint has the tables."""
    with ps_cluster(2, num_workers=2) as cluster:
        _run_together(
            [
                (
                    [ASYNC_WORKER, tmp_path / ("w%d.npy" % i), tmp_path / "ckpt"],
                    _env(cluster, "worker", i),
                )
                for i in range(2)
            ]
        )
        exported = subprocess.run(
            [
                sys.executable,
                ASYNC_WORKER,
                str(tmp_path / "held.npy"),
                str(tmp_path / "ckpt"),
                "--export",
            ],
            env=_env(cluster, "worker", 1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert exported.returncode == 0, exported.stdout[-3000:]
    union = np.union1d(np.load(tmp_path / "w0.npy"), np.load(tmp_path / "w1.npy"))
    held = np.sort(np.load(tmp_path / "held.npy"))
    np.testing.assert_array_equal(held, union)
    assert union.size > 500  # both workers' keys (disjoint ranges)
    latest = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))
    assert latest is not None
    tables = os.listdir(os.path.join(str(tmp_path / "ckpt"), "sparse-" + os.path.basename(latest)))
    assert sorted(t for t in tables if "_mht_" in t) == ["emb_mht_1of2", "emb_mht_2of2"]


def test_a_killed_asynchronous_worker_leaves_the_others_training(tmp_path):
    """2 ps x 2 asynchronous workers; worker 1 is killed with SIGKILL while it trains: the
    chief runs all its steps, and the tables stay whole: an export after it holds every key
    the chief trained and those worker 1 trained before it died."""
    with ps_cluster(2, num_workers=2) as cluster:
        chief = subprocess.Popen(
            [
                sys.executable,
                ASYNC_WORKER,
                str(tmp_path / "w0.npy"),
                str(tmp_path / "ckpt"),
                "--steps",
                "300",
            ],
            env=_env(cluster, "worker", 0),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        victim = subprocess.Popen(
            [
                sys.executable,
                ASYNC_WORKER,
                str(tmp_path / "w1.npy"),
                str(tmp_path / "ckpt"),
                "--steps",
                "1000000",
            ],
            env=_env(cluster, "worker", 1),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 120
            while not (tmp_path / "worker.ready").exists():
                assert time.time() < deadline and victim.poll() is None
                time.sleep(0.05)
            time.sleep(0.3)  # it trains
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            output = chief.communicate(timeout=300)[0]
            assert chief.returncode == 0, output[-3000:]
        finally:
            for process in (chief, victim):
                if process.poll() is None:
                    process.kill()
                process.wait()
        exported = subprocess.run(
            [
                sys.executable,
                ASYNC_WORKER,
                str(tmp_path / "held.npy"),
                str(tmp_path / "ckpt"),
                "--export",
            ],
            env=_env(cluster, "worker", 1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert exported.returncode == 0, exported.stdout[-3000:]
    held = np.load(tmp_path / "held.npy")
    assert np.isin(np.load(tmp_path / "w0.npy"), held).all()
    assert held.size > np.unique(np.load(tmp_path / "w0.npy")).size  # worker 1's keys too


def test_a_killed_ps_task_restarted_resumes_from_the_last_checkpoint(tmp_path):
    """SIGKILL of the ps task at step 25, a new ps on its port: the chief's
    MonitoredTrainingSession makes a new session, the Saver restores the tables from the
    step-20 checkpoint, and training goes on from global step 20 to the end; the table
    holds every key trained (those of the checkpoint and those trained after). The worker
    logs which ps task stopped and what to do."""
    ports = free_ports(2)
    cluster = {"ps": ["127.0.0.1:%d" % ports[0]], "worker": ["127.0.0.1:%d" % ports[1]]}
    processes = [_start_ps(cluster, 0)]
    worker = None
    try:
        worker = subprocess.Popen(
            [sys.executable, RECOVER_WORKER, str(tmp_path / "out.npz"), str(tmp_path / "ckpt")],
            env=_env(cluster, "worker", 0),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 120
        while not (tmp_path / "killme").exists():
            assert worker.poll() is None and time.time() < deadline, worker.stdout.read()[-3000:]
            time.sleep(0.05)
        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait()
        processes.append(_start_ps(cluster, 0))
        (tmp_path / "restarted").touch()
        output = worker.communicate(timeout=300)[0]
        assert worker.returncode == 0, output[-3000:]
        assert "ps task /job:ps/replica:0/task:0 stopped or restarted" in output, output[-3000:]
    finally:
        for process in processes + ([worker] if worker else []):
            if process.poll() is None:
                process.kill()
            process.wait()
    result = np.load(tmp_path / "out.npz")
    steps = dict(result["log"].tolist())
    # The global step each run read (before its own increment): 24 at the 25th run, then
    # 20 at the 26th, the step-20 checkpoint's.
    assert steps[25] == 24 and steps[26] == 20
    assert int(result["final"]) == 35
    np.testing.assert_array_equal(
        result["held"], np.concatenate([np.arange(16) + 100 * k for k in range(4)])
    )


def test_dense_data_parallel_training_with_all_reduce_matches_one_process(tmp_path):
    """A chief and a worker fit a linear model on their own batches, averaging gradients with
    all_reduce (CollectiveReduceV2 on CPU, graph mode, gRPC): both end with the weights one
    process gets from the two batches together (NumPy), and sum / max reduce exactly."""
    ports = free_ports(2)
    cluster = {"chief": ["127.0.0.1:%d" % ports[0]], "worker": ["127.0.0.1:%d" % ports[1]]}
    jobs = [("chief", 0), ("worker", 0)]
    _run_together(
        [
            ([ALLREDUCE_WORKER, tmp_path / ("%s.npz" % job)], _env(cluster, job, index))
            for job, index in jobs
        ]
    )
    sys.path.insert(0, os.path.dirname(ALLREDUCE_WORKER))
    try:
        import allreduce_worker  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    w = np.ones([3, 1])
    for (x0, y0), (x1, y1) in zip(allreduce_worker.batches(0), allreduce_worker.batches(1)):
        x, y = np.concatenate([x0, x1]).astype(np.float64), np.concatenate([y0, y1])
        w -= 0.1 * 2 * x.T @ (x @ w - y) / len(x)
    for job, _ in jobs:
        got = np.load(tmp_path / ("%s.npz" % job))
        np.testing.assert_allclose(got["w"], w, rtol=1e-5)
        assert got["total"].tolist() == [3, 30] and float(got["largest"]) == 1.0
    with pytest.raises(ValueError, match="reduction must be one of"):
        dist.all_reduce(tf.constant(1.0), "avg")


def _rank_cluster(ranks, chief=False):
    """{"worker": [...]} (or a chief and ranks - 1 workers) on free ports, with each task's
    (job, index) in rank order."""
    ports = free_ports(ranks)
    if chief:
        cluster = {
            "chief": ["127.0.0.1:%d" % ports[0]],
            "worker": ["127.0.0.1:%d" % p for p in ports[1:]],
        }
        return cluster, [("chief", 0)] + [("worker", i) for i in range(ranks - 1)]
    return ({"worker": ["127.0.0.1:%d" % p for p in ports]}, [("worker", i) for i in range(ranks)])


def _run_ranks(ranks, out, *args, chief=False):
    """Runs rank_worker.py as `ranks` ranks of a cluster (all must succeed); -> the loaded
    outputs in rank order."""
    cluster, tasks = _rank_cluster(ranks, chief)
    _run_together(
        [
            ([RANK_WORKER, str(out) + "-{rank}.npz"] + list(args), _env(cluster, job, index))
            for job, index in tasks
        ]
    )
    return [dict(np.load(str(out) + "-%d.npz" % rank)) for rank in range(ranks)]


def _run_local(out, *args):
    """rank_worker.py in one process (no TF_CONFIG) -> its output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [sys.executable, RANK_WORKER, str(out)] + [str(a) for a in args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return dict(np.load(out))


def _union(shards):
    """The shards' exports as one table, sorted by key (rows, slots, admission counts)."""
    keys = np.concatenate([s["keys"] for s in shards])
    order = np.argsort(keys, kind="stable")
    access = np.concatenate([s["access_keys"] for s in shards])
    aorder = np.argsort(access, kind="stable")
    return {
        "keys": keys[order],
        "values": np.concatenate([s["values"] for s in shards])[order],
        "slots": np.concatenate([s["slots"] for s in shards], 1)[:, order],
        "access_keys": access[aorder],
        "counts": np.concatenate([s["counts"] for s in shards])[aorder],
    }


@pytest.fixture(scope="module")
def sdk_two_ranks(tmp_path_factory):
    """The SDK-API model trained 12 steps by a chief and a worker (rank 0 saving a checkpoint
    at the end), and by one process on the global batches."""
    tmp = tmp_path_factory.mktemp("sdk_ranks")
    ranks = _run_ranks(2, tmp / "rank", "--checkpoint", tmp / "ckpt", "--save", chief=True)
    local = _run_local(
        tmp / "local.npz", "--local", 2, "--checkpoint", tmp / "local_ckpt", "--save"
    )
    return ranks, local, tmp / "ckpt"


def test_sdk_api_two_ranks_train_as_one_process_with_the_global_batch(sdk_two_ranks):
    """create_table + two sparse_lookups with admission (access_threshold=2), steps_to_live
    eviction by EvictHook, lazy Adam with all2all_gradients_op="sum_gradients_and_div_by_
    ranksize", dense gradients through hccl_ops.allreduce, MonitoredTrainingSession: 2 ranks
    on their own batches end with the table (rows, slots, admission counts), the dense
    weights, the losses and eval lookups of one process that trains on both batches. Each rank
    holds exactly the keys with abs(key % 2) == rank; counts are sums over the ranks (a key
    seen once on each rank in a step is admitted in that step)."""
    ranks, local, _ = sdk_two_ranks
    for rank, shard in enumerate(ranks):
        assert (int(shard["rank"]), int(shard["ranks"])) == (rank, 2)
        assert len(shard["keys"]) and np.all(np.abs(np.fmod(shard["keys"], 2)) == rank)
    assert int(local["ranks"]) == 1
    np.testing.assert_allclose(
        (ranks[0]["losses"] + ranks[1]["losses"]) / 2, local["losses"], rtol=1e-5, atol=1e-6
    )
    for shard in ranks:
        np.testing.assert_allclose(shard["w"], local["w"], rtol=1e-5, atol=1e-6)
    union = _union(ranks)
    np.testing.assert_array_equal(union["keys"], local["keys"])
    np.testing.assert_allclose(union["values"], local["values"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(union["slots"], local["slots"], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(union["access_keys"], local["access_keys"])
    np.testing.assert_array_equal(union["counts"], local["counts"])
    assert (union["counts"] >= 2).any() and len(local["keys"]) < 45  # admission and eviction
    evaluated = np.empty_like(local["eval"])
    evaluated[0::2], evaluated[1::2] = ranks[0]["eval"], ranks[1]["eval"]
    np.testing.assert_allclose(evaluated, local["eval"], rtol=1e-5, atol=1e-6)
    assert (local["eval"] == -1.0).all(-1).any()  # unknown keys read serving_default_value


@pytest.mark.parametrize("mode", ["spec", "modify", "table_gradients"])
def test_sdk_api_two_ranks_in_feature_spec_and_graph_modification_modes(
    mode, sdk_two_ranks, tmp_path
):
    """The same model with FeatureSpec lookups on a dataset mapped with get_asc_insert_func
    (one exchange per table and batch), with modify_graph=True lookups moved into the input
    pipeline by modify_graph_and_start_emb_cache (the optimizer built before follows the
    pipeline's exchange), or trained by minimize(loss, var_list=[table]) (the table's
    gradient from tf.gradients, both lookups in one IndexedSlices): 2 ranks train as one
    process on the global batch, which in turn trains as the fed lookups do."""
    args = ["--table-gradients"] if mode == "table_gradients" else ["--input", mode]
    ranks = _run_ranks(2, tmp_path / mode, *args)
    local = _run_local(tmp_path / "local.npz", "--local", 2, *args)
    np.testing.assert_allclose(
        (ranks[0]["losses"] + ranks[1]["losses"]) / 2, local["losses"], rtol=1e-5, atol=1e-6
    )
    union = _union(ranks)
    for key in ("keys", "access_keys", "counts"):
        np.testing.assert_array_equal(union[key], local[key])
    np.testing.assert_allclose(union["values"], local["values"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(union["slots"], local["slots"], rtol=1e-5, atol=1e-7)
    fed = sdk_two_ranks[1]
    np.testing.assert_allclose(local["losses"], fed["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(local["values"], fed["values"], rtol=1e-5, atol=1e-6)


def test_sdk_api_three_ranks_with_a_rank_sending_one_owner_train_as_one_process(tmp_path):
    """3 ranks (an owner count that is not a power of two), rank 1's keys all owned by rank 0
    (it sends the other owners nothing, and rank 2 owns none of its keys): the exchange gives
    every owner exactly the keys it owns, and the ranks train as one process on the global
    batch."""
    ranks = _run_ranks(3, tmp_path / "three", "--skew")
    local = _run_local(tmp_path / "local.npz", "--local", 3, "--skew")
    np.testing.assert_allclose(
        sum(r["losses"] for r in ranks) / 3, local["losses"], rtol=1e-5, atol=1e-6
    )
    for rank, shard in enumerate(ranks):
        assert len(shard["keys"]) and np.all(np.abs(np.fmod(shard["keys"], 3)) == rank)
    union = _union(ranks)
    for key in ("keys", "access_keys", "counts"):
        np.testing.assert_array_equal(union[key], local[key])
    np.testing.assert_allclose(union["values"], local["values"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(union["slots"], local["slots"], rtol=1e-5, atol=1e-7)
    evaluated = np.empty_like(local["eval"])
    for rank in range(3):
        evaluated[rank::3] = ranks[rank]["eval"]
    np.testing.assert_allclose(evaluated, local["eval"], rtol=1e-5, atol=1e-6)


def test_sdk_api_checkpoint_of_two_ranks_restores_into_three_ranks_and_one_process(
    sdk_two_ranks, tmp_path
):
    """Rank 0's Saver (MonitoredTrainingSession's) writes each rank's shard (emb@<r>of2) at
    the last step, before that step's eviction (rank 0 evicts every shard, after its save);
    3 ranks restore it (each shard keeping abs(key % 3) == rank) and so does one process:
    identical tables and dense weights, those of one process's checkpoint of the global batch
    at that step. 2 ranks restore that one-process checkpoint (its table, "emb") too."""
    ranks, _, checkpoint = sdk_two_ranks
    shards = sorted(os.listdir(checkpoint / "sparse-model.ckpt-12"))
    assert shards == ["emb@0of2", "emb@1of2"]
    three = _run_ranks(3, tmp_path / "three", "--checkpoint", checkpoint, "--steps", 0)
    for rank, shard in enumerate(three):
        assert np.all(np.abs(np.fmod(shard["keys"], 3)) == rank)
        np.testing.assert_array_equal(shard["w"], ranks[0]["w"])
    one = _run_local(tmp_path / "one.npz", "--local", 1, "--checkpoint", checkpoint, "--steps", 0)
    np.testing.assert_array_equal(one["w"], ranks[0]["w"])
    restored = _union([one])
    for key, value in _union(three).items():
        np.testing.assert_array_equal(value, restored[key])
    local_checkpoint = checkpoint.parent / "local_ckpt"
    assert os.listdir(local_checkpoint / "sparse-model.ckpt-12") == ["emb"]
    local = _union(
        [
            _run_local(
                tmp_path / "again.npz", "--local", 1, "--checkpoint", local_checkpoint, "--steps", 0
            )
        ]
    )
    for key in ("keys", "access_keys", "counts"):
        np.testing.assert_array_equal(restored[key], local[key])
    np.testing.assert_allclose(restored["values"], local["values"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(restored["slots"], local["slots"], rtol=1e-5, atol=1e-7)
    assert len(local["keys"]) > len(ranks[0]["keys"]) + len(ranks[1]["keys"])  # evicted after
    from_one = _run_ranks(2, tmp_path / "from_one", "--checkpoint", local_checkpoint, "--steps", 0)
    for rank, shard in enumerate(from_one):
        assert np.all(np.abs(np.fmod(shard["keys"], 2)) == rank)
    for key, value in _union(from_one).items():
        np.testing.assert_array_equal(value, local[key])


@pytest.mark.estimator
def test_sdk_api_estimator_over_two_ranks_trains_as_one_process(tmp_path):
    """tf.estimator with TF_CONFIG (a chief and a worker, Estimator.train, EvictHook on both):
    the worker needs no chief to initialise its variables (every rank's local initialisation
    receives rank 0's values), the chief's checkpoint holds both shards, and it restores into
    the table and dense weights one process's Estimator gets on the global batch."""
    cluster, tasks = _rank_cluster(2, chief=True)
    _run_together(
        [
            ([ESTIMATOR_RANK_WORKER, tmp_path / "ranks"], _env(cluster, job, index))
            for job, index in tasks
        ]
    )
    assert sorted(os.listdir(tmp_path / "ranks" / "sparse-model.ckpt-12")) == [
        "emb@0of2",
        "emb@1of2",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    _run_together([([ESTIMATOR_RANK_WORKER, tmp_path / "one", "--local", 2], env)])
    restored = [
        _run_local(
            tmp_path / ("%s.npz" % d), "--local", 1, "--steps", 0, "--checkpoint", tmp_path / d
        )
        for d in ("ranks", "one")
    ]
    for key in ("keys", "access_keys", "counts"):
        np.testing.assert_array_equal(restored[0][key], restored[1][key])
    for key in ("values", "slots", "w"):
        np.testing.assert_allclose(restored[0][key], restored[1][key], rtol=1e-5, atol=1e-6)
    assert len(restored[0]["keys"]) < 46  # some keys were evicted, some never admitted


def test_sdk_api_a_killed_rank_fails_the_others_clearly_and_a_restart_resumes(tmp_path):
    """Rank 1 of 2 is killed (SIGKILL) before step 5: rank 0 stops at once with RankLostError
    naming the lost task (MonitoredTrainingSession would otherwise wait for it forever), and
    the checkpoint it saved every 2 steps restarts both ranks, which train on from its step."""
    cluster, tasks = _rank_cluster(2)
    checkpoint = tmp_path / "ckpt"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                RANK_WORKER,
                str(tmp_path / "x-{rank}.npz"),
                "--steps",
                "1000",
                "--die-at",
                "5",
                "--checkpoint",
                str(checkpoint),
                "--save",
                "--save-every",
                "2",
            ],
            env=_env(cluster, job, index),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for job, index in tasks
    ]
    try:
        output = processes[0].communicate(timeout=120)[0]
        processes[1].wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert processes[1].returncode == -signal.SIGKILL
    assert processes[0].returncode == 1, output[-3000:]
    assert (
        "RankLostError: a training task of this synchronous cluster stopped or failed "
        "(task /job:worker/replica:0/task:1)" in output
    ), output[-3000:]
    saved = tf.train.latest_checkpoint(str(checkpoint))
    assert saved is not None and int(saved.rsplit("-", 1)[1]) in (2, 4)
    resumed = _run_ranks(2, tmp_path / "resumed", "--checkpoint", checkpoint, "--steps", 3)
    assert [int(r["step"]) for r in resumed] == [int(saved.rsplit("-", 1)[1]) + 3] * 2
    assert all(len(r["keys"]) for r in resumed)


def test_launch_runs_the_distributed_example_and_stops_everything():
    """python -m rec_sdk.distribute.launch: 2 ps + 2 workers of the example on one machine;
    both run every step and the model learns the synthetic labels; a failing worker's exit
    code is the launch's, and its partner is stopped."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.distribute.launch",
            "--ps",
            "2",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-m",
            "rec_sdk.examples.distributed_de",
            "--steps",
            "250",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    accuracies = []
    for i in range(2):
        final = [
            line
            for line in result.stdout.splitlines()
            if line.startswith("[worker %d] worker %d step 250:" % (i, i))
        ]
        assert final, result.stdout[-3000:]
        accuracies.append(float(final[0].split("accuracy ")[1].split()[0]))
    # Asynchronous: the worker that finishes last has trained on both workers' steps.
    assert max(accuracies) > 0.9, result.stdout[-3000:]
    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.distribute.launch",
            "--ps",
            "1",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-c",
            "import json, os, sys, time; "
            "i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
            "time.sleep(60 if i else 0); sys.exit(3)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 3, failed.stdout


def test_the_training_example_trains_dlrm_on_ps_tasks():
    """python -m rec_sdk.examples.train --api dynamic_embedding in a launched cluster (2 ps,
    1 worker): DLRM's variables sharded over the ps tasks train and evaluate."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.distribute.launch",
            "--ps",
            "2",
            "--workers",
            "1",
            "--",
            sys.executable,
            "-m",
            "rec_sdk.examples.train",
            "--api",
            "dynamic_embedding",
            "--model",
            "dlrm",
            "--data",
            "synthetic",
            "--rows",
            "5000",
            "--steps",
            "20",
            "--eval-every",
            "20",
            "--batch-size",
            "128",
            "--eval-batch-size",
            "512",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    final = [line for line in result.stdout.splitlines() if "[worker 0] final: eval AUC" in line]
    assert final, result.stdout[-3000:]
    assert 0.0 < float(final[0].split("AUC ")[1].split()[0]) <= 1.0


def test_the_training_example_trains_dlrm_over_two_ranks():
    """rec_sdk.examples.train with the SDK API in a cluster without ps tasks: 2 ranks train
    one model synchronously (each on its slice of the data) and so report the same AUC."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rec_sdk.distribute.launch",
            "--ps",
            "0",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-m",
            "rec_sdk.examples.train",
            "--model",
            "dlrm",
            "--data",
            "synthetic",
            "--rows",
            "8000",
            "--steps",
            "60",
            "--eval-every",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    finals = [
        line.split("final: ", 1)[1] for line in result.stdout.splitlines() if "final: " in line
    ]
    assert len(finals) == 2, result.stdout[-3000:]
    aucs = [float(final.split()[2]) for final in finals]
    assert aucs[0] == aucs[1] and aucs[0] > 0.55, finals


def test_a_ps_task_without_the_library_is_a_clear_error(tmp_path):
    with ps_cluster(bare=(0,)) as cluster:
        result = _run_worker(cluster, tmp_path / "x.npz")
    assert result.returncode != 0
    assert "rec_sdk's op library is not loaded in task /job:ps/replica:0/task:0" in result.stdout, (
        result.stdout[-3000:]
    )
    assert "python -m rec_sdk.distribute.server" in result.stdout


def test_a_cancelled_step_of_a_restarted_task_is_an_aborted_one():
    """MonitoredTrainingSession recovers from AbortedError only; a step cancelled because a
    ps task restarted reports CANCELLED first (seen in CI): it is re-raised as AbortedError."""
    message = (
        "Graph execution error:\n\nCANCELLED: From /job:worker/replica:0/task:0:\n"
        "RecvFromRemoteAsync is cancelled.\nABORTED: From /job:ps/replica:0/task:0:\n"
        "Session handle is not found: 337e. Possibly this worker "
        '("/job:ps/replica:0/task:0") just restarted.'
    )
    clear = explain_restarted_task(tf.errors.CancelledError(None, None, message))
    assert isinstance(clear, tf.errors.AbortedError) and clear.message == message
    assert (
        explain_restarted_task(tf.errors.CancelledError(None, None, "Run call was cancelled"))
        is None
    )
    assert explain_restarted_task(tf.errors.AbortedError(None, None, message)) is None


def test_sharded_tables_guard_rails(monkeypatch, tmp_path):
    """In a cluster (TF_CONFIG only, nothing runs): a rank that manages no shard saves
    nothing and never touches the directory; NumPy export and deltas refuse sharded tables;
    an IndexedSlices not keyed by the lookups is refused, not applied as row addresses; each
    graph gets its own collective instance keys; a cancelled collective of a restarted task is
    a RankLostError."""
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    (tmp_path / "ckpt").mkdir()
    for index in (1, 0):
        monkeypatch.setenv(
            "TF_CONFIG",
            json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        init(use_dynamic_expansion=True)
        try:
            with tf.Graph().as_default() as graph:
                table = create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())
                emb = sparse_lookup(table, tf.constant([1, 2, 3], tf.int64))
                with tf.compat.v1.Session(graph=graph) as sess:
                    if index == 1:
                        assert saver.save_tables(sess, tmp_path / "ckpt") == {}
                        assert os.listdir(tmp_path / "ckpt") == []
                        continue
                    with pytest.raises(ValueError, match="sharded over 2 ranks; export_npz"):
                        saver.export_npz(sess, tmp_path / "x.npz")
                    with pytest.raises(ValueError, match=r"save_tables\(delta=True\)"):
                        saver.save_tables(sess, tmp_path / "d", delta=True)
                opt = create_hash_optimizer_by_address(learning_rate=0.1)
                foreign = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([0, 1], tf.int64))
                with pytest.raises(TypeError, match="not keyed by its lookups"):
                    opt.apply_gradients([(foreign, table)])
                assert (
                    opt.apply_gradients([(tf.gradients(tf.reduce_sum(emb), table)[0], table)])
                    is not None
                )
                keys = {
                    int(tf.get_static_value(op.inputs[3])) // (1 << 20)
                    for op in graph.get_operations()
                    if op.type == "CollectiveGatherV2" and op.inputs[3].op.type == "Const"
                }
            with tf.Graph().as_default() as other:
                dist.all_reduce(tf.constant([1.0]))
                [op] = [o for o in other.get_operations() if o.type == "CollectiveReduceV2"]
                assert int(tf.get_static_value(op.inputs[3])) // (1 << 20) not in keys
            restarted = tf.errors.CancelledError(
                None,
                None,
                (
                    "RecvFromRemoteAsync is cancelled.\nABORTED: From /job:worker/replica:0/task:1:"
                    "\nSession handle is not found. Possibly this worker just restarted."
                ),
            )
            assert isinstance(explain_lost_rank(restarted, graph), RankLostError)
        finally:
            terminate_config_initializer()


def test_a_peer_gone_before_this_rank_fetched_its_buffers_is_a_lost_rank():
    """A peer that finished its part of a step and was killed before this rank fetched its
    buffers: RecvBuf fails to connect, with no word about collectives; in a graph with
    collectives that is a lost rank (MonitoredTrainingSession would otherwise make a new
    session and wait for the dead task forever), in one without, it is left as it is."""
    message = (
        "failed to connect to all addresses\nAdditional GRPC error information from remote "
        "target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf:"
    )
    error = tf.errors.UnavailableError(None, None, message)
    with tf.Graph().as_default() as graph:  # a graph of a rank (built, never run)
        tf.raw_ops.CollectiveGatherV2(
            input=tf.constant([1.0]),
            group_size=tf.constant(2),
            group_key=tf.constant(1),
            instance_key=tf.constant(1),
            ordering_token=[],
        )
    lost = explain_lost_rank(error, graph)
    assert isinstance(lost, RankLostError) and "(task /job:worker/replica:0/task:2)" in str(lost)
    with tf.Graph().as_default() as plain:
        tf.constant(1.0)
    assert explain_lost_rank(error, plain) is None
    ps = tf.errors.UnavailableError(
        None, None, "Socket closed\nfrom remote target /job:ps/replica:0/task:0 while calling X"
    )
    assert explain_lost_rank(ps, graph) is None


def test_explain_missing_library_words_only_that_error():
    error = tf.errors.NotFoundError(
        None,
        None,
        "Op type not registered 'RecSdk>EmbeddingTable' in binary running on vm. "
        "Additional GRPC error information from remote target /job:ps/replica:0/task:1:",
    )
    clear = explain_missing_library(error)
    assert isinstance(clear, tf.errors.NotFoundError)
    assert "not loaded in task /job:ps/replica:0/task:1" in clear.message
    assert "RecSdk>EmbeddingTable" in clear.message
    assert (
        explain_missing_library(tf.errors.NotFoundError(None, None, "Op type not registered 'Foo'"))
        is None
    )


def test_cluster_task_tf_config_and_devices(monkeypatch):
    cluster = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
    task = dist.task_from_tf_config(
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    assert (task.job_name, task.task_index) == ("worker", 0)
    assert dist.ps_devices(task) == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    assert list(dist.worker_config(task).device_filters) == ["/job:ps", "/job:worker/task:0"]
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 1}})
    )
    assert server_main.parse([]).task_index == 1
    assert (
        server_main.parse(["--cluster", json.dumps(cluster), "--job", "ps", "--task", "0"]).job_name
        == "ps"
    )
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG is not set"):
        dist.task_from_tf_config()
    with pytest.raises(ValueError, match="not JSON"):
        dist.task_from_tf_config("{")
    with pytest.raises(ValueError, match='"task" dict'):
        dist.task_from_tf_config({"cluster": cluster})
    with pytest.raises(ValueError, match="job_name 'chief' is not a job"):
        dist.ClusterTask(cluster, "chief", 0)
    with pytest.raises(ValueError, match=r"task_index must be an integer in \[0, 2\)"):
        dist.ClusterTask(cluster, "ps", 2)
    with pytest.raises(ValueError, match="no 'ps' job"):
        dist.ps_devices(tf.train.ClusterSpec({"worker": ["127.0.0.1:3"]}))
    with pytest.raises(SystemExit):
        server_main.parse(["--job", "ps"])


def test_a_process_pinned_to_fewer_cores_gets_as_many_threads(monkeypatch):
    """pinned_config: a process whose affinity allows fewer CPUs than the machine has gets
    TensorFlow thread pools of that size (a copy; thread counts the config sets are kept);
    on every core, the config is returned as it is (None included). worker_config too."""
    cores = os.cpu_count()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert dist.pinned_config() is None
    given = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
    assert dist.pinned_config(given) is given
    monkeypatch.setattr(os, "cpu_count", lambda: cores + 3)
    got = dist.pinned_config(given)
    assert got is not given and not given.intra_op_parallelism_threads
    assert (got.intra_op_parallelism_threads, got.inter_op_parallelism_threads) == (cores, cores)
    assert list(got.device_filters) == ["/job:ps"]
    given.inter_op_parallelism_threads = 7
    assert dist.pinned_config(given).inter_op_parallelism_threads == 7
    task = dist.ClusterTask({"worker": ["127.0.0.1:3"]}, "worker", 0)
    assert dist.worker_config(task).intra_op_parallelism_threads == cores
    # A real pinned process (taskset): one core, one thread per pool.
    result = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-c",
            "import rec_sdk.distribute as d; c = d.pinned_config(); "
            "print(c and (c.intra_op_parallelism_threads, c.inter_op_parallelism_threads))",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip().endswith("None" if cores == 1 else "(1, 1)"), result.stdout


PSS_CHIEF = os.path.join(HERE, "distribute", "pss_chief.py")


@pytest.mark.parametrize("call", ["plain", "nested"])
def test_keras_fit_under_parameter_server_strategy_keeps_tables_on_the_ps_tasks(tmp_path, call):
    """TFRA's movielens-1m-keras-ps shape: tf.distribute.experimental.ParameterServerStrategy
    (chief + 2 worker servers + 2 ps), de.keras.layers.SquashedEmbedding(devices=ps),
    model.fit, with the model's call a plain method or (as in the demo) a tf.function of
    its own. The workers used to abort on TensorFlow's `Check failed: size >= 0` (a
    variable of unknown shape placed on a ps task), and a nested call was refused; now the
    model trains: the loss falls, and the ps tables hold every key of the data."""
    ports = ["127.0.0.1:%d" % port for port in free_ports(5)]
    cluster = {"chief": [ports[0]], "worker": ports[1:3], "ps": ports[3:5]}
    server = [sys.executable, "-m", "rec_sdk.distribute.server"]
    out = tmp_path / "pss.json"
    with _servers(
        cluster, [(job, i, server) for job in ("ps", "worker") for i in range(2)]
    ) as servers:
        chief = subprocess.run(
            [sys.executable, PSS_CHIEF, str(out), call],
            env=_env(cluster, "chief", 0),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert chief.returncode == 0, chief.stdout[-3000:]
        for process in servers:
            assert process.poll() is None, "a worker or ps task died"
    result = json.loads(out.read_text())
    assert result["stored"] == result["distinct"] == 70
    assert all("/job:ps/" in device for device in result["table_devices"])
    losses = result["losses"]
    assert losses[-1] < 0.9 * losses[0], losses
