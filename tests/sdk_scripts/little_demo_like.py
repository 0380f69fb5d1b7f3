"""A training script written the way the SDK's `little_demo` example is, against rec_sdk's
module paths (the SDK's `mx_rec` renamed): the SDK names it imports must exist and behave.

Options come from the environment, as in the SDK's run.sh:
  USE_MODE            train | load_and_train | predict
  USE_MODIFY_GRAPH    0: FeatureSpec mode (get_asc_insert_func + start_asc_pipeline);
                      1: tensor ids + modify_graph_and_start_emb_cache
  USE_DYNAMIC         1: dynamic shape; 0: static shape (send_count)
  USE_DYNAMIC_EXPANSION  1: expansion mode, by-address LazyAdam over the lookup collections
  USE_MULTI_LOOKUP    1: the user table is looked up 1 + MULTI_LOOKUP_TIMES times
  USE_TIMESTAMP       1: feature admission (thresholds from FeatureSpecs or
                      access_and_evict_config), timestamps from return_timestamp, and
                      set_threshold(60) on the user table half way to the first evaluation
  USE_ONE_SHOT        1: one-shot iterators
  APPLY_GRADIENTS_STRATEGY  direct_apply | sum_same_id_gradients_and_apply (expansion mode)
Results go to the module-level dict RESULTS (losses, table sizes, exported tables).
"""

import glob
import os
import re

import numpy as np
import tensorflow as tf
from demo_data import BATCH, ITEM_FEATS, ITEM_VOCAB, USER_FEATS, USER_VOCAB, make_data

from rec_sdk.base.log import logger
from rec_sdk.constants.constants import (
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
    ASCEND_TIMESTAMP,
    ApplyGradientsStrategy,
    BaseEnum,
)
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.asc.manager import start_asc_pipeline
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
from rec_sdk.optimizers.lazy_adam import create_hash_optimizer
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.communication.hccl_ops import get_rank_id, get_rank_size
from rec_sdk.util.initialize import (
    ConfigInitializer,
    clear_channel,
    init,
    set_if_load,
    terminate_config_initializer,
)
from rec_sdk.util.ops import import_host_pipeline_ops
from rec_sdk.util.tf_version_adapter import hccl_ops
from rec_sdk.util.variable import get_dense_and_sparse_variable

tf.compat.v1.disable_eager_execution()

DIM = 8
MAX_STEPS, TRAIN_INTERVAL, EVAL_STEPS, SAVE_INTERVAL = 40, 20, 4, 20
ACCESS_THRESHOLD, EVICTION_THRESHOLD, NEW_THRESHOLD = 2, 3600, 60
MULTI_LOOKUP_TIMES = 2
RESULTS = {}


class UseMode(BaseEnum):
    TRAIN = "train"
    PREDICT = "predict"
    LOAD_AND_TRAIN = "load_and_train"


def flag(name, default=0):
    return bool(int(os.getenv(name, default)))


def make_batch_and_iterator(is_training, feature_spec_list=None):
    data = make_data(MAX_STEPS if is_training else EVAL_STEPS, seed=1 if is_training else 2)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH, drop_remainder=True)
    if USE_ONE_SHOT and not is_training:
        dataset = dataset.repeat()  # a one-shot iterator is never re-initialised
    if USE_TIMESTAMP:
        ops = import_host_pipeline_ops()

        def add_timestamp(batch):
            batch["timestamp"] = ops.return_timestamp(tf.cast(batch["label_0"], tf.int64))
            return batch

        dataset = dataset.map(add_timestamp)
    if not MODIFY_GRAPH_FLAG:
        insert_fn = get_asc_insert_func(
            tgt_key_specs=feature_spec_list, is_training=is_training, dump_graph=False
        )
        dataset = dataset.map(insert_fn)
    dataset = dataset.prefetch(100)
    if USE_ONE_SHOT:
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    return iterator.get_next(), iterator


