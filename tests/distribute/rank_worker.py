"""A rank of tests/test_distribute.py's SDK-API tests: a CTR model whose table is created with
create_table under init() and trained by lazy Adam (feature admission on, two lookups of the
table per step, keys unseen for 3 steps evicted by an EvictHook every 4 steps), its dense
layer by gradient descent on gradients summed with hccl_ops.allreduce, in
MonitoredTrainingSession.

    python rank_worker.py OUT.npz [--local N] [--steps S] [--checkpoint DIR] [--save]
                          [--save-every K] [--die-at STEP] [--last-step N]
                          [--input feed|spec|modify] [--table-gradients] [--skew]

"{rank}" in OUT is replaced by the rank. --input: fed placeholders (default), FeatureSpec
lookups on a dataset mapped with get_asc_insert_func, or tensor lookups with
modify_graph=True and modify_graph_and_start_emb_cache(). --table-gradients: the sparse
optimizer's minimize(loss, var_list=[table]) (tf.gradients of the table) instead of the
gradients of the lookup collections.

With TF_CONFIG this process is one rank of the cluster's training tasks; it trains on its own
batches. With --local N one process trains on the batches of all N ranks at once (their
concatenation: the global batch). --steps 0 restores DIR and exports only. --save: rank 0
saves DIR at the end (MonitoredTrainingSession's checkpoint); every rank restores DIR when it
holds a checkpoint. --last-step N: train from the restored global step up to step N, on the
batches of those steps (a resumed run goes on where it stopped; prints "RESUMED <step>"), and
--die-at fires only in the first start (REC_SDK_RESTART unset or 0). Writes the losses, the
dense weights, an eval lookup and this process's shard (keys, rows, slots, admission counts)
to OUT.npz.
"""

import argparse
import os
import signal

import numpy as np
import tensorflow as tf

import rec_sdk
import rec_sdk.distribute as dist
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.core.asc.helper import get_asc_insert_func
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.core.feature_process import EvictHook
from rec_sdk.graph.modifier import modify_graph_and_start_emb_cache
from rec_sdk.ops import table_ops
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.initialize import init
from rec_sdk.util.tf_version_adapter import hccl_ops as hccl_adapter

tf.compat.v1.disable_eager_execution()
BATCH, VOCAB, DIM = 8, 40, 4
EVAL_IDS = np.arange(-6, VOCAB + 6, dtype=np.int64).reshape(-1, 4)


