"""rec_sdk.dynamic_embedding training with DynamicEmbeddingOptimizer against TensorFlow's own
optimizers on a dense variable and a NumPy lazy Adam (one and three shards, duplicates, two
lookups per step, slots), trainables, unwrapped optimizers and graphs."""

import numpy as np
import pytest
import tensorflow as tf
from tests.helpers import new_session
from tests.test_dynamic_embedding import DIM, as_dict, f32, i64, keys_of

import rec_sdk.dynamic_embedding as de

# --- Training with DynamicEmbeddingOptimizer ----------------------------------------------

UNIVERSE = np.array([-7, 3, 11, 25, 40, 41, 99, 100, 1234, 5000, 77777, 2**40], np.int64)
STEPS = 6

TF_OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=0.5),
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.3),
    # rec_sdk's own (one accumulator per row), the same class on the dense reference.
    "rowwise_adagrad": lambda: de.RowwiseAdagradOptimizer(
        0.2, initial_accumulator_value=0.1, epsilon=1e-3
    ),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(
        0.3,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.05,
    ),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.8, beta2=0.9, epsilon=1e-3),
    # Without a rec_sdk kernel: TensorFlow's own kernel on the step's rows and slots.
    "adadelta": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-3),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(
        0.05, decay=0.8, momentum=0.5, centered=True
    ),
    "proximal_adagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(
        0.2,
        initial_accumulator_value=0.3,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
    ),
    "proximal_sgd": lambda: tf.compat.v1.train.ProximalGradientDescentOptimizer(
        0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.05
    ),
    "adagrad_da": lambda: tf.compat.v1.train.AdagradDAOptimizer(
        0.3,
        tf.compat.v1.train.get_or_create_global_step(),
        initial_gradient_squared_accumulator_value=0.2,
        l1_regularization_strength=0.01,
    ),
}
SLOTS = {
    "adagrad": ["accumulator"],
    "rowwise_adagrad": ["accumulator"],
    "sgd": [],
    "momentum": ["momentum"],
    "nesterov": ["momentum"],
    "ftrl": ["accum", "linear"],
    "adam": ["m", "v"],
    "adadelta": ["accum", "accum_update"],
    "rmsprop": ["rms", "mg", "momentum"],
    "proximal_adagrad": ["accumulator"],
    "proximal_sgd": [],
    "adagrad_da": ["gradient_accumulator", "gradient_squared_accumulator"],
}


