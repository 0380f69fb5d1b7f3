"""One rank of the chaos test (tests/test_chaos.py): two tables sharded over the ranks, trained
by two optimizers (lazy Adam and SGD) from a tf.data pipeline of this rank's batches, a dense
weight averaged with all_reduce_many, an evaluation every --eval-every steps and a checkpoint
every --save-every steps (rank 0, MonitoredTrainingSession), then one fault on --fault-rank:

    chaos_worker.py CKPT --steps S --fault KIND --fault-rank R --fault-step K
                    [--fault-phase train|eval|save] [--eval-every E] [--save-every V]

KIND: none; kill (SIGKILL itself); stop_long / stop_short (SIGSTOP itself, a helper sends
SIGCONT after --stop-seconds); slow (sleeps --stop-seconds: a stalled input or a long save,
alive all along); leave (closes its session before step K); extra (runs two
steps more than the others); uneven (its input ends before step K); phase (evaluates where
the others train step K); loss (runs only the loss, the forward exchange included, where
the others train step K); optimizer (runs one optimizer of the two where the others train
step K); error (raises before step K). The fault fires before the step's
training run (phase train), before its evaluation (eval), or after its save (save; rank 0
saves). Prints "FAULT <kind> <time.time()>" when it fires, "TRAINED <steps>" at the end.
"""

import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

import rec_sdk.distribute as dist
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.initialize import init

tf.compat.v1.disable_eager_execution()
BATCH = 8


def fault(kind, seconds):
    print("FAULT %s %.3f" % (kind, time.time()), flush=True)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind in ("stop_long", "stop_short"):
        subprocess.Popen(
            ["sh", "-c", "sleep %s; kill -CONT %d" % (seconds, os.getpid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "slow":
        time.sleep(seconds)
    if kind == "error":
        raise RuntimeError("chaos: rank fails on purpose")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=3)
    parser.add_argument("--fault-phase", default="train")
    parser.add_argument("--stop-seconds", type=float, default=2.0)
    # Rank 0's saves start this many seconds late (a large table's final save).
    parser.add_argument("--slow-save", type=float, default=0.0)
    args = parser.parse_args()
    # A rank still running after 60 s prints where its Python threads are (a hang's report).
    faulthandler.dump_traceback_later(60, exit=False)
    server = dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank, ranks = dist.rank_of(dist.current_task())
    if rank == 0 and args.slow_save:
        save = tf.compat.v1.train.Saver.save

        def slow_save(self, *a, **k):
            time.sleep(args.slow_save)
            return save(self, *a, **k)

        tf.compat.v1.train.Saver.save = slow_save
    mine = rank == args.fault_rank and args.fault != "none"
    steps = args.steps + (2 if mine and args.fault == "extra" else 0)
    batches = args.fault_step if mine and args.fault == "uneven" else steps

    def keys(step):
        rng = np.random.default_rng(7919 * step + 31 * rank)
        return rng.integers(-20, 60, size=(BATCH, 2)).astype(np.int64)

    data = tf.data.Dataset.from_tensor_slices(np.stack([keys(s) for s in range(batches)]))
    ids = tf.compat.v1.data.make_one_shot_iterator(data).get_next()
    tables = [
        create_table(
            tf.int64,
            4,
            "t%d" % t,
            tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=t),
            device_vocabulary_size=256,
        )
        for t in range(2)
    ]
    embs = [sparse_lookup(t, ids + 100 * i, name="lookup%d" % i) for i, t in enumerate(tables)]
    dense = tf.compat.v1.get_variable("dense", [4], initializer=tf.compat.v1.ones_initializer())
    loss = tf.add_n([tf.reduce_sum(tf.square(e * dense)) for e in embs])
    (grad,) = dist.all_reduce_many(tf.gradients(loss, [dense]), "mean")
    first = create_hash_optimizer_by_address(learning_rate=0.05).minimize(loss, var_list=tables[:1])
    train = tf.group(
        first,
        create_hash_optimizer_by_addr(learning_rate=0.1).minimize(loss, var_list=tables[1:]),
        tf.compat.v1.assign_sub(dense, 0.01 * grad),
        tf.compat.v1.train.get_or_create_global_step().assign_add(1),
    )
    # What a rank with the "loss" or "optimizer" fault runs instead of `train`.
    partial = {"loss": loss, "optimizer": first}
    eval_keys = tf.constant(np.arange(-10, 30, dtype=np.int64)[rank::ranks])
    evaluate = [
        sparse_lookup(t, eval_keys, is_train=False, name="eval%d" % i) for i, t in enumerate(tables)
    ]
    trained = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=rank == 0,
        config=dist.worker_config(server, collective=True),
        checkpoint_dir=args.ckpt,
        save_checkpoint_steps=args.save_every,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    ) as sess:
        for step in range(steps):
            if sess.should_stop():
                break
            here = mine and step == args.fault_step
            if mine and args.fault == "extra" and step == args.steps:
                print("FAULT extra %.3f" % time.time(), flush=True)  # its first extra step
            if here and args.fault == "uneven":
                print("FAULT uneven %.3f" % time.time(), flush=True)  # its input ends here
            if here and args.fault == "leave":
                print("FAULT leave %.3f" % time.time(), flush=True)
                break
            if (
                here
                and args.fault_phase == "train"
                and args.fault not in ("extra", "uneven", *partial)
            ):
                fault(args.fault, args.stop_seconds)
            if here and args.fault == "phase":
                sess.run(evaluate)
            elif here and args.fault in partial:
                print("FAULT %s %.3f" % (args.fault, time.time()), flush=True)
                sess.run(partial[args.fault])
            else:
                sess.run(train)
                trained += 1
            if here and args.fault_phase == "save":
                fault(args.fault, args.stop_seconds)
            if (step + 1) % args.eval_every == 0:
                if here and args.fault_phase == "eval":
                    fault(args.fault, args.stop_seconds)
                sess.run(evaluate)
    print("TRAINED %d" % trained, flush=True)


if __name__ == "__main__":
    sys.exit(main())