class MyModel:
    def __call__(self, embedding_list, label_0, label_1):
        x = tf.concat(embedding_list, axis=1)
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            w = tf.compat.v1.get_variable(
                "w", [x.shape[1], 2], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3)
            )
            b = tf.compat.v1.get_variable("b", [2], initializer=tf.zeros_initializer())
        logits = tf.matmul(x, w) + b
        self.loss_list = [
            tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label_0, logits=logits[:, 0])
            ),
            tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label_1, logits=logits[:, 1])
            ),
        ]
        return self


def model_forward(input_list, batch, is_train, modify_graph, config_dict=None):
    embedding_list = []
    for feature, hash_table, send_count in zip(*input_list):
        access_and_evict_config = None
        if isinstance(config_dict, dict):
            access_and_evict_config = config_dict.get(hash_table.table_name)
        embedding = sparse_lookup(
            hash_table,
            feature,
            send_count,
            is_train=is_train,
            access_and_evict_config=access_and_evict_config,
            is_grad=True,
            name=hash_table.table_name + "_lookup",
            modify_graph=modify_graph,
            batch=batch,
            serving_default_value=tf.ones(shape=(DIM,)) * 2,
        )
        embedding_list.append(tf.reduce_sum(embedding, axis=1, keepdims=False))
    return MyModel()(embedding_list, batch["label_0"], batch["label_1"])


def build_graph(table_list, is_train, feature_spec_list=None, config_dict=None):
    batch, iterator = make_batch_and_iterator(is_train, feature_spec_list)
    send_counts = [BATCH * USER_FEATS * (1 + MULTI_LOOKUP_TIMES), BATCH * ITEM_FEATS]
    if MODIFY_GRAPH_FLAG:
        input_list = [[batch["user_ids"], batch["item_ids"]], list(table_list), send_counts]
        if USE_MULTI_LOOKUP:
            for part in input_list:
                part.extend([part[0]] * MULTI_LOOKUP_TIMES)
        if USE_TIMESTAMP:
            tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"])
            tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"])  # twice: still one
    else:
        input_list = [
            feature_spec_list[: 2 + MULTI_LOOKUP_TIMES * USE_MULTI_LOOKUP],
            list(table_list),
            send_counts,
        ]
        if USE_MULTI_LOOKUP:
            for part in input_list[1:]:
                part.extend([part[0]] * MULTI_LOOKUP_TIMES)
    model = model_forward(input_list, batch, is_train, MODIFY_GRAPH_FLAG, config_dict)
    return iterator, model, batch


def create_feature_spec_list():
    access = ACCESS_THRESHOLD if USE_TIMESTAMP else None
    evict = EVICTION_THRESHOLD if USE_TIMESTAMP else None
    specs = [
        FeatureSpec(
            "user_ids",
            table_name="user_table",
            access_threshold=access,
            eviction_threshold=evict,
            faae_coefficient=1,
        ),
        FeatureSpec(
            "item_ids",
            table_name="item_table",
            access_threshold=access,
            eviction_threshold=evict,
            faae_coefficient=4,
        ),
    ]
    if USE_MULTI_LOOKUP:
        for _ in range(MULTI_LOOKUP_TIMES):
            specs.append(
                FeatureSpec(
                    "user_ids",
                    table_name="user_table",
                    access_threshold=access,
                    eviction_threshold=evict,
                    faae_coefficient=1,
                )
            )
    if USE_TIMESTAMP:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


