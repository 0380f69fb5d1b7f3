"""Tests for rec_sdk.optimizers: every sparse optimizer against a NumPy reference, in both
training flows (by address with dynamic expansion; by table without), plus validation, LazyAdam's
step count, -1 addresses and the one-optimizer-per-table rule."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import new_session, sorted_export
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import (
    adagrad,
    adagrad_by_addr,
    adagrad_rowwise,
    adagrad_rowwise_by_addr,
    ftrl,
    gradient_descent,
    gradient_descent_by_addr,
    lazy_adam,
    lazy_adam_by_addr,
)
from rec_sdk.optimizers.ftrl import FtrlOptimizer
from rec_sdk.util.initialize import init
from rec_sdk.util.variable import get_dense_and_sparse_variable

DIM = 3
RTOL, ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------
# NumPy references: one row update, given the summed gradient of the row.
# State is kept in float32 (as the table stores it); arithmetic in float64.
# ---------------------------------------------------------------------------


class LazyAdamRef:
    num_slots = 2

    def __init__(self, learning_rate, beta1, beta2, epsilon):
        self.lr, self.b1, self.b2, self.eps = learning_rate, beta1, beta2, epsilon

    def initial_slots(self):
        return [np.zeros(DIM, np.float32), np.zeros(DIM, np.float32)]

    def update(self, w, slots, g, step):
        m, v = (s.astype(np.float64) for s in slots)
        m = self.b1 * m + (1 - self.b1) * g
        v = self.b2 * v + (1 - self.b2) * g * g
        lr_t = self.lr * np.sqrt(1 - self.b2**step) / (1 - self.b1**step)
        w = w - lr_t * m / (np.sqrt(v) + self.eps)
        return w.astype(np.float32), [m.astype(np.float32), v.astype(np.float32)]


class GradientDescentRef:
    num_slots = 0

    def __init__(self, learning_rate, weight_decay):
        self.lr, self.wd = learning_rate, weight_decay

    def initial_slots(self):
        return []

    def update(self, w, slots, g, step):
        w = w.astype(np.float64)
        return (w - self.lr * (g + self.wd * w)).astype(np.float32), []


class AdagradRef:
    num_slots = 1

    def __init__(self, learning_rate, initial_accumulator_value):
        self.lr, self.init = learning_rate, initial_accumulator_value

    def initial_slots(self):
        return [np.full(DIM, self.init, np.float32)]

    def update(self, w, slots, g, step):
        a = slots[0].astype(np.float64) + g * g
        w = w - self.lr * g / np.sqrt(a)
        return w.astype(np.float32), [a.astype(np.float32)]


class RowwiseAdagradRef:
    """TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row (a slot of 1 float)."""

    num_slots = 1
    slot_width = 1

    def __init__(self, learning_rate, initial_accumulator_value, epsilon):
        self.lr, self.init, self.eps = learning_rate, initial_accumulator_value, epsilon

    def initial_slots(self):
        return [np.full(1, self.init, np.float32)]

    def update(self, w, slots, g, step):
        a = slots[0].astype(np.float64) + np.mean(g * g)
        w = w - self.lr * g / (np.sqrt(a) + self.eps)
        return w.astype(np.float32), [a.astype(np.float32)]


class FtrlRef:
    """TensorFlow's ApplyFtrlV2, as documented in tf.raw_ops.ApplyFtrlV2."""

    num_slots = 2

    def __init__(
        self, learning_rate, learning_rate_power, initial_accumulator_value, l1, l2, l2_shrinkage
    ):
        self.lr, self.lr_power, self.init = (
            learning_rate,
            learning_rate_power,
            initial_accumulator_value,
        )
        self.l1, self.l2, self.l2_shrinkage = l1, l2, l2_shrinkage

    def initial_slots(self):
        return [np.full(DIM, self.init, np.float32), np.zeros(DIM, np.float32)]

    def update(self, w, slots, g, step):
        var = w.astype(np.float64)
        accum, linear = (s.astype(np.float64) for s in slots)
        grad_with_shrinkage = g + 2 * self.l2_shrinkage * var
        accum_new = accum + g * g
        linear = (
            linear
            + grad_with_shrinkage
            - (accum_new**-self.lr_power - accum**-self.lr_power) / self.lr * var
        )
        quadratic = 1.0 / (accum_new**self.lr_power * self.lr) + 2 * self.l2
        var = np.where(
            np.abs(linear) > self.l1, (np.sign(linear) * self.l1 - linear) / quadratic, 0.0
        )
        return var.astype(np.float32), [accum_new.astype(np.float32), linear.astype(np.float32)]


