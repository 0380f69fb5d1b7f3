"""Stress: every checkpoint file of a table corrupted, truncated, deleted, and swapped with
another table's; each restore must fail with an error naming the file and leave the table
either untouched (an error found before loading) or empty (found while streaming): never
half-loaded.

    python tests/stress/corruption.py [--rows 200000]

The cases run in a child process (a crash is counted as a loss). Prints one summary line;
exits non-zero on any loss.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

DIM = 8
MODES = ("corrupt", "truncate", "delete", "swap")


def cases(rows):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk import saver as rec_saver
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import lazy_adam_by_addr
    from rec_sdk.util.initialize import init

    init(use_dynamic_expansion=True)
    tables = [
        create_table(
            tf.int64,
            DIM,
            name,
            tf.compat.v1.random_uniform_initializer(seed=i),
            device_vocabulary_size=rows,
        )
        for i, name in enumerate(("a", "b"))
    ]
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    times = tf.compat.v1.placeholder(tf.int64, [None])
    embs = [
        sparse_lookup(
            t,
            keys,
            name="lookup_" + t.table_name,
            timestamps=times,
            access_and_evict_config={"access_threshold": 2, "eviction_threshold": 10**9},
        )
        for t in tables
    ]
    loss = tf.add_n([tf.reduce_sum(tf.square(e)) for e in embs])
    grads = tf.gradients(loss, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB"))
    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
        zip(grads, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET"))
    )
    size = tables[0].size_tensor()
    refill = tables[0].upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, DIM]))
    looked, found = tables[0].lookup(tf.constant([1, 2, 3], tf.int64))
    intact_rows = tf.reduce_all(found) & tf.reduce_all(tf.equal(looked, 1.0))
    work = tempfile.mkdtemp(prefix="rec_sdk_corrupt_")
    results = []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        rng = np.random.default_rng(0)
        for step in range(3):
            batch = rng.integers(0, rows * 4, size=rows // 2)
            sess.run(train, {keys: batch, times: np.full(batch.size, step, np.int64)})
        good = os.path.join(work, "good")
        rec_saver.save_tables(sess, good)
        names = sorted(os.listdir(os.path.join(good, "a")))
        for name in names:
            for mode in MODES:
                case = os.path.join(work, "%s_%s" % (mode, name.replace(".", "_")))
                shutil.copytree(good, case)
                path = os.path.join(case, "a", name)
                length = os.path.getsize(path)
                if mode in ("corrupt", "truncate") and length == 0:
                    results.append((name, mode, "n/a", "empty file"))
                    continue
                if mode == "corrupt":
                    with open(path, "r+b") as f:
                        f.seek(length // 2)
                        byte = f.read(1)
                        f.seek(length // 2)
                        f.write(bytes([byte[0] ^ 0x5A]))
                elif mode == "truncate":
                    with open(path, "r+b") as f:
                        f.truncate(length - 1)
                elif mode == "delete":
                    os.remove(path)
                else:
                    other = os.path.join(case, "b", name)
                    with open(path, "rb") as f, open(other, "rb") as g:
                        if f.read() == g.read():
                            results.append((name, mode, "n/a", "identical in both tables"))
                            continue
                    tmp = path + ".swap"
                    os.rename(path, tmp)
                    os.rename(other, path)
                    os.rename(tmp, other)
                sess.run(refill)  # the table holds something before the restore
                try:
                    rec_saver.restore_tables(sess, case, tables=[tables[0]])
                    outcome, message = "LOSS", "restore succeeded"
                except tf.errors.OpError as e:
                    lines = e.message.splitlines()
                    after = [
                        lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("Node:")
                    ]
                    message = (after or [lines[-1] if lines else str(e)])[0]
                    # Another table's metadata shows as data files that do not match it.
                    named = name in message or (
                        name == "meta.txt"
                        and ("metadata" in message or (mode == "swap" and ".bin" in message))
                    )
                    # All or nothing: an error found before loading leaves the table as it
                    # was (the three rows of `refill`), one found while streaming leaves it
                    # empty; never half-loaded.
                    held = sess.run(size)
                    kept = held == 3 and sess.run(intact_rows)
                    outcome = "ok" if named and (held == 0 or kept) else "LOSS"
                    if not (held == 0 or kept):
                        message += " (table half-loaded: %d rows)" % held
                results.append((name, mode, outcome, message))
                shutil.rmtree(case, ignore_errors=True)
        # The intact checkpoint still restores.
        rec_saver.restore_tables(sess, good, tables=[tables[0]])
        intact = sess.run(size) > 0
    shutil.rmtree(work, ignore_errors=True)
    for name, mode, outcome, message in results:
        print("CASE", outcome, name, mode, message[:200], flush=True)
    print("INTACT", "ok" if intact else "LOSS", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        return cases(args.rows)
    start = time.time()
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", "--rows", str(args.rows)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = result.stdout.splitlines()
    checked = [ln.split(None, 5) for ln in lines if ln.startswith("CASE")]
    ran = [c for c in checked if c[1] != "n/a"]
    losses = [" ".join(c[2:]) for c in checked if c[1] == "LOSS"]
    intact = "INTACT ok" in lines
    if result.returncode != 0:
        losses.append("the child process failed: " + result.stderr.strip()[-500:])
    if not intact:
        losses.append("the intact checkpoint did not restore")
    files = sorted({c[2] for c in checked})
    print(
        "corruption: %d of %d cases failed cleanly (error naming the file, table untouched or "
        "empty) over %d files x %s, %d not applicable (empty or identical file), intact "
        "checkpoint restores: %s, "
        "rows=%d, %.0f s%s"
        % (
            len(ran) - len([c for c in ran if c[1] == "LOSS"]),
            len(ran),
            len(files),
            "/".join(MODES),
            len(checked) - len(ran),
            intact,
            args.rows,
            time.time() - start,
            "" if not losses else "; LOSS: " + "; ".join(losses[:5]),
        )
    )
    return 0 if not losses and ran else 1


if __name__ == "__main__":
    sys.exit(main())