class RunMode:
    def __init__(
        self, table_list, optimizer_list, train_model, eval_model, train_iterator, eval_iterator
    ):
        self.session = tf.compat.v1.Session(
            config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
            )
        )
        self.table_list = table_list
        self.optimizer_list = optimizer_list
        self.train_model, self.eval_model = train_model, eval_model
        self.train_iterator, self.eval_iterator = train_iterator, eval_iterator
        self.train_ops = []
        self.rank_id = get_rank_id()
        self.eval_losses = []

    def _infer(self):
        if not USE_ONE_SHOT:
            config = ConfigInitializer.get_instance().train_params_config
            initializer = (
                config.get_initializer(False)
                if MODIFY_GRAPH_FLAG
                else self.eval_iterator.initializer
            )
            self.session.run(initializer)
        channel_id = (
            ConfigInitializer.get_instance().train_params_config.get_training_mode_channel_id(False)
        )
        self.session.run(
            [
                clear_channel(is_train_channel=False),
                import_host_pipeline_ops().clear_channel(channel_id),
            ]
        )
        losses = []
        for _ in range(EVAL_STEPS):
            try:
                losses.append(self.session.run(self.eval_model.loss_list))
            except tf.errors.OutOfRangeError:
                break
        self.eval_losses.append(np.mean(losses, axis=0).tolist())

    def set_train_ops(self):
        dense_variables, sparse_variables = get_dense_and_sparse_variable()
        for loss, (dense_optimizer, sparse_optimizer) in zip(
            self.train_model.loss_list, self.optimizer_list
        ):
            grads = dense_optimizer.compute_gradients(loss, var_list=dense_variables)
            avg_grads = []
            for grad, var in grads:
                if get_rank_size() > 1:
                    grad = hccl_ops.allreduce(grad, "sum") if grad is not None else None
                if grad is not None:
                    avg_grads.append((grad, var))
            self.train_ops.append(dense_optimizer.apply_gradients(avg_grads))
            if flag("USE_DYNAMIC_EXPANSION"):
                train_emb_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
                if (
                    ApplyGradientsStrategy.mapping(os.getenv("APPLY_GRADIENTS_STRATEGY"))
                    == ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY
                ):
                    train_address_list = tf.compat.v1.get_collection(
                        ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS
                    )
                else:
                    train_address_list = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
                local_grads = tf.gradients(loss, train_emb_list)
                grads_and_vars = list(zip(local_grads, train_address_list))
                self.train_ops.append(sparse_optimizer.apply_gradients(grads_and_vars))
            else:
                sparse_grads = tf.gradients(loss, sparse_variables)
                self.train_ops.append(
                    sparse_optimizer.apply_gradients(list(zip(sparse_grads, sparse_variables)))
                )

    def train(self, if_load, model_file):
        self.set_train_ops()
        if MODIFY_GRAPH_FLAG:
            modify_graph_and_start_emb_cache(dump_graph=False)
        if not USE_ONE_SHOT:
            config = ConfigInitializer.get_instance().train_params_config
            self.session.run(
                config.get_initializer(True)
                if MODIFY_GRAPH_FLAG
                else self.train_iterator.initializer
            )
        self.session.run(tf.compat.v1.global_variables_initializer())
        saver = tf.compat.v1.train.Saver()
        if if_load:
            saver.restore(self.session, latest_model(model_file))
        losses, sizes = [], []
        for i in range(1, MAX_STEPS + 1):
            try:
                _, loss = self.session.run([self.train_ops, self.train_model.loss_list])
            except tf.errors.OutOfRangeError:
                break
            losses.append(loss)
            sizes.append([t.size() for t in self.table_list])  # Python ints, as the SDK's
            logger.info("training at step %d, table sizes %s", i, sizes[-1])
            if i % TRAIN_INTERVAL == 0:
                self._infer()
            if i % SAVE_INTERVAL == 0:
                saver.save(self.session, "./saved-model/model-%d" % self.rank_id, global_step=i)
            if USE_TIMESTAMP and i == TRAIN_INTERVAL // 2:
                self.change_threshold()
        RESULTS.update(train_losses=losses, table_sizes=sizes, steps=len(losses))

    def predict(self, model_file):
        tf.compat.v1.train.Saver().restore(self.session, latest_model(model_file))
        self._infer()

    def change_threshold(self):
        thres_tensor = tf.constant(NEW_THRESHOLD, dtype=tf.int32)
        set_threshold_op = ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(
            thres_tensor,
            emb_name=self.table_list[0].table_name,
            ids_name=self.table_list[0].table_name + "_lookup",
        )
        RESULTS["set_threshold"] = self.session.run([set_threshold_op])[0]


def latest_model(model_file):
    steps = [int(re.match(r".*sparse-model-0-([0-9]+)", f).group(1)) for f in model_file]
    return "./saved-model/model-0-%d" % max(steps)


