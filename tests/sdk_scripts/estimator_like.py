"""A training script written the way the SDK's `little_demo_estimator` example is, against
rec_sdk's module paths: tables made in the Estimator's model_fn, GraphModifierHook in every
mode, EvictHook in training, and the slicer hooks.

Options come from the environment:
  RUN_MODE            train | evaluate | predict | train_and_evaluate
  MODEL_DIR           the Estimator's model_dir
  USE_MODIFY_GRAPH    0: FeatureSpec mode; 1: tensor ids and graph modification
  USE_DYNAMIC, USE_DYNAMIC_EXPANSION, USE_MULTI_LOOKUP, USE_ONE_SHOT   as in little_demo
  USE_TIMESTAMP       1: admission and eviction by the batches' timestamps, EvictHook
  ENABLE_SLICER_TEST  1: tensor ids (with or without USE_MODIFY_GRAPH); the user ids are
                      made from constants in the model (an orphan lookup) and the item ids
                      pass through as_string + StringToNumber; OrphanLookupKeySlicerHook and
                      LookupSubgraphSlicerHook(op_types=["StringToNumber"]) move both into
                      the input pipeline (not with NO_SLICER_HOOKS=1)
Results go to the module-level dict RESULTS.
"""

import os

import numpy as np
import tensorflow as tf
from demo_data import BATCH, ITEM_FEATS, ITEM_VOCAB, USER_FEATS, USER_VOCAB, make_data

from rec_sdk.base.log import logger
from rec_sdk.constants.constants import (
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_TIMESTAMP,
)
from rec_sdk.core.asc.helper import FeatureSpec, get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import EvictHook
from rec_sdk.graph.hooks import LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook
from rec_sdk.graph.modifier import GraphModifierHook
from rec_sdk.optimizers.gradient_descent import create_hash_optimizer
from rec_sdk.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from rec_sdk.util.communication.hccl_ops import get_rank_size
from rec_sdk.util.initialize import ConfigInitializer, init, terminate_config_initializer
from rec_sdk.util.variable import get_dense_and_sparse_variable

tf.compat.v1.disable_eager_execution()

DIM = 8
TRAIN_STEPS, EVAL_STEPS = 30, 4
ACCESS_THRESHOLD, EVICTION_THRESHOLD = 1, 50  # timestamps advance 10 s per batch
MULTI_LOOKUP_TIMES = 2
RESULTS = {}
FEATURE_SPECS = {}  # is_training -> the FeatureSpecs of that input pipeline (FeatureSpec mode)


def flag(name, default=0):
    return bool(int(os.getenv(name, default)))


def feature_spec_list(params):
    access = ACCESS_THRESHOLD if params["use_timestamp"] else None
    evict = EVICTION_THRESHOLD if params["use_timestamp"] else None
    specs = [
        FeatureSpec(
            "user_ids", table_name="user_table", access_threshold=access, eviction_threshold=evict
        ),
        FeatureSpec(
            "item_ids",
            table_name="item_table",
            access_threshold=access,
            eviction_threshold=evict,
            faae_coefficient=4,
        ),
    ]
    if params["use_multi_lookup"]:
        specs += [
            FeatureSpec(
                "user_ids",
                table_name="user_table",
                access_threshold=access,
                eviction_threshold=evict,
            )
            for _ in range(MULTI_LOOKUP_TIMES)
        ]
    if params["use_timestamp"]:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


def input_fn(params, is_training):
    data = make_data(TRAIN_STEPS if is_training else EVAL_STEPS, seed=1 if is_training else 2)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH, drop_remainder=True)
    if not params["modify_graph"] and not params["slicer_test"]:
        specs = feature_spec_list(params)
        FEATURE_SPECS[is_training] = specs
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))
    if params["use_one_shot"]:
        return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return dataset


class LittleModel:
    def __init__(self, params, mode, features):
        self.params = params
        self.is_train = mode == tf.estimator.ModeKeys.TRAIN
        self.features = features

    def embeddings(self):
        initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=7)
        tables = [
            create_table(
                key_dtype=tf.int64,
                dim=tf.TensorShape([DIM]),
                name=name,
                emb_initializer=initializer,
                device_vocabulary_size=size * get_rank_size(),
            )
            for name, size in (("user_table", USER_VOCAB), ("item_table", ITEM_VOCAB))
        ]
        if self.params["modify_graph"] or self.params["slicer_test"]:
            user_ids, item_ids = self.features["user_ids"], self.features["item_ids"]
            if self.params["slicer_test"]:
                const = tf.constant(1, shape=user_ids.shape, dtype=user_ids.dtype)
                user_ids = const + 1 - 1  # computed without the iterator: an orphan lookup
                item_ids = tf.strings.to_number(tf.strings.as_string(item_ids), out_type=tf.int64)
            if self.params["use_timestamp"] and self.is_train:
                tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, self.features["timestamp"])
            ids = [user_ids, item_ids]
            config = (
                {"access_threshold": ACCESS_THRESHOLD, "eviction_threshold": EVICTION_THRESHOLD}
                if self.params["use_timestamp"]
                else None
            )
            configs = [config, dict(config, faae_coefficient=4) if config else None]
            if self.params["use_multi_lookup"]:
                ids += [user_ids] * MULTI_LOOKUP_TIMES
                configs += [config] * MULTI_LOOKUP_TIMES
        else:
            specs = FEATURE_SPECS[self.is_train]
            ids = specs[: 2 + MULTI_LOOKUP_TIMES * self.params["use_multi_lookup"]]
            configs = [None] * len(ids)
        lookup_tables = tables + [tables[0]] * (len(ids) - 2)
        send_counts = [BATCH * USER_FEATS * (1 + MULTI_LOOKUP_TIMES), BATCH * ITEM_FEATS]
        send_counts += [send_counts[0]] * (len(ids) - 2)
        outputs = []
        for feature, table, send_count, config in zip(ids, lookup_tables, send_counts, configs):
            emb = sparse_lookup(
                table,
                feature,
                send_count,
                dim=None,
                is_train=self.is_train,
                is_grad=True,
                name=table.table_name + "_lookup",
                modify_graph=self.params["modify_graph"],
                access_and_evict_config=config,
                batch=self.features,
            )
            outputs.append(tf.reduce_sum(emb, axis=1))
        return outputs

    def loss_and_predictions(self):
        x = tf.concat(self.embeddings(), axis=1)
        w = tf.compat.v1.get_variable(
            "w", [x.shape[1], 2], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3)
        )
        logits = tf.matmul(x, w)
        labels = tf.stack([self.features["label_0"], self.features["label_1"]], axis=1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        return loss, tf.sigmoid(logits), labels


def get_train_op(loss, params):
    dense_variables, sparse_variables = get_dense_and_sparse_variable()
    train_ops = [
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense_variables)
    ]
    if params["use_dynamic_expansion"]:
        sparse_optimizer = create_hash_optimizer_by_addr(learning_rate=0.1)
        local_embs = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        train_ops.append(
            sparse_optimizer.apply_gradients(list(zip(tf.gradients(loss, local_embs), addresses)))
        )
    else:
        sparse_optimizer = create_hash_optimizer(learning_rate=0.1)
        train_ops.append(
            sparse_optimizer.apply_gradients(
                list(zip(tf.gradients(loss, sparse_variables), sparse_variables))
            )
        )
    train_ops.append(tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1))
    return tf.group(*train_ops)


