"""Serving with in-place updates (rec_sdk.serving) against the frozen StaticHashTable export.

Model: one table (dim 16, int64 keys) looked up by 4 ids per example, an MLP 64-128-1 on
the concatenated rows, trained with lazy Adam / Adam in a tf.compat.v1 Session.

1. Load time and memory (--keys, default 1M and 10M): the table filled with that many keys,
   exported three ways (export_saved_model: StaticHashTable + rows variable; export_serving_
   model: split DenseHashTables filled from assets; plugin=True: a rec_sdk table), each
   loaded in a fresh process by TensorFlow's loader: seconds to load, and resident memory
   above the process before the load (VmRSS and peak VmHWM) per key, against the payload
   (8-byte key + 4 x dim row).
2. Serving (--serve-keys, default 1M): QPS and p50 / p99 latency of requests of batch 1 and
   256 (4 ids each) from 8 client threads, static export without updates vs the mutable
   export while an update (1% of the rows and the dense layer) is applied every
   --update-secs (10), rounds alternated in one process (static, mutable, static, mutable).
3. Training side (--train-secs per round): training steps/s (batch 4096, 1% new ids) without
   pushes and with a push every --push-secs (30; as PushHook pushes: after a step, files
   written in the background), rounds alternated, while a follower in the same process
   applies each update to the served model (polling every second); the update lag is, per
   update, from the take of the previous push (the oldest change it carries) to the served
   model holding it. The first round's time includes the first push of the session.
4. Catch-up (--catchup-keys, default 100k; --catchup-pushes, default 1000): a table trained
   and pushed that many times (50 rows written and 10 removed per push, each push
   cumulative since the newest whole update); a replica started after the last push, in a
   fresh process: seconds to load the export, then to follow (updates applied: at most 2).
5. Memory under churn (--churn-keys, default 1M): each of 20 pushes removes 2% of the keys
   and adds 2% new ones (the tombstones that removals leave, and the rebuilds they trigger);
   a fresh process loads the export and applies every push: resident memory per live key
   against the payload, and the slowest apply.

    .venv/bin/python benchmarks/bench_serving.py [--keys 1000000,10000000] [--quick]
        [--only load|serve|train|catchup|churn]
"""

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import serving_report  # benchmarks/, the folder of this script
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops.loader import load_ops
from rec_sdk.optimizers import lazy_adam
from rec_sdk.serving import (
    Pusher,
    ServedModel,
    export_saved_model,
    export_serving_model,
    follow,
    indexed,
)
from rec_sdk.util.initialize import init, terminate_config_initializer

DIM = 16
IDS = 4
FILL = 1 << 20


