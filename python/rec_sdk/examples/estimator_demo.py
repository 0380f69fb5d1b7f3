"""tf.estimator with rec_sdk tables: graph modification through GraphModifierHook.

The model of rec_sdk.examples.feature_spec_demo (MovieLens-100k, tables "user" and "item"
shared by two features each) as an Estimator model_fn that looks up the batch's id tensors
with `sparse_lookup(..., modify_graph=True)`. `GraphModifierHook()` in the train, eval and
predict hooks moves the key preprocessing into each mode's input pipeline; `EvictHook` evicts
keys not seen for `--eviction-days` days of data time during training. The Estimator's
checkpoints carry the tables, so evaluate and predict see the trained embeddings.

    python -m rec_sdk.examples.estimator_demo [--steps 600] [--model-dir DIR]
                                             [--train-and-evaluate]
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rec_sdk  # noqa: E402
from rec_sdk.base.tf_compat import estimator  # noqa: E402
from rec_sdk.core.embedding import create_table  # noqa: E402
from rec_sdk.core.feature_process import EvictHook  # noqa: E402
from rec_sdk.examples import feature_spec_demo  # noqa: E402
from rec_sdk.examples.metrics import auc, log_loss  # noqa: E402
from rec_sdk.graph.modifier import GraphModifierHook  # noqa: E402
from rec_sdk.optimizers import lazy_adam  # noqa: E402
from rec_sdk.util.initialize import init, terminate_config_initializer  # noqa: E402
from rec_sdk.util.variable import get_dense_and_sparse_variable  # noqa: E402

DAY = 86400


def make_input_fn(arrays, batch_size, is_training, seed=0, epochs=None):
    """An Estimator input_fn over the arrays (a dict of features, label included)."""

    def input_fn():
        dataset = tf.data.Dataset.from_tensor_slices(arrays)
        if is_training:
            dataset = dataset.shuffle(
                len(arrays["label"]), seed=seed, reshuffle_each_iteration=True
            ).repeat(epochs)
        return dataset.batch(batch_size, drop_remainder=is_training).prefetch(4)

    return input_fn


def make_model_fn(learning_rate=0.002, access_threshold=None, eviction_days=None, seed=0):
    tfe = estimator()  # tf.estimator, or a clear error on TensorFlow >= 2.16
    specs = feature_spec_demo.make_feature_specs(
        access_threshold, None if eviction_days is None else eviction_days * DAY
    )

    def model_fn(features, labels, mode):
        del labels  # the label is in the features dict
        is_train = mode == tfe.ModeKeys.TRAIN
        tables = {
            name: create_table(
                key_dtype=tf.int64,
                dim=feature_spec_demo.DIM,
                name=name,
                emb_initializer=tf.compat.v1.truncated_normal_initializer(
                    stddev=0.05, seed=seed + offset
                ),
                device_vocabulary_size=5000,
            )
            for name, offset in (("user", 1), ("item", 2))
        }
        if is_train:
            tf.compat.v1.add_to_collection(rec_sdk.TIMESTAMP_COLLECTION, features["timestamp"])
        batch_size = 256
        probabilities, label, loss = feature_spec_demo.build_model(
            tables, specs, features, batch_size, is_train=is_train, modify_graph=True
        )
        if mode == tfe.ModeKeys.PREDICT:
            return tfe.EstimatorSpec(mode, predictions={"probability": probabilities})
        if mode == tfe.ModeKeys.EVAL:
            metrics = {
                "auc": tf.compat.v1.metrics.auc(
                    label,
                    probabilities,
                    num_thresholds=2000,
                    summation_method="careful_interpolation",
                )
            }
            return tfe.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
        dense, sparse = get_dense_and_sparse_variable()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.group(
            tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(
                loss, global_step=global_step, var_list=dense
            ),
            lazy_adam.create_hash_optimizer(learning_rate=learning_rate).apply_gradients(
                zip(tf.gradients(loss, sparse), sparse)
            ),
        )
        return tfe.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def train_hooks(eviction_days=None, evict_step_interval=200):
    hooks = [GraphModifierHook()]
    if eviction_days is not None:
        hooks.append(EvictHook(evict_enable=True, evict_step_interval=evict_step_interval))
    return hooks


def run(
    model_dir,
    steps=600,
    batch_size=256,
    access_threshold=None,
    eviction_days=None,
    train_and_evaluate=False,
    seed=0,
    log=print,
    config=None,
    extra_train_hooks=(),
    evict_step_interval=200,
):
    """Trains, evaluates and predicts with an Estimator (or runs train_and_evaluate for
    `steps`). Returns {"eval": metrics dict, "predict_auc": AUC of the predictions,
    "predictions": count}."""
    tfe = estimator()
    train, test, _ = feature_spec_demo.load_inputs(seed=seed)
    hooks = train_hooks(eviction_days, evict_step_interval) + list(extra_train_hooks)
    init(train_steps=steps, eval_steps=-1)
    try:
        model = tfe.Estimator(
            make_model_fn(
                access_threshold=access_threshold, eviction_days=eviction_days, seed=seed
            ),
            model_dir=model_dir,
            config=config
            or tfe.RunConfig(
                tf_random_seed=seed,
                save_checkpoints_steps=max(steps // 2, 1),
                log_step_count_steps=None,
                save_summary_steps=max(steps // 4, 1),
            ),
        )
        train_input = make_input_fn(train, batch_size, True, seed)
        eval_input = make_input_fn(test, 1000, False)
        if train_and_evaluate:
            metrics, _ = tfe.train_and_evaluate(
                model,
                tfe.TrainSpec(train_input, max_steps=steps, hooks=hooks),
                tfe.EvalSpec(
                    eval_input,
                    steps=None,
                    hooks=[GraphModifierHook()],
                    throttle_secs=0,
                    start_delay_secs=0,
                ),
            )
        else:
            model.train(train_input, steps=steps, hooks=hooks)
            metrics = model.evaluate(eval_input, hooks=[GraphModifierHook()])
        log(
            "step %d: eval AUC %.4f  loss %.4f"
            % (metrics["global_step"], metrics["auc"], metrics["loss"])
        )
        probabilities = np.array(
            [
                p["probability"]
                for p in model.predict(
                    eval_input, hooks=[GraphModifierHook()], yield_single_examples=True
                )
            ]
        )
        predict_auc = auc(test["label"], probabilities)
        log(
            "predict: %d predictions, AUC %.4f, log loss %.4f"
            % (len(probabilities), predict_auc, log_loss(test["label"], probabilities))
        )
    finally:
        terminate_config_initializer()
    return {"eval": metrics, "predict_auc": predict_auc, "predictions": len(probabilities)}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--model-dir", default=None, help="checkpoint directory (default: a new temporary one)"
    )
    parser.add_argument("--access-threshold", type=int, default=None)
    parser.add_argument(
        "--eviction-days",
        type=int,
        default=None,
        help="with --access-threshold: EvictHook evicts keys not seen for "
        "this many days of data time",
    )
    parser.add_argument(
        "--train-and-evaluate", action="store_true", help="use tfe.train_and_evaluate"
    )
    args = parser.parse_args(argv)
    if args.eviction_days is not None and args.access_threshold is None:
        parser.error("--eviction-days needs --access-threshold")
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # Estimator's deprecations
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="rec_sdk_estimator_")
    return run(
        model_dir,
        steps=args.steps,
        access_threshold=args.access_threshold,
        eviction_days=args.eviction_days,
        train_and_evaluate=args.train_and_evaluate,
        log=lambda line: print(line, file=sys.stderr),
    )


if __name__ == "__main__":
    main()
