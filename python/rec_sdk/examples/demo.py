"""The demo behind `make demo`: a Wide&Deep CTR model trained with rec_sdk in tf.Session mode.

Data: MovieLens-100k (label: rating >= 4; sparse features user, item, occupation, zip, age,
gender and the multi-valued genres), or a Criteo-format TSV file of your own with --data.
Written in the SDK's style: init -> datasets and initializable iterators -> create_table ->
sparse_lookup -> dense + sparse optimizers -> Session loop with evaluation -> terminate.

    python -m rec_sdk.examples.demo [--epochs 3] [--expansion] [--data criteo.tsv]
"""

import argparse
import os
import sys
import time

# Keep the demo's output to its own progress lines (TensorFlow's INFO logs are hidden unless
# the caller chose a level).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rec_sdk  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.examples import data as datasets  # noqa: E402
from rec_sdk.examples.metrics import auc, log_loss  # noqa: E402
from rec_sdk.examples.models import dense_layer  # noqa: E402
from rec_sdk.examples.progress import Progress  # noqa: E402
from rec_sdk.optimizers import lazy_adam, lazy_adam_by_addr  # noqa: E402
from rec_sdk.util.initialize import get_use_dynamic_expansion, init, terminate_config_initializer  # noqa: E402
from rec_sdk.util.variable import get_dense_and_sparse_variable  # noqa: E402

# Keys of different fields share a table; the field number in the high bits keeps them apart.
FIELD_SHIFT = 40


def field_keys(ids, field):
    return ids.astype(np.int64) + (np.int64(field + 1) << FIELD_SHIFT)


def load_inputs(args):
    """-> (train, test, schema): dicts of arrays and a description of the features."""
    if args.data:
        raw = datasets.read_criteo_tsv(args.data, max_rows=args.max_rows)
        features = {"categorical": raw["categorical"], "dense": raw["dense"], "label": raw["label"]}
        train, test = datasets.train_test_split(features, test_fraction=0.1, seed=args.seed)
        schema = {"name": "criteo", "single": ["categorical"], "multi": [], "dense": "dense"}
        return train, test, schema
    raw, _ = datasets.load_movielens_100k()
    side = np.stack(
        [field_keys(raw[name], f) for f, name in enumerate(["occupation", "zip", "age", "gender"])],
        axis=1,
    )
    genres = np.where(raw["genres"] >= 0, field_keys(raw["genres"], 4), -1)
    features = {
        "user": raw["user_id"],
        "item": raw["item_id"],
        "side": side,
        "genres": genres,
        "label": raw["label"],
    }
    train, test = datasets.train_test_split(features, test_fraction=0.2, seed=args.seed)
    schema = {
        "name": "movielens",
        "single": ["user", "item", "side"],
        "multi": ["genres"],
        "dense": None,
    }
    return train, test, schema


def make_iterator(arrays, batch_size, shuffle, seed):
    dataset = tf.data.Dataset.from_tensor_slices(arrays)
    if shuffle:
        dataset = dataset.shuffle(len(arrays["label"]), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size).prefetch(2)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator, iterator.get_next()


def evaluate(sess, initializer, probabilities, labels):
    """(AUC, log loss) over one pass of an evaluation iterator, started by `initializer`."""
    sess.run(initializer)
    all_probs, all_labels = [], []
    while True:
        try:
            p, y = sess.run([probabilities, labels])
        except tf.errors.OutOfRangeError:
            break
        all_probs.append(p)
        all_labels.append(y)
    all_probs, all_labels = np.concatenate(all_probs), np.concatenate(all_labels)
    return auc(all_labels, all_probs), log_loss(all_labels, all_probs)