def model_fn(features, labels, mode, params):
    del labels
    loss, predictions, label = LittleModel(params, mode, features).loss_and_predictions()
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode,
            predictions={"task_1": predictions[:, 0], "task_2": predictions[:, 1], "label": label},
        )
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=get_train_op(loss, params))


def hooks_list(params, is_training):
    hooks = []
    if params["slicer_test"] and not flag("NO_SLICER_HOOKS"):
        hooks += [
            OrphanLookupKeySlicerHook(),
            LookupSubgraphSlicerHook(op_types=["StringToNumber"]),
        ]
    hooks.append(GraphModifierHook(modify_graph=params["modify_graph"]))
    if is_training and params["use_timestamp"]:
        hooks.append(EvictHook(evict_enable=True, evict_time_interval=3600, evict_step_interval=10))
    return hooks


def main():
    run_mode = os.getenv("RUN_MODE", "train_and_evaluate")
    if run_mode not in ("train", "evaluate", "predict", "train_and_evaluate"):
        raise ValueError("RUN_MODE must be train, evaluate, predict or train_and_evaluate")
    params = {
        "modify_graph": flag("USE_MODIFY_GRAPH"),
        "use_timestamp": flag("USE_TIMESTAMP"),
        "use_one_shot": flag("USE_ONE_SHOT"),
        "use_multi_lookup": flag("USE_MULTI_LOOKUP", 1),
        "use_dynamic_expansion": flag("USE_DYNAMIC_EXPANSION"),
        "slicer_test": flag("ENABLE_SLICER_TEST"),
    }
    init(
        train_steps=-1,
        eval_steps=-1,
        use_dynamic=flag("USE_DYNAMIC", 1),
        use_dynamic_expansion=params["use_dynamic_expansion"],
    )
    params["use_dynamic_expansion"] = ConfigInitializer.get_instance().use_dynamic_expansion
    config = tf.estimator.RunConfig(
        model_dir=os.environ["MODEL_DIR"],
        tf_random_seed=5,
        save_checkpoints_steps=TRAIN_STEPS,
        log_step_count_steps=None,
        save_summary_steps=TRAIN_STEPS,
    )
    estimator = tf.estimator.Estimator(model_fn=model_fn, params=params, config=config)
    train_hooks, eval_hooks = hooks_list(params, True), hooks_list(params, False)
    if run_mode == "train":
        estimator.train(lambda: input_fn(params, True), max_steps=TRAIN_STEPS, hooks=train_hooks)
    elif run_mode == "evaluate":
        RESULTS["eval"] = estimator.evaluate(
            lambda: input_fn(params, False), steps=EVAL_STEPS, hooks=eval_hooks
        )
    elif run_mode == "train_and_evaluate":
        RESULTS["eval"], _ = tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(
                lambda: input_fn(params, True), max_steps=TRAIN_STEPS, hooks=train_hooks
            ),
            tf.estimator.EvalSpec(
                lambda: input_fn(params, False),
                steps=EVAL_STEPS,
                hooks=eval_hooks,
                throttle_secs=0,
                start_delay_secs=0,
            ),
        )
    else:
        results = list(
            estimator.predict(
                lambda: input_fn(params, False), hooks=eval_hooks, yield_single_examples=False
            )
        )
        RESULTS["predictions"] = np.concatenate([r["task_1"] for r in results])
    RESULTS["evictions"] = [
        (h.evictions, h.last_result) for h in train_hooks if isinstance(h, EvictHook)
    ]
    RESULTS["sliced"] = [
        h.moved
        for h in train_hooks + eval_hooks
        if isinstance(h, (OrphanLookupKeySlicerHook, LookupSubgraphSlicerHook))
    ]
    terminate_config_initializer()
    logger.info("estimator demo done (%s)", run_mode)


if __name__ == "__main__":
    main()