def main():
    global USE_TIMESTAMP, MODIFY_GRAPH_FLAG, USE_ONE_SHOT, USE_MULTI_LOOKUP
    use_mode = UseMode.mapping(os.getenv("USE_MODE", "train"))
    USE_TIMESTAMP = flag("USE_TIMESTAMP")
    MODIFY_GRAPH_FLAG = flag("USE_MODIFY_GRAPH")
    USE_ONE_SHOT = flag("USE_ONE_SHOT")
    USE_MULTI_LOOKUP = flag("USE_MULTI_LOOKUP", 1)
    use_dynamic_expansion = flag("USE_DYNAMIC_EXPANSION")
    model_file = []
    if_load = use_mode in (UseMode.PREDICT, UseMode.LOAD_AND_TRAIN)
    if if_load:
        model_file = glob.glob("./saved-model/sparse-model-*")
        if not model_file:
            raise ValueError("no model file in ./saved-model")
    init(
        train_steps=TRAIN_INTERVAL,
        eval_steps=EVAL_STEPS,
        save_steps=SAVE_INTERVAL,
        max_steps=MAX_STEPS,
        use_dynamic=flag("USE_DYNAMIC", 1),
        use_dynamic_expansion=use_dynamic_expansion,
        if_load=if_load,
        use_mpi=True,
        use_hot=False,
        bind_cpu=True,
    )
    set_if_load(if_load)
    access_and_evict = None
    if USE_TIMESTAMP:
        access_and_evict = {
            "user_table": dict(
                access_threshold=ACCESS_THRESHOLD,
                eviction_threshold=EVICTION_THRESHOLD,
                faae_coefficient=1,
            ),
            "item_table": dict(
                access_threshold=ACCESS_THRESHOLD,
                eviction_threshold=EVICTION_THRESHOLD,
                faae_coefficient=4,
            ),
        }
    train_specs = eval_specs = None
    if not MODIFY_GRAPH_FLAG:
        train_specs, eval_specs = create_feature_spec_list(), create_feature_spec_list()
    if use_dynamic_expansion:
        sparse_optimizer = create_hash_optimizer_by_address(learning_rate=0.01)
    else:
        sparse_optimizer = create_hash_optimizer(learning_rate=0.01)
    optimizer_list = [(tf.compat.v1.train.AdamOptimizer(0.01), sparse_optimizer)]
    initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=128)
    user_table = create_table(
        key_dtype=tf.int64,
        dim=tf.TensorShape([DIM]),
        name="user_table",
        emb_initializer=initializer,
        all2all_gradients_op="sum_gradients_and_div_by_ranksize",
        is_dp=False,
        device_vocabulary_size=USER_VOCAB * get_rank_size(),
        host_vocabulary_size=0,
    )
    item_table = create_table(
        key_dtype=tf.int64,
        dim=tf.TensorShape([DIM]),
        name="item_table",
        emb_initializer=initializer,
        device_vocabulary_size=ITEM_VOCAB * get_rank_size(),
        host_vocabulary_size=0,
    )
    table_list = [user_table, item_table]
    train_iterator = train_model = None
    if use_mode in (UseMode.TRAIN, UseMode.LOAD_AND_TRAIN):
        train_iterator, train_model, _ = build_graph(
            table_list, True, train_specs, access_and_evict
        )
    eval_iterator, eval_model, _ = build_graph(table_list, False, eval_specs, access_and_evict)
    run_mode = RunMode(
        table_list, optimizer_list, train_model, eval_model, train_iterator, eval_iterator
    )
    if not MODIFY_GRAPH_FLAG:
        start_asc_pipeline()
    if MODIFY_GRAPH_FLAG and use_mode == UseMode.PREDICT:
        modify_graph_and_start_emb_cache(dump_graph=False)
    if use_mode in (UseMode.TRAIN, UseMode.LOAD_AND_TRAIN):
        run_mode.train(if_load, model_file)
    else:
        run_mode.predict(model_file)
    RESULTS["eval_losses"] = run_mode.eval_losses
    RESULTS["tables"] = {t.table_name: run_mode.session.run(t.export()[:2]) for t in table_list}
    RESULTS["if_load"] = ConfigInitializer.get_instance().if_load
    run_mode.session.close()
    terminate_config_initializer()
    logger.info("Demo done!")


if __name__ == "__main__":
    main()
