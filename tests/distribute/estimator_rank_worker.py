"""A rank of tests/test_distribute.py's tf.estimator test: rank_worker.py's model (a table
from create_table with admission, two lookups, lazy Adam; a dense layer on gradients summed
by hccl_ops.allreduce; EvictHook) in a model_fn, trained by Estimator.train with TF_CONFIG.

    python estimator_rank_worker.py MODEL_DIR [--local N] [--steps S]

With TF_CONFIG (a chief and workers) this process is one rank and trains on its own batches;
with --local N one process trains on the batches of N ranks at once. The chief writes the
checkpoint (every table shard) to MODEL_DIR at the end.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_worker import BATCH, DIM, batch, global_batch  # noqa: E402

import rec_sdk  # noqa: E402
import rec_sdk.distribute as dist  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.core.feature_process import EvictHook  # noqa: E402
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address  # noqa: E402
from rec_sdk.util.communication import hccl_ops  # noqa: E402
from rec_sdk.util.initialize import init  # noqa: E402
from rec_sdk.util.tf_version_adapter import hccl_ops as hccl_adapter  # noqa: E402

tf.compat.v1.disable_eager_execution()


def model_fn(features, labels, mode):
    ranks = hccl_ops.get_rank_size()
    table = create_table(
        tf.int64,
        DIM,
        "emb",
        tf.compat.v1.truncated_normal_initializer(seed=3),
        device_vocabulary_size=1000,
        steps_to_live=3,
        all2all_gradients_op="sum_gradients_and_div_by_ranksize",
    )
    admit = {"access_threshold": 2}
    emb_a = sparse_lookup(table, features["ids_a"], name="lookup_a", access_and_evict_config=admit)
    emb_b = sparse_lookup(table, features["ids_b"], name="lookup_b", access_and_evict_config=admit)
    x = tf.concat([tf.reduce_sum(emb_a, 1), tf.reduce_sum(emb_b, 1)], 1)
    w = tf.compat.v1.get_variable(
        "w",
        [2 * DIM, 1],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=5 + hccl_ops.get_rank_id()),
    )
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.matmul(x, w))
    )
    sparse_train = create_hash_optimizer_by_address(learning_rate=0.05).apply_gradients(
        zip(
            tf.gradients(loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)),
            tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET),
        )
    )
    dense_grad = hccl_adapter.allreduce(tf.gradients(loss, w)[0], "sum") / ranks
    step = tf.compat.v1.train.get_global_step()
    with tf.control_dependencies([sparse_train]):
        train = tf.group(w.assign_sub(0.1 * dense_grad), step.assign_add(1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--local", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    server = None if args.local else dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank = hccl_ops.get_rank_id()
    steps = [
        batch(rank, s) if not args.local else global_batch(args.local, s) for s in range(args.steps)
    ]

    def input_fn():
        data = tf.data.Dataset.from_tensor_slices(
            (
                {
                    "ids_a": np.stack([s[0] for s in steps]),
                    "ids_b": np.stack([s[1] for s in steps]),
                },
                np.stack([s[2] for s in steps]),
            )
        )
        return data

    config = tf.estimator.RunConfig(
        model_dir=args.model_dir,
        save_checkpoints_steps=args.steps,
        save_summary_steps=None,
        log_step_count_steps=None,
        session_config=dist.worker_config(server, collective=True) if server else None,
    )
    estimator = tf.estimator.Estimator(model_fn, config=config)
    estimator.train(
        input_fn, steps=args.steps, hooks=[EvictHook(evict_enable=True, evict_step_interval=4)]
    )
    print(
        "rank %d of %d trained %d steps (rows of %d)"
        % (rank, hccl_ops.get_rank_size(), args.steps, BATCH),
        flush=True,
    )


if __name__ == "__main__":
    main()