def batches(seed=0):
    """Per step: positions into UNIVERSE of two lookups (duplicates included) and weights."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        a = rng.integers(0, 8, size=(2, 4))  # mostly the first keys: repeats across steps
        b = rng.integers(4, len(UNIVERSE), size=5)
        out.append((a, b, rng.normal(size=(2, 4, DIM)).astype(np.float32)))
    return out


def model_loss(emb_a, emb_b, weights, dense):
    """Nonlinear in the embeddings (so updates depend on the values) and in a dense vector."""
    return (
        tf.reduce_sum(weights * emb_a)
        + 0.5 * tf.reduce_sum(tf.square(emb_b))
        + tf.reduce_sum(dense * tf.reduce_mean(emb_a, axis=[0, 1]))
    )


def train_de(name, sharded):
    """Trains a de.Variable (and a dense vector) for STEPS; -> (rows, slots, dense, initial)."""
    tf.compat.v1.reset_default_graph()
    v = de.Variable(
        dim=DIM,
        initializer=tf.compat.v1.random_normal_initializer(seed=5),
        devices=["/CPU:0"] * (3 if sharded else 1),
        name="trained",
    )
    initial = v.lookup(i64(UNIVERSE))
    a = tf.compat.v1.placeholder(tf.int64, [2, 4])
    b = tf.compat.v1.placeholder(tf.int64, [5])
    w = tf.compat.v1.placeholder(tf.float32, [2, 4, DIM])
    dense = tf.compat.v1.get_variable("dense", initializer=tf.constant([0.5, -0.5, 1.0]))
    loss = model_loss(
        de.embedding_lookup(v, a, name="a"), de.embedding_lookup(v, b, name="b"), w, dense
    )
    opt = de.DynamicEmbeddingOptimizer(TF_OPTIMIZERS[name]())
    step = tf.compat.v1.train.get_or_create_global_step()
    train = opt.minimize(loss, global_step=step)
    slots = [s.lookup(i64(UNIVERSE)) for s in v.get_slot_variables(opt)]
    assert [s.name for s in v.get_slot_variables(opt)] == [
        "trained/%s/%s" % (opt.get_name(), n) for n in SLOTS[name]
    ]
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        init_values = sess.run(initial)
        for ia, ib, wv in batches():
            sess.run(train, {a: UNIVERSE[ia], b: UNIVERSE[ib], w: wv})
        assert sess.run(step) == STEPS
        rows = as_dict(*sess.run(v.export()))
        return rows, [sess.run(s) for s in slots], sess.run(dense), init_values


def train_dense_reference(name, init_values):
    """The same model on a dense [len(UNIVERSE), DIM] tf.Variable with TF's own optimizer
    (whose sparse updates are lazy for these optimizers and sum duplicate indices)."""
    tf.compat.v1.reset_default_graph()
    table = tf.compat.v1.get_variable("table", initializer=tf.constant(init_values))
    a = tf.compat.v1.placeholder(tf.int32, [2, 4])
    b = tf.compat.v1.placeholder(tf.int32, [5])
    w = tf.compat.v1.placeholder(tf.float32, [2, 4, DIM])
    dense = tf.compat.v1.get_variable("dense", initializer=tf.constant([0.5, -0.5, 1.0]))
    loss = model_loss(tf.gather(table, a), tf.gather(table, b), w, dense)
    opt = TF_OPTIMIZERS[name]()
    train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        seen = set()
        for ia, ib, wv in batches():
            sess.run(train, {a: ia, b: ib, w: wv})
            seen.update(ia.reshape(-1).tolist() + ib.tolist())
        values = sess.run(table)
        slots = [sess.run(opt.get_slot(table, n)) for n in SLOTS[name]]
        return values, slots, sess.run(dense), sorted(seen)


def lazy_adam_reference(init_values, lr=0.1, b1=0.8, b2=0.9, eps=1e-3):
    """NumPy: lazy Adam on the touched rows (one bias-correction step count per apply), dense
    Adam on the dense vector, gradients of model_loss by hand."""
    table = init_values.astype(np.float64).copy()
    m, v = np.zeros_like(table), np.zeros_like(table)
    dense = np.array([0.5, -0.5, 1.0])
    dm, dv = np.zeros(DIM), np.zeros(DIM)
    seen = set()
    for t, (ia, ib, wv) in enumerate(batches(), start=1):
        emb_a = table[ia]
        grad_rows = {}
        g_a = wv + dense / 8.0
        for pos, g in zip(ia.reshape(-1), g_a.reshape(-1, DIM)):
            grad_rows[pos] = grad_rows.get(pos, 0) + g
        for pos in ib:
            grad_rows[pos] = grad_rows.get(pos, 0) + table[pos]
        g_dense = emb_a.reshape(-1, DIM).mean(axis=0)
        lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        for pos, g in grad_rows.items():
            m[pos] = b1 * m[pos] + (1 - b1) * g
            v[pos] = b2 * v[pos] + (1 - b2) * g * g
            table[pos] -= lr_t * m[pos] / (np.sqrt(v[pos]) + eps)
        dm = b1 * dm + (1 - b1) * g_dense
        dv = b2 * dv + (1 - b2) * g_dense**2
        dense = dense - lr_t * dm / (np.sqrt(dv) + eps)
        seen.update(grad_rows)
    return table, [m, v], dense, sorted(seen)


@pytest.mark.parametrize("name", list(TF_OPTIMIZERS))
@pytest.mark.parametrize("sharded", [False, True], ids=["one_shard", "three_shards"])
def test_training_matches_reference(name, sharded):
    rows, slots, dense, init_values = train_de(name, sharded)
    if name == "adam":
        want, want_slots, want_dense, seen = lazy_adam_reference(init_values)
    else:
        want, want_slots, want_dense, seen = train_dense_reference(name, init_values)
    # Exactly the keys a batch met were inserted, with the reference's values and slots.
    assert sorted(rows) == sorted(int(UNIVERSE[p]) for p in seen)
    for p in seen:
        np.testing.assert_allclose(
            rows[int(UNIVERSE[p])], want[p], rtol=2e-4, atol=2e-5, err_msg="key %d" % UNIVERSE[p]
        )
        for got, ref in zip(slots, want_slots):
            np.testing.assert_allclose(got[p], ref[p], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(dense, want_dense, rtol=2e-4, atol=2e-5)
    # Keys never trained read their slots' initial values.
    unseen = [p for p in range(len(UNIVERSE)) if p not in seen]
    if name == "adagrad" and unseen:
        np.testing.assert_allclose(slots[0][unseen], 0.5)


@pytest.mark.parametrize("use_resource", [True, False])
def test_rowwise_adagrad_on_dense_variables_against_numpy(use_resource):
    """de.RowwiseAdagradOptimizer on ordinary variables (resource and ref), sparse gradients
    with a duplicate index and a dense one: one accumulator per row, duplicates summed."""
    init = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0
    table = tf.compat.v1.get_variable("rw_table", initializer=init, use_resource=use_resource)
    vector = tf.compat.v1.get_variable(
        "rw_vector", initializer=np.float32([1.0, -2.0]), use_resource=use_resource
    )
    ids = tf.constant([0, 2, 0])
    weights = np.float32([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0], [2.0, 0.0, -1.0]])
    loss = tf.reduce_sum(tf.gather(table, ids) * weights) + tf.reduce_sum(vector * vector)
    train = de.RowwiseAdagradOptimizer(0.1, initial_accumulator_value=0.2, epsilon=1e-3).minimize(
        loss
    )
    want_table, acc = init.astype(np.float64), np.full(4, 0.2)
    want_vector, vector_acc = np.float64([1.0, -2.0]), 0.2
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
            grads = {0: weights[0] + weights[2], 2: weights[1]}
            for row, g in grads.items():
                acc[row] += np.mean(g * g)
                want_table[row] -= 0.1 * g / (np.sqrt(acc[row]) + 1e-3)
            g = 2 * want_vector
            vector_acc += np.mean(g * g)
            want_vector = want_vector - 0.1 * g / (np.sqrt(vector_acc) + 1e-3)
        np.testing.assert_allclose(sess.run(table), want_table, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sess.run(vector), want_vector, rtol=1e-5, atol=1e-6)


def test_training_inserts_only_when_the_optimizer_runs_and_eval_does_not():
    v = de.Variable(dim=2, initializer=0.25)
    ids = i64([[1, 2], [2, 3]])
    emb = de.embedding_lookup(v, ids)
    loss = tf.reduce_sum(emb)
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0)).minimize(
        loss
    )
    eval_emb = de.embedding_lookup(v, i64([4, 5]), name="eval")
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_allclose(sess.run(emb), 0.25)
        sess.run(eval_emb)
        assert sess.run(v.size()) == 0  # lookups never insert
        sess.run(train)
        assert as_dict(*sess.run(v.export())) == {1: [-0.75] * 2, 2: [-1.75] * 2, 3: [-0.75] * 2}


def test_trainables_and_return_trainable():
    v = de.Variable(dim=2, name="tv")
    frozen = de.Variable(dim=2, name="frozen", trainable=False)
    emb, trainable = de.embedding_lookup(v, i64([1, 2]), name="user", return_trainable=True)
    _, none = de.embedding_lookup(frozen, i64([1]), name="f", return_trainable=True)
    assert none is None
    assert v.get_trainable_by_name("user") is trainable
    assert v.trainable_store == {"user": trainable}
    assert trainable in tf.compat.v1.trainable_variables()
    assert trainable not in tf.compat.v1.global_variables()  # never saved, never initialised
    with pytest.raises(TypeError):
        v.get_trainable_by_name(3)
    assert emb.shape.as_list() == [2, 2]


def test_gradients_of_unique_and_max_norm():
    v = de.Variable(dim=2, initializer=0.0)
    setup = v.upsert(i64([1, 2]), f32([[3.0, 4.0], [0.3, 0.4]]))
    ids = i64([1, 1, 2])
    plain = de.embedding_lookup(v, ids)
    unique = de.embedding_lookup_unique(v, ids, name="u")
    clipped = de.embedding_lookup(v, ids, max_norm=1.0, name="c")
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(
        tf.reduce_sum(plain)
    )
    with new_session() as sess:
        sess.run(setup)
        a, b, c = sess.run([plain, unique, clipped])
        np.testing.assert_allclose(a, b)
        np.testing.assert_allclose(c, [[0.6, 0.8], [0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
        sess.run(train)
        # Key 1 appears twice: both gradients count (TFRA's plain lookup keeps one).
        np.testing.assert_allclose(
            sess.run(v.lookup(i64([1, 2]))), [[2.8, 3.8], [0.2, 0.3]], rtol=1e-6
        )


def test_bp_v2_gives_the_same_single_worker_result():
    results = []
    for bp_v2 in (False, True):
        tf.compat.v1.reset_default_graph()
        v = de.Variable(dim=2, initializer=0.5, bp_v2=bp_v2)
        loss = tf.reduce_sum(tf.square(de.embedding_lookup(v, i64([1, 2, 1]))))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1), bp_v2=bp_v2)
        train = opt.minimize(loss)
        with new_session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            results.append(sess.run(v.lookup(i64([1, 2]))))
    np.testing.assert_array_equal(results[0], results[1])


class _OwnOptimizer(tf.compat.v1.train.Optimizer):
    """An optimizer rec_sdk knows nothing of (neither a kernel nor its slots)."""


def test_unsupported_optimizer():
    with pytest.raises(TypeError, match="AdamOptimizer"):
        de.DynamicEmbeddingOptimizer(_OwnOptimizer(False, "own"))
    with pytest.raises(TypeError, match="tf.compat.v1.train"):
        de.DynamicEmbeddingOptimizer(object())


def test_unwrapped_optimizer_on_de_trainables_is_a_clear_error():
    from rec_sdk.util.variable import get_dense_and_sparse_variable

    v = de.Variable(dim=2, name="emb")
    dense = tf.compat.v1.get_variable("d", [2])
    loss = tf.reduce_sum(de.embedding_lookup(v, i64([1, 2])) * dense)
    with pytest.raises(TypeError, match="without DynamicEmbeddingOptimizer"):
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
    # The dense variables of the graph leave de trainables out.
    assert get_dense_and_sparse_variable()[0] == [dense]
    tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, var_list=[dense])


def test_slot_views_before_training_and_of_another_optimizer():
    v = de.Variable(dim=2, initializer=0.0, name="slots")
    adagrad = de.DynamicEmbeddingOptimizer(
        tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.5)
    )
    adam = tf.compat.v1.train.AdamOptimizer(0.1)
    train = adagrad.minimize(tf.reduce_sum(de.embedding_lookup(v, i64([1, 2]))))
    accum = v.get_slot_variables(adagrad)[0]
    m = v.get_slot_variables(adam)[0]
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(v.upsert(i64([7]), f32([[1.0, 1.0]])))
        # No optimizer ran yet: every key reads the initial accumulator.
        np.testing.assert_allclose(sess.run(accum.lookup(i64([7, 8]))), 0.5)
        keys, values = sess.run(accum.export())
        assert keys.tolist() == [7] and np.allclose(values, 0.5)
        sess.run(train)
        np.testing.assert_allclose(sess.run(accum.lookup(i64([1, 8]))), [[1.5, 1.5], [0.5, 0.5]])
        with pytest.raises(tf.errors.InvalidArgumentError, match="belong to optimizer Adagrad"):
            sess.run(m.lookup(i64([1])))


def test_one_optimizer_in_two_graphs():
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    for _ in range(2):
        with tf.Graph().as_default():
            v = de.Variable(dim=2, initializer=1.0)
            train = opt.minimize(tf.reduce_sum(de.embedding_lookup(v, i64([1]))))
            with new_session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train)
                np.testing.assert_allclose(sess.run(v.lookup(i64([1]))), [[0.9, 0.9]], rtol=1e-5)


def test_gradient_tape_in_graph_mode_reaches_the_trainable():
    """A Keras optimizer's minimize(callable, callable) in graph mode records the loss on a
    GradientTape: the lookup's trainable must be watched, or training silently does nothing."""
    ids = i64([1, 2, 2])
    dense = tf.Variable(np.full([3, 2], 0.5, np.float32))
    v = de.Variable(dim=2, initializer=0.5)
    trainables = []

    def de_loss():
        emb, trainable = de.embedding_lookup(v, ids, name="tape", return_trainable=True)
        trainables[:] = [trainable]
        return tf.reduce_sum(emb * emb)

    with tf.GradientTape() as tape:
        loss = de_loss()
    assert tape.gradient(loss, trainables)[0] is not None
    assert isinstance(trainables[0], de.TrainableWrapper)
    train = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.SGD(0.1)).minimize(
        de_loss, lambda: trainables
    )
    dense_train = tf.keras.optimizers.legacy.SGD(0.1).minimize(
        lambda: tf.reduce_sum(tf.square(tf.nn.embedding_lookup(dense, ids))), [dense]
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run([train, dense_train])
        np.testing.assert_allclose(sess.run(v.lookup(i64([1, 2]))), sess.run(dense)[1:], atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.keras.optimizers.legacy.RMSprop(0.1),
        lambda: tf.keras.optimizers.legacy.Nadam(0.1),
    ],
    ids=["RMSprop", "Nadam"],
)
def test_keras_generic_path_on_a_second_table_in_graph_mode(make):
    """One wrapped Keras optimizer on the generic path trains a table, then another table made
    later in the same graph (its private copy is not the first one): both as dense."""
    ids = i64([1, 2, 2, 3])
    opt = de.DynamicEmbeddingOptimizer(make())
    dense_opt = make()
    with new_session() as sess:
        for name in ("first", "second"):
            v = de.Variable(dim=2, initializer=0.5, name="generic_" + name)
            dense = tf.Variable(np.full([4, 2], 0.5, np.float32))
            train = opt.minimize(
                lambda v=v, name=name: tf.reduce_sum(
                    tf.square(de.embedding_lookup(v, ids, name="g_" + name) - 1.0)
                ),
                var_list=lambda v=v: [t for t in v.trainable_store.values()],
            )
            dense_train = dense_opt.minimize(
                lambda d=dense: tf.reduce_sum(tf.square(tf.nn.embedding_lookup(d, ids) - 1.0)),
                [dense],
            )
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run([train, dense_train])
            np.testing.assert_allclose(
                sess.run(v.lookup(i64([1, 2, 3]))), sess.run(dense)[1:], atol=1e-6
            )


