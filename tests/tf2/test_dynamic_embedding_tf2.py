"""rec_sdk.dynamic_embedding in TF2: eager, tf.function and Keras, against NumPy references
and against dense tf.Variables trained by the same optimizer."""

import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk import serving
from rec_sdk.ops import optimizer_ops

K = tf.keras.optimizers
IDS = np.array([[1, 2], [3, 1], [2, 2]], np.int64)  # duplicates within and across rows
KEYS = np.array([0, 1, 2, 3], np.int64)


@pytest.fixture(autouse=True)
def _eager():
    if not tf.executing_eagerly():
        pytest.skip("TF2 tests need eager execution")
    de.enable_train_mode()
    yield
    de.enable_train_mode()


def _initial(dim=3, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, (len(KEYS), dim)).astype(np.float32)


def _variable(name, dim=3, **kwargs):
    var = de.Variable(name=name, dim=dim, **kwargs)
    var.upsert(KEYS, _initial(dim))
    return var


def _loss_of(emb):
    return tf.reduce_sum(tf.square(tf.reduce_sum(emb, axis=1) - 0.5))


def test_variable_methods_eagerly_and_in_tf_function_match_a_dict():
    var = de.Variable(name="methods", dim=2, initializer=-1.0, devices=["/CPU:0"] * 2)
    ref = {}
    rng = np.random.RandomState(1)

    @tf.function
    def upsert(k, v):
        var.upsert(k, v)

    for step in range(4):
        keys = rng.randint(0, 20, 8).astype(np.int64)
        values = rng.rand(8, 2).astype(np.float32)
        (upsert if step % 2 else var.upsert)(tf.constant(keys), tf.constant(values))
        for k, v in zip(keys, values):
            ref[k] = v
        gone = keys[:2]
        var.remove(gone)
        for k in gone:
            ref.pop(k, None)
    assert int(var.size()) == len(ref)
    assert int(var.size(0)) + int(var.size(1)) == len(ref)
    probe = np.arange(20, dtype=np.int64)
    values, exists = var.lookup(probe, return_exists=True)
    for k, v, e in zip(probe, values.numpy(), exists.numpy()):
        assert e == (k in ref)
        np.testing.assert_array_equal(v, ref[k] if k in ref else [-1.0, -1.0])
    keys, values = var.export()
    assert sorted(keys.numpy().tolist()) == sorted(ref)
    lookup = tf.function(lambda k: var.lookup(k))
    np.testing.assert_array_equal(lookup(tf.constant(probe)), var.lookup(probe))
    var.clear()
    assert int(var.size()) == 0


def test_eager_tables_of_one_name_are_distinct_and_freed():
    a = de.Variable(name="same", dim=1)
    b = de.Variable(name="same", dim=1)
    a.upsert(np.array([1], np.int64), np.ones([1, 1], np.float32))
    assert int(a.size()) == 1 and int(b.size()) == 0
    handle = a.tables[0].handle
    del a
    with pytest.raises(tf.errors.NotFoundError):  # the table went with its object
        optimizer_ops.read_rows(handle, tf.constant([0], tf.int64), "x", [])


def _train_de(make_optimizer, name, steps=4, function=True, two_lookups=False):
    var = _variable(name)
    opt = de.DynamicEmbeddingOptimizer(make_optimizer())

    def loss():
        emb = de.embedding_lookup(var, IDS, name="emb")
        if two_lookups:
            emb = emb + de.embedding_lookup(var, IDS[:, ::-1], name="emb2")
        return _loss_of(emb)

    fn = tf.function(loss) if function else loss
    var_list = [var.get_trainable_by_name("emb")]  # before the first trace
    if two_lookups:
        var_list.append(var.get_trainable_by_name("emb2"))
    for _ in range(steps):
        opt.minimize(fn, var_list=var_list)
    return var.lookup(KEYS).numpy(), opt


def _train_dense(make_optimizer, steps=4, two_lookups=False):
    table = tf.Variable(_initial())
    opt = make_optimizer()

    def loss():
        emb = tf.nn.embedding_lookup(table, IDS)
        if two_lookups:
            emb = emb + tf.nn.embedding_lookup(table, IDS[:, ::-1])
        return _loss_of(emb)

    for _ in range(steps):
        opt.minimize(loss, var_list=[table])
    return table.numpy()