def trim_heap():
    """Gives freed heap memory back to the system, so that VmRSS shows what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Model:
    def __init__(self, keys):
        tf.compat.v1.reset_default_graph()
        terminate_config_initializer()
        init(use_dynamic_expansion=False)
        self.keys = keys
        self.step = tf.compat.v1.train.get_or_create_global_step()
        self.table = create_table(
            tf.int64,
            DIM,
            "items",
            tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1),
            device_vocabulary_size=keys + keys // 4 + 4096,
            servable=True,
        )
        self.ids = tf.compat.v1.placeholder(tf.int64, [None, IDS], name="ids")
        self.labels = tf.compat.v1.placeholder(tf.float32, [None])
        with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
            self.layers = [
                tf.compat.v1.get_variable("w1", [IDS * DIM, 128]),
                tf.compat.v1.get_variable("w2", [128, 1]),
            ]
        logits = self._mlp(True)
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=self.labels, logits=logits)
        )
        self.train = tf.group(
            tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
                loss, var_list=self.layers, global_step=self.step
            ),
            lazy_adam.create_hash_optimizer(1e-3).apply_gradients(
                zip(tf.gradients(loss, [self.table]), [self.table])
            ),
        )
        self.prob = tf.sigmoid(self._mlp(False))
        self.fill_keys = tf.compat.v1.placeholder(tf.int64, [None])
        self.fill = self.table.upsert(
            self.fill_keys, tf.random.uniform([tf.size(self.fill_keys), DIM], -0.05, 0.05)
        )
        self.rng = np.random.RandomState(0)

    def _mlp(self, train):
        e = sparse_lookup(self.table, self.ids, is_train=train, name="train" if train else "serve")
        h = tf.nn.relu(tf.matmul(tf.reshape(e, [-1, IDS * DIM]), self.layers[0]))
        return tf.reshape(tf.matmul(h, self.layers[1]), [-1])

    def filled_session(self):
        sess = tf.compat.v1.Session()
        sess.run(tf.compat.v1.global_variables_initializer())
        for first in range(0, self.keys, FILL):
            sess.run(self.fill, {self.fill_keys: np.arange(first, min(first + FILL, self.keys))})
        return sess

    def batch(self, n=4096, new=0.01):
        """Ids mostly among the stored keys, a fraction `new` of them new."""
        ids = self.rng.randint(0, self.keys, (n, IDS))
        fresh = self.rng.rand(n, IDS) < new
        ids[fresh] = self.keys + self.rng.randint(0, self.keys // 4, fresh.sum())
        return {self.ids: ids, self.labels: self.rng.rand(n).round()}

    def export(self, sess, root, kind):
        inputs, outputs = {"ids": self.ids}, {"prob": self.prob}
        path = os.path.join(root, kind)
        t = time.perf_counter()
        if kind == "static":
            export_saved_model(sess, path, inputs, outputs)
        else:
            export_serving_model(
                sess,
                path,
                inputs,
                outputs,
                os.path.join(root, kind + "_push"),
                plugin=kind == "plugin",
            )
        return time.perf_counter() - t


# --- 1. load time and memory -------------------------------------------------------------


def load_child(path):
    """(In a fresh process) loads a SavedModel; prints seconds and memory."""
    if "plugin" in path:
        load_ops()  # the op library, as a server of a plugin-mode model loads it
    rss0, hwm0 = status_kb("VmRSS"), status_kb("VmHWM")
    t = time.perf_counter()
    sess = tf.compat.v1.Session(graph=tf.Graph())
    with sess.graph.as_default():
        tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
    seconds = time.perf_counter() - t
    trim_heap()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rss_kb": status_kb("VmRSS") - rss0,
                "peak_kb": status_kb("VmHWM") - max(hwm0, rss0),
            }
        )
    )


def bench_load(keys_list, root):
    rows = []
    for keys in keys_list:
        model = Model(keys)
        sess = model.filled_session()
        for kind in ("static", "mutable", "plugin"):
            export_s = model.export(sess, root, kind)
            out = subprocess.run(
                [sys.executable, __file__, "--load-child", os.path.join(root, kind)],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            payload = keys * (8 + 4 * DIM)
            rows.append(
                {
                    "keys": keys,
                    "kind": kind,
                    "export_s": round(export_s, 1),
                    "load_s": round(got["seconds"], 2),
                    "rss_kb": got["rss_kb"],
                    "rss_per_payload": round(got["rss_kb"] * 1024 / payload, 2),
                    "peak_per_payload": round(got["peak_kb"] * 1024 / payload, 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(os.path.join(root, kind), ignore_errors=True)
            shutil.rmtree(os.path.join(root, kind + "_push"), ignore_errors=True)
        sess.close()
    return rows


# --- 2. serving throughput and latency ----------------------------------------------------


def serve_round(served, batch, seconds, keys, clients=8, apply=None):
    sig = served.signatures["serving_default"]
    feed_name, fetch = sig.inputs["ids"].name, sig.outputs["prob"].name
    stop = threading.Event()
    latencies = [[] for _ in range(clients)]

    def client(i):
        rng = np.random.RandomState(i)
        while not stop.is_set():
            ids = rng.randint(0, keys, (batch, IDS))
            t = time.perf_counter()
            served.sess.run(fetch, {feed_name: ids})
            latencies[i].append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    applier = None
    if apply is not None:
        applier = threading.Thread(target=apply, args=(stop,))
        applier.start()
    time.sleep(seconds)
    stop.set()
    for t in threads + ([applier] if applier else []):
        t.join()
    lat = np.concatenate([np.asarray(x) for x in latencies])
    return {
        "qps": len(lat) / seconds * batch,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
    }


def bench_serve(keys, root, seconds, update_secs, rounds=2):
    model = Model(keys)
    sess = model.filled_session()
    model.export(sess, root, "static")
    model.export(sess, root, "mutable")
    push_dir = os.path.join(root, "mutable_push")
    pusher = Pusher(push_dir)
    updates_needed = int(rounds * 2 * seconds / update_secs) + 2
    for _ in range(updates_needed):
        # 1% of the rows change (as a busy minute of training would change them).
        sess.run(model.fill, {model.fill_keys: model.rng.choice(keys, keys // 100, False)})
        sess.run(model.train, model.batch(1024))
        pusher.push(sess)
    sess.close()
    static = ServedModel(os.path.join(root, "static"))
    mutable = ServedModel(os.path.join(root, "mutable"))
    applied = []

    def apply(stop):
        while not stop.wait(update_secs):
            t = time.perf_counter()
            applied.extend(follow_one(push_dir, mutable))
            applied.append(("seconds", time.perf_counter() - t))

    results = []
    for batch in (1, 256):
        for r in range(rounds):
            for kind, served in (("static", static), ("mutable", mutable)):
                got = serve_round(
                    served, batch, seconds, keys, apply=apply if kind == "mutable" else None
                )
                got.update(batch=batch, kind=kind, round=r)
                results.append(got)
                print(json.dumps(got), flush=True)
    apply_seconds = [s for k, s in applied if k == "seconds"] if applied else []
    return results, apply_seconds


# --- 4. and 5. catch-up and churn ---------------------------------------------------------


def follow_child(export_dir, push_dir):
    """(In a fresh process) loads an export and brings it up to date: with push_dir's updates
    applied one by one when ONE_BY_ONE is set (churn), else with follow (catch-up). Prints
    seconds and memory."""
    rss0 = status_kb("VmRSS")
    t = time.perf_counter()
    served = ServedModel(export_dir)
    load_s = time.perf_counter() - t
    trim_heap()
    load_rss = status_kb("VmRSS") - rss0
    applies = []
    t = time.perf_counter()
    if os.environ.get("ONE_BY_ONE"):
        for version in sorted(int(n) for n in os.listdir(push_dir) if n.isdigit()):
            a = time.perf_counter()
            served.apply(os.path.join(push_dir, "%010d" % version))
            applies.append(time.perf_counter() - a)
    else:
        applied = follow(push_dir, served)
        applies = [0.0] * len(applied)
    follow_s = time.perf_counter() - t
    trim_heap()
    live, bucket_bytes = 0, 0
    for keys, table_bytes in served.sess.run(_served_sizes(served)):
        live += keys
        bucket_bytes += table_bytes
    print(
        json.dumps(
            {
                "load_s": load_s,
                "follow_s": follow_s,
                "applied": len(applies),
                "max_apply_s": max(applies) if applies else 0.0,
                "apply_s": [round(a, 3) for a in applies],
                "load_rss_kb": load_rss,
                "rss_kb": status_kb("VmRSS") - rss0,
                "live_keys": int(live),
                "bucket_bytes": int(bucket_bytes),
            }
        )
    )


def _served_sizes(served):
    """[(live keys, bytes)] tensors of each served table of a loaded model: an index and its
    rows (indexed.IndexedTable) or a split table's hash tables of rows (mutable.ServedTable)."""
    graph = served.graph
    out = []

    def read(name):
        handle = graph.get_operation_by_name(name).outputs[0]
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64)

    def buckets(handle, values):
        keys, _ = tf.raw_ops.LookupTableExportV2(
            table_handle=handle, Tkeys=tf.int64, Tvalues=values
        )
        return tf.cast(tf.shape(keys)[0], tf.int64)

    with graph.as_default():
        for table in [op for op in graph.get_operations() if op.type == "MutableDenseHashTableV2"]:
            handle = table.outputs[0]
            if table.name.endswith("_index"):
                stem = table.name[: -len("_index")]
                rows = graph.get_operation_by_name(stem + "_rows").outputs[0]
                capacity = tf.raw_ops.VariableShape(input=rows, out_type=tf.int64)[0]
                out.append(
                    (
                        read(stem + "_used") - 1 - read(stem + "_stale"),
                        buckets(handle, tf.int32) * indexed.SLOT_BYTES + capacity * 4 * DIM,
                    )
                )
            else:
                out.append(
                    (
                        tf.raw_ops.LookupTableSizeV2(table_handle=handle)
                        - read(table.name + "_tombstones"),
                        buckets(handle, tf.float32) * (8 + 4 * DIM),
                    )
                )
    return out


