"""Stress: memory stays bounded under an endless stream of new keys, and a full
`evict_when_full` table keeps training.

Part A streams `--keys` distinct, never-repeating keys (10^7 in the full run) through a
dynamically expanding table (dim 8, LazyAdam by address: 2 slots per row) with admission
(access_threshold 2) and eviction by timestamp: every step brings `--batch` new keys; 10% of
them occur twice in their batch (admitted at once), 10% come back in the next step (admitted
then), the other 80% stay pending admission counts until they age out. Sample timestamps
advance `TICK` seconds per step; `eviction_threshold` is `--evict-age` steps and an EvictHook
(MonitoredSession, global step) evicts every `--evict-every` steps.

Bounds asserted (the child's own /proc/self/status):
  * keys held: after an eviction at newest clock s only keys last seen in the last
    `evict-age` steps remain, and at most `evict-every` more steps come before the next one,
    so size + pending never exceed H = (evict-age + evict-every + 1) x batch keys (each step
    adds at most `batch` new keys). Checked at every step, before that step's eviction.
  * not growing with the stream: the peak of size + pending over the second half of the
    stream is at most 1.1x its peak over the first half after warm-up.
  * resident memory: after a warm-up (the table at its eviction equilibrium: max(30 steps,
    10% of the stream)), VmRSS at the end and the peak VmHWM after warm-up (reset through
    /proc/self/clear_refs where the kernel allows) exceed VmRSS at warm-up by at most
    H x `--bytes-per-key` (default 512 B: a row is 24 + 3 x 32 = 120 B, index and pending
    maps at load <= 1/2 and doubling add at most ~4x that) + `--slack-mb` (default 64 MiB:
    TensorFlow's allocator and batch tensors). Memory that grows with the stream instead
    (rows, slots or pending counts never freed, rows not reused) costs at least 24-120 B
    per streamed key (about 65 B measured with eviction turned off): 240+ MB over the 10^7
    keys of the full run, beyond the bound (H x 512 B + 64 MiB = 81 MiB with the defaults).
    The quick run is a smoke test: its stream is too short for that margin.

Part B: a fixed-capacity table (init(use_dynamic_expansion=False), device_vocabulary_size
`--capacity`, LazyAdam) created with evict_when_full=True is looked up by two features in
one step (two sparse_lookup of the table: the first gets 2k new keys, the second k of those
and k of its own, both the same 64 hot keys; 3k + 64 distinct keys a step) on a stream of
new keys far beyond its capacity (`--b-steps` x 3k). For each load k of `--b-keys` every step
must succeed with a finite loss, size stays <= capacity, the hot keys keep their rows and
those rows keep changing (training goes on), and keys are evicted (stats()). The default
loads are 15% and 23% of the capacity per step: more than the rows of the table's last 8
lookups leave room for (capacity / 9), so the rows of recent steps must be evicted too (before
that was fixed, 23% failed a third of the steps with "a batch holds more new keys than the
table's capacity can take even after eviction").

    python tests/stress/memory.py [--keys 10000000] [--batch 5000] [--b-steps 2000]
    python tests/stress/memory.py --keys 1000000 --b-steps 100      # quick

Each part runs in its own child process (a crash or hang is counted as a loss). Prints one
summary line; exits non-zero on any loss.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DIM = 8
TICK = 60  # timestamp seconds per step
T0 = 1_700_000_000
HOT = 64


def _status():
    """{VmRSS, VmHWM} of this process in bytes."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(line.split()[1]) * 1024
    return values