LAZY_ADAM = dict(learning_rate=0.05, beta1=0.8, beta2=0.95, epsilon=1e-6)
SGD = dict(learning_rate=0.1, weight_decay=0.01)
ADAGRAD = dict(learning_rate=0.3, initial_accumulator_value=0.2)
ROWWISE = dict(learning_rate=0.3, initial_accumulator_value=0.0, epsilon=1e-3)
FTRL = dict(
    learning_rate=0.5,
    learning_rate_power=-0.5,
    initial_accumulator_value=0.1,
    l1=0.5,
    l2=0.1,
    l2_shrinkage=0.02,
)
FTRL_POWER = dict(FTRL, learning_rate_power=-0.7, l1=0.0, l2=0.0, l2_shrinkage=0.0)


def _ftrl(params, by_address):
    return FtrlOptimizer(
        params["learning_rate"],
        params["learning_rate_power"],
        params["initial_accumulator_value"],
        params["l1"],
        params["l2"],
        params["l2_shrinkage"],
        "Ftrl",
        by_address=by_address,
    )


# name -> (plain optimizer factory, by-address optimizer factory, reference)
OPTIMIZERS = {
    "lazy_adam": (
        lambda: lazy_adam.create_hash_optimizer(**LAZY_ADAM),
        lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(**LAZY_ADAM),
        lambda: LazyAdamRef(**LAZY_ADAM),
    ),
    "sgd": (
        lambda: gradient_descent.create_hash_optimizer(**SGD),
        lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(**SGD),
        lambda: GradientDescentRef(**SGD),
    ),
    "adagrad": (
        lambda: adagrad.create_hash_optimizer(**ADAGRAD),
        lambda: adagrad_by_addr.create_hash_optimizer_by_address(**ADAGRAD),
        lambda: AdagradRef(**ADAGRAD),
    ),
    "adagrad_rowwise": (
        lambda: adagrad_rowwise.create_hash_optimizer(**ROWWISE),
        lambda: adagrad_rowwise_by_addr.create_hash_optimizer_by_address(**ROWWISE),
        lambda: RowwiseAdagradRef(**ROWWISE),
    ),
    "ftrl": (
        lambda: ftrl.create_hash_optimizer(
            FTRL["learning_rate"],
            FTRL["learning_rate_power"],
            FTRL["initial_accumulator_value"],
            l1_regularization_strength=FTRL["l1"],
            l2_regularization_strength=FTRL["l2"],
            l2_shrinkage_regularization_strength=FTRL["l2_shrinkage"],
        ),
        lambda: _ftrl(FTRL, by_address=True),
        lambda: FtrlRef(**FTRL),
    ),
    "ftrl_power": (
        lambda: ftrl.create_hash_optimizer(
            FTRL_POWER["learning_rate"],
            FTRL_POWER["learning_rate_power"],
            FTRL_POWER["initial_accumulator_value"],
        ),
        lambda: _ftrl(FTRL_POWER, by_address=True),
        lambda: FtrlRef(**FTRL_POWER),
    ),
}


