"""Many tables of mixed dims and optimizers over ranks (tests/test_distribute.py): one rank of
a cluster (TF_CONFIG), or with --local N one process training the N ranks' global batch.

    tables_rank_worker.py OUT [--local N] [--tables T] [--steps S] [--empty R] [--ops]
                          [--leave-before train|eval] [--fail-at STEP]

Table t has dim 4 * (1 + t % 4), keys from its own range (some negative), and is trained by
lazy Adam (even t) or SGD (odd t), each optimizer over its tables' lookups in one minimize;
rank r's batch of a step is the r-th slice of the global one (--empty R: rank R's batches
are empty, and the global batch holds the other ranks' slices only). After training, one eval
lookup per table (is_train=False, of known and unknown keys) runs, twice. Saves every
table's export (this rank's shard), the losses, the eval rows and the collectives each
traced step ran (the training steps', then the two evaluations') to OUT ({rank} replaced).
--leave-before train: rank 1 stops one training step before the others (and evaluates
nothing); --leave-before eval: rank 1 trains every step but leaves before the evaluation.
--fail-at STEP: rank 1 raises an error before that step.
--ops: builds the graph (and finalizes it as MonitoredTrainingSession does) and writes {"ops":
the ops a training step runs (those the train op depends on), "collectives": how many of them
are collectives, "eval_collectives": those of the evaluation lookups, "observes": the
size-hint observations of the graph, "observes_after_read": those ordered after their read}
as JSON to OUT instead.
"""

import argparse
import faulthandler
import json

import numpy as np
import tensorflow as tf

import rec_sdk.distribute as dist
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from rec_sdk.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from rec_sdk.util.communication import hccl_ops
from rec_sdk.util.initialize import init

BATCH = 6  # rows per rank


def dim_of(t):
    return 4 * (1 + t % 4)


def global_ids(t, step, rows):
    rng = np.random.default_rng(7919 * step + t)
    return rng.integers(-3, 25 + 3 * t, size=(rows, 2)).astype(np.int64)


def step_ops(graph, fetch):
    """The ops `fetch` depends on (data and control inputs, transitively)."""
    seen, todo = set(), [fetch]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return [graph.get_operation_by_name(name) for name in seen]


TRACE = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)


def collectives_run(metadata):
    """How many collective ops a traced step ran (on this process's devices), and the bytes
    their outputs hold (what this rank received)."""
    nodes = [
        node
        for device in metadata.step_stats.dev_stats
        for node in device.node_stats
        if "Collective" in node.node_name
    ]
    return len(nodes), sum(
        output.tensor_description.allocation_description.requested_bytes
        for node in nodes
        for output in node.output
    )


def main():
    # A rank still running after 240 s prints where each of its Python threads is (the
    # harness kills it at 300 s): which session run waits.
    faulthandler.dump_traceback_later(240, exit=False)
    tf.compat.v1.disable_eager_execution()
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--local", type=int, default=0)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--empty", type=int, default=-1)
    parser.add_argument("--ops", action="store_true")
    parser.add_argument("--emb-dtype", default="float32")
    parser.add_argument("--leave-before", choices=("train", "eval"))
    parser.add_argument(
        "--fail-at", type=int, default=-1, help="rank 1 raises an error before this step"
    )
    args = parser.parse_args()
    server = None
    if not args.local and not args.ops:
        server = dist.start_server(collective=True)
    init(use_dynamic_expansion=True)
    rank, ranks = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
    tables, ids, embs = [], [], []
    for t in range(args.tables):
        tables.append(
            create_table(
                tf.int64,
                dim_of(t),
                "t%d" % t,
                tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=t),
                device_vocabulary_size=256,
                emb_dtype=args.emb_dtype,
            )
        )
        ids.append(tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids%d" % t))
        embs.append(sparse_lookup(tables[-1], ids[-1], name="lookup%d" % t))
    loss = tf.add_n([tf.reduce_sum(tf.square(e)) * (1.0 + 0.1 * t) for t, e in enumerate(embs)])
    adam = create_hash_optimizer_by_address(learning_rate=0.05)
    sgd = create_hash_optimizer_by_addr(learning_rate=0.1)
    train = [adam.minimize(loss, var_list=tables[0::2])]
    if args.tables > 1:
        train.append(sgd.minimize(loss, var_list=tables[1::2]))
    train = tf.group(train)
    eval_keys = [np.arange(-4, 30 + 3 * t, dtype=np.int64)[rank::ranks] for t in range(args.tables)]
    evals = [
        sparse_lookup(table, tf.constant(keys), is_train=False, name="eval%d" % t)
        for t, (table, keys) in enumerate(zip(tables, eval_keys))
    ]
    exports = [table.export() for table in tables]
    if args.ops:
        graph = tf.compat.v1.get_default_graph()
        evaluate = tf.group(evals)
        tf.compat.v1.train.Scaffold().finalize()
        ops = step_ops(graph, train)
        evaluation = step_ops(graph, evaluate)
        # Each step's hint is read before the step's need changes it (ranks.py _send_keys).
        observes = [op for op in graph.get_operations() if op.type.endswith("RankObserveSize")]
        read_first = [
            op
            for op in observes
            if any(
                c.type.endswith("RankSizeClass") and c.get_attr("hint") == op.get_attr("hint")
                for c in op.control_inputs
            )
        ]
        with open(args.out, "w") as f:
            json.dump(
                {
                    "observes": len(observes),
                    "observes_after_read": len(read_first),
                    "ops": len(ops),
                    "collectives": sum(op.type.startswith("Collective") for op in ops),
                    "eval_collectives": sum(op.type.startswith("Collective") for op in evaluation),
                },
                f,
            )
        return

    def feed(step):
        out = {}
        for t, placeholder in enumerate(ids):
            full = global_ids(t, step, BATCH * (args.local or ranks))
            parts = [full[r * BATCH : (r + 1) * BATCH] for r in range(args.local or ranks)]
            if 0 <= args.empty < len(parts):
                parts[args.empty] = parts[args.empty][:0]
            out[placeholder] = np.concatenate(parts) if args.local else parts[rank]
        return out

    config = dist.worker_config(server, collective=True) if server else None
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target if server else "",
        is_chief=rank == 0,
        config=config,
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    ) as sess:
        leaving = rank == 1 and args.leave_before
        ran = []  # the collectives each step ran (the training steps', then the evaluation's)
        for step in range(args.steps - (leaving == "train")):
            if rank == 1 and step == args.fail_at:
                raise RuntimeError("rank 1 fails at step %d" % step)
            metadata = tf.compat.v1.RunMetadata()
            losses.append(
                sess.run([train, loss], feed(step), options=TRACE, run_metadata=metadata)[1]
            )
            ran.append(collectives_run(metadata))
        if leaving:
            print("rank 1 leaves before the others' %s" % leaving, flush=True)
            return
        for _ in range(2):
            metadata = tf.compat.v1.RunMetadata()
            evaluated = sess.run(evals, options=TRACE, run_metadata=metadata)
            ran.append(collectives_run(metadata))
        exported = sess.run(exports)
    out = {
        "losses": np.array(losses),
        "collectives_run": np.array([r[0] for r in ran]),
        "received_bytes": np.array([r[1] for r in ran]),
    }
    for t, ((keys, values, slots), rows_) in enumerate(zip(exported, evaluated)):
        order = np.argsort(keys)
        out["keys%d" % t], out["values%d" % t] = keys[order], values[order]
        out["slots%d" % t], out["eval%d" % t] = slots[:, order], rows_
    np.savez(args.out.replace("{rank}", str(rank)), **out)


if __name__ == "__main__":
    main()
