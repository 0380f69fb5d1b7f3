"""Stress: SIGKILL a process at random moments while Saver.save writes a large table.

A writer process sets its table to a closed-form state per step (every key's embedding and
both LazyAdam slots are functions of the key and the step, and so are its admission count and
last-seen clock, set by a training lookup of every key), sets the global step and saves, step
after step. The driver kills it at a random moment, then a verifier process restores
`tf.train.latest_checkpoint` and checks that every row and slot is exactly the saved step's,
that every count and clock is too (the restored table saved again: its counts.bin and
last_seen.bin, see tf_ops/core/checkpoint.h), and that no temporary directory of the dead
writer outlives that restore.

    python tests/stress/kill_during_save.py [--rows 3000000] [--kills 20] [--seed 0]

Prints one summary line; exits non-zero on any loss.
"""

import argparse
import glob
import os
import random
import shutil
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
    table = create_table(
        tf.int64, DIM, "stress", tf.compat.v1.zeros_initializer(), device_vocabulary_size=rows
    )
    # Rows come from import_rows; the keys of a training lookup that have no row stay pending
    # admission (their counts stay below the threshold); nothing is evicted (no evict op).
    config = {"access_threshold": 10**6, "eviction_threshold": 10**9}
    table.configure_admission("kill_during_save", **config)
    step = tf.compat.v1.train.get_or_create_global_step()
    keys = tf.constant(np.arange(rows, dtype=np.int64) * 7 - rows)
    step_value = tf.compat.v1.placeholder(tf.int64, [])
    # The state of step s: value = s + key % 997 / 1000 (+ 0.25 and + 0.5 for the slots).
    base = tf.cast(step_value, tf.float32) + tf.cast(keys % 997, tf.float32) / 1000.0
    values = tf.tile(base[:, None], [1, DIM])
    slots = tf.stack([values + 0.25, values + 0.5])
    seen = tf.concat([keys, _pending_keys(rows)], 0)
    counts, clocks = _counts_and_clocks(seen, step_value)
    touch = table.find_or_insert(seen, True, counts=counts, times=clocks, name="touch")
    emb = sparse_lookup(
        table,
        tf.constant([0], tf.int64),
        name="attach",
        access_and_evict_config=config,
        timestamps=tf.zeros([1], tf.int64),
    )
    addresses = tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET")
    grads = tf.gradients(
        tf.reduce_sum(emb), tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB")
    )
    attach = lazy_adam_by_addr.create_hash_optimizer_by_address(0.1).apply_gradients(
        zip(grads, addresses)
    )
    write = tf.group(table.import_rows(keys, values, slots), tf.compat.v1.assign(step, step_value))
    ops = {
        "attach": attach,
        "write": write,
        "touch": touch,
        "step": step,
        "step_value": step_value,
        "export": table.export(),
        "keys": keys,
    }
    return ops, tf.compat.v1.train.Saver(max_to_keep=2)


def _pending_keys(rows):
    """Keys counting towards admission (none is a key of a row: another residue mod 7)."""
    import numpy as np

    return np.arange(rows // 10, dtype=np.int64) * 7 - rows + 3


def _counts_and_clocks(keys, step):
    """The admission count and clock each key gets at `step` (tensors or NumPy arrays):
    import_rows replaces the table's contents (rows and pending keys), then one training
    lookup gives pending keys this count and every key this clock (newer than any of an
    earlier step). Rows keep no count (the table does not track accesses)."""
    return keys % 5 + 1 + step % 3, step * 10 + (keys // 7) % 7


def _session():
    import tensorflow as tf

    return tf.compat.v1.Session(
        config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
        )
    )


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
            sess.run(ops["touch"], {ops["step_value"]: step})
            saver.save(sess, os.path.join(directory, "model"), global_step=step)
            print("SAVED", step, flush=True)
            step += 1


def verifier(directory, rows):
    """Exit 0 when latest_checkpoint restores exactly; prints the step."""
    import numpy as np
    import tensorflow as tf

    from rec_sdk.saver import save_tables

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
        again = os.path.join(directory, "verifier-%d" % os.getpid())
        save_tables(sess, again)
    table_dir = os.path.join(again, "stress")
    saved_keys = np.fromfile(os.path.join(table_dir, "keys.bin"), "<i8")
    saved_counts = np.fromfile(os.path.join(table_dir, "counts.bin"), "<u4")
    saved_clocks = np.fromfile(os.path.join(table_dir, "last_seen.bin"), "<i8")
    pending = np.fromfile(os.path.join(table_dir, "pending.bin"), "<i8").reshape(-1, 3)
    shutil.rmtree(again)
    pending = pending[np.argsort(pending[:, 0])]
    want_counts, want_clocks = _counts_and_clocks(pending[:, 0], step)
    counts_ok = (
        np.array_equal(pending[:, 0], np.sort(_pending_keys(rows)))
        and np.array_equal(pending[:, 1], want_counts)
        and np.array_equal(pending[:, 2], want_clocks)
        and not np.any(saved_counts)
        and np.array_equal(saved_clocks, _counts_and_clocks(saved_keys, step)[1])
    )
    order = np.argsort(keys)
    keys, values, slots = keys[order], values[order], slots[:, order]
    expected_keys = np.sort(np.arange(rows, dtype=np.int64) * 7 - rows)
    base = np.float32(step) + (expected_keys % 997).astype(np.float32) / np.float32(1000.0)
    want = np.tile(base[:, None], [1, DIM]).astype(np.float32)
    ok = (
        counts_ok
        and np.array_equal(keys, expected_keys)
        and np.array_equal(values, want)
        and np.array_equal(slots[0], want + np.float32(0.25))
        and np.array_equal(slots[1], want + np.float32(0.5))
    )
    leftovers = glob.glob(os.path.join(directory, "*.tmp-*"))
    print("RESTORED", step, "EXACT" if ok else "MISMATCH", "LEFTOVERS", len(leftovers), flush=True)
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
            child = subprocess.Popen(
                me + ["--role", "writer", "--dir", directory, "--first-step", str(next_step)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
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
            check = subprocess.run(
                me + ["--role", "verifier", "--dir", directory],
                capture_output=True,
                text=True,
                timeout=600,
            )
            line = (
                [ln for ln in check.stdout.splitlines() if ln.startswith("RESTORED")]
                or [check.stdout.strip() or check.stderr.strip()[-500:]]
            )[0]
            if check.returncode != 0:
                problems.append("after kill %d: %s" % (kill, line))
                continue
            survived += 1
            steps.append(int(line.split()[1]))
            next_step = steps[-1] + 1
    seconds = time.time() - start
    print(
        "kill_during_save: %d of %d kills survived (latest checkpoint restored exactly: "
        "rows, slots, counts and clocks; no leftover temporary directory), rows=%d with 2 slots, "
        "steps restored %s, %.0f s%s"
        % (
            survived,
            args.kills,
            args.rows,
            steps,
            seconds,
            "" if not problems else "; LOSS: " + "; ".join(problems),
        )
    )
    return 0 if survived == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