def build_model(tables, schema, batch, is_train):
    """Wide&Deep logits and loss for one batch."""
    deep_inputs, wide_terms = [], []
    for name in schema["single"]:
        ids = batch[name]
        table = (
            tables["categorical"]
            if schema["name"] == "criteo"
            else tables["side" if name == "side" else name]
        )
        emb = sparse_lookup(
            table,
            ids,
            is_train=is_train,
            name="%s_lookup_%s" % (name, "train" if is_train else "eval"),
        )
        deep_inputs.append(tf.reshape(emb, [-1, int(np.prod(emb.shape[1:]))]))
        wide = sparse_lookup(
            tables["wide"],
            ids,
            is_train=is_train,
            name="wide_%s_%s" % (name, "train" if is_train else "eval"),
        )
        wide_terms.append(
            tf.reshape(tf.reduce_sum(wide, axis=list(range(1, wide.shape.rank))), [-1])
        )
    for name in schema["multi"]:
        ids = batch[name]
        mask = tf.cast(ids >= 0, tf.float32)[..., tf.newaxis]
        emb = sparse_lookup(
            tables["side"],
            ids,
            is_train=is_train,
            name="%s_lookup_%s" % (name, "train" if is_train else "eval"),
        )
        pooled = tf.reduce_sum(emb * mask, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        deep_inputs.append(pooled)
        wide = sparse_lookup(
            tables["wide"],
            ids,
            is_train=is_train,
            name="wide_%s_%s" % (name, "train" if is_train else "eval"),
        )
        wide_terms.append(tf.reduce_sum(wide * mask, axis=[1, 2]))
    if schema["dense"]:
        deep_inputs.append(batch[schema["dense"]])
    x = tf.concat(deep_inputs, axis=1)
    x = dense_layer(x, 64, "deep_1", tf.nn.relu)
    x = dense_layer(x, 32, "deep_2", tf.nn.relu)
    logits = tf.reshape(dense_layer(x, 1, "deep_out"), [-1]) + tf.add_n(wide_terms)
    labels = tf.cast(batch["label"], tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return tf.sigmoid(logits), labels, loss


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data",
        help="a Criteo-format TSV file (label, I1..I13, C1..C26) to "
        "train on instead of MovieLens-100k",
    )
    parser.add_argument("--max-rows", type=int, default=None, help="read at most this many rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument(
        "--expansion",
        action="store_true",
        help="dynamic-expansion tables trained by address (LazyAdam by address)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(args.seed)
    train, test, schema = load_inputs(args)
    n_train = len(train["label"])
    steps_per_epoch = (n_train + args.batch_size - 1) // args.batch_size
    print(
        "rec_sdk demo: Wide&Deep on %s, %d train / %d test rows, %s mode"
        % (
            schema["name"],
            n_train,
            len(test["label"]),
            "dynamic-expansion" if args.expansion else "fixed-capacity",
        ),
        file=sys.stderr,
    )

    init(train_steps=steps_per_epoch * args.epochs, use_dynamic_expansion=args.expansion)
    train_iterator, train_batch = make_iterator(train, args.batch_size, True, args.seed)
    eval_iterator, eval_batch = make_iterator(test, 4096, False, args.seed)

    initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=args.seed)
    vocabulary = 2_000_000 if args.data else 20_000
    names = ["categorical"] if args.data else ["user", "item", "side"]
    tables = {
        name: create_table(tf.int64, args.dim, name, initializer, device_vocabulary_size=vocabulary)
        for name in names
    }
    tables["wide"] = create_table(
        tf.int64, 1, "wide", tf.compat.v1.zeros_initializer(), device_vocabulary_size=vocabulary
    )

    _, _, loss = build_model(tables, schema, train_batch, is_train=True)
    eval_probs, eval_labels, _ = build_model(tables, schema, eval_batch, is_train=False)

    dense_vars, sparse_vars = get_dense_and_sparse_variable()
    dense_opt = tf.compat.v1.train.AdamOptimizer(args.learning_rate)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    if get_use_dynamic_expansion():
        sparse_opt = lazy_adam_by_addr.create_hash_optimizer_by_address(args.learning_rate)
        local_embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        sparse_grads = tf.gradients(loss, local_embs)
        sparse_train = sparse_opt.apply_gradients(zip(sparse_grads, addresses))
    else:
        sparse_opt = lazy_adam.create_hash_optimizer(args.learning_rate)
        sparse_train = sparse_opt.apply_gradients(zip(tf.gradients(loss, sparse_vars), sparse_vars))
    dense_train = dense_opt.minimize(loss, global_step=global_step, var_list=dense_vars)
    train_op = tf.group(dense_train, sparse_train)

    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=0, inter_op_parallelism_threads=0
    )
    results = {}
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        start = time.perf_counter()
        for epoch in range(args.epochs):
            sess.run(train_iterator.initializer)
            progress = Progress(steps_per_epoch, "epoch %d/%d" % (epoch + 1, args.epochs))
            losses = []
            while True:
                try:
                    _, batch_loss = sess.run([train_op, loss])
                except tf.errors.OutOfRangeError:
                    break
                losses.append(batch_loss)
                progress.update(1, samples=args.batch_size, loss=float(np.mean(losses[-50:])))
            test_auc, test_loss = evaluate(sess, eval_iterator.initializer, eval_probs, eval_labels)
            sizes = {name: t.size() for name, t in tables.items()}  # the SDK's: ints
            print(
                "epoch %d: train loss %.4f  test AUC %.4f  test log loss %.4f  table sizes %s"
                % (epoch + 1, float(np.mean(losses)), test_auc, test_loss, sizes),
                file=sys.stderr,
            )
            results = {"test_auc": test_auc, "test_loss": test_loss}
        elapsed = time.perf_counter() - start
    terminate_config_initializer()
    print(
        "final test AUC %.4f  test log loss %.4f  (%.1f s of training and evaluation)"
        % (results["test_auc"], results["test_loss"], elapsed)
    )
    return results


if __name__ == "__main__":
    main()
