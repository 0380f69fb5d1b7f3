"""The batched exchange of tables sharded over ranks (rec_sdk.distribute.ranks): the ops that pack
many tables' rows into one exchange, a step's op count flat in the table count, and many
tables of mixed dims and optimizers over ranks training as one process (processes on
127.0.0.1, free ports, always stopped)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tests.helpers import new_session
from tests.rank_runs import run_ranks
from tests.test_distribute import _env, _rank_cluster

from rec_sdk.distribute import ranks as ranks_module
from rec_sdk.distribute.ranks import routes as rank_routes
from rec_sdk.ops import table_ops

HERE = os.path.dirname(os.path.abspath(__file__))
TABLES_WORKER = os.path.join(HERE, "distribute", "tables_rank_worker.py")


def test_pack_and_split_rows_match_numpy():
    with tf.Graph().as_default(), new_session() as sess:
        _pack_and_split(sess)


def _pack_and_split(sess):
    rng = np.random.default_rng(0)
    blocks = [
        rng.random((3, 2), np.float32),
        rng.random((0, 5), np.float32),
        rng.random((4, 5), np.float32),
        rng.random((2, 1), np.float32),
    ]
    packed, sizes = table_ops.pack_rows([tf.constant(b) for b in blocks], 6)
    back = table_ops.split_rows(packed, sizes, [b.shape[1] for b in blocks])
    packed, sizes, back = sess.run([packed, sizes, back])
    expected = np.zeros((9, 6), np.float32)
    row = 0
    for b in blocks:
        expected[row : row + len(b), : b.shape[1]] = b
        row += len(b)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(sizes, [3, 0, 4, 2])
    for got, b in zip(back, blocks):
        np.testing.assert_array_equal(got, b)
    # int64 vectors are blocks of one column; dims 0 gives vectors back.
    keys, sizes = table_ops.pack_rows(
        [tf.constant([5, -7], tf.int64), tf.constant([[1, 2]], tf.int64)], 2
    )
    keys, (first, second) = sess.run([keys, table_ops.split_rows(keys, sizes, [0, 2])])
    np.testing.assert_array_equal(keys, [[5, 0], [-7, 0], [1, 2]])
    np.testing.assert_array_equal(first, [5, -7])
    np.testing.assert_array_equal(second, [[1, 2]])


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda rows: table_ops.pack_rows([rows], 2)[0], "3 columns, more than width=2"),
        (
            lambda rows: table_ops.split_rows(rows, tf.constant([1, 2]), [3, 3]),
            "sizes add up to 3 rows; packed has 2",
        ),
        (
            lambda rows: table_ops.split_rows(rows, tf.constant([-1, 3]), [3, 3]),
            r"sizes\[0\] must be >= 0",
        ),
        (
            lambda rows: table_ops.split_rows(rows, tf.constant([1, 1]), [3, 4]),
            r"dims\[1\] must be in \[0, 3\]",
        ),
        (
            lambda rows: table_ops.split_rows(rows, tf.constant([2]), [3, 3]),
            "sizes must be a vector of 2",
        ),
    ],
)
def test_pack_and_split_rows_refuse_bad_input(build, message):
    with tf.Graph().as_default(), new_session() as sess:
        rows = tf.compat.v1.placeholder_with_default(tf.ones([2, 3]), [None, None])
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            sess.run(build(rows))


def _step_ops(tables, ranks):
    """The tables worker's graph built (not run) as rank 0 of `ranks` (no servers: the graph
    alone), or as one process (ranks=1) -> {"ops", "collectives"} of a training step."""
    out = os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "rank_ops_%d_%d_%d.json" % (os.getpid(), tables, ranks)
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    if ranks > 1:
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": ["127.0.0.1:1"] * ranks}, "task": {"type": "worker", "index": 0}}
        )
    result = subprocess.run(
        [sys.executable, TABLES_WORKER, out, "--tables", str(tables), "--ops"]
        + ([] if ranks > 1 else ["--local", "2"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    with open(out) as f:
        counted = json.load(f)
    os.remove(out)
    return counted


def test_every_exchange_reads_its_size_hint_before_the_step_changes_it():
    """A step's size class comes from the hint before the step's need updates it, on every
    rank: were the read left unordered (it has no input), a rank that ran it late would pick
    the next class, and the ranks' all-to-alls would wait for each other forever."""
    counted = _step_ops(6, 2)
    assert counted["observes"] >= 2  # the training batches' and the evaluation's
    assert counted["observes_after_read"] == counted["observes"], counted


