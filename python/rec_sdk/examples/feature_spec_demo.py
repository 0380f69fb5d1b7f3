"""FeatureSpec mode end to end: a CTR model on MovieLens-100k with the SDK's key pipeline.

In FeatureSpec mode the model does not look up id tensors directly. Each sparse feature is
described by a `FeatureSpec` (where its ids are in the batch, which table they go to), the
dataset is mapped with `get_asc_insert_func(tgt_key_specs=...)`, which deduplicates the keys
of every table inside tf.data (overlapping with training through `prefetch`), and
`sparse_lookup(table, spec, batch=batch)` only maps the precomputed unique keys to rows.
Features that share a table are deduplicated together: the table sees each key once per
step, however many features use it.

The features of this example (label: rating >= 4):

    table "user": user_id           [batch]      the user's id
                  user_side         [batch, 4]   occupation, zip, age, gender
    table "item": item_id           [batch]      the item's id
                  genres            [batch, 6]   the item's genres (-1 pads, masked out)
    timestamp (is_timestamp=True)   [batch]      the rating's time, for eviction by age

Keys of different fields in one table are kept apart by a field number in their high bits.

The script follows the SDK's order: init -> FeatureSpecs -> datasets mapped with the insert
function -> create_table -> sparse_lookup for the train and eval graphs -> dense and sparse
optimizers -> start_asc_pipeline -> Session loop with periodic evaluation -> terminate.

With --modify-graph the same model is written the SDK's other way: plain datasets, lookups of
the batch's id tensors with `modify_graph=True`, timestamps registered in
rec_sdk.TIMESTAMP_COLLECTION, and `modify_graph_and_start_emb_cache()` once the graph is
built; the iterators are then started with `get_initializer(True/False)`. Graph modification
builds the same input pipeline, so both modes train identically.

    python -m rec_sdk.examples.feature_spec_demo [--steps 600] [--static] [--access-threshold 2]
                                                 [--modify-graph]
"""

import argparse
import os
import sys
import time

# Keep the output to the example's own lines unless the caller chose a TensorFlow log level.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rec_sdk  # noqa: E402
from rec_sdk.core.asc.feature_spec import FeatureSpec  # noqa: E402
from rec_sdk.core.asc.helper import get_asc_insert_func  # noqa: E402
from rec_sdk.core.asc.manager import start_asc_pipeline  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.core.feature_process import evict_tables  # noqa: E402
from rec_sdk.examples import data as datasets  # noqa: E402
from rec_sdk.examples.demo import evaluate, field_keys  # noqa: E402
from rec_sdk.examples.models import dense_layer  # noqa: E402
from rec_sdk.examples.progress import Progress  # noqa: E402
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from rec_sdk.optimizers import lazy_adam  # noqa: E402
from rec_sdk.util.initialize import (  # noqa: E402
    get_initializer,
    get_target_batch,
    init,
    terminate_config_initializer,
)
from rec_sdk.util.variable import get_dense_and_sparse_variable  # noqa: E402

DIM = 16
USER_SIDE_FIELDS = ("occupation", "zip", "age", "gender")
# Field numbers (the high bits of a key, see demo.field_keys) within each table.
USER_ID_FIELD, ITEM_ID_FIELD, GENRE_FIELD = 0, 0, 1
USER_SIDE_FIRST_FIELD = 1  # occupation 1, zip 2, age 3, gender 4


def load_inputs(seed=0, test_fraction=0.2):
    """MovieLens-100k as (train, test, vocab_sizes): dicts of NumPy arrays whose sparse
    features already hold the int64 keys of their table."""
    raw, vocab_sizes = datasets.load_movielens_100k()
    user_side = np.stack(
        [
            field_keys(raw[name], USER_SIDE_FIRST_FIELD + i)
            for i, name in enumerate(USER_SIDE_FIELDS)
        ],
        axis=1,
    )
    genres = np.where(raw["genres"] >= 0, field_keys(raw["genres"], GENRE_FIELD), -1)
    features = {
        "user_id": field_keys(raw["user_id"], USER_ID_FIELD),
        "user_side": user_side,
        "item_id": field_keys(raw["item_id"], ITEM_ID_FIELD),
        "genres": genres,
        "timestamp": raw["timestamp"],
        "label": raw["label"],
    }
    train, test = datasets.train_test_split(features, test_fraction=test_fraction, seed=seed)
    return train, test, vocab_sizes