def _reset_peak():
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _keys(start, count):
    """`count` distinct non-negative int64 keys for stream positions start.. (a bijection of
    the position onto [0, 2^63), so they are spread over the key space)."""
    import numpy as np

    positions = np.arange(start, start + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = positions * np.uint64(0x9E3779B97F4A7C15)
    return (mixed & np.uint64(2**63 - 1)).astype(np.int64)


def part_a(args):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.core.feature_process import EvictHook
    from rec_sdk.optimizers import lazy_adam_by_addr
    from rec_sdk.util.initialize import init

    batch_size = args.batch
    steps = args.keys // batch_size
    held_bound = (args.evict_age + args.evict_every + 1) * batch_size
    warm = max(30, steps // 10)
    init(use_dynamic_expansion=True)
    step_var = tf.compat.v1.train.get_or_create_global_step()
    table = create_table(
        tf.int64,
        DIM,
        "stream",
        tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=1),
        device_vocabulary_size=min(held_bound, 10**6),
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    times = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=times,
        access_and_evict_config={
            "access_threshold": 2,
            "eviction_threshold": args.evict_age * TICK,
        },
    )
    loss = tf.reduce_mean(tf.square(emb - 0.5))
    grads = tf.gradients(loss, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB"))
    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
        zip(grads, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET"))
    )
    with tf.control_dependencies([train]):
        train = tf.compat.v1.assign_add(step_var, 1)
        stats = table.stats()
    final_stats = table.stats()
    hook = EvictHook(evict_enable=True, evict_step_interval=args.evict_every)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
    )
    creator = tf.compat.v1.train.ChiefSessionCreator(config=config)
    start = time.time()
    held = []  # size + pending before each step's eviction
    peak_size = peak_pending = 0
    bad_loss = 0
    warm_status = None
    peak_reset = False
    previous = None
    with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
        for step in range(steps):
            fresh = _keys(step * batch_size, batch_size)
            parts = [fresh, fresh[: batch_size // 10]]  # 10%: twice in the batch
            if previous is not None:  # 10% of the previous step's keys come back
                parts.append(previous[batch_size // 10 : batch_size // 5])
            batch = np.concatenate(parts)
            stamp = np.full(batch.size, T0 + step * TICK, np.int64)
            _, value, values = sess.run([train, loss, stats], {ids: batch, times: stamp})
            previous = fresh
            bad_loss += not np.isfinite(value)
            held.append(int(values["size"] + values["pending"]))
            peak_size = max(peak_size, int(values["size"]))
            peak_pending = max(peak_pending, int(values["pending"]))
            if step == warm - 1:
                warm_status = _status()
                peak_reset = _reset_peak()
        final = sess.run(final_stats)
        end_status = _status()  # the table still alive
    half = warm + (steps - warm) // 2
    result = {
        "keys": steps * batch_size,
        "steps": steps,
        "warm": warm,
        "bound": held_bound,
        "peak_size": peak_size,
        "peak_pending": peak_pending,
        "peak_held": max(held),
        "peak_held_first": max(held[warm:half]),
        "peak_held_second": max(held[half:]),
        "size": int(final["size"]),
        "pending": int(final["pending"]),
        "evicted": int(final["evicted"]),
        "admitted": int(final["admitted"]),
        "evictions": hook.evictions,
        "bad_loss": bad_loss,
        "rss_warm": warm_status["VmRSS"],
        "rss_end": end_status["VmRSS"],
        "hwm": end_status["VmHWM"],
        "hwm_reset": peak_reset,
        "seconds": round(time.time() - start, 1),
    }
    print("RESULT", json.dumps(result), flush=True)
    return 0


def part_b(args):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import lazy_adam
    from rec_sdk.util.initialize import init

    init(use_dynamic_expansion=False)
    table = create_table(
        tf.int64,
        DIM,
        "full",
        tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=2),
        device_vocabulary_size=args.capacity,
        evict_when_full=True,
    )
    first = tf.compat.v1.placeholder(tf.int64, [None])
    second = tf.compat.v1.placeholder(tf.int64, [None])
    emb1 = sparse_lookup(table, first, name="feature_1")
    emb2 = sparse_lookup(table, second, name="feature_2")
    loss = tf.reduce_mean(tf.square(emb1 - 0.5)) + tf.reduce_mean(tf.square(emb2 + 0.5))
    train = lazy_adam.create_hash_optimizer(0.01).minimize(loss)
    with tf.control_dependencies([train]):
        stats = table.stats()
    hot = _keys(10**15, HOT)
    read_hot = table.lookup(tf.constant(hot))
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
    )
    n = args.b_keys
    start = time.time()
    ok = failed = bad_loss = over = 0
    errors = []
    streamed = 0
    hot_values = []
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(args.b_steps):
            fresh = _keys(step * 2 * n, 2 * n)  # half shared, then the second's own
            own = _keys(10**12 + step * n, n)
            feed = {
                first: np.concatenate([fresh[:n], fresh[n:], hot]),
                second: np.concatenate([fresh[n:], own, hot]),
            }
            streamed += 3 * n
            try:
                _, value, values = sess.run([train, loss, stats], feed)
            except tf.errors.OpError as e:
                failed += 1
                if not errors:
                    lines = [ln.strip() for ln in e.message.splitlines() if ln.strip()]
                    after = [
                        lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("Node:")
                    ]
                    errors.append(
                        "step %d: %s: %s"
                        % (step, type(e).__name__, (after or lines or [""])[0][:300])
                    )
            else:
                ok += 1
                bad_loss += not np.isfinite(value)
                over += int(values["size"]) > args.capacity
            if step in (0, args.b_steps // 2, args.b_steps - 1):
                found_values, found = sess.run(read_hot)
                hot_values.append(found_values if found.all() else None)
        final = sess.run(table.stats())
    moved = [
        a is not None and b is not None and not np.array_equal(a, b)
        for a, b in zip(hot_values, hot_values[1:])
    ]
    result = {
        "steps": args.b_steps,
        "ok": ok,
        "failed": failed,
        "errors": errors,
        "bad_loss": bad_loss,
        "over_capacity": over,
        "keys": streamed,
        "capacity": args.capacity,
        "size": int(final["size"]),
        "final_over": int(final["size"]) > args.capacity,
        "evicted": int(final["evicted"]),
        "hot_kept": all(v is not None for v in hot_values) and len(hot_values) == 3,
        "hot_moved": len(moved) == 2 and all(moved),
        "seconds": round(time.time() - start, 1),
    }
    print("RESULT", json.dumps(result), flush=True)
    return 0


def _run_child(args, part, limit, b_keys=None):
    command = [sys.executable, os.path.abspath(__file__), "--child", part]
    for key in ("keys", "batch", "evict_age", "evict_every", "capacity", "b_steps"):
        command += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    command += ["--b-keys", str(b_keys or 1)]
    with tempfile.TemporaryDirectory(prefix="rec_sdk_memory_") as work:
        try:  # the child works in a scratch directory: nothing it writes lands in the tree
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=limit, cwd=work
            )
        except subprocess.TimeoutExpired:
            return None, "part %s: no result within %d s" % (part, limit)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        return None, "part %s: the child process failed (exit %d): %s" % (
            part,
            result.returncode,
            result.stderr.strip()[-500:],
        )
    return json.loads(lines[-1][len("RESULT ") :]), None


def _check_a(args, losses):
    a, error = _run_child(args, "a", args.timeout)
    if error:
        losses.append(error)
        return "A: no result"
    mib = 1 << 20
    limit = a["bound"] * args.bytes_per_key + args.slack_mb * mib
    growth_end = a["rss_end"] - a["rss_warm"]
    growth_peak = a["hwm"] - a["rss_warm"]
    if a["peak_held"] > a["bound"]:
        losses.append(
            "A: keys held (size + pending) reached %d, bound %d" % (a["peak_held"], a["bound"])
        )
    if a["peak_held_second"] > 1.1 * a["peak_held_first"]:
        losses.append(
            "A: keys held grow with the stream: peak %d in the first half, %d "
            "in the second" % (a["peak_held_first"], a["peak_held_second"])
        )
    if growth_end > limit:
        losses.append(
            "A: RSS grew %.0f MiB after warm-up, bound %.0f MiB" % (growth_end / mib, limit / mib)
        )
    if a["hwm_reset"] and growth_peak > limit:
        losses.append(
            "A: peak RSS %.0f MiB above RSS at warm-up, bound %.0f MiB"
            % (growth_peak / mib, limit / mib)
        )
    if a["bad_loss"]:
        losses.append("A: %d steps with a non-finite loss" % a["bad_loss"])
    if a["evicted"] == 0 or a["admitted"] == 0:
        losses.append("A: nothing admitted or evicted (%d, %d)" % (a["admitted"], a["evicted"]))
    return (
        "A: %d new keys in %d steps of %d, end size %d pending %d (peaks %d / %d, size + "
        "pending <= %d), admitted %d evicted %d in %d evictions, RSS warm-up %.0f MiB end "
        "%.0f MiB peak%s %.0f MiB (growth bound %.0f MiB), %.1f s"
        % (
            a["keys"],
            a["steps"],
            args.batch,
            a["size"],
            a["pending"],
            a["peak_size"],
            a["peak_pending"],
            a["bound"],
            a["admitted"],
            a["evicted"],
            a["evictions"],
            a["rss_warm"] / mib,
            a["rss_end"] / mib,
            " after warm-up" if a["hwm_reset"] else " (process)",
            a["hwm"] / mib,
            limit / mib,
            a["seconds"],
        )
    )


def _check_b(args, b_keys, losses):
    b, error = _run_child(args, "b", args.timeout, b_keys)
    where = "B(%d keys/step)" % (3 * b_keys + HOT)
    if error:
        losses.append(where + ": " + error)
        return where + ": no result"
    if b["failed"]:
        losses.append(
            "%s: %d of %d steps failed: %s"
            % (where, b["failed"], b["steps"], "; ".join(b["errors"]))
        )
    if b["over_capacity"] or b["final_over"]:
        losses.append("%s: size above capacity in %d steps" % (where, b["over_capacity"]))
    if b["bad_loss"]:
        losses.append("%s: %d steps with a non-finite loss" % (where, b["bad_loss"]))
    if not b["hot_kept"] or not b["hot_moved"]:
        losses.append(
            "%s: hot keys' rows lost or not trained (kept %s, changing %s)"
            % (where, b["hot_kept"], b["hot_moved"])
        )
    if b["evicted"] == 0:
        losses.append(where + ": nothing evicted")
    return "%s: %d of %d steps ok, %d new keys, size %d, evicted %d, %.1f s" % (
        where,
        b["ok"],
        b["steps"],
        b["keys"],
        b["size"],
        b["evicted"],
        b["seconds"],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--evict-age", type=int, default=4, help="eviction_threshold, steps")
    parser.add_argument("--evict-every", type=int, default=2, help="EvictHook step interval")
    parser.add_argument("--bytes-per-key", type=int, default=512)
    parser.add_argument("--slack-mb", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument(
        "--b-keys",
        default="1000,1500",
        help="part B loads: new keys per feature and step, comma-separated",
    )
    parser.add_argument("--b-steps", type=int, default=2_000)
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per child")
    parser.add_argument("--child", choices=["a", "b"])
    args = parser.parse_args()
    if args.child == "a":
        return part_a(args)
    if args.child == "b":
        args.b_keys = int(args.b_keys)
        return part_b(args)
    if args.keys // args.batch < 60:
        parser.error("--keys / --batch must give at least 60 steps")

    start = time.time()
    losses = []
    texts = [_check_a(args, losses)]
    loads = [int(k) for k in args.b_keys.split(",") if k.strip()]
    texts.append("B: evict_when_full capacity %d, 2 lookups per step" % args.capacity)
    texts += [_check_b(args, k, losses) for k in loads]
    print(
        "memory: %s; %.0f s%s"
        % (
            "; ".join(texts),
            time.time() - start,
            "" if not losses else "; LOSS: " + "; ".join(losses),
        )
    )
    return 1 if losses else 0


if __name__ == "__main__":
    sys.exit(main())