OPTIMIZERS = {
    # fused kernels
    "keras.Adam": lambda: K.Adam(0.1),
    "legacy.Adam": lambda: K.legacy.Adam(0.1),
    "v1.Adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "keras.Adagrad": lambda: K.Adagrad(0.1),
    "legacy.Adagrad": lambda: K.legacy.Adagrad(0.1),
    "keras.SGD": lambda: K.SGD(0.1),
    "keras.SGD.nesterov": lambda: K.SGD(0.1, momentum=0.9, nesterov=True),
    "legacy.SGD.momentum": lambda: K.legacy.SGD(0.1, momentum=0.9),
    "v1.Momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "keras.Ftrl": lambda: K.Ftrl(0.1, l1_regularization_strength=0.01),
    "legacy.Ftrl": lambda: K.legacy.Ftrl(0.1, l2_shrinkage_regularization_strength=0.01),
    # generic path
    "keras.Adamax": lambda: K.Adamax(0.1),
    "legacy.RMSprop": lambda: K.legacy.RMSprop(0.1, momentum=0.5, centered=True),
    "keras.Nadam": lambda: K.Nadam(0.1),
    "legacy.Adam.amsgrad": lambda: K.legacy.Adam(0.1, amsgrad=True),
    "v1.RMSProp": lambda: tf.compat.v1.train.RMSPropOptimizer(0.1),
}
# The Keras 2 optimizers' Adam updates m and v as m += (g - m)(1 - beta1): other rounding.
TOLERANCE = {"keras.Adam": 2e-5, "keras.Nadam": 2e-5}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_matches_a_dense_variable(name):
    """The rows of the batch train as a dense table's with the same optimizer (rows 1-3: the
    dense Keras 2 Ftrl also rewrites row 0, which is not in the batch)."""
    rows, opt = _train_de(OPTIMIZERS[name], "train_" + name.replace(".", "_"))
    dense = _train_dense(OPTIMIZERS[name])
    np.testing.assert_allclose(rows[1:], dense[1:], atol=TOLERANCE.get(name, 1e-6), rtol=0)
    np.testing.assert_array_equal(rows[0], _initial()[0])  # lazy: row 0 untouched
    if not isinstance(opt, tf.compat.v1.train.Optimizer):
        assert int(opt.iterations) == 4


@pytest.mark.parametrize("name", ["legacy.Nadam", "keras.RMSprop"])
def test_generic_path_over_two_tables_follows_learning_rate_changes(name):
    """Two de tables trained by one generic-path optimizer as two dense tables are, with the
    learning rate changed (as a Keras callback does) after two steps: the private copies take
    the new rate, and Nadam's momentum cache advances once per step, not once per table."""
    make = {
        "legacy.Nadam": lambda: K.legacy.Nadam(0.1),
        "keras.RMSprop": lambda: K.RMSprop(0.1, momentum=0.5),
    }[name]
    tag = name.replace(".", "_")
    tables = [_variable("lr_a_" + tag), _variable("lr_b_" + tag)]
    dense = [tf.Variable(_initial()), tf.Variable(_initial())]
    de_opt = de.DynamicEmbeddingOptimizer(make())
    dense_opt = make()

    def de_loss():
        return sum(
            _loss_of(de.embedding_lookup(t, IDS, name="emb")) * (i + 1)
            for i, t in enumerate(tables)
        )

    def dense_loss():
        return sum(_loss_of(tf.nn.embedding_lookup(t, IDS)) * (i + 1) for i, t in enumerate(dense))

    var_list = [t.get_trainable_by_name("emb") for t in tables]

    @tf.function
    def step():
        de_opt.minimize(de_loss, var_list=var_list)

    for i in range(5):
        if i == 2:
            de_opt.learning_rate = 0.02
            dense_opt.learning_rate = 0.02
        step()
        dense_opt.minimize(dense_loss, var_list=dense)
    for t, d in zip(tables, dense):
        np.testing.assert_allclose(t.lookup(KEYS).numpy()[1:], d.numpy()[1:], atol=1e-6)


@pytest.mark.parametrize("function", [True, False])
def test_two_lookups_of_one_table_in_one_step(function):
    make = OPTIMIZERS["legacy.Adagrad"]
    rows, _ = _train_de(make, "two_lookups_%s" % function, function=function, two_lookups=True)
    np.testing.assert_allclose(rows[1:], _train_dense(make, two_lookups=True)[1:], atol=1e-6)


def test_tf_function_retraces_and_inserts_new_keys_with_their_initial_values():
    var = de.Variable(name="retrace", dim=2, initializer=0.5)
    opt = de.DynamicEmbeddingOptimizer(K.SGD(1.0))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(de.embedding_lookup(var, ids, name="e"))
        shadow = var.get_trainable_by_name("e")
        opt.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))

    step(tf.constant([1, 2, 1], tf.int64))
    step(tf.constant([[3, 4], [1, 5]], tf.int64))  # another shape: a second trace
    keys, values = var.export()
    got = dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))
    # 0.5 - lr * (number of times a key was looked up)
    assert got == {1: 0.5 - 3.0, 2: -0.5, 3: -0.5, 4: -0.5, 5: -0.5}
    shadow = var.get_trainable_by_name("e")
    np.testing.assert_array_equal(np.sort(shadow.ids.numpy()), [1, 3, 4, 5])
    # the shadow holds the current rows of its ids
    np.testing.assert_array_equal(shadow.numpy(), var.lookup(shadow.ids).numpy())


def test_gradient_tape_with_dense_variables_and_v1_optimizer():
    var = _variable("mixed")
    dense = tf.Variable([[1.0], [2.0], [3.0]])
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with tf.GradientTape() as tape:
        emb, shadow = de.embedding_lookup(var, IDS[:, 0], name="m", return_trainable=True)
        loss = tf.reduce_sum(tf.matmul(emb, dense))
    grads = tape.gradient(loss, [shadow, dense])
    opt.apply_gradients(zip(grads, [shadow, dense]))
    x = _initial()
    np.testing.assert_allclose(
        dense.numpy()[:, 0], [1, 2, 3] - 0.1 * x[IDS[:, 0]].sum(0), rtol=1e-6
    )
    expected = x.copy()
    for k in IDS[:, 0]:
        expected[k] -= 0.1 * np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(var.lookup(KEYS).numpy(), expected, atol=1e-6)


