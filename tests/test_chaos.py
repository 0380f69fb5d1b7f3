"""The chaos test of ranks (issue: ranks that never hang): 2 to 4 ranks training two tables
with two optimizers from tf.data, evaluating and saving between training steps
(tests/distribute/chaos_worker.py), with one fault at a step and phase: a SIGKILL, a SIGSTOP
longer than the watchdog's bound or shorter, a rank sleeping longer than the bound (slow
but alive), leaving early, failing, running extra steps, running out of input, evaluating
where the others train, or running only part of their step (the loss, one optimizer). Every
trial must end
with every rank's exit within the bound (no hang: the harness never retries) and the error
naming the cause on the ranks it stopped; a short SIGSTOP, a slow rank and the end of one
rank's input stop no rank with an error (the ranks waiting for the slow one log what it
does).

CI runs one trial per fault; `make stress` runs CHAOS_TRIALS (default 50) random ones."""

import os
import random
import time

import pytest
from tests.rank_runs import Rank, report, wait_all
from tests.test_distribute import _env, _rank_cluster

WORKER = os.path.join(os.path.dirname(__file__), "distribute", "chaos_worker.py")
PEER_TIMEOUT = 6.0  # the watchdog's bound in these tests (REC_SDK_PEER_TIMEOUT_S)
INTERVAL = 1.0  # its ping interval: min(5, PEER_TIMEOUT / 6)
STEPS, EVAL_EVERY, SAVE_EVERY = 8, 3, 4
# Phases each fault can fire in (the others are about steps, so fire before a training run).
PHASES = {
    "kill": ("train", "eval", "save"),
    "stop_long": ("train", "eval", "save"),
    "stop_short": ("train", "eval", "save"),
    "slow": ("train", "eval", "save"),
    "error": ("train", "eval", "save"),
    "leave": ("train",),
    "extra": ("train",),
    "uneven": ("train",),
    "phase": ("train",),
    "loss": ("train",),
    "optimizer": ("train",),
}


def _fault_steps(phase):
    """The steps a fault of `phase` can fire at (evaluations and saves happen at some)."""
    if phase == "eval":
        return [s for s in range(STEPS) if (s + 1) % EVAL_EVERY == 0]
    if phase == "save":
        return [s for s in range(STEPS) if (s + 1) % SAVE_EVERY == 0]
    return list(range(1, STEPS))


def _trained(out):
    lines = [line for line in out.splitlines() if line.startswith("TRAINED ")]
    return int(lines[-1].split()[1]) if lines else None


def _fault_time(out):
    lines = [line for line in out.splitlines() if line.startswith("FAULT ")]
    return float(lines[-1].split()[2]) if lines else None