def test_references_match_tensorflow_dense_kernels():
    """The NumPy references agree with TensorFlow's own dense optimizer kernels."""
    rng = np.random.RandomState(0)
    w0 = rng.normal(size=DIM).astype(np.float32)
    grads = rng.normal(size=(4, DIM)).astype(np.float32)
    var = tf.Variable(w0, use_resource=True)
    m = tf.Variable(np.zeros(DIM, np.float32), use_resource=True)
    v = tf.Variable(np.zeros(DIM, np.float32), use_resource=True)
    acc = tf.Variable(np.zeros(DIM, np.float32), use_resource=True)
    lin = tf.Variable(np.zeros(DIM, np.float32), use_resource=True)
    g = tf.compat.v1.placeholder(tf.float32, [DIM])
    t = tf.compat.v1.placeholder(tf.float32, [])
    f = lambda x: tf.constant(x, tf.float32)  # noqa: E731
    adam = tf.raw_ops.ResourceApplyAdam(
        var=var.handle,
        m=m.handle,
        v=v.handle,
        beta1_power=f(LAZY_ADAM["beta1"]) ** t,
        beta2_power=f(LAZY_ADAM["beta2"]) ** t,
        lr=f(LAZY_ADAM["learning_rate"]),
        beta1=f(LAZY_ADAM["beta1"]),
        beta2=f(LAZY_ADAM["beta2"]),
        epsilon=f(LAZY_ADAM["epsilon"]),
        grad=g,
    )
    adagrad_op = tf.raw_ops.ResourceApplyAdagrad(
        var=var.handle, accum=acc.handle, lr=f(ADAGRAD["learning_rate"]), grad=g
    )
    ftrl_op = tf.raw_ops.ResourceApplyFtrlV2(
        var=var.handle,
        accum=acc.handle,
        linear=lin.handle,
        grad=g,
        lr=f(FTRL["learning_rate"]),
        l1=f(FTRL["l1"]),
        l2=f(FTRL["l2"]),
        l2_shrinkage=f(FTRL["l2_shrinkage"]),
        lr_power=f(FTRL["learning_rate_power"]),
    )
    cases = [
        (adam, LazyAdamRef(**LAZY_ADAM), [m, v]),
        (adagrad_op, AdagradRef(**ADAGRAD), [acc]),
        (ftrl_op, FtrlRef(**FTRL), [acc, lin]),
    ]
    with new_session() as sess:
        for op, ref, slot_vars in cases:
            sess.run(var.assign(w0))
            slots = ref.initial_slots()
            for s, value in zip(slot_vars, slots):
                sess.run(s.assign(value))
            w = w0
            for step, grad in enumerate(grads, 1):
                sess.run(op, {g: grad, t: step})
                w, slots = ref.update(w, slots, grad.astype(np.float64), step)
                np.testing.assert_allclose(sess.run(var), w, rtol=RTOL, atol=ATOL)
                for s, value in zip(slot_vars, slots):
                    np.testing.assert_allclose(sess.run(s), value, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------
# The training scenario: two lookups of one table (user ids and clicked user ids) per step,
# duplicate keys within a batch and across the two lookups, keys missing from some steps and
# keys first seen in later steps.
# ---------------------------------------------------------------------------

BIG = 5_000_000_000  # does not fit in int32
STEPS = [
    # (user ids [4], clicked ids [4, 3])
    ([3, 17, 3, 42], [[17, 99, 99], [3, 3, 42], [1000, 17, 3], [99, 42, 42]]),
    ([17, 17, 17, 99], [[17, 1000, 1000], [99, 99, 99], [17, 1000, 99], [1000, 17, 17]]),
    ([-7, 3, BIG, 3], [[-7, 3, 3], [BIG, BIG, 42], [3, -7, 42], [42, 42, 42]]),
    ([99, 1000, 99, 5], [[5, 5, 5], [99, 1000, 5], [1000, 1000, 1000], [5, 99, 99]]),
    ([3, -7, 17, BIG], [[42, 3, 17], [17, 17, 17], [-7, BIG, 3], [3, 3, 3]]),
    ([42, 42, 42, 42], [[42, 42, 42], [42, 42, 42], [42, 42, 42], [42, 42, 42]]),
]
ALL_KEYS = sorted({k for user, clicked in STEPS for k in user + sum(clicked, [])})
_rng = np.random.RandomState(1234)
TARGETS = [_rng.normal(size=(4, DIM)).astype(np.float32) for _ in STEPS]
CLICK_WEIGHTS = [_rng.normal(scale=0.5, size=(4, 3, DIM)).astype(np.float32) for _ in STEPS]


def _reference_gradients(state, step_index):
    """{key: summed gradient} of loss = 0.5 |user_emb - target|^2 + sum(click_w * click_emb)."""
    user, clicked = STEPS[step_index]
    grads = {}
    for pos, key in enumerate(user):
        g = state[key][0].astype(np.float64) - TARGETS[step_index][pos]
        grads[key] = grads.get(key, 0.0) + g
    for b, row in enumerate(clicked):
        for c, key in enumerate(row):
            grads[key] = grads.get(key, 0.0) + CLICK_WEIGHTS[step_index][b, c].astype(np.float64)
    return grads


class Scenario:
    """The graph of the scenario on one table, trained by `flow`."""

    def __init__(self, flow, optimizer, table_name="user", with_global_step=False):
        self.table = create_table(
            tf.int64,
            DIM,
            table_name,
            tf.compat.v1.truncated_normal_initializer(stddev=0.5, seed=7),
            device_vocabulary_size=64,
        )
        self.user = tf.compat.v1.placeholder(tf.int64, [None], name="user_ids")
        self.clicked = tf.compat.v1.placeholder(tf.int64, [None, None], name="clicked_ids")
        self.target = tf.compat.v1.placeholder(tf.float32, [None, DIM])
        self.click_w = tf.compat.v1.placeholder(tf.float32, [None, None, DIM])
        user_emb = sparse_lookup(self.table, self.user, name="user_lookup")
        click_emb = sparse_lookup(self.table, self.clicked, name="click_lookup")
        self.loss = 0.5 * tf.reduce_sum(tf.square(user_emb - self.target)) + tf.reduce_sum(
            self.click_w * click_emb
        )
        self.global_step = (
            tf.compat.v1.train.get_or_create_global_step() if with_global_step else None
        )
        self.optimizer = optimizer
        if flow == "by_address":
            local_embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
            addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
            assert len(local_embs) == 2 and len(addresses) == 2
            grads = tf.gradients(self.loss, local_embs)
            self.train = optimizer.apply_gradients(
                zip(grads, addresses), global_step=self.global_step
            )
        elif flow == "by_table":
            dense_vars, sparse_vars = get_dense_and_sparse_variable()
            assert dense_vars == [] and sparse_vars == [self.table]
            grads = tf.gradients(self.loss, sparse_vars)
            assert isinstance(grads[0], tf.IndexedSlices)
            self.train = optimizer.apply_gradients(
                zip(grads, sparse_vars), global_step=self.global_step
            )
        elif flow == "minimize":
            self.train = optimizer.minimize(self.loss, global_step=self.global_step)
        else:
            raise AssertionError(flow)
        self.initial = self.table.lookup(tf.constant(ALL_KEYS, tf.int64), init_missing=True)
        self.export = self.table.export()

    def feed(self, step_index):
        user, clicked = STEPS[step_index]
        return {
            self.user: user,
            self.clicked: clicked,
            self.target: TARGETS[step_index],
            self.click_w: CLICK_WEIGHTS[step_index],
        }

    def initial_values(self, sess):
        values, exists = sess.run(self.initial)
        assert not exists.any()
        assert sess.run(self.table.size_tensor()) == 0
        return {k: values[i] for i, k in enumerate(ALL_KEYS)}


def _check_l1_sparsity(name, state):
    """With FTRL's l1 the scenario drives some (not all) weights exactly to 0."""
    if name == "ftrl":
        values = np.stack([w for w, _ in state.values()])
        assert 0 < (values == 0).sum() < values.size


def _check_against_reference(sess, scenario, ref, steps=None, step_numbers=None):
    """Runs the scenario's steps and compares values and slots with `ref` after every step."""
    init_values = scenario.initial_values(sess)
    state = {}
    previous = None
    for step_index in range(len(STEPS) if steps is None else steps):
        user, clicked = STEPS[step_index]
        batch_keys = set(user) | set(sum(clicked, []))
        for key in batch_keys:
            if key not in state:
                state[key] = (init_values[key], ref.initial_slots())
        grads = _reference_gradients(state, step_index)
        assert set(grads) == batch_keys
        t = step_numbers[step_index] if step_numbers else step_index + 1
        for key, g in grads.items():
            state[key] = ref.update(state[key][0], state[key][1], g, t)
        sess.run(scenario.train, scenario.feed(step_index))

        keys, values, slots = sorted_export(*sess.run(scenario.export))
        assert keys.tolist() == sorted(state)
        assert slots.shape == (ref.num_slots, len(keys), getattr(ref, "slot_width", DIM))
        expected_values = np.stack([state[k][0] for k in keys])
        np.testing.assert_allclose(
            values,
            expected_values,
            rtol=RTOL,
            atol=ATOL,
            err_msg="values after step %d" % (step_index + 1),
        )
        for s in range(ref.num_slots):
            expected_slot = np.stack([state[k][1][s] for k in keys])
            np.testing.assert_allclose(
                slots[s],
                expected_slot,
                rtol=RTOL,
                atol=ATOL,
                err_msg="slot %d after step %d" % (s, step_index + 1),
            )
        if previous is not None:
            # Lazy: rows (and slots) of keys absent from this batch are untouched, bit for bit.
            prev_keys, prev_values, prev_slots = previous
            for i, key in enumerate(prev_keys):
                if key in batch_keys:
                    continue
                j = int(np.searchsorted(keys, key))
                np.testing.assert_array_equal(values[j], prev_values[i])
                np.testing.assert_array_equal(slots[:, j], prev_slots[:, i])
        previous = (keys, values, slots)
    return state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_by_address_flow_matches_reference(name):
    init(use_dynamic_expansion=True)
    _, by_addr, make_ref = OPTIMIZERS[name]
    scenario = Scenario("by_address", by_addr())
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _check_l1_sparsity(name, _check_against_reference(sess, scenario, make_ref()))


@pytest.mark.parametrize("flow", ["by_table", "minimize"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_table_flow_matches_reference(name, flow):
    init(use_dynamic_expansion=False)
    plain, _, make_ref = OPTIMIZERS[name]
    scenario = Scenario(flow, plain())
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _check_l1_sparsity(name, _check_against_reference(sess, scenario, make_ref()))


@pytest.mark.parametrize("expansion", [True, False])
def test_global_step_incremented(expansion):
    init(use_dynamic_expansion=expansion)
    plain, by_addr, make_ref = OPTIMIZERS["lazy_adam"]
    scenario = Scenario(
        "by_address" if expansion else "by_table",
        by_addr() if expansion else plain(),
        with_global_step=True,
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        _check_against_reference(sess, scenario, make_ref(), steps=3)
        assert sess.run(scenario.global_step) == 3


def test_weight_decay_default_by_addr():
    """gradient_descent_by_addr's default weight decay is 1e-4 and is applied."""
    init(use_dynamic_expansion=True)
    scenario = Scenario("by_address", gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1))
    with new_session() as sess:
        _check_against_reference(sess, scenario, GradientDescentRef(0.1, 1e-4), steps=4)


def test_gradient_descent_without_weight_decay():
    init(use_dynamic_expansion=False)
    scenario = Scenario("by_table", gradient_descent.create_hash_optimizer(0.2))
    with new_session() as sess:
        _check_against_reference(sess, scenario, GradientDescentRef(0.2, 0.0), steps=4)


def test_learning_rate_tensor():
    init(use_dynamic_expansion=False)
    lr = tf.compat.v1.placeholder_with_default(tf.constant(0.05), [])
    scenario = Scenario(
        "by_table", adagrad.create_hash_optimizer(learning_rate=lr, initial_accumulator_value=0.2)
    )
    with new_session() as sess:
        _check_against_reference(sess, scenario, AdagradRef(0.05, 0.2), steps=4)
        with pytest.raises(tf.errors.InvalidArgumentError, match="learning_rate"):
            feed = scenario.feed(0)
            feed[lr] = -1.0
            sess.run(scenario.train, feed)


# ---------------------------------------------------------------------------
# LazyAdam's step
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("expansion", [True, False])
def test_lazy_adam_two_apply_gradients_use_steps_one_then_two(expansion):
    """Two train ops from one LazyAdam share its step: the first run uses t=1, the second t=2,
    and so on, whichever op runs."""
    init(use_dynamic_expansion=expansion)
    opt = (
        lazy_adam_by_addr.create_hash_optimizer_by_address(**LAZY_ADAM)
        if expansion
        else lazy_adam.create_hash_optimizer(**LAZY_ADAM)
    )
    scenario = Scenario("by_address" if expansion else "by_table", opt)
    if expansion:
        grads = tf.gradients(
            scenario.loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        )
        second = opt.apply_gradients(
            zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
        )
    else:
        second = opt.apply_gradients(
            zip(tf.gradients(scenario.loss, scenario.table), [scenario.table])
        )
    first = scenario.train
    ops = [first, second, second, first]
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        init_values = scenario.initial_values(sess)
        ref = LazyAdamRef(**LAZY_ADAM)
        state = {}
        for step_index, op in enumerate(ops):
            for key in set(STEPS[step_index][0]) | set(sum(STEPS[step_index][1], [])):
                state.setdefault(key, (init_values[key], ref.initial_slots()))
            for key, g in _reference_gradients(state, step_index).items():
                state[key] = ref.update(state[key][0], state[key][1], g, step_index + 1)
            sess.run(op, scenario.feed(step_index))
        keys, values, slots = sorted_export(*sess.run(scenario.export))
    np.testing.assert_allclose(values, np.stack([state[k][0] for k in keys]), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        slots[1], np.stack([state[k][1][1] for k in keys]), rtol=RTOL, atol=ATOL
    )


def test_lazy_adam_step_with_two_tables_in_one_apply():
    """One apply_gradients over two tables counts one step: both tables use t=1, then t=2."""
    init(use_dynamic_expansion=False)
    tables = [
        create_table(
            tf.int64, DIM, name, tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=10
        )
        for name in ("a", "b")
    ]
    ids = tf.constant([1, 2, 2], tf.int64)
    embs = [sparse_lookup(t, ids) for t in tables]
    weights = np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -0.1], [0.4, 0.4, 0.4]], np.float32)
    loss = tf.reduce_sum(weights * embs[0]) + tf.reduce_sum(2 * weights * embs[1])
    opt = lazy_adam.create_hash_optimizer(**LAZY_ADAM)
    train = opt.minimize(loss)
    exports = [t.export() for t in tables]
    ref = LazyAdamRef(**LAZY_ADAM)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
        got = [sorted_export(*sess.run(e)) for e in exports]
    for scale, (keys, values, slots) in zip((1.0, 2.0), got):
        assert keys.tolist() == [1, 2]
        g = {1: scale * weights[0], 2: scale * (weights[1] + weights[2])}
        for i, key in enumerate(keys):
            w, s = np.full(DIM, 0.5, np.float32), ref.initial_slots()
            for step in (1, 2):
                w, s = ref.update(w, s, g[key].astype(np.float64), step)
            np.testing.assert_allclose(values[i], w, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(slots[0, i], s[0], rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------
# Addresses of keys without a row (-1) are skipped
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("expansion", [True, False])
def test_not_found_keys_in_eval_are_never_updated(expansion):
    init(use_dynamic_expansion=expansion)
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=16
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    train_emb = sparse_lookup(table, ids, is_train=True, name="train_lookup")
    eval_emb = sparse_lookup(table, ids, is_train=False, name="eval_lookup")
    graph = tf.compat.v1.get_default_graph()
    loss = tf.reduce_sum(eval_emb * tf.constant([1.0, 2.0, 3.0]))
    if expansion:
        opt = gradient_descent_by_addr.create_hash_optimizer_by_addr(1.0, weight_decay=0.0)
        local_emb = graph.get_tensor_by_name("eval_lookup/find_or_insert:1")  # the rows
        addresses = graph.get_tensor_by_name("eval_lookup/find_or_insert:0")
        train = opt.apply_gradients(zip(tf.gradients(loss, [local_emb]), [addresses]))
    else:
        opt = gradient_descent.create_hash_optimizer(1.0)
        train = opt.apply_gradients(zip(tf.gradients(loss, [table]), [table]))
    with new_session() as sess:
        sess.run(train_emb, {ids: [1, 2]})
        assert (
            sess.run(
                addresses
                if expansion
                else graph.get_tensor_by_name("eval_lookup/find_or_insert:0"),
                {ids: [7, 1, 8, 9, 1]},
            )
            == -1
        ).sum() == 3
        sess.run(train, {ids: [7, 1, 8, 9, 1]})
        assert sess.run(table.size_tensor()) == 2
        values, exists = sess.run(table.lookup(tf.constant([1, 2, 7, 8, 9], tf.int64)))
    assert exists.tolist() == [True, True, False, False, False]
    np.testing.assert_allclose(values[0], 0.5 - 2 * np.array([1.0, 2.0, 3.0]), rtol=RTOL)
    np.testing.assert_array_equal(values[1], np.full(DIM, 0.5, np.float32))
    np.testing.assert_array_equal(values[2:], np.zeros((3, DIM), np.float32))


def test_stale_address_rejected():
    """An address looked up before its key was removed is rejected, not applied to another
    key's row."""
    init(use_dynamic_expansion=True)
    table = create_table(
        tf.int64, DIM, "stale", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=16
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    sparse_lookup(table, ids)
    addresses_t = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)[0]
    opt = gradient_descent_by_addr.create_hash_optimizer_by_addr(1.0)
    # Feeding the lookup's addresses replays old addresses into the optimizer.
    train = opt.apply_gradients([(tf.ones([2, DIM]), addresses_t)])
    with new_session() as sess:
        addresses = sess.run(addresses_t, {ids: [1, 2]})
        sess.run(table.remove(tf.constant([1], tf.int64)))
        sess.run(addresses_t, {ids: [3]})  # re-uses the row of key 1
        with pytest.raises(tf.errors.InvalidArgumentError, match="stale"):
            sess.run(train, {addresses_t: addresses})
        values, _ = sess.run(table.lookup(tf.constant([2, 3], tf.int64)))
    np.testing.assert_array_equal(values, np.full((2, DIM), 0.5, np.float32))


# ---------------------------------------------------------------------------
# One sparse optimizer per table
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first,second",
    [("lazy_adam", "adagrad"), ("adagrad", "ftrl"), ("sgd", "lazy_adam"), ("ftrl", "sgd")],
)
def test_second_optimizer_on_same_table_fails(first, second):
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64, DIM, "shared", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=16
    )
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    loss = tf.reduce_sum(tf.square(emb))
    train1 = OPTIMIZERS[first][0]().minimize(loss)
    train2 = OPTIMIZERS[second][0]().minimize(loss)
    export = table.export()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train1)
        before = sess.run(export)
        with pytest.raises(tf.errors.FailedPreconditionError, match="shared"):
            sess.run(train2)
        after = sess.run(export)
        # The first optimizer keeps working.
        sess.run(train1)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_two_instances_of_same_optimizer_share_a_table():
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64, DIM, "shared", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=16
    )
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    loss = tf.reduce_sum(tf.square(emb))
    train1 = adagrad.create_hash_optimizer(0.1).minimize(loss)
    train2 = adagrad.create_hash_optimizer(0.1).minimize(loss)
    with new_session() as sess:
        sess.run(train1)
        sess.run(train2)