def test_inference_mode_reads_only_and_is_thread_safe():
    var = _variable("inference")
    layer_ids = np.arange(100, 200, dtype=np.int64)
    de.enable_inference_mode()
    assert de.get_model_mode() == de.ModelMode.INFERENCE
    lookup = tf.function(lambda ids: de.embedding_lookup(var, ids, name="infer"))
    results, errors = [], []

    def worker():
        try:
            for _ in range(20):
                results.append(lookup(tf.constant(layer_ids)).numpy())
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80
    assert int(var.size()) == len(KEYS)  # nothing inserted
    assert "infer" not in var.trainable_store


def test_keras_layers_fit_evaluate_predict():
    layer = de.keras.layers.Embedding(4, name="fit_emb", init_capacity=64)
    inputs = tf.keras.layers.Input(shape=(None,), dtype=tf.int64)
    x = tf.keras.layers.GlobalAveragePooling1D()(layer(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(K.Adam(0.05)), loss="binary_crossentropy")
    assert layer.shadow in model.trainable_weights
    rng = np.random.RandomState(0)
    features = rng.randint(0, 50, (256, 4)).astype(np.int64)
    labels = (features[:, 0] % 2).astype(np.float32)
    history = model.fit(features, labels, batch_size=32, epochs=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.05
    assert int(layer.params.size()) == len(np.unique(features))
    before = int(layer.params.size())
    model.evaluate(features + 1000, labels, verbose=0)
    model.predict(features + 2000, verbose=0)
    assert int(layer.params.size()) == before  # evaluation and prediction only read


def test_squashed_and_field_wise_embedding():
    squashed = de.keras.layers.SquashedEmbedding(
        2, initializer=tf.keras.initializers.Zeros(), key_dtype=tf.int32, name="sq"
    )
    squashed.params.upsert(tf.constant([3, 0, 1]), tf.ones([3, 2]))
    np.testing.assert_array_equal(squashed(tf.constant([3, 0, 1, 2])), [3.0, 3.0])
    np.testing.assert_array_equal(squashed(tf.constant([[3, 0], [1, 2]])), [[2, 2], [1, 1]])
    fields = de.keras.layers.FieldWiseEmbedding(
        2, 3, lambda x: tf.math.floormod(x, 3), initializer=1.0, name="fw"
    )
    ids = np.array([[0, 1, 3, 4], [2, 5, 8, 6]], np.int64)
    out = fields(ids).numpy()
    counts = np.stack([np.bincount(row % 3, minlength=3) for row in ids])
    np.testing.assert_array_equal(out, np.repeat(counts[:, :, None], 2, axis=2))


def test_documented_example_runs_as_written():
    init = tf.keras.initializers.RandomNormal()
    params = de.get_variable("doc_example_foo", dim=4, initializer=init)
    optimizer = tf.keras.optimizers.Adam(1e-3)
    optimizer = de.DynamicEmbeddingOptimizer(optimizer)
    ids = tf.constant([[1, 2], [3, 4]], tf.int64)

    @tf.function
    def loss_fn(ids):
        emb = de.embedding_lookup(params, ids, name="user_embedding")
        emb = tf.math.reduce_sum(emb, axis=1)
        loss = tf.reduce_mean(emb)
        return loss

    before = params.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    for _ in range(10):
        optimizer.minimize(
            lambda: loss_fn(ids), var_list=[params.get_eager_trainable_by_name("user_embedding")]
        )
    after = params.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    # d loss / d row = 1 / 2 for every element: Adam moves each by lr per step
    np.testing.assert_allclose(before - after, np.full((4, 4), 10 * 1e-3), rtol=1e-3)


def _kernel_rows(dim=2):
    var = de.Variable(name="kernel_rows", dim=dim)
    keys = tf.constant([5, 6, 7], tf.int64)
    var.upsert(keys, tf.constant(_initial(dim)[:3]))
    table = var.tables[0]
    return var, keys, table, table.find_or_insert(keys, is_train=True)


@pytest.mark.parametrize("inside_sqrt", [False, True])
def test_adagrad_epsilon_forms_against_numpy(inside_sqrt):
    var, keys, table, addresses = _kernel_rows()
    w, a = _initial(2)[:3].astype(np.float64), np.full((3, 2), 0.0)
    rng = np.random.RandomState(3)
    for _ in range(3):
        g = rng.randn(3, 2).astype(np.float32)
        optimizer_ops.apply_adagrad(
            table.handle, addresses, g, 0.1, 0.0, epsilon=0.01, epsilon_inside_sqrt=inside_sqrt
        )
        a += g.astype(np.float64) ** 2
        w -= 0.1 * g / (np.sqrt(a + 0.01) if inside_sqrt else np.sqrt(a) + 0.01)
    np.testing.assert_allclose(var.lookup(keys).numpy(), w, rtol=1e-5)


@pytest.mark.parametrize("nesterov", [False, True])
def test_keras_momentum_velocity_against_numpy(nesterov):
    var, keys, table, addresses = _kernel_rows()
    w, v = _initial(2)[:3].astype(np.float64), np.zeros((3, 2))
    rng = np.random.RandomState(4)
    for lr in (0.1, 0.05, 0.2):  # a changing rate: velocity differs from accumulation
        g = rng.randn(3, 2).astype(np.float32)
        optimizer_ops.apply_momentum(
            table.handle, addresses, g, lr, 0.9, use_nesterov=nesterov, velocity=True
        )
        v = 0.9 * v - lr * g
        w += 0.9 * v - lr * g if nesterov else v
    np.testing.assert_allclose(var.lookup(keys).numpy(), w, rtol=1e-5)


def test_velocity_and_accumulation_momentum_do_not_share_a_table():
    _, _, table, addresses = _kernel_rows()
    g = np.ones((3, 2), np.float32)
    optimizer_ops.apply_momentum(table.handle, addresses, g, 0.1, 0.9, velocity=True)
    with pytest.raises(tf.errors.FailedPreconditionError, match="KerasMomentum"):
        optimizer_ops.apply_momentum(table.handle, addresses, g, 0.1, 0.9)


def test_keras_optimizer_with_factored_slots_is_a_clear_error():
    var = _variable("factored")
    opt = de.DynamicEmbeddingOptimizer(K.Adafactor(0.1))
    with pytest.raises(NotImplementedError, match="Adafactor"):
        opt.minimize(
            lambda: _loss_of(de.embedding_lookup(var, IDS, name="f")),
            var_list=[var.get_trainable_by_name("f")],
        )


def test_use_ema_is_a_clear_error():
    with pytest.raises(ValueError, match="use_ema"):
        de.DynamicEmbeddingOptimizer(K.Adam(0.1, use_ema=True))


def test_shadow_prefetch_size_unique_and_ragged_lookups():
    """ShadowVariable.read_value(do_prefetch), _reset_ids and size; embedding_lookup_unique
    of ragged ids; sparse lookups of ragged ids and through a shadow, against a dict."""
    var = _variable("shadow_api", dim=2, initializer=0.5)
    rows = dict(zip(KEYS.tolist(), _initial(2)))

    def ref(keys):
        return np.array([rows.get(int(k), [0.5, 0.5]) for k in keys], np.float32)

    shadow = de.shadow_ops.ShadowVariable(var, name="shadow_api_s")
    assert int(shadow.size()) == len(KEYS)
    assert shadow.read_value().shape[0] == 0
    shadow._reset_ids(tf.constant([3, 9], tf.int64))  # pylint: disable=protected-access
    assert shadow.read_value(do_prefetch=False).shape[0] == 0
    np.testing.assert_array_equal(shadow.read_value(do_prefetch=True), ref([3, 9]))
    np.testing.assert_array_equal(shadow.read_value(False), ref([3, 9]))

    ragged = tf.ragged.constant([[2, 3], [9, 2, 1]], dtype=tf.int64)
    out = de.shadow_ops.embedding_lookup_unique(shadow, ragged, 2, True)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.flat_values, ref([2, 3, 9, 2, 1]))
    np.testing.assert_array_equal(out.row_lengths(), [2, 3])
    base = de.shadow_ops.embedding_lookup_unique_base(
        ragged, 2, lambda ids: tf.gather(tf.constant(_initial(2)), ids % 4), True
    )
    np.testing.assert_array_equal(base.flat_values, _initial(2)[[2, 3, 1, 2, 1]])

    sparse = de.embedding_lookup_sparse(var, ragged, None, combiner="sum")
    np.testing.assert_allclose(sparse, [ref([2, 3]).sum(0), ref([9, 2, 1]).sum(0)], rtol=1e-6)
    safe = de.safe_embedding_lookup_sparse(shadow, ragged, combiner="mean")
    np.testing.assert_allclose(safe, [ref([2, 3]).mean(0), ref([9, 2, 1]).mean(0)], rtol=1e-6)
    np.testing.assert_array_equal(shadow.ids.numpy(), [2, 3, 9, 1])  # trained through it


def test_ragged_safe_lookup_fills_empty_rows_against_numpy():
    """fill_empty_ragged_rows (TFRA's ragged_embedding_ops._fill_empty_rows) against lists,
    with empty first, last and all rows; safe_embedding_lookup_sparse of ragged ids and
    weights (weights <= 0 dropped for mean, default_id) equals the SparseTensor path and a
    NumPy reference, and its gradients train the same rows."""
    fill = de.ragged_embedding_ops._fill_empty_rows  # pylint: disable=protected-access
    for rows in ([[], [1, 2], [], [3], []], [[], []], [[4, 5, 6]]):
        filled, empty = fill(tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1), 7)
        assert filled.to_list() == [r if r else [7] for r in rows]
        np.testing.assert_array_equal(empty, [not r for r in rows])
    with pytest.raises(TypeError, match="RaggedTensor"):
        fill(tf.constant([[1]], tf.int64), 0)

    var = _variable("ragged_safe", dim=2, initializer=0.5)
    rows = dict(zip(KEYS.tolist(), _initial(2)))
    ids = [[2, 3], [], [9, 2, 1], [3], []]
    weights = [[1.0, 2.0], [], [0.5, -1.0, 3.0], [0.0], []]

    def ref(combiner, default_id):
        out = []
        for r, w in zip(ids, weights):
            kept = [(k, x) for k, x in zip(r, w) if combiner == "sum" or x > 0]
            if not kept:
                out.append(
                    rows.get(default_id, [0.5, 0.5]) if default_id is not None else [0.0, 0.0]
                )
                continue
            emb = np.array([rows.get(k, [0.5, 0.5]) for k, _ in kept], np.float64)
            x = np.array([x for _, x in kept])[:, None]
            total = (emb * x).sum(0)
            out.append(total if combiner == "sum" else total / x.sum())
        return np.array(out)

    r_ids = tf.ragged.constant(ids, dtype=tf.int64, ragged_rank=1)
    r_w = tf.ragged.constant(weights, dtype=tf.float32, ragged_rank=1)
    for combiner, default_id in (("sum", None), ("mean", None), ("mean", 3)):
        got = de.safe_embedding_lookup_sparse(
            var, r_ids, r_w, combiner=combiner, default_id=default_id
        )
        via_sparse = de.safe_embedding_lookup_sparse(
            var, r_ids.to_sparse(), r_w.to_sparse(), combiner=combiner, default_id=default_id
        )
        np.testing.assert_allclose(got, ref(combiner, default_id), rtol=1e-6)
        np.testing.assert_allclose(got, via_sparse, rtol=1e-6)

    grads = []
    for sparse in (False, True):
        shadow = de.shadow_ops.ShadowVariable(var, name="ragged_safe_s%d" % sparse)
        with tf.GradientTape() as tape:
            out = de.safe_embedding_lookup_sparse(
                shadow,
                r_ids.to_sparse() if sparse else r_ids,
                r_w.to_sparse() if sparse else r_w,
                combiner="mean",
            )
            loss = tf.reduce_sum(out * tf.constant([[1.0, 2.0]]))
        grad = tape.gradient(loss, shadow)
        order = np.argsort(shadow.ids.numpy())
        grads.append((shadow.ids.numpy()[order], tf.convert_to_tensor(grad).numpy()[order]))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-6)