def batch(rank, step, skew=0):
    """Rank `rank`'s batch of `step`; with skew=N (the rank count), rank 1's keys are all
    multiples of N: every one of them belongs to rank 0, the other owners get none."""
    rng = np.random.default_rng(1000 * step + rank)
    ids_a = rng.integers(-5, VOCAB // 2, size=(BATCH, 3)).astype(np.int64)
    ids_b = rng.integers(VOCAB // 2, VOCAB, size=(BATCH, 2)).astype(np.int64)
    labels = (rng.random((BATCH, 1)) < 0.4).astype(np.float32)
    if skew and rank == 1:
        ids_a, ids_b = ids_a - np.fmod(ids_a, skew), ids_b - np.fmod(ids_b, skew)
    return ids_a, ids_b, labels


def global_batch(ranks, step, skew=0):
    parts = [batch(r, step, skew) for r in range(ranks)]
    return tuple(np.concatenate(p, 0) for p in zip(*parts))


SPECS = [
    FeatureSpec("ids_a", table_name="emb", access_threshold=2),
    FeatureSpec("ids_b", table_name="emb", access_threshold=2),
]


def inputs(args, rank):
    """(ids_a, ids_b, labels, feed(step) -> feed_dict, the iterator's batch or None): fed
    placeholders, or a one-shot iterator over the steps' batches (mapped with
    get_asc_insert_func in FeatureSpec mode)."""
    rows = (args.local or 1) * BATCH
    skew = (args.local or args.ranks) if args.skew else 0
    steps = [
        batch(rank, s, skew) if not args.local else global_batch(args.local, s, skew)
        for s in range(max(args.steps, 1))
    ]
    if args.input == "feed":
        ids_a = tf.compat.v1.placeholder(tf.int64, [rows, 3])
        ids_b = tf.compat.v1.placeholder(tf.int64, [rows, 2])
        labels = tf.compat.v1.placeholder(tf.float32, [rows, 1])
        return ids_a, ids_b, labels, lambda s: dict(zip((ids_a, ids_b, labels), steps[s])), None
    dataset = tf.data.Dataset.from_tensor_slices(
        {
            key: np.stack([step[i] for step in steps])
            for i, key in enumerate(("ids_a", "ids_b", "labels"))
        }
    )
    if args.input == "spec":
        dataset = dataset.map(get_asc_insert_func(tgt_key_specs=SPECS, is_training=True))
    got = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return got["ids_a"], got["ids_b"], got["labels"], lambda s: None, got


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--local", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--input", choices=("feed", "spec", "modify"), default="feed")
    parser.add_argument("--table-gradients", action="store_true")
    parser.add_argument(
        "--skew", action="store_true", help="rank 1's keys all belong to rank 0 (see batch)"
    )
    parser.add_argument(
        "--die-at", type=int, default=-1, help="rank 1 kills itself (SIGKILL) before this step"
    )
    parser.add_argument("--last-step", type=int, default=0)
    args = parser.parse_args()
    if args.last_step:
        args.steps = args.last_step
        if int(os.environ.get("REC_SDK_RESTART", "0")):
            args.die_at = -1
    server = None
    if not args.local:
        server = dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    args.ranks = ranks
    ids_a, ids_b, labels, feed, batch_ = inputs(args, rank)
    step = tf.compat.v1.train.get_or_create_global_step()
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
    if args.input == "spec":
        emb_a, emb_b = (
            sparse_lookup(table, spec, batch=batch_, name="lookup_" + spec.name[-1])
            for spec in SPECS
        )
    else:
        modify = args.input == "modify"
        emb_a = sparse_lookup(
            table,
            ids_a,
            name="lookup_a",
            access_and_evict_config=admit,
            modify_graph=modify,
            batch=batch_,
        )
        emb_b = sparse_lookup(
            table,
            ids_b,
            name="lookup_b",
            access_and_evict_config=admit,
            modify_graph=modify,
            batch=batch_,
        )
    features = tf.concat([tf.reduce_sum(emb_a, 1), tf.reduce_sum(emb_b, 1)], 1)
    # Each rank initialises w differently: MonitoredTrainingSession's local initialisation
    # sets every rank's variables to rank 0's (rec_sdk broadcasts them).
    w = tf.compat.v1.get_variable(
        "w", [2 * DIM, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=5 + rank)
    )
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.matmul(features, w))
    )
    sparse_opt = create_hash_optimizer_by_address(learning_rate=0.05)
    if args.table_gradients:  # tf.gradients(loss, table): one IndexedSlices for both lookups
        sparse_train = sparse_opt.minimize(loss, var_list=[table])
    else:
        local_embs = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        sparse_train = sparse_opt.apply_gradients(zip(tf.gradients(loss, local_embs), addresses))
    dense_grad = hccl_adapter.allreduce(tf.gradients(loss, w)[0], "sum") / ranks
    with tf.control_dependencies([sparse_train]):
        train = tf.group(w.assign_sub(0.1 * dense_grad), step.assign_add(1))
    eval_emb = sparse_lookup(
        table,
        tf.constant(EVAL_IDS[rank::ranks]),
        is_train=False,
        name="eval",
        serving_default_value=-1.0,
    )
    export = table.export()
    if args.input == "modify":
        modify_graph_and_start_emb_cache()
    access = table_ops.export_access(table.handle)

    config = dist.worker_config(server, collective=True) if server else None
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target if server else "",
        is_chief=rank == 0,
        checkpoint_dir=args.checkpoint,
        save_checkpoint_steps=(args.save_every or args.steps)
        if (args.save and rank == 0)
        else None,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
        config=config,
        hooks=[EvictHook(evict_enable=True, evict_step_interval=4)],
    ) as sess:
        first = 0
        if args.last_step:
            first = sess.run(step)
            print("RESUMED %d" % first, flush=True)
        for s in range(first, args.steps):
            if s == args.die_at and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            _, value = sess.run([train, loss], feed(s))
            losses.append(value)
        # The eval lookup's exchange waits for every rank (rank 0 restores every shard
        # before its first step); the export comes after it.
        evaluated = sess.run(eval_emb)
        (keys, values, slots), (akeys, _, counts), weights, last = sess.run(
            [export, access, w, step]
        )
    order, aorder = np.argsort(keys), np.argsort(akeys)
    np.savez(
        args.out.replace("{rank}", str(rank)),
        losses=np.array(losses),
        w=weights,
        eval=evaluated,
        keys=keys[order],
        values=values[order],
        slots=slots[:, order],
        access_keys=akeys[aorder],
        counts=counts[aorder],
        rank=rank,
        ranks=ranks,
        step=last,
    )


if __name__ == "__main__":
    main()