@pytest.mark.once
def test_a_steps_op_count_over_ranks_is_flat_in_the_table_count():
    """The exchange's ops per step (those over one process's) do not grow with the number of
    tables: 6 and 20 tables of mixed dims, trained by two optimizers (two batches of
    lookups), add the same ops; so do the collectives. The evaluation lookups are batched
    too (when MonitoredTrainingSession or Estimator finalizes the graph)."""
    extra = {}
    for tables in (1, 6, 20):
        ranked, local = _step_ops(tables, 2), _step_ops(tables, 1)
        assert local["collectives"] == local["eval_collectives"] == 0
        extra[tables] = (ranked["ops"] - local["ops"], ranked["collectives"])
        # The evaluation lookups of the graph: one exchange for all of them (the needs
        # gather, the keys all-to-all, the rows all-to-all; a second keys all-to-all
        # when keys did not fit the size class: it runs on such steps only, see below).
        assert ranked["eval_collectives"] == 4, (tables, ranked)
    # One optimizer for one table, two for more: the second adds its gradient all-to-all
    # only (the optimizers share the step's forward exchange); 14 more tables add no op (the
    # ops per table are those one process runs: the table's own lookup and update).
    assert extra[20][0] <= extra[6][0], extra
    assert extra[6][1] == extra[20][1] == extra[1][1] + 1, extra


def _tables_over_ranks(tmp_path, ranks, *args, env=None):
    cluster, tasks = _rank_cluster(ranks)
    outputs = run_ranks(
        [
            (
                [TABLES_WORKER, str(tmp_path / "rank-{rank}.npz")] + list(args),
                dict(_env(cluster, job, index), **(env or {})),
            )
            for job, index in tasks
        ],
        timeout=300,
    )
    for rank, (code, out) in enumerate(outputs):
        assert code == 0, "rank %d exited with %s:\n%s" % (rank, code, out[-4000:])
    shards = [dict(np.load(str(tmp_path / ("rank-%d.npz" % r)))) for r in range(ranks)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [sys.executable, TABLES_WORKER, str(tmp_path / "local.npz"), "--local", str(ranks)]
        + [str(a) for a in args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return shards, dict(np.load(str(tmp_path / "local.npz")))


def _assert_ranks_equal_local(shards, local, tables, rtol=1e-5):
    np.testing.assert_allclose(sum(s["losses"] for s in shards), local["losses"], rtol=rtol)
    for t in range(tables):
        keys = np.concatenate([s["keys%d" % t] for s in shards])
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], local["keys%d" % t])
        values = np.concatenate([s["values%d" % t] for s in shards])[order]
        np.testing.assert_allclose(values, local["values%d" % t], rtol=rtol, atol=1e-6)
        if rtol > 1e-5:
            # Half-precision rows: sums in another order may round to the other neighbour
            # now and then, never more.
            assert np.mean(values == local["values%d" % t]) > 0.95
        slots = np.concatenate([s["slots%d" % t] for s in shards], 1)[:, order]
        np.testing.assert_allclose(slots, local["slots%d" % t], rtol=max(rtol, 1e-5), atol=1e-5)
        # Each rank evaluated its slice of the eval keys; one process all of them.
        evaluated = np.zeros_like(local["eval%d" % t])
        for r, s in enumerate(shards):
            evaluated[r :: len(shards)] = s["eval%d" % t]
        np.testing.assert_allclose(evaluated, local["eval%d" % t], rtol=rtol, atol=1e-6)