class _Ranker(tf.Module):
    """A module with a sharded de.Variable, its shadow and a wrapped Keras Adam."""

    def __init__(self, name):
        super().__init__()
        self.params = de.Variable(name=name, dim=2, initializer=0.0, devices=["/CPU:0"] * 2)
        self.shadow = de.shadow_ops.ShadowVariable(self.params, name=name + "-shadow")
        self.opt = de.DynamicEmbeddingOptimizer(K.legacy.Adam(0.1))

    def train(self, ids):
        self.opt.minimize(
            lambda: tf.reduce_sum(
                tf.square(de.shadow_ops.embedding_lookup(self.shadow, ids) - 1.0)
            ),
            [self.shadow],
        )


def _rows_and_slots(module, keys):
    slots = module.params.get_slot_variables(module.opt)
    return [module.params.lookup(keys).numpy()] + [s.lookup(keys).numpy() for s in slots]


def test_tf_train_checkpoint_saves_and_restores_tables_with_slots(tmp_path):
    """de.train.DECheckpoint (tf.train.Checkpoint) of a module: the tables' keys, rows and
    Adam slots, restored into a new module whose table held other keys (replaced), and
    training continues from them exactly as it would have; the shadow is saved empty."""
    keys = tf.constant([1, 2, 3, 4, 5], tf.int64)
    first = _Ranker("ckpt_a")
    for _ in range(3):
        first.train(keys)
    saved = _rows_and_slots(first, keys)
    assert first.opt.get_slot(first.shadow, "m").params.name.endswith("/m")  # TFRA scripts
    path = de.train.DECheckpoint(m=first, opt=first.opt).save(str(tmp_path / "ckpt"))
    assert first.shadow.read_value().shape[0] == 0  # emptied when saved
    first.train(keys)
    expected = _rows_and_slots(first, keys)

    second = _Ranker("ckpt_b")
    second.params.upsert(tf.constant([99], tf.int64), tf.constant([[9.0, 9.0]]))
    second.train(tf.constant([7], tf.int64))  # its table has slots and other keys
    tf.train.Checkpoint(m=second, opt=second.opt).restore(path).assert_consumed()
    for got, want in zip(_rows_and_slots(second, keys), saved):
        np.testing.assert_array_equal(got, want)
    assert int(second.params.size()) == 5  # 99 and 7 went with the restore
    second.train(keys)
    for got, want in zip(_rows_and_slots(second, keys), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _keras_model(name):
    inputs = tf.keras.layers.Input(shape=(None,), dtype=tf.int64)
    emb = de.keras.layers.Embedding(3, name=name, initializer=0.5)
    out = tf.keras.layers.Dense(1)(tf.reduce_sum(emb(inputs), axis=1))
    model = tf.keras.Model(inputs, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(K.legacy.Adam(0.05)), loss="mse")
    return model, emb


@pytest.mark.parametrize("whitelist", [None, ["RecSdk"], ["TFRA"]])
def test_keras_saved_model_save_load_weights_and_serving(tmp_path, whitelist):
    """model.save (SavedModel) of a Keras model with a de Embedding, with rec_sdk's op
    namespace whitelisted (or TFRA's, which scripts name); load_weights into a new model
    restores the table; tf.saved_model.load serves the same predictions in this process."""
    model, emb = _keras_model("sm_emb")
    ids = np.array([[1, 2], [3, 1], [4, 5]], np.int64)
    model.fit(ids, np.ones([3, 1], np.float32), epochs=3, verbose=0)
    expected = model.predict(ids, verbose=0)
    path = str(tmp_path / "model")
    model.save(path, options=tf.saved_model.SaveOptions(namespace_whitelist=whitelist))

    new_model, new_emb = _keras_model("sm_emb")
    new_model.load_weights(path).expect_partial()
    np.testing.assert_array_equal(new_emb.params.export()[0], emb.params.export()[0])
    np.testing.assert_allclose(new_model.predict(ids, verbose=0), expected, rtol=1e-6)
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(served(tf.constant(ids), training=False), expected, rtol=1e-6)


def test_saved_model_whitelist_without_rec_sdk_namespace_is_refused(tmp_path):
    model, _ = _keras_model("refused_emb")
    model.predict(np.array([[1]], np.int64), verbose=0)
    with pytest.raises(ValueError, match="RecSdk"):
        model.save(
            str(tmp_path / "m"), options=tf.saved_model.SaveOptions(namespace_whitelist=["Other"])
        )


_PLAIN_LOADER = """
import sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
with open(sys.argv[1] + "/saved_model.pb", "rb") as f:
    assert b"RecSdk>" not in f.read()  # no rec_sdk op in any graph or function
out = served.signatures["serving_default"](tf.constant(np.load(sys.argv[2])))
np.save(sys.argv[3], list(out.values())[0].numpy())
assert "rec_sdk" not in sys.modules
"""


def _served(tmp_path, probe):
    """The predictions for `probe` of the SavedModel in tmp_path/serving, loaded by a process
    without rec_sdk (_PLAIN_LOADER)."""
    np.save(str(tmp_path / "probe.npy"), probe)
    script = tmp_path / "load.py"
    script.write_text(_PLAIN_LOADER)
    subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "serving"),
            str(tmp_path / "probe.npy"),
            str(tmp_path / "out.npy"),
        ],
        check=True,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    return np.load(str(tmp_path / "out.npy"))


