"""The step headers' ops and the end-of-input wiring in one process (the ranks' behaviour is
in tests/test_chaos.py and tests/test_rank_batches.py)."""

import numpy as np
import pytest
import tensorflow as tf

from rec_sdk.base.graph_state import state_of
from rec_sdk.distribute.ranks import headers as headers_module
from rec_sdk.distribute.ranks import input_end
from rec_sdk.ops import loader, table_ops


def _header(plan, need, has_data=True, batch=3, phase=table_ops.PHASE_TRAIN, restart=0):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        out = table_ops.rank_step_header(
            tf.constant(plan, tf.int64), need, tf.constant(has_data), batch, phase, restart
        )
        return sess.run(out)


def test_a_header_carries_its_fields_and_the_key_of_its_position_in_the_plan():
    key, header, position = _header([3, 7, 9], 5, restart=2)
    assert position == 0 and key == table_ops.FIRST_HEADER_KEY
    assert header.shape == (8,)
    version, step, phase, restart, has_data, plan, batch, need = header
    train = table_ops.PHASE_TRAIN
    assert (version, phase, restart, has_data, batch, need) == (1, train, 2, 1, 3, 5)
    assert step >= 1 and plan > 0
    # Without a plan (a run the wrapper did not see) the run's first header is at position 0.
    key, header, position = _header([], 5, has_data=False)
    assert position == 0 and key == table_ops.FIRST_HEADER_KEY and header[4] == 0 and header[5] == 0


def test_a_later_position_takes_the_key_of_its_position():
    """Batch 3 at position 1 of plan [7, 3], in the run where batch 7's header was checked,
    gets the second position's instance key (the wait for that check is core/step_header.h's
    StepHeaders::WhenTurn, googletest step_header_test.cc)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        plan = tf.constant([7, 3], tf.int64)
        first = table_ops.rank_step_header(plan, 2, tf.constant(True), 7, 1, 0)
        checked = table_ops.rank_check_headers(first[1], first[2])
        with tf.control_dependencies([checked]):
            plan_after = tf.identity(plan)
        second = table_ops.rank_step_header(plan_after, 4, tf.constant(True), 3, 1, 0)
        (key, header, position), need = sess.run([second, checked])
    assert position == 1 and key == table_ops.FIRST_HEADER_KEY + 1 and need == 2
    assert header[6] == 3 and header[7] == 4


def _check(rows):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        flat = tf.constant(np.asarray(rows, np.int64).reshape(-1))
        return sess.run(table_ops.rank_check_headers(flat, tf.constant(0)))


def _row(step=4, phase=table_ops.PHASE_TRAIN, has_data=1, plan=11, batch=3, need=6):
    return [1, step, phase, 0, has_data, plan, batch, need]


def test_the_check_gives_the_largest_need_or_the_error_every_rank_raises():
    assert _check([_row(need=6), _row(need=9)]) == 9
    with pytest.raises(tf.errors.FailedPreconditionError, match="different phases: rank 0"):
        _check([_row(), _row(phase=table_ops.PHASE_EVAL)])
    with pytest.raises(tf.errors.OutOfRangeError, match="rank 1 ran out of input"):
        _check([_row(), _row(has_data=0)])
    left = [1, 4, table_ops.PHASE_LEFT, 0, 0, 0, -1, 0]
    with pytest.raises(tf.errors.FailedPreconditionError, match="rank 1 closed its session"):
        _check([_row(), left])
    with pytest.raises(tf.errors.InvalidArgumentError, match="gathered must be a vector of 8"):
        _check([[1, 2, 3]])


def test_the_phases_python_names_are_those_the_kernels_know():
    """PHASE_* and PHASE_NAMES agree with tf_ops/core/step_header.h: a leave header takes
    PHASE_LEFT and PHASE_ENDED only, and the check describes each phase by its name."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        phase = tf.compat.v1.placeholder(tf.int64, [])
        leave = table_ops.rank_leave_header(phase, 0)
        for ok in (table_ops.PHASE_LEFT, table_ops.PHASE_ENDED):
            assert sess.run(leave, {phase: ok})[2] == ok
        for bad in (table_ops.PHASE_TRAIN, table_ops.PHASE_EVAL, 0, 5):
            with pytest.raises(tf.errors.InvalidArgumentError, match="phase must be 3"):
                sess.run(leave, {phase: bad})
    for code in (table_ops.PHASE_TRAIN, table_ops.PHASE_EVAL):
        other = table_ops.PHASE_EVAL if code == table_ops.PHASE_TRAIN else table_ops.PHASE_TRAIN
        with pytest.raises(tf.errors.FailedPreconditionError) as e:
            _check([_row(phase=code), _row(phase=other)])
        assert "(%s, plan" % table_ops.PHASE_NAMES[code] in str(e.value)