@pytest.mark.stress
def test_forty_tables_of_mixed_dims_over_three_ranks_train_as_one_process(tmp_path):
    """40 tables (dims 4 to 16, lazy Adam and SGD) over 3 ranks (the training lookups in one
    exchange, the evaluation lookups in another) == one process on the global batch."""
    shards, local = _tables_over_ranks(tmp_path, 3, "--tables", 40, "--steps", 4)
    _assert_ranks_equal_local(shards, local, 40)
    # The collectives each step ran, on every rank: once the size classes are known (after
    # the first step; the first evaluation), a training step runs the header (which carries
    # the needs), the keys all-to-all and the rows all-to-all of its one batch of lookups
    # (both optimizers'), and one gradient all-to-all per optimizer, nothing else.
    # An evaluation runs three. The first of each also sent the keys again, in a larger
    # class.
    for shard in shards:
        ran = list(shard["collectives_run"])
        assert ran == [6, 5, 5, 5, 4, 3], ran


def test_half_precision_tables_over_two_ranks_train_as_one_process(tmp_path):
    """bfloat16 rows over 2 ranks (rows exchanged as float32, each owner rounding its own
    updates) == one process with bfloat16 rows, to the rounding of the last bit."""
    shards, local = _tables_over_ranks(
        tmp_path, 2, "--tables", 4, "--steps", 3, "--emb-dtype", "bfloat16"
    )
    _assert_ranks_equal_local(shards, local, 4, rtol=2.0**-7)


@pytest.mark.stress
def test_per_host_dedup_over_two_hosts_of_two_ranks_trains_as_one_process(tmp_path):
    """REC_SDK_RANKS_PER_HOST=2 over 4 ranks (2 hosts of 2): each key goes first to the rank
    of its host in the owner's place, which deduplicates the host's keys and passes them to
    the owner (rows back the same way, gradients summed at each level) == one process on the
    global batch; each level runs the collectives of an exchange in its own groups."""
    shards, local = _tables_over_ranks(
        tmp_path, 4, "--tables", 8, "--steps", 3, env={ranks_module.RANKS_PER_HOST_ENV: "2"}
    )
    _assert_ranks_equal_local(shards, local, 8)
    for shard in shards:
        ran = list(shard["collectives_run"])
        # The step header, then two levels of (needs gather, keys, rows, lazy Adam's and
        # SGD's gradients) of the one batch of training lookups; the first step also resends
        # at each level, the first evaluation where its keys outgrew the level's class.
        assert ran[:3] == [1 + 2 * 6, 1 + 2 * 5, 1 + 2 * 5] and ran[4] == 1 + 2 * 3, ran
        assert 1 + 2 * 3 <= ran[3] <= 1 + 2 * 4, ran


def test_ranks_per_host_from_the_setting_and_the_addresses(monkeypatch):
    """REC_SDK_RANKS_PER_HOST: unset / 0 / 1 / one host of every rank / one rank per host:
    no per-host dedup; a divisor L of the rank count: hosts of L consecutive ranks; auto:
    from the addresses (consecutive tasks of a host, as many on each; else none, with a
    warning); anything else is refused naming the setting and the value."""
    devices = ["/job:worker/replica:0/task:%d/device:CPU:0" % r for r in range(4)]
    env = ranks_module.RANKS_PER_HOST_ENV
    two_hosts = ["10.0.0.1:2222", "10.0.0.1:2223", "10.0.0.2:2222", "10.0.0.2:2223"]
    for value, addresses, want in [
        (None, two_hosts, 0),
        ("0", two_hosts, 0),
        ("1", two_hosts, 0),
        ("4", None, 0),
        ("2", None, 2),
        (" Auto ", two_hosts, 2),
        ("auto", ["127.0.0.1:%d" % p for p in range(4)], 0),  # one host
        ("auto", ["a:1", "b:1", "c:1", "d:1"], 0),  # one rank per host
        ("auto", ["a:1", "b:1", "a:2", "b:2"], 0),  # not consecutive
        ("auto", ["a:1", "a:2", "a:3", "b:1"], 0),
    ]:  # not as many on each
        if value is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, value)
        assert ranks_module.ranks_per_host(devices, addresses) == want, (value, addresses)
    for bad in ("3", "-2", "two"):
        monkeypatch.setenv(env, bad)
        with pytest.raises(
            ValueError,
            match="%s must be auto, 0 or a divisor of the rank "
            "count \\(4\\), got '%s'" % (env, bad),
        ):
            ranks_module.ranks_per_host(devices, two_hosts)
    # The routes of rank 3 of 2 hosts of 2: its host's group, then its place's.
    monkeypatch.setenv(env, "2")
    on_host, across = rank_routes.routes(3, devices, two_hosts)
    assert (on_host.group.key, on_host.group.devices, on_host.index) == (3, devices[2:], 1)
    assert (across.group.key, across.group.devices, across.index) == (5, devices[1::2], 1)
    assert not on_host.last and across.last


