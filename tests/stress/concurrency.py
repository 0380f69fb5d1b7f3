"""Stress: threads and sessions racing on one table.

Two scenarios, each in its own child process (a crash or a hang is counted as a loss):

  sessions   Two sessions on one in-process TensorFlow server (so they share the server's
             table, as the workers of a cluster do), two training threads each, train one
             table with SGD (learning rate 1, no weight decay) on seeded batches drawn from a
             small key space (heavy overlap between threads), while a fifth thread saves the
             table (save_tables) again and again. The loss is the sum of the embeddings, so a
             step moves every row of its batch by exactly minus the key's count in the batch:
             at the end every row must equal minus the key's total count over all threads'
             steps, exactly (a lost update shows as a row short of it). Every checkpoint saved
             during training must restore, hold only keys that were trained, and rows whose
             values are integers between minus the key's total count and 0.
  eviction   One table with admission and eviction by timestamp (a clock that advances every
             step, eviction_threshold 2): training threads update keys of set A, an eviction
             thread evicts all the time (rows of A go while their steps are in flight), and a
             churn thread upserts keys of set B with values that encode the key and reads them
             back. Keys of B are never trained: a B row that reads anything but its own values
             is a foreign write. A rows start at 0 and only go down by whole numbers: a
             gathered A row with a positive or fractional value is a read of another key's row.
             An update whose rows were evicted meanwhile must fail with a stale-address error
             (InvalidArgument), which is counted, not a loss.

    python tests/stress/concurrency.py [--seconds 60] [--seed 0]

Prints one summary line; exits non-zero on any loss.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

DIM = 4
KEY_SPACE = 4096
BATCH = 512


def _session_config():
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)


def _train_graph(table, keys, **lookup_args):
    """SGD (learning rate 1) of sum(embeddings): (train op, embeddings)."""
    import tensorflow as tf

    from rec_sdk.core.embedding import sparse_lookup
    from rec_sdk.optimizers import gradient_descent_by_addr

    emb = sparse_lookup(table, keys, **lookup_args)
    grads = tf.gradients(
        tf.reduce_sum(emb), tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB")
    )
    optimizer = gradient_descent_by_addr.create_hash_optimizer_by_addr(1.0, weight_decay=0.0)
    train = optimizer.apply_gradients(
        zip(grads, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET"))
    )
    return train, emb


def sessions(seconds, seed, work):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk import saver as rec_saver
    from rec_sdk.core.embedding import create_table
    from rec_sdk.util.initialize import init, terminate_config_initializer

    init(use_dynamic_expansion=True)
    graph = tf.compat.v1.get_default_graph()
    table = create_table(
        tf.int64, DIM, "shared", tf.compat.v1.zeros_initializer(), device_vocabulary_size=KEY_SPACE
    )
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    train, _ = _train_graph(table, keys)
    export = table.export()
    server = tf.distribute.Server.create_local_server()
    sessions_ = [
        tf.compat.v1.Session(server.target, graph=graph, config=_session_config()) for _ in range(2)
    ]
    counts = [np.zeros(KEY_SPACE, np.int64) for _ in range(4)]
    # Steps TensorFlow's distributed runtime aborted ("The same RunGraph request was received
    # twice": its check of recent request ids, outside rec_sdk) may or may not have run.
    uncertain = [np.zeros(KEY_SPACE, np.int64) for _ in range(4)]
    aborted = [0] * 4
    steps = [0] * 4
    errors = []
    saves = []
    deadline = time.time() + seconds
    done = threading.Event()

    def trainer(index):
        sess = sessions_[index // 2]
        rng = np.random.default_rng((seed, index))
        try:
            while time.time() < deadline:
                batch = rng.integers(0, KEY_SPACE, BATCH)
                try:
                    sess.run(train, {keys: batch})
                except tf.errors.AbortedError:
                    uncertain[index] += np.bincount(batch, minlength=KEY_SPACE)
                    aborted[index] += 1
                    continue
                counts[index] += np.bincount(batch, minlength=KEY_SPACE)
                steps[index] += 1
        except Exception as e:  # pylint: disable=broad-except
            errors.append(
                "trainer %d after %d steps: %s %s"
                % (index, steps[index], type(e).__name__, str(e)[:300])
            )

    def saver():
        n = 0
        try:
            while not done.is_set():
                path = os.path.join(work, "save%d" % n)
                rec_saver.save_tables(sessions_[n % 2], path)
                saves.append(path)
                n += 1
                time.sleep(0.05)
        except Exception as e:  # pylint: disable=broad-except
            errors.append("saver: %r" % (e,))

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(4)]
    save_thread = threading.Thread(target=saver)
    for t in threads + [save_thread]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    save_thread.join()
    got_keys, got_values, _ = sessions_[0].run(export)
    for sess in sessions_:
        sess.close()
    total, maybe = sum(counts), sum(uncertain)
    expected_keys = np.flatnonzero(total)
    lost = wrong_keys = 0
    order = np.argsort(got_keys)
    got_keys, got_values = got_keys[order], got_values[order]
    if (
        np.setdiff1d(expected_keys, got_keys).size
        or np.setdiff1d(got_keys, np.flatnonzero(total + maybe)).size
    ):
        wrong_keys = int(len(np.setxor1d(got_keys, expected_keys)))
    else:
        # -row is the key's count over the steps that ran: exactly the certain ones, plus
        # any of the aborted ones.
        moved = -got_values
        low, high = total[got_keys][:, None], (total + maybe)[got_keys][:, None]
        lost = int(np.sum((moved < low) | (moved > high) | (moved != np.round(moved))))
    # Every checkpoint written while training: restorable, and each value an integer in
    # [-total count, 0] of its key.
    bad_saves = 0
    tf.compat.v1.reset_default_graph()
    terminate_config_initializer()
    init(use_dynamic_expansion=True)
    table = create_table(
        tf.int64, DIM, "shared", tf.compat.v1.zeros_initializer(), device_vocabulary_size=KEY_SPACE
    )
    export = table.export()
    with tf.compat.v1.Session(config=_session_config()) as sess:
        for path in saves:
            try:
                rec_saver.restore_tables(sess, path)
                k, v, _ = sess.run(export)
            except Exception as e:  # pylint: disable=broad-except
                errors.append("restore of %s: %r" % (os.path.basename(path), e))
                bad_saves += 1
                continue
            if not len(k):
                continue  # saved before the first step
            if (
                k.min() < 0
                or k.max() >= KEY_SPACE
                or np.any(v != np.round(v))
                or np.any(v > 0)
                or np.any(v < -(total + maybe)[k][:, None])
            ):
                bad_saves += 1
    return {
        "steps": int(sum(steps)),
        "aborted": int(sum(aborted)),
        "keys": int(len(expected_keys)),
        "lost_rows": lost,
        "wrong_keys": wrong_keys,
        "saves": len(saves),
        "bad_saves": bad_saves,
        "errors": errors[:5],
        "error_count": len(errors),
        "ok": not errors
        and lost == 0
        and wrong_keys == 0
        and bad_saves == 0
        and len(saves) > 0
        and sum(steps) > 0,
    }


def eviction(seconds, seed, work):
    del work
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk.core.embedding import create_table
    from rec_sdk.util.initialize import init

    init(use_dynamic_expansion=True)
    table = create_table(
        tf.int64,
        DIM,
        "evicting",
        tf.compat.v1.zeros_initializer(),
        device_vocabulary_size=KEY_SPACE,
    )
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    times = tf.compat.v1.placeholder(tf.int64, [None])
    train, emb = _train_graph(
        table,
        keys,
        timestamps=times,
        access_and_evict_config={"access_threshold": 0, "eviction_threshold": 2},
    )
    evict = table.evict()
    b_keys = tf.compat.v1.placeholder(tf.int64, [None])
    pattern = tf.tile(tf.cast(b_keys, tf.float32)[:, None] + 0.5, [1, DIM])
    upsert = table.upsert(b_keys, pattern)
    b_read = table.lookup(b_keys)
    remove = table.remove(b_keys)
    b_set = np.arange(10**6, 10**6 + 256, dtype=np.int64)
    clock = [0]
    stats = {
        "steps": 0,
        "stale": 0,
        "evictions": 0,
        "rows_evicted": 0,
        "churns": 0,
        "foreign_writes": 0,
        "foreign_reads": 0,
    }
    errors = []
    deadline = time.time() + seconds
    sess = tf.compat.v1.Session(config=_session_config())

    def trainer(index):
        rng = np.random.default_rng((seed, index))
        try:
            while time.time() < deadline:
                clock[0] += 1
                batch = rng.integers(0, KEY_SPACE, BATCH)
                try:
                    _, rows = sess.run([train, emb], {keys: batch, times: np.full(BATCH, clock[0])})
                except tf.errors.InvalidArgumentError as e:
                    if "stale" not in str(e):
                        raise
                    stats["stale"] += 1
                    continue
                stats["steps"] += 1
                if np.any(rows > 0) or np.any(rows != np.round(rows)):
                    stats["foreign_reads"] += 1
        except Exception as e:  # pylint: disable=broad-except
            errors.append(
                "trainer %d after %d steps: %s %s"
                % (index, stats["steps"], type(e).__name__, str(e)[:300])
            )

    def evictor():
        try:
            while time.time() < deadline:
                rows, _ = sess.run(evict)
                stats["evictions"] += 1
                stats["rows_evicted"] += int(rows)
        except Exception as e:  # pylint: disable=broad-except
            errors.append("evictor: %r" % (e,))

    def churn():
        expected = b_set[:, None].astype(np.float32) + 0.5
        try:
            while time.time() < deadline:
                sess.run(upsert, {b_keys: b_set})
                values, exists = sess.run(b_read, {b_keys: b_set})
                present = exists.astype(bool)
                if np.any(values[present] != np.broadcast_to(expected, values.shape)[present]):
                    stats["foreign_writes"] += 1
                sess.run(remove, {b_keys: b_set})
                stats["churns"] += 1
        except Exception as e:  # pylint: disable=broad-except
            errors.append("churn: %r" % (e,))

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(2)] + [
        threading.Thread(target=evictor),
        threading.Thread(target=churn),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sess.close()
    stats.update(errors=errors[:5], error_count=len(errors))
    stats["ok"] = (
        not errors
        and stats["foreign_writes"] == 0
        and stats["foreign_reads"] == 0
        and stats["steps"] > 0
        and stats["rows_evicted"] > 0
        and stats["churns"] > 0
    )
    return stats


SCENARIOS = {"sessions": sessions, "eviction": eviction}


def child(scenario, seconds, seed):
    work = tempfile.mkdtemp(prefix="rec_sdk_concurrency_")
    try:
        result = SCENARIOS[scenario](seconds, seed, work)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.seed)
        return 0
    start = time.time()
    parts, losses = [], 0
    for scenario in ("sessions", "eviction"):
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            scenario,
            "--seconds",
            str(args.seconds),
            "--seed",
            str(args.seed),
        ]
        try:
            run = subprocess.run(
                command, capture_output=True, text=True, timeout=args.seconds * 4 + 120
            )
        except subprocess.TimeoutExpired:
            parts.append("%s: HANG (no result within %.0f s)" % (scenario, args.seconds * 4 + 120))
            losses += 1
            continue
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            parts.append(
                "%s: CRASH (exit %d) %s" % (scenario, run.returncode, run.stderr.strip()[-400:])
            )
            losses += 1
            continue
        result = json.loads(lines[-1][len("RESULT ") :])
        losses += not result["ok"]
        if scenario == "sessions":
            parts.append(
                "sessions: %d steps of 4 threads in 2 sessions of one server (%d more aborted "
                "by TensorFlow's runtime), %d keys, %d rows off their updates, %d wrong keys, "
                "%d saves during training (%d bad)"
                % (
                    result["steps"],
                    result["aborted"],
                    result["keys"],
                    result["lost_rows"],
                    result["wrong_keys"],
                    result["saves"],
                    result["bad_saves"],
                )
            )
        else:
            parts.append(
                "eviction: %d steps (%d failed stale, as they must), %d evictions of %d rows, "
                "%d churns of never-trained keys: %d foreign writes, %d foreign reads"
                % (
                    result["steps"],
                    result["stale"],
                    result["evictions"],
                    result["rows_evicted"],
                    result["churns"],
                    result["foreign_writes"],
                    result["foreign_reads"],
                )
            )
        if result["error_count"]:
            parts[-1] += "; %d errors: %s" % (result["error_count"], result["errors"])
    print(
        "concurrency: %s; %s in %.0f s"
        % ("; ".join(parts), "LOSS" if losses else "no loss", time.time() - start)
    )
    return 1 if losses else 0


if __name__ == "__main__":
    sys.exit(main())
