"""A whole SDK-style training script (tf.compat.v1.Session, tf.data, two tables, a dense MLP,
a dense Adam and a sparse LazyAdam) learns a planted signal, with and without dynamic
expansion."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
from helpers import session_config
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers import lazy_adam, lazy_adam_by_addr
from rec_sdk.util import initialize
from rec_sdk.util.initialize import init, terminate_config_initializer
from rec_sdk.util.variable import get_dense_and_sparse_variable

NUM_USERS, NUM_ITEMS, NUM_GROUPS = 300, 120, 4
NUM_SAMPLES, BATCH, STEPS, DIM = 16384, 128, 200, 8


def _synthetic_data(seed=0):
    """(user, item, label): label is 1 exactly when the user's and the item's hidden groups
    match (with 5% label noise). Ids are large, sparse int64 keys."""
    rng = np.random.RandomState(seed)
    user_group = rng.randint(0, NUM_GROUPS, NUM_USERS)
    item_group = rng.randint(0, NUM_GROUPS, NUM_ITEMS)
    u = rng.randint(0, NUM_USERS, NUM_SAMPLES)
    i = rng.randint(0, NUM_ITEMS, NUM_SAMPLES)
    label = (user_group[u] == item_group[i]).astype(np.float32)
    flip = rng.rand(NUM_SAMPLES) < 0.05
    label[flip] = 1.0 - label[flip]
    user_ids = u.astype(np.int64) * 1_000_003 + 2**40
    item_ids = i.astype(np.int64) * 7_919 - 12345
    return user_ids, item_ids, label


def _dense(x, n_in, n_out, name, rng):
    w = tf.Variable(
        rng.normal(scale=np.sqrt(2.0 / n_in), size=(n_in, n_out)).astype(np.float32),
        name=name + "_w",
    )
    b = tf.Variable(np.zeros(n_out, np.float32), name=name + "_b")
    return tf.matmul(x, w) + b


def _run_script(use_dynamic_expansion):
    tf.compat.v1.set_random_seed(0)
    init(
        train_steps=STEPS, eval_steps=-1, save_steps=-1, use_dynamic_expansion=use_dynamic_expansion
    )

    # Tables
    user_table = create_table(
        key_dtype=tf.int64,
        dim=tf.TensorShape([DIM]),
        name="user_table",
        emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
        device_vocabulary_size=1000,
    )
    item_table = create_table(
        key_dtype=tf.int64,
        dim=tf.TensorShape([DIM]),
        name="item_table",
        emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=2),
        device_vocabulary_size=1000,
    )

    # Input pipeline
    user_ids, item_ids, labels = _synthetic_data()
    dataset = tf.data.Dataset.from_tensor_slices(
        {"user": user_ids, "item": item_ids, "label": labels}
    )
    dataset = dataset.shuffle(4096, seed=3).repeat().batch(BATCH, drop_remainder=True)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    batch = iterator.get_next()

    # Model
    user_emb = sparse_lookup(user_table, batch["user"], is_train=True, name="user_lookup")
    item_emb = sparse_lookup(item_table, batch["item"], is_train=True, name="item_lookup")
    rng = np.random.RandomState(4)
    x = tf.concat([user_emb, item_emb, user_emb * item_emb], axis=1)
    hidden = tf.nn.relu(_dense(x, 3 * DIM, 32, "hidden", rng))
    logits = tf.squeeze(_dense(hidden, 32, 1, "out", rng), axis=1)
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits)
    )

    # Optimizers
    global_step = tf.compat.v1.train.get_or_create_global_step()
    dense_vars, sparse_vars = get_dense_and_sparse_variable()
    assert len(dense_vars) == 4
    assert sparse_vars == [user_table, item_table]
    dense_opt = tf.compat.v1.train.AdamOptimizer(learning_rate=0.01)
    dense_train = dense_opt.apply_gradients(
        zip(tf.gradients(loss, dense_vars), dense_vars), global_step=global_step
    )
    if use_dynamic_expansion:
        sparse_opt = lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.02)
        local_embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        assert len(local_embs) == len(addresses) == 2
        sparse_train = sparse_opt.apply_gradients(zip(tf.gradients(loss, local_embs), addresses))
    else:
        sparse_opt = lazy_adam.create_hash_optimizer(learning_rate=0.02)
        sparse_train = sparse_opt.apply_gradients(zip(tf.gradients(loss, sparse_vars), sparse_vars))
    train_op = tf.group(dense_train, sparse_train)

    losses = []
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
        for _ in range(STEPS):
            step_loss, _ = sess.run([loss, train_op])
            losses.append(step_loss)
        sizes = sess.run([user_table.size_tensor(), item_table.size_tensor()])
        capacities = sess.run([user_table.capacity_tensor(), item_table.capacity_tensor()])
        step = sess.run(global_step)
    terminate_config_initializer()
    return np.array(losses), sizes, capacities, step


_RESULTS = {}


def _results(use_dynamic_expansion):
    if use_dynamic_expansion not in _RESULTS:
        tf.compat.v1.reset_default_graph()
        _RESULTS[use_dynamic_expansion] = _run_script(use_dynamic_expansion)
    return _RESULTS[use_dynamic_expansion]


@pytest.mark.parametrize("use_dynamic_expansion", [True, False])
def test_training_script_learns(use_dynamic_expansion):
    losses, sizes, capacities, step = _results(use_dynamic_expansion)
    assert not initialize.is_initialized()
    assert np.all(np.isfinite(losses))
    first, last = losses[:20].mean(), losses[-20:].mean()
    # Chance level is about 0.69 (a quarter of the pairs are positive: about 0.56 for a
    # constant predictor). Training the dense layers alone on the initial embeddings only gets
    # to about 0.93 * first; learning the embeddings brings the loss well below.
    assert first > 0.5
    assert last < 0.6 * first, (first, last)
    assert step == STEPS
    # Every user and item was seen in 200 batches of 128.
    assert sizes == [NUM_USERS, NUM_ITEMS]
    if use_dynamic_expansion:
        assert all(c >= s for c, s in zip(capacities, sizes))
    else:
        assert capacities == [1000, 1000]


def test_both_flows_train_identically():
    """The by-address flow (dynamic expansion) and the by-table flow apply the same updates:
    with the same seeds, the loss curves agree."""
    expansion = _results(True)[0]
    fixed = _results(False)[0]
    np.testing.assert_allclose(expansion, fixed, rtol=1e-4, atol=1e-5)