def make_feature_specs(access_threshold=None, eviction_threshold=None):
    """The FeatureSpecs of the batch: four looked-up features in two tables, and the
    per-sample timestamps. Every spec of a table must carry the same thresholds."""
    thresholds = {}
    if access_threshold is not None:
        thresholds["access_threshold"] = access_threshold
        if eviction_threshold is not None:
            thresholds["eviction_threshold"] = eviction_threshold
    return [
        FeatureSpec("user_id", table_name="user", index_key="user_id", **thresholds),
        FeatureSpec("user_side", table_name="user", index_key="user_side", **thresholds),
        FeatureSpec("item_id", table_name="item", index_key="item_id", **thresholds),
        FeatureSpec("genres", table_name="item", index_key="genres", **thresholds),
        # No table is named "timestamp": these timestamps serve every table of the pipeline.
        FeatureSpec("timestamp", index_key="timestamp", is_timestamp=True),
    ]


def make_iterator(arrays, batch_size, specs, is_training, seed):
    """An initializable iterator over batches, holding the pipeline's unique keys when
    `specs` are given (FeatureSpec mode; graph modification adds them later otherwise)."""
    dataset = tf.data.Dataset.from_tensor_slices(arrays)
    if is_training:
        dataset = dataset.shuffle(len(arrays["label"]), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if specs is not None:
        insert_fn = get_asc_insert_func(tgt_key_specs=specs, is_training=is_training)
        dataset = dataset.map(insert_fn)
    dataset = dataset.prefetch(10)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator, iterator.get_next()


def build_model(tables, specs, batch, batch_size, is_train, modify_graph=False):
    """(probabilities, labels, loss) of one batch. The dense layers are shared by the train
    and eval graphs (AUTO_REUSE in dense_layer); the tables are shared by construction.
    With modify_graph the lookups take the batch's id tensors (and the specs only say where
    they are and the tables' thresholds)."""
    suffix = "train" if is_train else "eval"
    embeddings = {}
    for spec in specs:
        if spec.is_timestamp:
            continue
        ids_per_sample = int(np.prod(batch[spec.index_key].shape[1:]))
        ids, config = spec, None
        if modify_graph:
            ids = batch[spec.index_key]
            if spec.access_threshold is not None:
                config = {
                    "access_threshold": spec.access_threshold,
                    "eviction_threshold": spec.eviction_threshold,
                }
        embeddings[spec.index_key] = sparse_lookup(
            tables[spec.table_name],
            ids,
            send_count=batch_size * ids_per_sample,
            is_train=is_train,
            name="%s_lookup_%s" % (spec.index_key, suffix),
            batch=batch,
            modify_graph=modify_graph,
            access_and_evict_config=config,
        )

    user = embeddings["user_id"]  # [batch, dim]
    user_side = tf.reshape(embeddings["user_side"], [-1, len(USER_SIDE_FIELDS) * DIM])
    item = embeddings["item_id"]  # [batch, dim]
    mask = tf.cast(batch["genres"] >= 0, tf.float32)[..., tf.newaxis]  # padding -> 0
    genres = tf.reduce_sum(embeddings["genres"] * mask, axis=1) / tf.maximum(
        tf.reduce_sum(mask, axis=1), 1.0
    )  # [batch, dim]

    x = tf.concat([user, user_side, item, genres, user * item], axis=1)
    x = dense_layer(x, 64, "mlp_1", tf.nn.relu)
    x = dense_layer(x, 32, "mlp_2", tf.nn.relu)
    logits = tf.reshape(dense_layer(x, 1, "mlp_out"), [-1])
    labels = tf.cast(batch["label"], tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return tf.sigmoid(logits), labels, loss


def run(
    steps=600,
    batch_size=256,
    use_dynamic=True,
    eval_every=200,
    access_threshold=None,
    seed=0,
    log=print,
    eviction_threshold=None,
    learning_rate=0.002,
    eval_batch_size=1000,
    show_progress=False,
    session_config=None,
    modify_graph=False,
    export_tables=False,
):
    """Trains for `steps` steps (re-reading the training data as needed), evaluating on the
    test split every `eval_every` steps (0: only at the end). modify_graph: write the model
    in graph-modification mode instead of FeatureSpec mode (see the module doc).

    Returns a dict: test_auc, test_loss (final evaluation), train_steps, train_loss (mean of
    the last 50 steps), losses (every step's), history ([(step, auc, loss)] of every
    evaluation), tables ({name: {stat: int}} from table.stats()), elapsed_s (session time),
    and with export_tables, exported ({name: (keys, values, slots)} sorted by key).
    """
    tf.compat.v1.set_random_seed(seed)
    train, test, _ = load_inputs(seed=seed)
    steps_per_epoch = len(train["label"]) // batch_size

    init(train_steps=steps, eval_steps=-1, use_dynamic=use_dynamic)
    try:
        # 1. What the batch holds and where each feature is looked up.
        specs = make_feature_specs(access_threshold, eviction_threshold)

        # 2. Datasets whose batches carry the deduplicated keys of every table.
        pipeline_specs = None if modify_graph else specs
        train_iterator, train_batch = make_iterator(train, batch_size, pipeline_specs, True, seed)
        eval_iterator, eval_batch = make_iterator(
            test, eval_batch_size, pipeline_specs, False, seed
        )
        if modify_graph:
            # Tensor lookups that evict by age read the samples' timestamps from here.
            tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, train_batch["timestamp"])

        # 3. Tables; room for every key of MovieLens-100k, with spare capacity.
        tables = {}
        for name, seed_offset in (("user", 1), ("item", 2)):
            tables[name] = create_table(
                key_dtype=tf.int64,
                dim=tf.TensorShape([DIM]),
                name=name,
                emb_initializer=tf.compat.v1.truncated_normal_initializer(
                    stddev=0.05, seed=seed + seed_offset
                ),
                device_vocabulary_size=5000,
            )

        # 4. The model, built once on the training batch and once on the evaluation batch.
        _, _, loss = build_model(
            tables, specs, train_batch, batch_size, is_train=True, modify_graph=modify_graph
        )
        eval_probs, eval_labels, _ = build_model(
            tables, specs, eval_batch, eval_batch_size, is_train=False, modify_graph=modify_graph
        )

        # 5. Optimizers: Adam for the dense layers, LazyAdam on the table rows in the batch.
        dense_variables, sparse_variables = get_dense_and_sparse_variable()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        dense_optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
        sparse_optimizer = lazy_adam.create_hash_optimizer(learning_rate=learning_rate)
        dense_train = dense_optimizer.minimize(
            loss, global_step=global_step, var_list=dense_variables
        )
        sparse_train = sparse_optimizer.apply_gradients(
            zip(tf.gradients(loss, sparse_variables), sparse_variables)
        )
        train_op = tf.group(dense_train, sparse_train)

        # 6. The graph is complete: check the pipeline against the tables (FeatureSpec mode),
        # or move the lookups' key preprocessing into the input pipelines (graph modification).
        if modify_graph:
            modify_graph_and_start_emb_cache()
            train_init, eval_init = get_initializer(True), get_initializer(False)
            # Ops that read the old batch now read the new iterator's, but a tensor of the
            # old batch fetched as it is (here the float labels, which tf.cast returned
            # unchanged) still names the old iterator: fetch the new batch's instead.
            eval_labels = get_target_batch(False)["label"]
        else:
            start_asc_pipeline()
            train_init, eval_init = train_iterator.initializer, eval_iterator.initializer
        exports = {name: table.export() for name, table in tables.items()}
        stats = {name: table.stats() for name, table in tables.items()}
        # With an eviction threshold, evict at every evaluation (an EvictHook does this in a
        # MonitoredTrainingSession or an Estimator).
        evict_op = evict_tables() if eviction_threshold is not None else None
        # Made before the session runs anything: building ops later would modify the graph
        # under a session that already ran part of it.
        init_op = tf.compat.v1.global_variables_initializer()

        def evaluate_model(sess):
            return evaluate(sess, eval_init, eval_probs, eval_labels)

        history, losses = [], []
        with tf.compat.v1.Session(config=session_config) as sess:
            sess.run(train_init)
            sess.run(init_op)
            progress = Progress(steps, "training") if show_progress else None
            start = time.perf_counter()
            step = epoch = 0
            while step < steps:
                try:
                    _, batch_loss = sess.run([train_op, loss])
                except tf.errors.OutOfRangeError:
                    # End of the training data: start another (reshuffled) epoch.
                    epoch += 1
                    sess.run(train_init)
                    continue
                step += 1
                losses.append(batch_loss)
                if progress:
                    progress.update(1, samples=batch_size, loss=float(np.mean(losses[-50:])))
                if eval_every and step % eval_every == 0 and step < steps:
                    if evict_op is not None:
                        sess.run(evict_op)
                    test_auc, test_loss = evaluate_model(sess)
                    history.append((step, test_auc, test_loss))
                    log(
                        "step %d (epoch %.2f): train loss %.4f  test AUC %.4f  test loss %.4f"
                        % (
                            step,
                            step / steps_per_epoch,
                            float(np.mean(losses[-50:])),
                            test_auc,
                            test_loss,
                        )
                    )
            test_auc, test_loss = evaluate_model(sess)
            history.append((step, test_auc, test_loss))
            table_stats = {
                name: {k: int(v) for k, v in values.items()}
                for name, values in sess.run(stats).items()
            }
            elapsed = time.perf_counter() - start
            exported = {}
            if export_tables:
                for name, (keys, values, slots) in sess.run(exports).items():
                    order = np.argsort(keys)
                    exported[name] = (keys[order], values[order], slots[:, order])
    finally:
        terminate_config_initializer()

    log(
        "final (step %d, %s shapes, %s): test AUC %.4f  test loss %.4f  (%.1f s)"
        % (
            step,
            "dynamic" if use_dynamic else "static",
            "graph modification" if modify_graph else "FeatureSpec mode",
            test_auc,
            test_loss,
            elapsed,
        )
    )
    for name, values in table_stats.items():
        log("table %-5s %s" % (name, "  ".join("%s=%d" % kv for kv in values.items())))
    return {
        "test_auc": test_auc,
        "test_loss": test_loss,
        "train_steps": step,
        "train_loss": float(np.mean(losses[-50:])),
        "losses": losses,
        "history": history,
        "tables": table_stats,
        "elapsed_s": elapsed,
        "exported": exported,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600, help="training steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--eval-every", type=int, default=200, help="evaluate every N steps (0: only at the end)"
    )
    parser.add_argument(
        "--static",
        action="store_true",
        help="static-shape mode: init(use_dynamic=False), lookups bounded by send_count",
    )
    parser.add_argument(
        "--access-threshold",
        type=int,
        default=None,
        help="feature admission: a key gets a row once seen this many times",
    )
    parser.add_argument(
        "--eviction-threshold",
        type=int,
        default=None,
        help="with --access-threshold: evict keys not seen for this many "
        "seconds of data time (at every evaluation)",
    )
    parser.add_argument(
        "--modify-graph",
        action="store_true",
        help="write the model with id-tensor lookups and graph modification "
        "instead of FeatureSpecs",
    )
    parser.add_argument("--learning-rate", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.eviction_threshold is not None and args.access_threshold is None:
        parser.error("--eviction-threshold needs --access-threshold (-1: no admission)")

    tf.compat.v1.disable_eager_execution()
    return run(
        steps=args.steps,
        batch_size=args.batch_size,
        use_dynamic=not args.static,
        eval_every=args.eval_every,
        access_threshold=args.access_threshold,
        seed=args.seed,
        eviction_threshold=args.eviction_threshold,
        learning_rate=args.learning_rate,
        show_progress=True,
        modify_graph=args.modify_graph,
        log=lambda line: print(line, file=sys.stderr),
    )


if __name__ == "__main__":
    main()