def test_same_optimizer_with_other_initial_accumulator_is_rejected():
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        DIM,
        "shared_acc",
        tf.compat.v1.constant_initializer(0.5),
        device_vocabulary_size=16,
    )
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    loss = tf.reduce_sum(tf.square(emb))
    train1 = adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.1).minimize(loss)
    train2 = adagrad.create_hash_optimizer(0.1, initial_accumulator_value=0.2).minimize(loss)
    with new_session() as sess:
        sess.run(train1)
        with pytest.raises(tf.errors.FailedPreconditionError, match="shared_acc"):
            sess.run(train2)


def test_ftrl_errors_name_the_keyword_used():
    init(use_dynamic_expansion=False)
    with pytest.raises(ValueError, match=r"^l1 must be"):
        ftrl.create_hash_optimizer(0.1, l1=-1.0)
    with pytest.raises(ValueError, match=r"^l2_regularization_strength must be"):
        ftrl.create_hash_optimizer(0.1, l2_regularization_strength=-1.0)


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


BY_ADDR_FACTORIES = [
    lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(),
    lambda: adagrad_by_addr.create_hash_optimizer_by_address(),
    lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1),
    lambda: gradient_descent_by_addr.create_hash_optimizer_by_address(0.1),
    lambda: _ftrl(FTRL, by_address=True),
]
PLAIN_FACTORIES = [
    lambda: lazy_adam.create_hash_optimizer(),
    lambda: adagrad.create_hash_optimizer(),
    lambda: gradient_descent.create_hash_optimizer(0.1),
    lambda: ftrl.create_hash_optimizer(0.1),
]


