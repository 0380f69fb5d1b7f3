"""Restarts by `python -m rec_sdk.distribute.launch --max-restarts N`: when a worker fails,
every task is stopped and started again (new ports, REC_SDK_RESTART=k); ranks that restore
their checkpoint directory train on from the last checkpoint, exactly as an uninterrupted
run restored from that checkpoint does."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_WORKER = os.path.join(HERE, "distribute", "rank_worker.py")
LAST_STEP, DIE_AT, SAVE_EVERY = 10, 5, 2


def _launch(*args, timeout=400):
    """launch's output and exit code (it never outlives `timeout`)."""
    result = subprocess.run(
        [sys.executable, "-m", "rec_sdk.distribute.launch"] + [str(a) for a in args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    return result.returncode, result.stdout


def _train(out, checkpoint, restarts=0, *args):
    """rank_worker.py (`args` added) over 2 ranks under launch --max-restarts `restarts`,
    training to LAST_STEP from `checkpoint`."""
    return _launch(
        "--ps", 0, "--workers", 2, "--max-restarts", restarts, "--",
        sys.executable, RANK_WORKER, str(out) + "-{rank}.npz", "--checkpoint", checkpoint,
        "--save", "--save-every", SAVE_EVERY, "--last-step", LAST_STEP, *args,
    )  # fmt: skip


def _resumed(output, worker):
    """The global steps worker `worker` resumed from, one per start."""
    return [int(s) for s in re.findall(r"^\[worker %d\] RESUMED (\d+)$" % worker, output, re.M)]


def test_a_killed_rank_restarts_every_rank_which_train_on_exactly_from_the_last_checkpoint(
    tmp_path,
):
    """Rank 1 of 2 is killed (SIGKILL) before step 5 under --max-restarts 1: launch stops
    rank 0 and starts both again, which restore the checkpoint of step 4 (saved every 2
    steps) and train to step 10. Their tables (keys, rows, Adam slots, admission counts),
    dense weights, losses and evaluation equal, bit for bit, those of an uninterrupted run of
    2 ranks restored from that same checkpoint."""
    checkpoint = tmp_path / "ckpt"
    code, output = _train(tmp_path / "restarted", checkpoint, 1, "--die-at", DIE_AT)
    assert code == 0, output[-5000:]
    assert (
        "[launch] worker 1 was killed by signal 9; every task stopped, starting them all again "
        "from the last checkpoint (restart 1 of 1)" in output
    ), output[-5000:]
    last = (DIE_AT // SAVE_EVERY) * SAVE_EVERY
    assert _resumed(output, 0) == _resumed(output, 1) == [0, last], output[-5000:]
    # The reference: a copy of the checkpoint directory whose latest checkpoint is `last`.
    reference = tmp_path / "reference"
    shutil.copytree(checkpoint, reference)
    assert (reference / ("sparse-model.ckpt-%d" % last)).is_dir()
    tf.compat.v1.train.update_checkpoint_state(
        str(reference), str(reference / ("model.ckpt-%d" % last))
    )
    code, output = _train(tmp_path / "uninterrupted", reference)
    assert code == 0, output[-5000:]
    assert _resumed(output, 0) == _resumed(output, 1) == [last], output[-5000:]
    for rank in range(2):
        restarted = np.load(tmp_path / ("restarted-%d.npz" % rank))
        uninterrupted = np.load(tmp_path / ("uninterrupted-%d.npz" % rank))
        assert int(restarted["step"]) == LAST_STEP
        assert len(restarted["losses"]) == LAST_STEP - last
        assert len(restarted["keys"]) > 0
        for key in uninterrupted.files:
            np.testing.assert_array_equal(restarted[key], uninterrupted[key], err_msg=key)


def test_launch_gives_up_after_its_restarts_with_the_failing_code():
    """A worker that fails in every start: launch starts the tasks max_restarts + 1 times
    (each with its restart id) and exits with the worker's code; --max-restarts < 0 is a
    usage error naming it."""
    code, output = _launch(
        "--ps", 0, "--workers", 2, "--max-restarts", 2, "--",
        sys.executable, "-c",
        "import json, os, sys, time; "
        "i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
        "print('restart', os.environ['REC_SDK_RESTART'], flush=True); "
        "time.sleep(60 if i else 0); sys.exit(3)",
        timeout=120,
    )  # fmt: skip
    assert code == 3, output
    for k in range(3):
        assert "[worker 0] restart %d" % k in output, output
    assert "restart 2 of 2" in output and "no restart left (--max-restarts 2)" in output, output
    code, output = _launch(
        "--ps", 0, "--workers", 1, "--", sys.executable, "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", timeout=120,
    )  # fmt: skip
    assert code == 128 + signal.SIGKILL, output  # as a shell reports a killed command
    code, output = _launch("--max-restarts", -1, "--", "true", timeout=60)
    assert code == 2 and "--max-restarts must be >= 0" in output, output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_launch_stopped_by_a_signal_stops_every_task_and_what_it_started(tmp_path, signum):
    """SIGTERM (a scheduler stopping the job) or SIGHUP (its terminal closing) to launch: it
    exits with 128 + the signal and nothing it started is left running, the processes a
    wrapped worker command started (`sh -c 'python ...'`) included."""
    pids = tmp_path / "pids"
    launch = subprocess.Popen(
        [sys.executable, "-m", "rec_sdk.distribute.launch", "--ps", "1", "--workers", "2",
         "--max-restarts", "3", "--", "sh", "-c",
         "%s -c \"import os, time; open('%s', 'a').write('%%d\\n' %% os.getpid()); "
         "time.sleep(300)\"; true" % (sys.executable, pids)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not pids.exists() or len(pids.read_text().split()) < 2
        ):
            time.sleep(0.2)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2
        launch.send_signal(signum)
        output = launch.communicate(timeout=60)[0]
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert launch.returncode == 128 + signum, output
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in workers):
        time.sleep(0.1)
    assert not [pid for pid in workers if _running(pid)], output


def _running(pid):
    """Whether process `pid` exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