def test_two_lookups_of_a_key_in_one_step_count_once():
    v = de.Variable(dim=2, initializer=0.1, restrict_policy=de.FrequencyRestrictPolicy)
    a = tf.compat.v1.placeholder(tf.int64, [None])
    b = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(de.embedding_lookup(v, a, name="a")) + tf.reduce_sum(
        de.embedding_lookup(v, b, name="b")
    )
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(
        loss
    )
    with new_session() as sess:
        sess.run(train, {a: [1, 2], b: [1]})  # key 1 in both lookups: one update, one count
        np.testing.assert_allclose(sess.run(v.lookup(i64([1]))), [[-0.9, -0.9]], rtol=1e-6)
        sess.run(train, {a: [2], b: [3]})  # key 2: two steps
        sess.run(v.restrict(1))
        assert keys_of(sess, v) == [2]


def test_table_names_follow_variable_names():
    a, b = de.Variable(name="a/b"), de.Variable(name="a_b")
    assert a.tables[0].table_name == "a_b_mht_1of1"
    assert b.tables[0].table_name == "a_b_1_mht_1of1"
    with pytest.raises(TypeError, match="restrict_policy"):
        de.Variable(restrict_policy=de.RestrictPolicy)


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
def test_int32_keys_and_empty_batches_train(key_dtype):
    v = de.Variable(key_dtype=key_dtype, dim=2, initializer=1.0, devices=["/CPU:0"] * 2)
    ids = tf.compat.v1.placeholder(key_dtype, [None])
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.5)).minimize(
        tf.reduce_sum(de.embedding_lookup(v, ids))
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: np.array([], key_dtype.as_numpy_dtype)})
        assert sess.run(v.size()) == 0
        sess.run(train, {ids: np.array([3, 4, 3], key_dtype.as_numpy_dtype)})
        # Adagrad: a = 0.1 + g^2, w -= 0.5 g / sqrt(a): key 3 has g = 2, key 4 g = 1.
        got = as_dict(*sess.run(v.export()))
        np.testing.assert_allclose(got[3], [1 - 0.5 * 2 / np.sqrt(4.1)] * 2, rtol=1e-5)
        np.testing.assert_allclose(got[4], [1 - 0.5 / np.sqrt(1.1)] * 2, rtol=1e-5)