@pytest.mark.parametrize("factory", BY_ADDR_FACTORIES)
def test_by_addr_optimizer_needs_expansion(factory):
    init(use_dynamic_expansion=False)
    with pytest.raises(ValueError, match="use_dynamic_expansion=True"):
        factory()


@pytest.mark.parametrize("factory", PLAIN_FACTORIES)
def test_plain_optimizer_rejected_with_expansion(factory):
    init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match="by_addr"):
        factory()


@pytest.mark.parametrize("factory", BY_ADDR_FACTORIES + PLAIN_FACTORIES)
def test_optimizer_before_init_raises(factory):
    with pytest.raises(RuntimeError, match="init"):
        factory()


@pytest.mark.parametrize(
    "expansion,factory,param",
    [
        (False, lambda: lazy_adam.create_hash_optimizer(beta1=1.0), "beta1"),
        (False, lambda: lazy_adam.create_hash_optimizer(beta1=0.0), "beta1"),
        (False, lambda: lazy_adam.create_hash_optimizer(beta2=1.5), "beta2"),
        (False, lambda: lazy_adam.create_hash_optimizer(epsilon=0), "epsilon"),
        (False, lambda: lazy_adam.create_hash_optimizer(learning_rate=-0.1), "learning_rate"),
        (True, lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(beta1=1.0), "beta1"),
        (True, lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(epsilon=0.0), "epsilon"),
        (False, lambda: adagrad.create_hash_optimizer(learning_rate=11), "learning_rate"),
        (
            False,
            lambda: adagrad.create_hash_optimizer(initial_accumulator_value=0),
            "initial_accumulator_value",
        ),
        (
            False,
            lambda: adagrad.create_hash_optimizer(initial_accumulator_value=1.5),
            "initial_accumulator_value",
        ),
        (
            True,
            lambda: adagrad_by_addr.create_hash_optimizer_by_address(learning_rate=11),
            "learning_rate",
        ),
        (
            True,
            lambda: adagrad_by_addr.create_hash_optimizer_by_address(initial_accumulator_value=0),
            "initial_accumulator_value",
        ),
        (False, lambda: adagrad_rowwise.create_hash_optimizer(epsilon=0.0), "initial_accumulator"),
        (False, lambda: adagrad_rowwise.create_hash_optimizer(epsilon=-1e-8), "epsilon"),
        (False, lambda: adagrad_rowwise.create_hash_optimizer(learning_rate=11), "learning_rate"),
        (
            True,
            lambda: adagrad_rowwise_by_addr.create_hash_optimizer_by_address(
                initial_accumulator_value=-0.1
            ),
            "initial_accumulator_value",
        ),
        (False, lambda: ftrl.create_hash_optimizer(0.1, l1_regularization_strength=-1), "l1"),
        (False, lambda: ftrl.create_hash_optimizer(0.1, l1=-1), "l1"),
        (False, lambda: ftrl.create_hash_optimizer(0.1, l2=-0.5), "l2"),
        (False, lambda: ftrl.create_hash_optimizer(0.1, l2_shrinkage=-0.5), "l2_shrinkage"),
        (
            False,
            lambda: ftrl.create_hash_optimizer(0.1, learning_rate_power=0.5),
            "learning_rate_power",
        ),
        (
            False,
            lambda: ftrl.create_hash_optimizer(0.1, initial_accumulator_value=-1),
            "initial_accumulator_value",
        ),
        (False, lambda: ftrl.create_hash_optimizer(-0.1), "learning_rate"),
        (
            False,
            lambda: gradient_descent.create_hash_optimizer(0.1, weight_decay=0.5),
            "weight_decay",
        ),
        (
            False,
            lambda: gradient_descent.create_hash_optimizer(0.1, weight_decay=1e-6),
            "weight_decay",
        ),
        (False, lambda: gradient_descent.create_hash_optimizer(-1.0), "learning_rate"),
        (
            True,
            lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=1.5),
            "weight_decay",
        ),
        (
            True,
            lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=-0.1),
            "weight_decay",
        ),
    ],
)
def test_hyperparameter_out_of_range(expansion, factory, param):
    init(use_dynamic_expansion=expansion)
    with pytest.raises(ValueError, match=param):
        factory()