def _worker_module():
    """tables_rank_worker.py as a module (its data and dims)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tables_rank_worker", TABLES_WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_received_bytes(ranks, tables, steps):
    """What each rank receives per traced step of tables_rank_worker.py (the training steps, then
    the two evaluations), from its data and the exchange's formula: per batch of T lookups
    (dims up to D, one key column), the step header N x 8 x 8 bytes, the keys all-to-all N x
    (T + cap) x 8, the rows N x cap x (D + 1) x 4, each optimizer's gradients N x cap x D x
    4 (the training lookups of both optimizers are one batch), with cap the rows of the
    batch's size class: the hint (class 0 at first; one class above a need that outgrew it),
    or, in a step whose need outgrew the hint, the need's class after a second keys all-to-
    all in it."""
    worker = _worker_module()
    rows, class_of = table_ops.size_class_rows, table_ops.size_class_of
    hints = {}

    def exchange(name, need, lookups, dim, gradients):
        hint = hints.get(name, 0)
        cap = rows(hint)
        total = ranks * 8 * 8 + ranks * (lookups + cap) * 8
        if need > cap:
            cap = rows(class_of(need))
            total += ranks * (lookups + cap) * 8
            hints[name] = class_of(need) + 1
        return total + ranks * cap * (dim + 1) * 4 + gradients * ranks * cap * dim * 4

    def need(keys_of):  # keys_of(t, r) -> rank r's keys of table t
        return max(
            np.bincount(
                np.concatenate([np.abs(np.fmod(np.unique(keys_of(t, r)), ranks)) for t in batch]),
                minlength=ranks,
            ).max()
            for r in range(ranks)
        )

    out = []
    batch = range(tables)
    for step in range(steps):
        ids = {t: worker.global_ids(t, step, worker.BATCH * ranks) for t in batch}
        out.append(
            exchange(
                "train",
                need(lambda t, r, ids=ids: ids[t][r * worker.BATCH : (r + 1) * worker.BATCH]),
                tables,
                max(map(worker.dim_of, batch)),
                min(tables, 2),  # lazy Adam's gradients, then SGD's
            )
        )
    for _ in range(2):
        out.append(
            exchange(
                "eval",
                need(lambda t, r: np.arange(-4, 30 + 3 * t)[r::ranks]),
                tables,
                max(map(worker.dim_of, batch)),
                0,
            )
        )
    return out


@pytest.mark.stress
def test_the_bytes_a_rank_receives_per_step_match_the_formula(tmp_path):
    """Counted (the outputs of the collectives each traced step ran, on every rank) against
    the formula (_expected_received_bytes) for 1, 3 and 8 tables over 2 ranks and 8 over 3:
    no byte more than the keys, rows and gradients in their size classes."""
    for ranks, tables in ((2, 1), (2, 3), (3, 8)):
        shards, _ = _tables_over_ranks(tmp_path, ranks, "--tables", tables, "--steps", 4)
        want = _expected_received_bytes(ranks, tables, 4)
        for shard in shards:
            assert list(shard["received_bytes"]) == want, (ranks, tables)


def test_a_rank_with_empty_batches_trains_with_the_others(tmp_path):
    """Rank 1 looks up no key in any step (it still owns keys and updates them): the ranks
    train as one process on rank 0's batches."""
    shards, local = _tables_over_ranks(tmp_path, 2, "--tables", 3, "--steps", 3, "--empty", 1)
    assert not shards[1]["losses"].any()
    _assert_ranks_equal_local(shards, local, 3)