def test_keras_model_exports_for_serving_without_the_plugin(tmp_path):
    """rec_sdk.serving.export_keras_model: a SavedModel of stock ops, loaded by a process
    that never imports rec_sdk, predicts what the model predicts (keys never trained read the
    constant initializer's value)."""
    model, emb = _keras_model("plain_emb")
    ids = np.array([[1, 2], [3, 1], [4, 5]], np.int64)
    model.fit(ids, np.ones([3, 1], np.float32), epochs=3, verbose=0)
    probe = np.array([[1, 2], [3, 77], [88, 99]], np.int64)  # 77, 88, 99: never trained
    expected = model.predict(probe, verbose=0)
    rows = serving.export_keras_model(model, str(tmp_path / "serving"))
    assert rows == int(emb.params.size()) == 5
    np.testing.assert_allclose(_served(tmp_path, probe), expected, rtol=1e-6)


def test_keras_model_exports_int8_rows_for_serving(tmp_path):
    """export_keras_model(row_dtype="int8"): the layers' rows quantized per row; the stock-op
    SavedModel predicts what the model predicts, to the quantization's error."""
    model, _ = _keras_model("int8_emb")
    ids = np.array([[1, 2], [3, 1], [4, 5]], np.int64)
    model.fit(ids, np.ones([3, 1], np.float32), epochs=3, verbose=0)
    probe = np.array([[1, 2], [3, 77], [4, 5]], np.int64)
    expected = model.predict(probe, verbose=0)
    serving.export_keras_model(model, str(tmp_path / "serving"), row_dtype="int8")
    served = _served(tmp_path, probe)
    np.testing.assert_allclose(served, expected, atol=5e-3)
    stored = tf.train.list_variables(str(tmp_path / "serving" / "variables" / "variables"))
    reader = tf.train.load_checkpoint(str(tmp_path / "serving" / "variables" / "variables"))
    assert tf.int8 in {reader.get_variable_to_dtype_map()[name] for name, _ in stored}