def test_inference_mode_lookups_only_read():
    assert de.get_model_mode() == de.ModelMode.TRAIN == "train"
    v = de.Variable(dim=2, initializer=0.5, name="served")
    before = set(tf.compat.v1.get_default_graph().get_operations())  # e.g. checkpoint ops
    de.enable_inference_mode()
    try:
        assert de.get_model_mode() == "inference"
        emb, trainable = de.embedding_lookup(v, i64([1, 2, 1]), return_trainable=True)
    finally:
        de.enable_train_mode()
    assert trainable is None and not tf.compat.v1.trainable_variables()
    # Nothing the lookup built writes to a table: it may run from many threads at once.
    writers = {
        "RecSdk>TableFindOrInsert",
        "RecSdk>TableUpsert",
        "RecSdk>TableRemove",
        "RecSdk>TableWriteRows",
        "RecSdk>TableReadRows",
        "RecSdk>TrainableRows",
    }
    built = {
        op.type for op in tf.compat.v1.get_default_graph().get_operations() if op not in before
    }
    assert not built & writers, built & writers
    with new_session() as sess:
        np.testing.assert_allclose(sess.run(emb), 0.5)
        assert sess.run(v.size()) == 0
    # Lookups built after enable_train_mode train again.
    _, trainable = de.embedding_lookup(v, i64([3]), return_trainable=True, name="again")
    assert trainable is not None