def run_trial(tmp_path, ranks, kind, fault_rank, step, phase, extra=()):
    """Runs one trial; fails naming it (and showing every rank's output) unless it ended as
    the fault should end it."""
    cluster, tasks = _rank_cluster(ranks)
    stop_seconds = PEER_TIMEOUT + 8 if kind in ("stop_long", "slow") else 2.0
    args = [
        str(tmp_path / "ckpt"),
        "--steps", STEPS, "--eval-every", EVAL_EVERY, "--save-every", SAVE_EVERY,
        "--fault", kind, "--fault-rank", fault_rank, "--fault-step", step,
        "--fault-phase", phase, "--stop-seconds", stop_seconds, *extra,
    ]  # fmt: skip
    env = {"REC_SDK_PEER_TIMEOUT_S": str(PEER_TIMEOUT), "REC_SDK_RANK_PROGRESS_S": "4"}
    started = [Rank([WORKER] + args, dict(_env(cluster, job, i), **env)) for job, i in tasks]
    what = "trial: %d ranks, %s on rank %d at step %d (%s)" % (ranks, kind, fault_rank, step, phase)
    try:
        outputs = wait_all(started, timeout=120 + 20 * ranks)
    except AssertionError as e:
        raise AssertionError("%s: a hang\n%s" % (what, e)) from None
    full = "%s\n%s" % (what, report(started))
    codes = [code for code, _ in outputs]
    texts = [text for _, text in outputs]
    others = [r for r in range(ranks) if r != fault_rank]
    fired = _fault_time(texts[fault_rank])
    assert kind == "none" or fired is not None, full
    # Every rank ends within the bound after the fault: at once, or the watchdog's timeout
    # plus two intervals (a stopped rank: once it runs again and finds its peers gone).
    bound = 30.0 + (PEER_TIMEOUT + 2 * INTERVAL if kind == "stop_long" else 0)
    bound += stop_seconds if kind == "slow" else 0
    if fired is not None:
        late = {
            r: round(started[r].ended_at - fired, 1)
            for r in range(ranks)
            if started[r].ended_at - fired > bound + (stop_seconds if r == fault_rank else 0)
        }
        assert not late, "%s\nranks ending later than %.0f s after the fault: %s" % (
            full,
            bound,
            late,
        )
    who = "rank %d" % fault_rank
    if kind in ("none", "stop_short", "slow"):
        assert codes == [0] * ranks and {_trained(t) for t in texts} == {STEPS}, full
    if kind == "slow":  # never aborted; the ranks waiting for it said what it does
        waited = [t for r, t in enumerate(texts) if r != fault_rank and "has waited" in t]
        assert waited and all(
            "%s passed the header of its step" % who in t or "%s waits in the header" % who in t
            for t in waited
        ), full
    elif kind == "uneven":
        assert codes == [0] * ranks and {_trained(t) for t in texts} == {step}, full
        for r in others:
            assert "%s ran out of input" % who in texts[r], full
    elif kind == "extra":
        assert codes[fault_rank] != 0, full
        assert "closed its session while %s runs another step" % who in texts[fault_rank], full
        assert all(codes[r] == 0 and _trained(texts[r]) == STEPS for r in others), full
    elif kind == "phase":
        assert all(c != 0 for c in codes), full
        assert all("the ranks run different phases" in t for t in texts), full
    elif kind in ("loss", "optimizer"):  # the same lookups, another rest of the step
        assert all(c != 0 for c in codes), full
        words = "the ranks run different batches of lookups or collectives"
        assert all(words in t for t in texts), full
    elif kind in ("leave", "error"):
        assert (codes[fault_rank] == 0) == (kind == "leave"), full
        for r in others:
            if codes[r] == 0:  # it had trained every step: a fault after the last one
                assert _trained(texts[r]) == STEPS, full
            else:
                assert "%s closed its session" % who in texts[r], full
    elif kind == "kill":
        # The others fail naming a lost rank: the killed one, or (3 ranks or more) one that
        # failed for it first, which names it; one that had trained every step may end well,
        # having said that it left without meeting it.
        assert codes[fault_rank] == -9, full

        def names(text, rank):
            return ("RankLostError" in text and "task:%d)" % rank in text) or (
                "rank %d (127.0.0.1" % rank in text and "stopped answering" in text
            )

        for r in others:
            assert codes[r] != 0 or _trained(texts[r]) == STEPS, full
            assert any(names(texts[r], lost) for lost in range(ranks) if lost != r), full
        assert any(names(texts[r], fault_rank) for r in others), full
    elif kind == "stop_long":
        # Each rank exits for the silent rank (17), or fails first as another one exits for
        # it, naming it as the cause.
        assert codes[fault_rank] != 0, full
        for r in others:
            assert codes[r] != 0 and "%s (127.0.0.1" % who in texts[r], full
            assert "stopped answering" in texts[r] or "not answered" in texts[r], full
    return time.time()


# One trial of each fault (CI): 2 ranks, or 3 where the fault's words name several ranks.
QUICK = [
    (2, "none", 1, 0, "train"),
    (2, "kill", 1, 3, "train"),
    (2, "stop_long", 1, 2, "eval"),
    (2, "stop_short", 0, 3, "save"),
    (2, "slow", 1, 2, "eval"),
    (3, "leave", 2, 4, "train"),
    (2, "error", 0, 2, "eval"),
    (2, "extra", 1, 0, "train"),
    (3, "uneven", 1, 5, "train"),
    (2, "phase", 0, 4, "train"),
    (2, "loss", 1, 3, "train"),
    (3, "optimizer", 0, 2, "train"),
    (3, "kill", 2, 7, "save"),  # after the last step: rank 0's closing save
]


@pytest.mark.parametrize("ranks, kind, fault_rank, step, phase", QUICK)
def test_each_fault_ends_every_rank_clearly_and_in_time(
    tmp_path, ranks, kind, fault_rank, step, phase
):
    run_trial(tmp_path, ranks, kind, fault_rank, step, phase)


@pytest.mark.stress
def test_ranks_whose_input_ended_wait_for_rank_0s_final_save(tmp_path):
    """The ranks stop together at the end of the shortest input, then rank 0 saves (3 s late
    here, as a large table's save is): the others must not exit before it read their tasks
    and closed its session (it waited for a task that was gone and exited with 17; 3 of 4
    runs before the ranks met at close). In `make stress`, not CI: under heavy load it still
    fails about 1 run in 20 the other way round (RELIABILITY.md, known gaps)."""
    run_trial(tmp_path, 3, "uneven", 1, 6, "train", extra=("--slow-save", 3))


def random_trial(rng):
    kind = rng.choice(sorted(PHASES))
    phase = rng.choice(PHASES[kind])
    ranks = rng.choice([2, 3, 4])
    return ranks, kind, rng.randrange(ranks), rng.choice(_fault_steps(phase)), phase


@pytest.mark.stress
def test_random_faults_never_hang(tmp_path):
    """CHAOS_TRIALS (default 50) random trials: 0 hangs, every one ending as its fault
    should (the seed is printed: CHAOS_SEED replays them)."""
    seed = int(os.environ.get("CHAOS_SEED", str(int(time.time()))))
    print("CHAOS_SEED=%d" % seed)
    rng = random.Random(seed)
    for n in range(int(os.environ.get("CHAOS_TRIALS", "50"))):
        trial = random_trial(rng)
        path = tmp_path / ("trial%d" % n)
        path.mkdir()
        run_trial(path, *trial)