@pytest.mark.parametrize("function", [True, False])
def test_one_lookup_name_used_three_times_in_a_step(function):
    """Three lookups with one name (one ShadowVariable) in one step, eagerly or in a
    tf.function: each lookup's gradient reaches its own rows, as three lookups of a dense
    table do."""
    var = _variable("thrice_%s" % function)
    opt = de.DynamicEmbeddingOptimizer(K.legacy.Adagrad(0.1))
    dense = tf.Variable(_initial())
    dense_opt = K.legacy.Adagrad(0.1)
    parts = [IDS[:1], IDS[1:], IDS[::-1]]

    def loss():
        return sum(
            _loss_of(de.embedding_lookup(var, p, name="same")) * (i + 1)
            for i, p in enumerate(parts)
        )

    def dense_loss():
        return sum(
            _loss_of(tf.nn.embedding_lookup(dense, p)) * (i + 1) for i, p in enumerate(parts)
        )

    fn = tf.function(loss) if function else loss
    var_list = [var.get_trainable_by_name("same")]
    for _ in range(3):
        opt.minimize(fn, var_list=var_list)
        dense_opt.minimize(dense_loss, [dense])
    np.testing.assert_allclose(var.lookup(KEYS).numpy()[1:], dense.numpy()[1:], atol=1e-6)


