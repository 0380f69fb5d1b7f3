"""Checkpoint benchmark: save and restore throughput of a large table, next to this machine's
sequential file write/read speed and TFRA's save/restore of the same data, in one run.

Table: --keys keys (default 10M) of dim 16 with LazyAdam slots (embedding + 2 slots per row:
212 bytes of files per row: key 8, 3 x 64 floats bytes, count 4, last-seen 8).

  * rec_sdk save: rec_sdk.saver.save_tables (what Saver.save runs), streamed files + fsync +
    rename; restore: rec_sdk.saver.restore_tables into a fresh table. Peak RSS growth during
    the save is sampled every 5 ms.
  * disk: writing a file of the same size with 4 MiB writes + fsync, then reading it back.
    Before every read (this file, the checkpoint files of each library) the files' pages are
    dropped from the page cache (posix_fadvise DONTNEED after fsync), so reads come from the
    disk for all alike.
  * TFRA 0.7.2 (when installed): three de.Variable tables (embedding and Adam's two slots, as
    TFRA keeps them) with the same keys, saved and restored by tf.compat.v1.train.Saver.

    .venv/bin/python benchmarks/bench_checkpoint.py [--keys 10000000] [--dir /tmp/...]
"""

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

DIM = 16
BATCH = 1 << 20


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples the resident set size in a thread while the block runs."""

    def __enter__(self):
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self.peak = max(self.peak, rss_bytes())
                time.sleep(0.005)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self):
        return self.peak - self.start


def drop_cache(path):
    """Drops a file's (clean) pages from the page cache, or every file's under a directory."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(root, f) for root, _, files in os.walk(path) for f in files]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_speed(directory, size):
    path = os.path.join(directory, "disk_probe.bin")
    block = np.random.default_rng(0).bytes(4 << 20)
    start = time.perf_counter()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    drop_cache(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass
    read_s = time.perf_counter() - start
    os.remove(path)
    return written / write_s, written / read_s


def fill_batches(keys):
    for start in range(0, keys, BATCH):
        stop = min(keys, start + BATCH)
        k = np.arange(start, stop, dtype=np.int64) * 7919 + 13
        yield k, np.random.default_rng(start).random((stop - start, DIM), dtype=np.float32)


def bench_rec_sdk(keys, directory):
    import rec_sdk
    from rec_sdk import saver
    from rec_sdk.core.embedding import create_table, sparse_lookup
    from rec_sdk.optimizers import lazy_adam_by_addr
    from rec_sdk.util.initialize import init, terminate_config_initializer

    init(use_dynamic_expansion=True)
    table = create_table(
        tf.int64,
        DIM,
        "bench",
        tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
        device_vocabulary_size=keys,
    )
    keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
    values_ph = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    upsert = table.upsert(keys_ph, values_ph)
    # One LazyAdam step attaches the two slots to every row.
    emb = sparse_lookup(table, keys_ph[:8], is_train=True)
    grads = tf.gradients(
        tf.reduce_sum(emb), tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    )
    train = lazy_adam_by_addr.create_hash_optimizer_by_address(0.001).apply_gradients(
        zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
    )
    out = {}
    target = os.path.join(directory, "sparse-rec_sdk")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for k, v in fill_batches(keys):
            sess.run(upsert, {keys_ph: k, values_ph: v})
        sess.run(train, {keys_ph: np.arange(8, dtype=np.int64) * 7919 + 13})
        out["rows"] = int(sess.run(table.size_tensor()))
        with PeakRss() as rss:
            start = time.perf_counter()
            saver.save_tables(sess, target)
            out["save_s"] = time.perf_counter() - start
        out["save_rss_growth"] = rss.growth
        out["table_rss"] = rss.start
    out["bytes"] = sum(
        os.path.getsize(os.path.join(target, "bench", f))
        for f in os.listdir(os.path.join(target, "bench"))
    )
    drop_cache(target)
    with tf.compat.v1.Session() as sess:
        start = time.perf_counter()
        saver.restore_tables(sess, target)
        out["restore_s"] = time.perf_counter() - start
        assert int(sess.run(table.size_tensor())) == out["rows"]
    shutil.rmtree(target)
    terminate_config_initializer()
    return out


def bench_tfra(keys, directory):
    try:
        import tensorflow_recommenders_addons.dynamic_embedding as de
    except Exception as e:  # not installed, or does not load into this TF
        return {"error": "%s: %s" % (type(e).__name__, e)}
    variables = [
        de.get_variable(name, key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, initializer=0.0)
        for name in ("emb", "m", "v")
    ]
    keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
    values_ph = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    upserts = [v.upsert(keys_ph, values_ph) for v in variables]
    tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    prefix = os.path.join(directory, "tfra")
    out = {}
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for k, v in fill_batches(keys):
            sess.run(upserts, {keys_ph: k, values_ph: v})
        start = time.perf_counter()
        path = saver.save(sess, prefix)
        out["save_s"] = time.perf_counter() - start
    out["bytes"] = sum(
        os.path.getsize(os.path.join(directory, f))
        for f in os.listdir(directory)
        if f.startswith("tfra")
    )
    for f in os.listdir(directory):
        if f.startswith("tfra"):
            drop_cache(os.path.join(directory, f))
    with tf.compat.v1.Session() as sess:
        start = time.perf_counter()
        saver.restore(sess, path)
        out["restore_s"] = time.perf_counter() - start
        out["rows"] = int(sess.run(variables[0].size()))
    for f in os.listdir(directory):
        if f.startswith("tfra"):
            os.remove(os.path.join(directory, f))
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--skip-tfra", action="store_true")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    directory = args.dir or tempfile.mkdtemp(prefix="rec_sdk_bench_")
    print(
        "machine: %s, %d cores, Python %s, TensorFlow %s; files in %s"
        % (
            platform.processor() or platform.machine(),
            os.cpu_count(),
            platform.python_version(),
            tf.__version__,
            directory,
        )
    )
    ours = bench_rec_sdk(args.keys, directory)
    write_bps, read_bps = disk_speed(directory, ours["bytes"])
    tf.compat.v1.reset_default_graph()
    tfra = {"error": "skipped"} if args.skip_tfra else bench_tfra(args.keys, directory)
    gb = 1e9
    print(
        "\n%d rows, dim %d, LazyAdam slots: %.2f GB of table files"
        % (ours["rows"], DIM, ours["bytes"] / gb)
    )
    print("| operation | seconds | GB/s | M rows/s | vs disk |")
    print("|---|---|---|---|---|")
    print(
        "| disk: sequential write + fsync | %.2f | %.2f | | 1.00x |"
        % (ours["bytes"] / write_bps, write_bps / gb)
    )
    print(
        "| rec_sdk save (Saver.save's table part) | %.2f | %.2f | %.1f | %.2fx |"
        % (
            ours["save_s"],
            ours["bytes"] / ours["save_s"] / gb,
            ours["rows"] / ours["save_s"] / 1e6,
            ours["bytes"] / ours["save_s"] / write_bps,
        )
    )
    if "error" not in tfra:
        print(
            "| TFRA 0.7.2 Saver.save (3 tables) | %.2f | %.2f | %.1f | %.2fx |"
            % (
                tfra["save_s"],
                tfra["bytes"] / tfra["save_s"] / gb,
                tfra["rows"] / tfra["save_s"] / 1e6,
                tfra["bytes"] / tfra["save_s"] / write_bps,
            )
        )
    print(
        "| disk: sequential read | %.2f | %.2f | | 1.00x |"
        % (ours["bytes"] / read_bps, read_bps / gb)
    )
    print(
        "| rec_sdk restore | %.2f | %.2f | %.1f | %.2fx |"
        % (
            ours["restore_s"],
            ours["bytes"] / ours["restore_s"] / gb,
            ours["rows"] / ours["restore_s"] / 1e6,
            ours["bytes"] / ours["restore_s"] / read_bps,
        )
    )
    if "error" not in tfra:
        print(
            "| TFRA 0.7.2 Saver.restore (3 tables) | %.2f | %.2f | %.1f | %.2fx |"
            % (
                tfra["restore_s"],
                tfra["bytes"] / tfra["restore_s"] / gb,
                tfra["rows"] / tfra["restore_s"] / 1e6,
                tfra["bytes"] / tfra["restore_s"] / read_bps,
            )
        )
    else:
        print("\nTFRA not measured (%s)" % tfra["error"])
    print(
        "\npeak RSS growth during the rec_sdk save: %.1f MB (table process RSS %.2f GB)"
        % (ours["save_rss_growth"] / 1e6, ours["table_rss"] / gb)
    )
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