@pytest.mark.parametrize("policy", ["timestamp", "frequency"])
def test_restrict_policy_status_and_apply_update(policy):
    cls = {"timestamp": de.TimestampRestrictPolicy, "frequency": de.FrequencyRestrictPolicy}
    v = de.Variable(dim=2, initializer=0.0, name="with_status", restrict_policy=cls[policy])
    status = v.restrict_policy.status
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    update = v.restrict_policy.apply_update(ids)
    with new_session() as sess:
        assert sess.run(status.size()) == 0
        sess.run(update, {ids: [0, 1, 2, 2]})
        sess.run(update, {ids: [1, 2, 3]})
        assert sess.run(status.size()) == 4 == sess.run(v.size())
        keys, stat = sess.run(status.export())
    stat = dict(zip(keys.tolist(), stat.tolist()))
    if policy == "timestamp":
        assert stat[0] < stat[1] == stat[2] == stat[3]
    else:  # one count per key and update, however often the key occurs in it
        assert stat == {0: 1, 1: 2, 2: 2, 3: 1}


def test_optimizer_slots_of_a_trainable():
    v = de.Variable(dim=2, initializer=0.0, name="slotted")
    dense = tf.compat.v1.get_variable("dense_w", [2])
    emb, trainable = de.embedding_lookup(v, i64([4, 5]), return_trainable=True)
    opt = de.DynamicEmbeddingOptimizer(
        tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.25)
    )
    train = opt.minimize(tf.reduce_sum(emb * dense))
    assert opt.get_slot_names() == ["accumulator"]
    slot = opt.get_slot(trainable, "accumulator")
    assert slot.params.name == "slotted/Adagrad/accumulator"
    assert opt.get_slot(trainable, "m") is None
    assert opt.get_slot(dense, "accumulator") is not None  # dense variables as before
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        assert sess.run(slot.params.size()) == 2
        np.testing.assert_allclose(sess.run(slot.params.lookup(i64([9]))), [[0.25, 0.25]])