def test_keras_de_layer_shared_by_two_inputs():
    """One de Embedding layer called on two inputs of a model (a shared embedding), trained
    by fit as the same model with a dense Embedding layer (SGD: lazy and dense agree)."""

    def model_of(embedding):
        a = tf.keras.layers.Input(shape=(2,), dtype=tf.int64)
        b = tf.keras.layers.Input(shape=(3,), dtype=tf.int64)
        x = tf.concat([tf.reduce_sum(embedding(a), 1), tf.reduce_mean(embedding(b), 1)], 1)
        out = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.3))(x)
        model = tf.keras.Model([a, b], out)
        return model

    de_layer = de.keras.layers.Embedding(2, initializer=0.2, name="shared_emb")
    dense_layer = tf.keras.layers.Embedding(
        10, 2, embeddings_initializer=tf.keras.initializers.Constant(0.2)
    )
    de_model, dense_model = model_of(de_layer), model_of(dense_layer)
    de_model.compile(optimizer=de.DynamicEmbeddingOptimizer(K.legacy.SGD(0.1)), loss="mse")
    dense_model.compile(optimizer=K.legacy.SGD(0.1), loss="mse")
    a = np.array([[1, 2], [3, 1]], np.int64)
    b = np.array([[2, 4, 4], [5, 1, 6]], np.int64)
    y = np.array([[1.0], [-1.0]], np.float32)
    for model in (de_model, dense_model):
        model.fit([a, b], y, batch_size=2, epochs=4, verbose=0, shuffle=False)
    keys = np.arange(1, 7, dtype=np.int64)
    np.testing.assert_allclose(
        de_layer.params.lookup(keys).numpy(), dense_layer.embeddings.numpy()[1:7], atol=1e-6
    )


def test_model_checkpoint_callback_and_trainable_wrapper_class(tmp_path):
    """de.keras.callbacks.ModelCheckpoint saves the tables with the weights during fit; the
    trainables are de.TrainableWrappers; the Horovod callbacks say Horovod is out of scope."""
    model, emb = _keras_model("cb_emb")
    ids = np.array([[1, 2], [3, 1], [4, 5]], np.int64)
    path = str(tmp_path / "weights")
    model.fit(
        ids,
        np.ones([3, 1], np.float32),
        epochs=2,
        verbose=0,
        callbacks=[de.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)],
    )
    expected = model.predict(ids, verbose=0)
    new_model, _ = _keras_model("cb_emb")
    new_model.load_weights(path).expect_partial()  # the optimizer's state is not needed
    np.testing.assert_allclose(new_model.predict(ids, verbose=0), expected, rtol=1e-6)
    assert isinstance(emb.shadow, de.TrainableWrapper)
    with pytest.raises(NotImplementedError, match="Horovod"):
        de.keras.callbacks.DEHvdModelCheckpoint(path)


@pytest.mark.parametrize(
    "shards,optimizer", [(5, "adam"), (2, "adam"), (1, "adam"), (2, "rowwise_adagrad")]
)
def test_checkpoint_restores_into_another_number_of_shards(tmp_path, shards, optimizer):
    """A tf.train.Checkpoint of a 3-shard variable, one shard never trained (no slots),
    read into 5, 2 and 1 shards: every key with its row and Adam slots (or row-wise Adagrad's
    one float per row), each in the shard the partitioner names."""
    keys = tf.constant(np.arange(-5, 10), tf.int64)

    def module(count):
        m = tf.Module()
        m.params = de.Variable(name="reshard", dim=2, initializer=0.0, devices=["/CPU:0"] * count)
        m.opt = de.DynamicEmbeddingOptimizer(
            K.legacy.Adam(0.1) if optimizer == "adam" else de.RowwiseAdagradOptimizer(0.1)
        )
        m.shadow = de.shadow_ops.ShadowVariable(m.params, name="reshard-shadow")
        return m

    def train(m, ids):
        m.opt.minimize(
            lambda: tf.reduce_sum(tf.square(de.shadow_ops.embedding_lookup(m.shadow, ids) - 1.0)),
            var_list=[m.shadow],
        )

    first = module(3)
    first.params.upsert(keys, tf.constant(_initial(2, seed=3).repeat(4, 0)[:15]))
    train(first, tf.constant([0, 3, 6, 1, 4, -5], tf.int64))  # keys mod 3 in {0, 1}
    assert int(first.params.size()) == 15
    path = de.train.DECheckpoint(m=first, opt=first.opt).save(str(tmp_path / "c"))
    want = [first.params.lookup(keys).numpy()] + [
        s.lookup(keys).numpy() for s in first.params.get_slot_variables(first.opt)
    ]

    second = module(shards)
    tf.train.Checkpoint(m=second, opt=second.opt).read(path).assert_existing_objects_matched()
    train(second, tf.constant([], tf.int64))  # attaches the optimizer's slots
    got = [second.params.lookup(keys).numpy()] + [
        s.lookup(keys).numpy() for s in second.params.get_slot_variables(second.opt)
    ]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert [int(second.params.size(i)) for i in range(shards)] == [
        int(np.sum(np.mod(np.arange(-5, 10), shards) == i)) for i in range(shards)
    ]