@pytest.mark.parametrize("expansion", [False, True])
def test_ftrl_zero_learning_rate_rejected_at_construction(expansion):
    """FTRL divides by the learning rate: its kernel accepts only learning_rate > 0, so the
    Python layer must reject 0 when the optimizer is created, not at the first training step."""
    init(use_dynamic_expansion=expansion)
    with pytest.raises(ValueError, match="learning_rate"):
        if expansion:
            _ftrl(dict(FTRL, learning_rate=0.0), by_address=True)
        else:
            ftrl.create_hash_optimizer(0.0)


def test_hyperparameter_wrong_type():
    init(use_dynamic_expansion=False)
    with pytest.raises(TypeError, match="beta1"):
        lazy_adam.create_hash_optimizer(beta1="0.9")
    with pytest.raises(TypeError, match="weight_decay"):
        gradient_descent.create_hash_optimizer(0.1, weight_decay=True)
    with pytest.raises(TypeError, match="unexpected"):
        ftrl.create_hash_optimizer(0.1, l3=0.1)
    with pytest.raises(ValueError, match="name"):
        adagrad.create_hash_optimizer(name="")


def test_accepted_edge_values():
    init(use_dynamic_expansion=True)
    gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=0.5)
    gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=0.0)
    lazy_adam_by_addr.create_hash_optimizer_by_address(beta2=1.0, epsilon=1.0)
    adagrad_by_addr.create_hash_optimizer_by_address(
        learning_rate=10, initial_accumulator_value=1.0
    )


def test_apply_gradients_argument_checks():
    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64, DIM, "t", tf.compat.v1.constant_initializer(0.5), device_vocabulary_size=16
    )
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    opt = gradient_descent.create_hash_optimizer(0.1)
    dense = tf.Variable(1.0)
    with pytest.raises(ValueError, match="no gradients"):
        opt.apply_gradients([(None, table)])
    with pytest.raises(TypeError, match="IndexedSlices"):
        opt.apply_gradients([(tf.zeros([2, DIM]), table)])
    with pytest.raises(TypeError, match="rec_sdk"):
        opt.apply_gradients([(tf.constant(1.0), dense)])
    assert opt.get_name() == "GradientDescent" and opt.name == "GradientDescent"
    del emb