def run_follow_child(export_dir, push_dir, one_by_one=False):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if one_by_one:
        env["ONE_BY_ONE"] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--follow-child", export_dir, push_dir],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_catchup(keys, pushes, root):
    model = Model(keys)
    sess = model.filled_session()
    model.export(sess, root, "catchup")
    push_dir = os.path.join(root, "catchup_push")
    pusher = Pusher(push_dir)
    t = time.perf_counter()
    for _ in range(pushes):
        sess.run(model.fill, {model.fill_keys: model.rng.randint(0, keys + keys // 4, 50)})
        sess.run(model.table.remove(model.rng.randint(0, keys, 10)))
        pusher.push(sess)
    push_s = time.perf_counter() - t
    sess.close()
    got = run_follow_child(os.path.join(root, "catchup"), push_dir)
    got.update(
        keys=keys,
        pushes=pushes,
        push_s=push_s,
        whole=pusher.whole_updates,
        kept=len([n for n in os.listdir(push_dir) if n.isdigit()]),
    )
    print(json.dumps(got), flush=True)
    return got


def bench_churn(keys, root, pushes=20):
    model = Model(keys)
    sess = model.filled_session()
    model.export(sess, root, "churn")
    push_dir = os.path.join(root, "churn_push")
    pusher = Pusher(push_dir, base_fraction=100)  # cumulative: the removals stay tombstones
    stored = np.arange(keys, dtype=np.int64)
    fresh = keys
    gone_keys = tf.compat.v1.placeholder(tf.int64, [None])
    remove = model.table.remove(gone_keys)
    for _ in range(pushes):
        gone = model.rng.choice(len(stored), keys // 50, replace=False)
        sess.run(remove, {gone_keys: stored[gone]})
        new = np.arange(fresh, fresh + keys // 50, dtype=np.int64)
        fresh += len(new)
        sess.run(model.fill, {model.fill_keys: new})
        stored = np.concatenate([np.delete(stored, gone), new])
        pusher.push(sess)
    sess.close()
    got = run_follow_child(os.path.join(root, "churn"), push_dir, one_by_one=True)
    payload = got["live_keys"] * (8 + 4 * DIM)
    got.update(
        keys=keys,
        pushes=pushes,
        rss_per_payload=got["rss_kb"] * 1024 / payload,
        buckets_per_payload=got["bucket_bytes"] / payload,
        load_rss_per_payload=got["load_rss_kb"] * 1024 / (keys * (8 + 4 * DIM)),
    )
    assert got["live_keys"] == len(stored), (got["live_keys"], len(stored))
    print(json.dumps(got), flush=True)
    return got


def follow_one(push_dir, model):
    """Applies the next update only (one per period, as a pusher would publish them)."""
    version, _ = model.version()
    path = os.path.join(push_dir, "%010d" % (version + 1))
    if not os.path.isdir(path):
        return []
    return [("version", model.apply(path))]


# --- 3. training side: push cost and update lag -------------------------------------------


def bench_train(keys, root, seconds, push_secs):
    """Rounds without and with pushes alternated on one filled session; pushes as PushHook
    makes them (after a step, every push_secs, files written in the background)."""
    model = Model(keys)
    sess = model.filled_session()
    model.export(sess, root, "lag")
    push_dir = os.path.join(root, "lag_push")
    served = ServedModel(os.path.join(root, "lag"))
    pusher = Pusher(push_dir)
    out = {}
    for label in ("no push", "push", "no push 2", "push 2"):
        pushing = label.startswith("push")
        takes, applied = {}, {}
        stop = threading.Event()

        def follower(stop=stop, applied=applied):
            while not stop.wait(1.0):
                for version in follow(push_dir, served):
                    applied[version] = time.time()

        thread = threading.Thread(target=follower)
        thread.start()
        steps, previous_take = 0, time.time()
        feeds = [model.batch(4096) for _ in range(8)]
        t0 = last_push = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sess.run(model.train, feeds[steps % len(feeds)])
            steps += 1
            if pushing and time.perf_counter() - last_push >= push_secs:
                last_push = time.perf_counter()
                taken_at = time.time()
                version = pusher.push(sess, wait=False)
                if version is not None:
                    takes[version] = (previous_take, taken_at)
                    previous_take = taken_at
        elapsed = time.perf_counter() - t0
        pusher.wait()
        time.sleep(2.5)
        stop.set()
        thread.join()
        # An update carries the changes made since the previous take: its oldest change is
        # that take's time.
        lags = [applied[v] - takes[v][0] for v in takes if v in applied]
        out[label] = {
            "steps_per_s": steps / elapsed,
            "pushes": len(takes),
            "applied": sum(v in applied for v in takes),
            "max_lag_s": max(lags) if lags else None,
        }
        print(label, json.dumps(out[label]), flush=True)
    sess.close()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="1000000,10000000")
    parser.add_argument("--serve-keys", type=int, default=1000000)
    parser.add_argument("--serve-secs", type=float, default=20)
    parser.add_argument("--update-secs", type=float, default=10)
    parser.add_argument("--train-secs", type=float, default=95)
    parser.add_argument("--push-secs", type=float, default=30)
    parser.add_argument("--quick", action="store_true", help="small sizes, short runs")
    parser.add_argument("--catchup-keys", type=int, default=100000)
    parser.add_argument("--catchup-pushes", type=int, default=1000)
    parser.add_argument("--churn-keys", type=int, default=1000000)
    parser.add_argument("--only", choices=["load", "serve", "train", "catchup", "churn"])
    parser.add_argument("--load-child")
    parser.add_argument("--follow-child", nargs=2, metavar=("EXPORT", "PUSH_DIR"))
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    if args.load_child:
        load_child(args.load_child)
        return
    if args.follow_child:
        follow_child(*args.follow_child)
        return
    if args.quick:
        args.keys, args.serve_keys, args.serve_secs = "100000", 100000, 4
        args.update_secs, args.train_secs, args.push_secs = 2, 12, 4
        args.catchup_keys, args.catchup_pushes, args.churn_keys = 20000, 100, 100000
    root = tempfile.mkdtemp(prefix="rec_sdk_bench_serving_")
    print("machine:", platform.platform(), os.cpu_count(), "cores; tensorflow", tf.__version__)
    try:
        load = serve = train = catchup = churn = None
        apply_seconds = []
        if args.only in (None, "load"):
            load = bench_load([int(k) for k in args.keys.split(",")], root)
        if args.only in (None, "serve"):
            serve, apply_seconds = bench_serve(
                args.serve_keys, root, args.serve_secs, args.update_secs
            )
        if args.only in (None, "train"):
            train = bench_train(args.serve_keys, root, args.train_secs, args.push_secs)
        if args.only in (None, "catchup"):
            catchup = bench_catchup(args.catchup_keys, args.catchup_pushes, root)
        if args.only in (None, "churn"):
            churn = bench_churn(args.churn_keys, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    serving_report.report(load, serve, apply_seconds, train, DIM)
    if catchup:
        print(
            "\n## catch-up after %(pushes)d pushes (%(keys)d keys): load %(load_s).2f s, "
            "follow %(follow_s).2f s (%(applied)d updates applied); the chain holds "
            "%(kept)d updates, %(whole)d whole ones written; pushing took %(push_s).0f s" % catchup
        )
    if churn:
        print(
            "\n## churn (%(keys)d keys, %(pushes)d pushes of 2%% removed + 2%% new): "
            "hash table buckets %(buckets_per_payload).2fx the live keys' payload; "
            "RSS %(rss_per_payload).2fx after the pushes "
            "(%(load_rss_per_payload).2fx after the load); slowest apply %(max_apply_s).3f s"
            % churn
        )


if __name__ == "__main__":
    main()