def test_an_iterator_read_as_optional_reads_once_a_step_and_says_when_it_ended():
    """input_end: the readers of get_next (built before and after the has_data tensor) read
    one element a run through the optional read; has_data is false at the end, with empty
    tensors instead of an error; a fetch of the old get_next tensor gets the new read."""
    graph = tf.Graph()
    with graph.as_default():
        data = tf.data.Dataset.from_tensor_slices(
            {"ids": np.arange(12, dtype=np.int64).reshape(3, 4), "label": np.arange(3.0)}
        )
        element = tf.compat.v1.data.make_one_shot_iterator(data.batch(1)).get_next()
        early = element["ids"] * 2
        has = input_end.has_data([early])
        late = element["label"] + 1.0  # built after the has_data tensor
        input_end.prepare(graph, every_read=True)
        with tf.compat.v1.Session() as sess:
            for step in range(3):
                fetches, _ = input_end.fetches_and_feeds(graph, [early, late, has, element], None)
                e, lbl, h, elem = sess.run(fetches)
                assert h and e.tolist() == [list(range(8 * step, 8 * step + 8, 2))]
                assert lbl.tolist() == [step + 1.0] and elem["ids"].tolist() == [
                    list(range(4 * step, 4 * step + 4))
                ]
            e, lbl, h = sess.run([early, late, has])
            assert not h and e.shape == (0, 4) and lbl.shape == (0,)
    assert state_of(graph).rank_input_ends  # one read rewired, once
    assert len(state_of(graph).rank_input_ends) == 1


def test_headers_of_a_run_without_a_plan_take_positions_in_the_order_they_begin():
    """A run the wrapper gave no plan (a callable made from the session): each of its headers
    gets its own position and instance key (they used to share the first, and two batches of
    one step collided in TensorFlow's collectives); a plan that lacks a batch that runs is
    refused, naming it."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        none = tf.constant([], tf.int64)
        first = table_ops.rank_step_header(none, 2, tf.constant(True), 7, 1, 0)
        checked = table_ops.rank_check_headers(first[1], first[2])
        with tf.control_dependencies([checked]):
            second = table_ops.rank_step_header(none, 4, tf.constant(True), 3, 1, 0)
        (key0, _, at0), (key1, _, at1) = sess.run([first, second])
        assert (at0, at1) == (0, 1)
        assert (key0, key1) == (table_ops.FIRST_HEADER_KEY, table_ops.FIRST_HEADER_KEY + 1)
        lacking = table_ops.rank_step_header(tf.constant([7], tf.int64), 2, True, 3, 1, 0)
        with pytest.raises(tf.errors.InvalidArgumentError, match="batch 3 .* plan does not"):
            sess.run(lacking)


def test_a_plan_follows_what_session_run_converts():
    """A step fetched through a resource variable's assign_add (made under the train ops'
    control dependencies) reaches the lookups' headers: the run gets its plan."""
    graph = tf.Graph()
    with graph.as_default():
        plan = tf.compat.v1.placeholder_with_default(tf.constant([], tf.int64), [None])
        header = table_ops.rank_step_header(plan, 1, tf.constant(True), 5, 1, 0)[1]
        step = tf.compat.v1.train.get_or_create_global_step()
        with tf.control_dependencies([header]):
            bumped = tf.compat.v1.assign_add(step, 1)
        assert not isinstance(bumped, (tf.Tensor, tf.Operation))
        for fetch in (bumped, [bumped], {"step": bumped}):
            found, _ = headers_module._reached(graph, headers_module._leaves(fetch), [], [])
            assert found is not None and found.tolist()[:1] == [5], fetch