def test_python_and_numpy_keys_and_values_convert_to_the_variables_dtypes():
    v = de.Variable(dim=2, key_dtype=tf.int32, name="converted")
    upsert = v.upsert([1, 2], np.ones([2, 2]))  # a list of ints, float64 values
    found = v.lookup(np.array([2, 3], np.int64))
    with new_session() as sess:
        sess.run(upsert)
        np.testing.assert_allclose(sess.run(found), [[1, 1], [0, 0]])
    with pytest.raises(TypeError, match="key_dtype"):
        v.lookup(tf.constant([1.5]))


def test_size_works_after_the_graph_is_finalized():
    v = de.Variable(dim=2, name="sized")
    upsert = v.upsert(i64([1, 2]), f32([[1.0, 1.0], [2.0, 2.0]]))
    first = v.size()
    with tf.control_dependencies([upsert]):
        after_upsert = v.size()  # ordered after the upsert, so never handed out later
    assert after_upsert is not first
    tf.compat.v1.get_default_graph().finalize()
    assert v.size() is first
    with new_session() as sess:
        assert sess.run(first) == 0
        sess.run(upsert)
        assert sess.run(v.size()) == 2


def test_adam_matches_tensorflows_adam_to_1e6():
    """A wrapped AdamOptimizer corrects its rate from float32 beta powers, as TensorFlow's
    Adam does: with every row in every batch, the rows follow a dense variable's to 1e-6."""
    init = np.random.default_rng(3).normal(size=(3, 4)).astype(np.float32)
    x = tf.constant(np.random.default_rng(4).normal(size=(4, 1)).astype(np.float32))
    ids = i64([0, 1, 2])
    dense = tf.compat.v1.get_variable("dense_table", initializer=tf.constant(init))
    dense_loss = tf.reduce_sum(tf.square(tf.matmul(tf.gather(dense, ids), x)))
    dense_train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(dense_loss)
    v = de.Variable(dim=4, name="adam_rows")
    emb, trainable = de.embedding_lookup(v, ids, return_trainable=True)
    de_loss = tf.reduce_sum(tf.square(tf.matmul(emb, x)))
    de_train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(
        de_loss, var_list=[trainable]
    )
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(v.upsert(ids, init))
        for _ in range(10):
            sess.run([dense_train, de_train])
        np.testing.assert_allclose(sess.run(v.lookup(ids)), sess.run(dense), rtol=1e-6, atol=1e-6)