@pytest.mark.parametrize(
    "how, args, says",
    [
        (
            "leaves a training step early",
            ["--leave-before", "train"],
            "rank 1 leaves before the others' train",
        ),
        (
            "leaves before the evaluation",
            ["--leave-before", "eval"],
            "rank 1 leaves before the others' eval",
        ),
        ("fails with an error", ["--fail-at", "2"], "RuntimeError: rank 1 fails at step 2"),
    ],
)
def test_a_rank_that_runs_a_step_another_left_fails_clearly(tmp_path, how, args, says):
    """Ranks must run the same steps, evaluation included: when rank 1 leaves one training
    step or the evaluation early, or fails, its session's close sends its leave header and
    rank 0's next step fails at once, saying that rank 1 closed its session while rank 0 runs
    another step, instead of waiting for it. No retry: a hang fails the test."""
    del how
    cluster, tasks = _rank_cluster(2)
    outputs = run_ranks(
        [
            (
                [TABLES_WORKER, str(tmp_path / "rank-{rank}.npz"), "--tables", "2", "--steps", "3"]
                + args,
                _env(cluster, job, index),
            )
            for job, index in tasks
        ],
        timeout=120,
    )
    assert says in outputs[1][1], outputs[1][1][-3000:]
    code, out = outputs[0]
    assert code != 0, out[-3000:]
    assert "FailedPreconditionError" in out, out[-3000:]
    assert "rank 1 closed its session while rank 0 runs another step" in out, out[-3000:]


def test_size_classes_and_the_hint_every_rank_keeps_equal():
    """The exchanges' size classes (core/size_class.h) as Python sees them: class i holds
    (4 + i % 4) << (i // 4) keys, SIZE_CLASSES of them; the hint starts at class 0, grows to
    one class above a need at once, and a need no class holds is refused naming it."""
    rows = table_ops.size_class_rows
    with tf.Graph().as_default():
        need = tf.compat.v1.placeholder(tf.int64, [])
        current = table_ops.rank_size_class("test_size_classes")
        observed = table_ops.rank_observe_size(need, "test_size_classes")
        with tf.compat.v1.Session() as sess:
            assert sess.run(current) == (0, 4)
            assert sess.run(observed, {need: 100}) == (19, 112)  # 7 << 4 >= 100 > 6 << 4
            assert rows(19) == 112 and rows(20) == 128
            assert sess.run(current) == (20, 128)
            assert sess.run(observed, {need: 0}) == (0, 4)
            for value in (1, 4, 5, 9, 31, 33, 1000, 4097, 123456):
                index = table_ops.size_class_of(value)
                assert rows(index) >= value > (rows(index - 1) if index else 0)
                assert sess.run(observed, {need: value}) == (index, rows(index))
            largest = rows(table_ops.SIZE_CLASSES - 1)
            assert sess.run(observed, {need: largest}) == (table_ops.SIZE_CLASSES - 1, largest)
            for bad in (largest + 1, -1):
                with pytest.raises(
                    tf.errors.InvalidArgumentError,
                    match=r"need must be in \[0, %d\] rows per rank, got %d" % (largest, bad),
                ):
                    sess.run(observed, {need: bad})
            assert sess.run(current) == (table_ops.SIZE_CLASSES - 1, largest)


def test_a_wait_for_update_steps_finishes_once_they_are_done():
    """rank 0's fence: RankWaitForSteps(target) finishes once the process's count of update
    steps (RankStepDone) reaches target, whichever thread gets there; it holds no thread
    while it waits (two waits pending on a 1-thread pool do not stop the step that ends them)."""
    import threading

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
        done, count = table_ops.rank_step_done(), table_ops.rank_steps()
        target = tf.compat.v1.placeholder(tf.int64, [])
        wait = table_ops.rank_wait_for_steps(target)
        start = sess.run(count)
        sess.run(wait, {target: start})  # reached already: at once
        finished = []
        waiters = [
            threading.Thread(target=lambda: finished.append(sess.run(wait, {target: start + 2})))
            for _ in range(2)
        ]
        for waiter in waiters:
            waiter.start()
        sess.run(done)
        for waiter in waiters:
            waiter.join(0.5)
        assert not finished and sess.run(count) == start + 1
        sess.run(done)
        for waiter in waiters:
            waiter.join(30)
        assert len(finished) == 2 and sess.run(count) == start + 2
        with pytest.raises(tf.errors.InvalidArgumentError, match="target must be a scalar >= 0"):
            sess.run(wait, {target: -1})