def test_a_plan_is_the_batches_a_runs_fetches_reach_in_build_order():
    """The plan of a run: the header ops its fetches reach (data and control inputs), by
    batch id; whether it runs ops on another rank's task."""
    graph = tf.Graph()
    with graph.as_default():
        plan = tf.compat.v1.placeholder_with_default(tf.constant([], tf.int64), [None])
        ops = {
            batch: table_ops.rank_step_header(
                plan, 1, tf.constant(True), batch, table_ops.PHASE_TRAIN, 0
            )[1]
            for batch in (1, 2, 3)
        }
        with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
            remote = tf.identity(ops[2])
        both = tf.group(ops[3], ops[1])
        peers = ["/job:worker/replica:0/task:1/"]
        found, touches = headers_module._reached(graph, [both], [], peers)
        assert found.tolist() == [1, 3, -1] and not touches  # -1: no other collective
        found, touches = headers_module._reached(graph, [remote], [], peers)
        assert found.tolist() == [2, -1] and touches
        assert headers_module._reached(graph, [plan], [], peers) == (None, False)
        # A fed tensor cuts the walk: its producer does not run.
        assert headers_module._reached(graph, [remote], [ops[2]], peers) == (None, True)
        # The other collectives a run reaches name its last entry: runs that share the
        # lookups but reduce other tensors get other plans (and digests).
        reduced = [
            tf.raw_ops.CollectiveReduceV2(
                input=tf.cast(ops[1][0], tf.float32) * scale,
                group_size=2,
                group_key=1,
                instance_key=100 + i,
                ordering_token=[],
                merge_op="Add",
                final_op="Id",
                name="reduce%d" % i,
            )
            for i, scale in enumerate((1.0, 2.0))
        ]
        plans = [headers_module._reached(graph, [r], [], peers)[0].tolist() for r in reduced]
        assert plans[0][:1] == plans[1][:1] == [1] and plans[0][1] < -1 and plans[1][1] < -1
        assert plans[0] != plans[1]
        again = headers_module._reached(graph, [reduced[0]], [], peers)[0].tolist()
        assert again == plans[0]


class _Dog:
    def enter(self, what):
        self.what = what

    def leave(self):
        pass


class _RemoteOnly:
    """Headers whose runs read other ranks' tasks without a plan (rank 0's saves)."""

    ran = True
    task = "/job:worker/replica:0/task:0"

    def plan_of(self, graph, fetches, feed_dict):
        return None, True


def test_a_save_that_loses_a_rank_raises_rank_lost_not_a_retried_error(monkeypatch):
    """Rank 0's save reads other ranks' shards without a collective: when such a rank is
    gone, TensorFlow's UnavailableError would make MonitoredTrainingSession build a new session
    and wait for that task forever; it is a RankLostError naming the task."""
    monkeypatch.setattr(headers_module, "headers_of", lambda graph: _RemoteOnly())
    monkeypatch.setattr(input_end, "fetches_and_feeds", lambda graph, f, d: (f, d))
    monkeypatch.setattr(headers_module.watchdog, "watch", lambda task: _Dog())

    class Session:
        graph = None

    for error in (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError):

        def run(session, fetches, feed_dict, options, run_metadata, error=error):
            raise error(
                None,
                None,
                "Socket closed\nAdditional GRPC error information from remote target "
                "/job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvTensor",
            )

        with pytest.raises(loader.RankLostError, match=r"task /job:worker/replica:0/task:2\)"):
            headers_module._run_with_plan(run, Session(), "save", None, None, None)
    # Other errors pass as they are.

    def invalid(session, fetches, feed_dict, options, run_metadata):
        raise tf.errors.InvalidArgumentError(None, None, "bad")

    with pytest.raises(tf.errors.InvalidArgumentError):
        headers_module._run_with_plan(invalid, Session(), "save", None, None, None)
