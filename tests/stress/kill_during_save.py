"""Stress: SIGKILL a process at random moments while Saver.save writes a large table.

A writer process sets its table to a closed-form state per step (every key's embedding and
both LazyAdam slots are functions of the key and the step), sets the global step and saves,
step after step. The driver kills it at a random moment, then a verifier process restores
`tf.train.latest_checkpoint` and checks that every row and slot is exactly the saved step's,
and that no temporary directory of the dead writer outlives that restore.

    python tests/stress/kill_during_save.py [--rows 3000000] [--kills 20] [--seed 0]

Prints one summary line; exits non-zero on any loss.
"""
import argparse
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

DIM = 8


def _graph(rows):
    """The writer's and verifier's graph: (ops dict, saver)."""
    import numpy as np
    import tensorflow as tf
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import lazy_adam_by_addr
    from rec_sdk.util.initialize import init

    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, DIM, "stress", tf.compat.v1.zeros_initializer(),
                         device_vocabulary_size=rows)
    step = tf.compat.v1.train.get_or_create_global_step()
    keys = tf.constant(np.arange(rows, dtype=np.int64) * 7 - rows)
    step_value = tf.compat.v1.placeholder(tf.int64, [])
    # The state of step s: value = s + key % 997 / 1000 (+ 0.25 and + 0.5 for the slots).
    base = tf.cast(step_value, tf.float32) + tf.cast(keys % 997, tf.float32) / 1000.0
    values = tf.tile(base[:, None], [1, DIM])
    slots = tf.stack([values + 0.25, values + 0.5])
    emb = sparse_lookup(table, tf.constant([0], tf.int64), name="attach")
    addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")
    grads = tf.gradients(tf.reduce_sum(emb),
                         tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB"))
    attach = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1).apply_gradients(
        zip(grads, addresses))
    write = tf.group(table.import_rows(keys, values, slots),
                     tf.compat.v1.assign(step, step_value))
    ops = {"attach": attach, "write": write, "step": step, "step_value": step_value,
           "export": table.export(), "keys": keys}
    return ops, tf.compat.v1.train.Saver(max_to_keep=2)


def _session():
    import tensorflow as tf
    return tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2))


def writer(directory, rows, first_step):
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    ops, saver = _graph(rows)
    with _session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(ops["attach"])
        step = first_step
        while True:
            sess.run(ops["write"], {ops["step_value"]: step})
            saver.save(sess, os.path.join(directory, "model"), global_step=step)
            print("SAVED", step, flush=True)
            step += 1


def verifier(directory, rows):
    """Exit 0 when latest_checkpoint restores exactly; prints the step."""
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    ops, saver = _graph(rows)
    path = tf.train.latest_checkpoint(directory)
    if path is None:
        print("NOCHECKPOINT", flush=True)
        return 0
    with _session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.restore(sess, path)
        step = int(sess.run(ops["step"]))
        keys, values, slots = sess.run(ops["export"])
    order = np.argsort(keys)
    keys, values, slots = keys[order], values[order], slots[:, order]
    expected_keys = np.sort(np.arange(rows, dtype=np.int64) * 7 - rows)
    base = (np.float32(step) + (expected_keys % 997).astype(np.float32) / np.float32(1000.0))
    want = np.tile(base[:, None], [1, DIM]).astype(np.float32)
    ok = (np.array_equal(keys, expected_keys) and np.array_equal(values, want)
          and np.array_equal(slots[0], want + np.float32(0.25))
          and np.array_equal(slots[1], want + np.float32(0.5)))
    leftovers = glob.glob(os.path.join(directory, "*.tmp-*"))
    print("RESTORED", step, "EXACT" if ok else "MISMATCH", "LEFTOVERS", len(leftovers),
          flush=True)
    return 0 if ok and not leftovers else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--role", choices=["driver", "writer", "verifier"], default="driver")
    parser.add_argument("--dir")
    parser.add_argument("--first-step", type=int, default=1)
    args = parser.parse_args()
    if args.role == "writer":
        return writer(args.dir, args.rows, args.first_step)
    if args.role == "verifier":
        return verifier(args.dir, args.rows)

    rng = random.Random(args.seed)
    start = time.time()
    me = [sys.executable, os.path.abspath(__file__), "--rows", str(args.rows)]
    survived, problems, steps = 0, [], []
    with tempfile.TemporaryDirectory(prefix="rec_sdk_kill_") as directory:
        next_step = 1
        for kill in range(args.kills):
            child = subprocess.Popen(me + ["--role", "writer", "--dir", directory,
                                           "--first-step", str(next_step)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
            try:
                # Let it save at least once, then kill it at a random moment of a later save.
                first = child.stdout.readline()
                if not first.startswith("SAVED"):
                    problems.append("writer %d did not save: %r" % (kill, first))
                    continue
                time.sleep(rng.uniform(0.0, 1.5))
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
            check = subprocess.run(me + ["--role", "verifier", "--dir", directory],
                                   capture_output=True, text=True, timeout=600)
            line = ([l for l in check.stdout.splitlines() if l.startswith("RESTORED")]
                    or [check.stdout.strip() or check.stderr.strip()[-500:]])[0]
            if check.returncode != 0:
                problems.append("after kill %d: %s" % (kill, line))
                continue
            survived += 1
            steps.append(int(line.split()[1]))
            next_step = steps[-1] + 1
    seconds = time.time() - start
    print("kill_during_save: %d of %d kills survived (latest checkpoint restored exactly, no "
          "leftover temporary directory), rows=%d with 2 slots, steps restored %s, %.0f s%s"
          % (survived, args.kills, args.rows, steps, seconds,
             "" if not problems else "; LOSS: " + "; ".join(problems)))
    return 0 if survived == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
