"""The exchange's routing and packing ops (RecSdk>RankRouteKeys, RecSdk>RankFillParts; the
core's rank_parts.h) against NumPy, and their answers to bad input."""

import numpy as np
import pytest
import tensorflow as tf

from rec_sdk.ops import rank_parts

tf.compat.v1.disable_eager_execution()


def _run(fetches, feed=None):
    with tf.compat.v1.Session() as sess:
        return sess.run(fetches, feed)


def _route(keys, dest_of_owner, parts):
    """NumPy: each key's part (its owner abs(key % R) with C's remainder) and slot there."""
    owners = np.abs(np.fmod(keys, len(dest_of_owner)))
    dest = np.asarray(dest_of_owner)[owners].astype(np.int32)
    within = np.zeros_like(dest)
    seen = np.zeros(parts, np.int32)
    for i, d in enumerate(dest):
        within[i] = seen[d]
        seen[d] += 1
    return dest, within, seen


def _fill(values, dest, within, cap, parts, head, take):
    rows = head.shape[1] + cap
    out = np.zeros((parts, rows, values.shape[1]), values.dtype)
    out[:, : head.shape[1]] = head
    for i, (d, w) in enumerate(zip(dest, within)):
        if w < cap:
            out[d, head.shape[1] + w] = values[take[i] if take is not None else i]
    return out


@pytest.mark.parametrize("trial", range(6))
def test_routing_and_parts_match_numpy(trial):
    """Random keys (negative ones, the int64 extremes), owners mapped to fewer parts (a level
    of per-host dedup), parts cut at a cap smaller than the largest part, a header, rows
    taken by index: the same parts as NumPy's."""
    rng = np.random.default_rng(trial)
    ranks = int(rng.integers(1, 6))
    parts = int(rng.integers(1, ranks + 1))
    dest_of_owner = rng.integers(0, parts, size=ranks).astype(np.int32)
    keys = rng.integers(-1000, 1000, size=int(rng.integers(0, 200))).astype(np.int64)
    keys = np.concatenate([keys, np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])])
    dest, within, per_dest = _run(rank_parts.route_keys(keys, dest_of_owner, parts))
    want = _route(keys, dest_of_owner, parts)
    for got, expected in zip((dest, within, per_dest), want):
        np.testing.assert_array_equal(got, expected)
    width = int(rng.integers(1, 5))
    cap = int(max(per_dest) * (0.5 if trial % 2 else 1.5))
    head = rng.integers(0, 9, size=(parts, int(rng.integers(0, 3)), width)).astype(np.int64)
    values = rng.integers(-50, 50, size=(len(keys), width)).astype(np.int64)
    got = _run(rank_parts.fill_parts(values, dest, within, cap, parts, head=head))
    np.testing.assert_array_equal(got, _fill(values, dest, within, cap, parts, head, None))
    rows = rng.standard_normal((7, width)).astype(np.float32)
    take = rng.integers(0, 7, size=len(keys)).astype(np.int32)
    got = _run(rank_parts.fill_parts(rows, dest, within, cap, parts, take=take))
    empty = np.zeros((parts, 0, width), np.float32)
    np.testing.assert_array_equal(got, _fill(rows, dest, within, cap, parts, empty, take))


def test_bad_input_is_an_invalid_argument_naming_it():
    """Out-of-range parts, slots and take indices, a negative cap and an output too large to
    shape: InvalidArgumentError naming what is wrong, never a crash."""
    values = tf.compat.v1.placeholder(tf.int64, [None, None])
    dest = tf.compat.v1.placeholder(tf.int32, [None])
    within = tf.compat.v1.placeholder(tf.int32, [None])
    take = tf.compat.v1.placeholder(tf.int32, [None])
    cap = tf.compat.v1.placeholder(tf.int32, [])
    head = tf.compat.v1.placeholder(tf.int64, [None, None, None])
    filled = rank_parts.fill_parts(values, dest, within, cap, 2, head=head, take=take)
    ok = {
        values: [[1], [2]],
        dest: [0, 1],
        within: [0, 0],
        take: [],
        cap: 1,
        head: np.zeros((2, 0, 1), np.int64),
    }
    assert _run(filled, ok).tolist() == [[[1]], [[2]]]
    for change, words in [
        ({dest: [0, 2]}, "entry 1 goes to part 2"),
        ({within: [0, -1]}, "slot -1"),
        ({take: [0, 5]}, "take[1] is 5"),
        ({cap: -1}, "cap must be >= 0"),
        ({values: [[1]]}, "values has 1 rows for 2 entries"),
        ({head: np.zeros((3, 0, 1), np.int64)}, "head must be [2, rows, 1]"),
        ({take: [0]}, "must be vectors of one length"),
        (
            {values: np.zeros((0, 1 << 40), np.int64), dest: [], within: [], cap: 2**31 - 1,
             head: np.zeros((2, 0, 1 << 40), np.int64)},
            "overflow",
        ),
    ]:  # fmt: skip
        with pytest.raises(tf.errors.InvalidArgumentError, match=words.replace("[", r"\[")):
            _run(filled, {**ok, **change})
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    owners = tf.compat.v1.placeholder(tf.int32, [None])
    routed = rank_parts.route_keys(keys, owners, 2)
    assert _run(routed, {keys: [3, -4], owners: [1, 0]})[0].tolist() == [0, 1]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dest_of_owner\[1\] is 2"):
        _run(routed, {keys: [3], owners: [0, 2]})
    with pytest.raises(tf.errors.InvalidArgumentError, match="dest_of_owner not empty"):
        _run(routed, {keys: [3], owners: []})