def test_checkpoint_keeps_restrict_policy_statistics(tmp_path):
    """Access counts and last-seen clocks survive a tf.train.Checkpoint (into another
    number of shards too), and training after the restore is newer than anything restored."""

    def variable(count):
        m = tf.Module()
        m.params = de.Variable(
            name="stats",
            dim=1,
            devices=["/CPU:0"] * count,
            restrict_policy=de.FrequencyRestrictPolicy,
        )
        return m

    first = variable(2)
    policy = first.params.restrict_policy
    for ids in ([1, 2, 3], [2, 3], [3], [4]):
        policy.apply_update(tf.constant(ids, tf.int64))
    saved = dict(zip(*[t.numpy().tolist() for t in policy.status.export()]))
    assert saved == {1: 1, 2: 2, 3: 3, 4: 1}
    path = tf.train.Checkpoint(m=first).save(str(tmp_path / "c"))
    second = variable(3)
    tf.train.Checkpoint(m=second).read(path)
    status = second.params.restrict_policy.status.export()
    assert dict(zip(*[t.numpy().tolist() for t in status])) == saved
    by_time = de.TimestampRestrictPolicy(second.params)
    clocks = dict(zip(*[t.numpy().tolist() for t in by_time.status.export()]))
    by_time.apply_update(tf.constant([1], tf.int64))
    after = dict(zip(*[t.numpy().tolist() for t in by_time.status.export()]))
    assert after[1] > max(clocks.values())


def test_string_keys_in_tf2_train_checkpoint_and_saved_model(tmp_path):
    """String keys in TF2: a tf.function step trains them as an int64 variable trains the
    same keys; tf.train.Checkpoint restores rows, slots and strings into another number of
    shards; a Keras layer with string ids fits, saves and loads as a SavedModel that
    predicts as the model does."""
    words = ["apple", "pear", "", "apple", "fig"]
    ints = [0, 1, 2, 0, 3]
    made = {}
    for kind, ids in (("s", tf.constant(words)), ("i", tf.constant(ints, tf.int64))):
        var = de.Variable(
            key_dtype=ids.dtype,
            dim=2,
            initializer=0.25,
            name="skeys_" + kind,
            devices=["/CPU:0"] * 3,
        )
        opt = de.DynamicEmbeddingOptimizer(K.Adam(0.1))

        @tf.function
        def step(var=var, opt=opt, ids=ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(de.embedding_lookup(var, ids, name="e") - 1.0))
            shadow = var.get_trainable_by_name("e")
            opt.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))

        for _ in range(3):
            step()
        made[kind] = (var, opt)
    s_keys, s_rows = made["s"][0].export()
    i_keys, i_rows = made["i"][0].export()
    by_word = dict(zip((k.decode() for k in s_keys.numpy()), s_rows.numpy().tolist()))
    assert by_word == {
        w: i_rows.numpy()[list(i_keys.numpy()).index(i)].tolist() for w, i in zip(words, ints)
    }

    path = tf.train.Checkpoint(v=made["s"][0]).save(str(tmp_path / "ckpt"))
    again = de.Variable(
        key_dtype=tf.string, dim=2, initializer=0.0, name="skeys_s", devices=["/CPU:0"] * 2
    )
    again.upsert(["stale"], [[9.0, 9.0]])
    tf.train.Checkpoint(v=again).restore(path).expect_partial()
    keys, rows = again.export()
    assert dict(zip((k.decode() for k in keys.numpy()), rows.numpy().tolist())) == by_word

    inputs = tf.keras.Input((2,), dtype=tf.string)
    layer = de.keras.layers.Embedding(3, key_dtype=tf.string, initializer=0.1, name="semb")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.reshape(layer(inputs), [-1, 6])))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(K.Adam(0.05)), loss="mse")
    x = tf.constant([["a", "b"], ["c", "a"]])
    model.fit(x, tf.constant([[1.0], [0.0]]), epochs=2, verbose=0)
    assert sorted(k.decode() for k in layer.params.export()[0].numpy()) == ["a", "b", "c"]
    model.save(str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_allclose(loaded(x), model(x), rtol=1e-6, atol=1e-6)  # float rounding near 0


@pytest.mark.parametrize(
    "value_dtype,creator_dtype", [(tf.bfloat16, None), (tf.float32, "float16")]
)
def test_half_precision_rows_train_in_tf_function_and_restore_into_float32(
    value_dtype, creator_dtype, tmp_path
):
    """A bfloat16 variable (and a float32 one with float16 rows) trains in a tf.function
    through its shadow; its tf.train.Checkpoint restores into a float32 variable, which then
    holds exactly the half-precision values."""
    creator = de.CuckooHashTableCreator(emb_dtype=creator_dtype) if creator_dtype else None
    var = de.get_variable(
        "half_%s" % value_dtype.name,
        value_dtype=value_dtype,
        dim=4,
        initializer=tf.keras.initializers.RandomNormal(0, 0.1, seed=1),
        kv_creator=creator,
    )
    assert var.tables[0].spec.emb_dtype == (creator_dtype or value_dtype.name)
    opt = de.DynamicEmbeddingOptimizer(K.legacy.Adam(0.1))
    ids = tf.constant([1, 2, 3, 2], tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(var, ids, name="half", return_trainable=True)
            loss = tf.reduce_sum(tf.square(tf.cast(emb, tf.float32) - 1.0))
        opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
        return loss

    losses = [float(step()) for _ in range(30)]
    assert losses[-1] < losses[0] / 20, losses
    path = tf.train.Checkpoint(v=var).save(str(tmp_path / "ckpt"))
    wide = de.get_variable("half_wide_%s" % value_dtype.name, dim=4)
    tf.train.Checkpoint(v=wide).restore(path)
    values = var.lookup(ids).numpy()
    np.testing.assert_array_equal(wide.lookup(ids).numpy(), values.astype(np.float32))
    half = np.float16 if creator_dtype == "float16" else value_dtype.as_numpy_dtype
    np.testing.assert_array_equal(values.astype(half).astype(np.float32), values.astype(np.float32))