def test_trainable_update_op_slot_tables_and_resource_handle():
    v = de.Variable(dim=2, initializer=1.0, name="wrapped", devices=["/CPU:0"] * 2)
    _, trainable = de.embedding_lookup(v, i64([1, 2, 3]), return_trainable=True)
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    assert [s.tables for s in v.get_slot_variables(opt)] == [v.tables, v.tables]
    assert v.tables[0].resource_handle is v.tables[0].handle
    with new_session() as sess:
        assert sess.run(v.size()) == 0
        sess.run(trainable.update_op())  # stores the rows the lookup read
        assert sess.run(v.size()) == 3
        np.testing.assert_allclose(sess.run(v.lookup(i64([1, 2, 3]))), 1.0)


def test_graph_trainable_reads_as_its_lookups_rows_and_trains_through_them():
    """A graph-mode lookup's trainable read as a tensor (an L2 term of it, or a loss of it
    alone as TFRA's tests write) is the rows of the lookup's distinct keys, and its gradient
    trains those rows: SGD against NumPy."""
    var = de.get_variable("reads_as_rows", dim=2, initializer=0.5)
    ids = i64([3, 7, 3])
    emb, trainable = de.embedding_lookup(var, ids, name="rr", return_trainable=True)
    read = trainable.read_value()
    loss = tf.reduce_sum(emb) + 0.5 * tf.nn.l2_loss(trainable)
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(
        loss, var_list=[trainable]
    )
    alone = de.get_variable("reads_as_rows_alone", dim=2, initializer=1.0)
    _, tw = de.embedding_lookup(alone, i64([5]), name="ra", return_trainable=True)
    train_alone = de.DynamicEmbeddingOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.25)
    ).minimize(lambda: tw * tw, var_list=[tw])
    rows = {3: np.full(2, 0.5), 7: np.full(2, 0.5)}
    counts = {3: 2, 7: 1}
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            np.testing.assert_allclose(sess.run(read), [rows[3], rows[7]], rtol=1e-6)
            sess.run(train)
            for k in rows:  # d/drow: count (sum of emb) + 0.5 * row (l2_loss = sum(x^2) / 2)
                rows[k] = rows[k] - 0.1 * (counts[k] + 0.5 * rows[k])
        np.testing.assert_allclose(sess.run(var.lookup(i64([3, 7]))), [rows[3], rows[7]], rtol=1e-6)
        row = 1.0
        for _ in range(2):
            sess.run(train_alone)
            row -= 0.25 * 2 * row
        np.testing.assert_allclose(sess.run(alone.lookup(i64([5]))), [[row, row]], rtol=1e-6)
        assert sess.run(alone.size()) == 1


def test_graph_trainables_are_placed_with_the_ids():
    """A graph-mode lookup's trainable sits on its ids' device (the rows go where the ids
    come from), whatever device scope the lookup is built in; ids without a device leave it
    to the scope."""
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            var = de.get_variable("placed", dim=2)
        with tf.device("/job:worker/task:1"):
            ids = i64([1, 2, 3])
            sp_ids = tf.SparseTensor([[0, 0], [1, 0]], i64([4, 5]), [2, 1])
        with tf.device("/job:ps/task:0"):
            _, dense_tw = de.embedding_lookup(var, ids, name="d", return_trainable=True)
            _, sparse_tw = de.embedding_lookup_sparse(
                var, sp_ids, None, name="s", return_trainable=True
            )
            _, safe_tw = de.safe_embedding_lookup_sparse(
                var, sp_ids, None, name="f", return_trainable=True
            )
            _, scoped_tw = de.embedding_lookup(var, i64([7]), name="x", return_trainable=True)
        for trainable in (dense_tw, sparse_tw, safe_tw):
            assert trainable.device == "/job:worker/task:1"
        assert scoped_tw.device == "/job:ps/task:0"
