"""Stress: the disk fills up during checkpoint saves; every failed save must raise a clean
error, leave nothing behind and keep the previous checkpoints restorable exactly, and once
space is freed saving must work again.

The driver mounts a small tmpfs on a fresh temporary mountpoint (unmounted in `finally`,
whatever happens) sized for the whole run; the child process (a crash is counted as a loss)
fills it with a ballast file to leave just the room a case needs, and deletes the ballast to
free space. Without permission to mount (not root, no CAP_SYS_ADMIN) it falls back to
RLIMIT_FSIZE in the child (SIGXFSZ ignored, so writes fail with EFBIG): the limit on one
file's size then plays the part of the free space, and the summary line says so.

The table: dynamic expansion, dim 8, LazyAdam by address (2 slots), admission (threshold 2,
so pending keys, counts and clocks are saved too), incremental checkpoints on; a dense
variable of 32 floats per first-checkpoint row, saved by TensorFlow. In order:

  1. `--rows` rows; Saver.save(model-1) succeeds: the state S1.
  A. the table grows to 3x; the room left is 1.5x the first checkpoint's tables (per-file
     limit: 1.5x its largest file): Saver.save(model-2) fails while writing the tables.
  2. save_tables(tables/full) succeeds: the state S2.
  C. the table trains on; save_tables(tables/full) again, over the existing one, fails.
  D. save_tables(tables/delta1, delta=True) fails; with space again it succeeds, and
     restore_tables(full, deltas=[delta1]) in a fresh session equals the live table (a failed
     save commits nothing, so the retried delta loses no change).
  B. the room left holds the tables but not TensorFlow's bundle: Saver.save(model-3) fails
     in TensorFlow's part, after its tables were written.
  E. save_tables(tables/delta2, delta=True) and restore_tables(full, deltas=[delta1, delta2])
     equals the live table (a Saver.save that failed must not have moved the delta chain).
  3. with space again Saver.save(model-4) succeeds and restores exactly.

After each failed save: the error is an exception (tf.errors.OpError or OSError) naming what
failed, the checkpoint and table directories list exactly the entries they had before (no
`sparse-*.tmp-*` / `.old-` directory, no table directory of the failed checkpoint, nothing
TensorFlow left), `tf.train.latest_checkpoint` still names model-1, and model-1 (keys,
embeddings, both slots, stats, dense variable, global step) and tables/full restore exactly
in a fresh session. At the end model-1, tables/full and model-4 restore exactly again.

    python tests/stress/full_disk.py [--rows 1000000] [--method auto|tmpfs|rlimit]

Prints one summary line; exits non-zero on any loss.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

DIM = 8
GROWTH = 3
DENSE_PER_ROW = 32  # dense floats per first-checkpoint row: TF's data file > any table file
BATCH = 100_000


# --- child ----------------------------------------------------------------------------------


class Disk:
    """Leaves `room` bytes for the next writes: a ballast file on the tmpfs, or
    RLIMIT_FSIZE (the most one file may hold)."""

    def __init__(self, root, method):
        self.root, self.method = root, method
        self.ballast = os.path.join(root, "ballast")
        if method == "rlimit":
            import signal

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def free(self):
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def leave(self, room):
        self.release()
        if self.method == "rlimit":
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (int(room), resource.RLIM_INFINITY))
            return
        size = (self.free() - int(room)) // 4096 * 4096
        if size <= 0:
            raise RuntimeError(
                "the tmpfs has %d bytes free, less than the %d to leave" % (self.free(), room)
            )
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)

    def release(self):
        if self.method == "rlimit":
            import resource

            resource.setrlimit(
                resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
        elif os.path.exists(self.ballast):
            os.remove(self.ballast)

    def measure(self, directory):
        """What a save of `directory`'s size needs: total bytes (tmpfs: rounded to pages),
        or its largest file (rlimit)."""
        sizes = [
            os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(directory) for f in files
        ]
        if self.method == "rlimit":
            return max(sizes)
        return sum((s + 4095) // 4096 * 4096 for s in sizes)


def child(root, method, rows):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    from rec_sdk import saver as rec_saver
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import lazy_adam_by_addr
    from rec_sdk.util.initialize import init

    disk = Disk(root, method)
    ckpt_dir = os.path.join(root, "ckpt")
    tables_dir = os.path.join(root, "tables")
    os.mkdir(ckpt_dir)
    os.mkdir(tables_dir)
    prefix = os.path.join(ckpt_dir, "model")
    full = os.path.join(tables_dir, "full")

    init(use_dynamic_expansion=True, enable_incremental_checkpoint=True)
    step_var = tf.compat.v1.train.get_or_create_global_step()
    table = create_table(
        tf.int64,
        DIM,
        "big",
        tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=1),
        device_vocabulary_size=rows,
    )
    dense = tf.compat.v1.get_variable(
        "dense",
        [rows * DENSE_PER_ROW],
        tf.float32,
        initializer=tf.compat.v1.random_uniform_initializer(seed=2),
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    times = tf.compat.v1.placeholder(tf.int64, [None])
    emb = sparse_lookup(
        table,
        ids,
        timestamps=times,
        access_and_evict_config={"access_threshold": 2, "eviction_threshold": 10**9},
    )
    loss = tf.reduce_mean(tf.square(emb - 0.5))
    grads = tf.gradients(loss, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_LOCAL_EMB"))
    train = tf.group(
        lazy_adam_by_addr.create_hash_optimizer_by_address(0.01).apply_gradients(
            zip(grads, tf.compat.v1.get_collection("ASCEND_SPARSE_LOOKUP_ID_OFFSET"))
        ),
        tf.compat.v1.assign_add(step_var, 1),
    )
    bump = tf.compat.v1.assign_add(dense, tf.ones_like(dense) * 0.25)
    export, stats = table.export(), table.stats()
    saver = tf.compat.v1.train.Saver(max_to_keep=10)
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2
    )
    results = []

    def case(name, ok, detail=""):
        results.append((name, ok))
        print("CASE", "ok" if ok else "LOSS", name, detail.replace("\n", " ")[:400], flush=True)

    def snapshot(sess, tables_only=False):
        keys, values, slots = sess.run(export)
        order = np.argsort(keys, kind="stable")
        state = {
            "keys": keys[order],
            "values": values[order],
            "slots": slots[:, order],
            "stats": {k: int(v) for k, v in sess.run(stats).items() if k != "capacity"},
        }
        if not tables_only:
            state["dense"], state["step"] = sess.run([dense, step_var])
        return state

    def differences(want, got):
        wrong = []
        for key in want:
            if key not in got:
                continue
            a, b = want[key], got[key]
            if isinstance(a, dict):
                if a != b:
                    wrong.append("%s %s != %s" % (key, b, a))
            elif not (np.shape(a) == np.shape(b) and np.array_equal(a, b)):
                wrong.append("%s differ (shapes %s, %s)" % (key, np.shape(b), np.shape(a)))
        return wrong

    def restores(name, want, path=None, directory=None, deltas=()):
        """Restores into a fresh session and compares with `want`."""
        try:
            with tf.compat.v1.Session(config=config) as fresh:
                if path is not None:
                    saver.restore(fresh, path)
                else:
                    rec_saver.restore_tables(fresh, directory, deltas=list(deltas))
                wrong = differences(want, snapshot(fresh, tables_only=path is None))
        except (tf.errors.OpError, OSError, ValueError) as e:
            wrong = ["restore failed: %s: %s" % (type(e).__name__, _message(e))]
        case(name, not wrong, "; ".join(wrong) or "exact (%d rows)" % len(want["keys"]))

    def listing():
        return {d: sorted(os.listdir(d)) for d in (ckpt_dir, tables_dir)}

    def failing_save(name, save, room):
        """Runs `save` with only `room` left; it must fail cleanly and leave no trace."""
        before = listing()
        disk.leave(room)
        try:
            save()
            error = None
        except (tf.errors.OpError, OSError) as e:
            error = "%s: %s" % (type(e).__name__, _message(e))
        except Exception as e:  # pylint: disable=broad-except
            error = "UNEXPECTED %s: %s" % (type(e).__name__, _message(e))
        finally:
            disk.release()
        after = listing()
        litter = [
            os.path.join(os.path.basename(d), name)
            for d in after
            for name in sorted(set(after[d]) - set(before[d]))
        ]
        gone = [
            os.path.join(os.path.basename(d), name)
            for d in after
            for name in sorted(set(before[d]) - set(after[d]))
        ]
        # TensorFlow's bundle writer leaves "<prefix>.data-...tempstate<n>" when a write fails
        # (the stock Saver too); rec_sdk's Saver wrapper is the one that could remove it.
        by_tf = [n for n in litter if ".tempstate" in n or n.startswith("ckpt/checkpoint.tmp")]
        ours = [n for n in litter if n not in by_tf]
        latest = tf.train.latest_checkpoint(ckpt_dir)
        ok = (
            error is not None
            and not error.startswith("UNEXPECTED")
            and not litter
            and not gone
            and latest == prefix + "-1"
        )
        detail = "error: %s" % error if error else "the save succeeded (room %d)" % room
        if ours:
            detail += "; left behind: %s" % ours
        if by_tf:
            detail += "; left behind by TensorFlow's part of the save: %s (%d bytes)" % (
                by_tf,
                sum(os.path.getsize(os.path.join(root, n)) for n in by_tf),
            )
        if gone:
            detail += "; removed: %s" % gone
        if latest != prefix + "-1":
            detail += "; latest_checkpoint is %s" % latest
        case(name, ok, detail)
        for name in litter:  # the next cases start clean
            path = os.path.join(root, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    counter = [0]

    def grow(sess, count, retrain=None):
        """Admits `count` new keys (each twice in its batch), leaves 1% of that pending, and
        trains `retrain` existing keys again."""
        step = int(sess.run(step_var))
        done = 0
        while done < count:
            n = min(BATCH, count - done)
            new = np.arange(counter[0], counter[0] + n, dtype=np.int64) * 7919 + 11
            counter[0] += n
            pending = -np.arange(counter[0], counter[0] + n // 100, dtype=np.int64) - 1
            counter[0] += n // 100
            parts = [new, new, pending]
            if retrain is not None:
                parts.append(retrain[done : done + n])
            batch = np.concatenate(parts)
            sess.run(train, {ids: batch, times: np.full(batch.size, 1000 + step, np.int64)})
            done += n
            step += 1

    def print_info(text):
        print("INFO", text, flush=True)

    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        grow(sess, rows)
        first = saver.save(sess, prefix, global_step=1)
        s1 = snapshot(sess)
        c1 = disk.measure(rec_saver.sparse_dir(first))
        print_info(
            "model-1: %d rows, tables %d bytes%s, TF data %d bytes"
            % (
                len(s1["keys"]),
                c1,
                " (largest file)" if method == "rlimit" else "",
                os.path.getsize(first + ".data-00000-of-00001"),
            )
        )

        # A: the grown table does not fit.
        grow(sess, (GROWTH - 1) * rows)
        sess.run(bump)
        failing_save(
            "A_saver_tables_do_not_fit", lambda: saver.save(sess, prefix, global_step=2), 1.5 * c1
        )
        restores("A_model1_restores_exactly", s1, path=first)

        # 2, C: save_tables over an existing directory fails.
        rec_saver.save_tables(sess, full)
        s2 = snapshot(sess, tables_only=True)
        c2 = disk.measure(full)
        keys = s2["keys"]
        grow(sess, rows // 20, retrain=keys[::3])
        failing_save(
            "C_save_tables_over_existing", lambda: rec_saver.save_tables(sess, full), c2 // 2
        )
        restores("C_full_restores_exactly", s2, directory=full)

        # D: a failed delta, then the delta again.
        delta1 = os.path.join(tables_dir, "delta1")
        grow(sess, rows // 20, retrain=keys[1::3])
        failing_save(
            "D_delta_does_not_fit",
            lambda: rec_saver.save_tables(sess, delta1, delta=True),
            8192 if method == "tmpfs" else 4096,
        )
        try:
            rec_saver.save_tables(sess, delta1, delta=True)
            case("D_delta_saves_after_freeing_space", True)
        except (tf.errors.OpError, OSError) as e:
            case("D_delta_saves_after_freeing_space", False, _message(e))
        restores(
            "D_full_plus_delta1_is_the_table",
            snapshot(sess, tables_only=True),
            directory=full,
            deltas=[delta1],
        )

        # B: the tables fit, TensorFlow's bundle does not.
        grow(sess, rows // 20, retrain=keys[2::3])
        sess.run(bump)
        # What this state's tables need, scaled from tables/full by rows (a save here to
        # measure it would be a committed full save and restart the delta chain).
        rows_now = int(sess.run(stats["size"]))
        tables_now = int(c2 * rows_now / len(s2["keys"]) * 1.02) + 65536
        data_file = os.path.getsize(first + ".data-00000-of-00001")
        if method == "rlimit":
            room = tables_now
            if room >= data_file:
                raise RuntimeError(
                    "TF's data file (%d B) is not bigger than the largest table "
                    "file (%d B)" % (data_file, tables_now)
                )
        else:
            room = tables_now + data_file // 2
        failing_save(
            "B_saver_tensorflow_part_does_not_fit",
            lambda: saver.save(sess, prefix, global_step=3),
            room,
        )
        restores("B_model1_restores_exactly", s1, path=first)

        # E: is the delta chain intact after the failed Saver.save?
        delta2 = os.path.join(tables_dir, "delta2")
        grow(sess, 1000, retrain=keys[:1000])
        rec_saver.save_tables(sess, delta2, delta=True)
        restores(
            "E_chain_after_failed_saver_save",
            snapshot(sess, tables_only=True),
            directory=full,
            deltas=[delta1, delta2],
        )

        # 3: space again.
        try:
            fourth = saver.save(sess, prefix, global_step=4)
            s4 = snapshot(sess)
            case("saver_saves_after_freeing_space", True)
            restores("model4_restores_exactly", s4, path=fourth)
        except (tf.errors.OpError, OSError) as e:
            case("saver_saves_after_freeing_space", False, _message(e))
        restores("end_model1_restores_exactly", s1, path=first)
        restores("end_full_restores_exactly", s2, directory=full)
        print_info("final rows %d" % len(sess.run(export)[0]))
    print("DONE", flush=True)
    return 0


def _message(error):
    """The line of an error that says what happened (TF errors: the one after 'Node:')."""
    text = getattr(error, "message", None) or str(error)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    after = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.startswith("Node:")]
    return ((after or lines or [""])[0])[:300]


def _short(detail):
    """'error: InternalError: cannot write '/x/y/values.bin': No space left on device' ->
    'InternalError (values.bin: No space left on device)'."""
    text = detail[len("error: ") :]
    kind, _, message = text.partition(": ")
    names = [w.strip("'\";,:") for w in message.split() if "/" in w]
    tail = message.rsplit(": ", 1)[-1] if ": " in message else message.rsplit("; ", 1)[-1]
    where = os.path.basename(names[0]) if names else ""
    return "%s (%s%s)" % (kind, where + ": " if where else "", tail[:60])


# --- driver ---------------------------------------------------------------------------------


def _mount(mountpoint, megabytes):
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=%dm,mode=0700" % megabytes, "tmpfs", mountpoint],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0, result.stderr.strip()


def _unmount(mountpoint):
    for command in (["umount", mountpoint], ["umount", "-l", mountpoint]):
        if subprocess.run(command, capture_output=True).returncode == 0:
            return True
    return False


def _mounted(mountpoint):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == mountpoint for line in f if len(line.split()) > 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--method", choices=["auto", "tmpfs", "rlimit"], default="auto")
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.child:
        return child(args.dir, args.method, args.rows)

    start = time.time()
    losses = []
    # Room for model-1, tables/full, two deltas and model-4 (about 128 B per row
    # of table files, 4 B per dense float), with a margin.
    row_bytes = 128
    need = args.rows * (row_bytes * (2 + 2 * (GROWTH + 0.3)) + 2 * DENSE_PER_ROW * 4)
    megabytes = int(need * 1.2 / 2**20) + 64
    work = tempfile.mkdtemp(prefix="rec_sdk_full_disk_")
    mountpoint = os.path.join(work, "disk")
    os.mkdir(mountpoint)
    method = args.method
    mounted = False
    why = ""
    try:
        if method in ("auto", "tmpfs"):
            mounted, why = _mount(mountpoint, megabytes)
            if not mounted and method == "tmpfs":
                raise SystemExit("full_disk: mount failed: %s" % why)
            method = "tmpfs" if mounted else "rlimit"
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "--dir",
            mountpoint,
            "--method",
            method,
            "--rows",
            str(args.rows),
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=args.timeout, cwd=work
            )
            stdout, stderr, code = result.stdout, result.stderr, result.returncode
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr, code = "no result within %d s" % args.timeout, -1
    finally:
        if mounted:
            if not _unmount(mountpoint) or _mounted(mountpoint):
                losses.append("could not unmount %s" % mountpoint)
        if not _mounted(mountpoint):
            shutil.rmtree(work, ignore_errors=True)
    lines = stdout.splitlines()
    cases = [
        ln.split(None, 3) + [""] * (4 - len(ln.split(None, 3)))
        for ln in lines
        if ln.startswith("CASE ")
    ]
    info = [ln[5:] for ln in lines if ln.startswith("INFO ")]
    failed = [c for c in cases if c[1] != "ok"]
    losses += ["%s: %s" % (c[2], c[3]) for c in failed]
    if code != 0 or "DONE" not in lines:
        losses.append("the child process failed (exit %s): %s" % (code, stderr.strip()[-600:]))
    errors = [
        "%s %s" % (c[2].split("_")[0], _short(c[3]))
        for c in cases
        if c[1] == "ok" and c[3].startswith("error:")
    ]
    how = (
        "tmpfs of %d MiB" % megabytes
        if method == "tmpfs"
        else "RLIMIT_FSIZE per file, %s"
        % ("mount not permitted: " + why if why else "--method rlimit")
    )
    print(
        "full_disk: %d of %d checks ok (%s), rows=%d grown %dx, %s; failed saves raised: %s; "
        "%.0f s%s"
        % (
            len(cases) - len(failed),
            len(cases),
            how,
            args.rows,
            GROWTH,
            "; ".join(info),
            ", ".join(errors) or "none",
            time.time() - start,
            "" if not losses else "; LOSS: " + "; ".join(losses),
        )
    )
    return 1 if losses or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
