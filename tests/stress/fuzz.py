"""Stress: seeded random calls of every RecSdk> op (all 33), bad shapes, dtypes, addresses, sizes
and values mixed with valid ones: no crash, no hang, only clean errors, table invariants kept.

    python tests/stress/fuzz.py [--calls 1000000] [--seed 0] [--children K]
    python tests/stress/fuzz.py --calls 40000                 # the quick subset (~20 s)
    python tests/stress/fuzz.py --calls 1000000 --seed 0 --children 20 --chunk 7 [--verbose]

The last form replays one chunk in this process (same --calls/--seed/--children as the run
that reported it): the same sequence of ops, variants and input draws, though the tables'
states may drift from the first run (their hash seeds are random, so which rows a full table
keeps, evicts or restricts can differ); --verbose prints every call with its inputs and
outcome. A crash or hang also reports the call that was running, with its input shapes.
FUZZ_PER_OP=1 in the environment prints per-op outcomes and their commonest error messages.

Inputs come from numpy's seeded Generator (np.random.default_rng([seed, chunk])): a fuzzing
library (hypothesis, atheris) costs far more per example than the ~100 us an op call takes
here, and is not installed. Each child process builds, once, a graph (graph mode) of op
"variants" over placeholders of unknown shape, run through Session callables: the ops on nine
tables (int32/int64 keys, dims 1 to 37, fixed capacity with or without eviction, dynamic,
track_changes/track_access, private or shared between sessions, two containers), with key
dtypes and dims that do or do not match their table and random attributes (slot,
init_missing, slot_optimizer, unique_addresses, use_nesterov, accumulator values, restrict
`by`, admission thresholds), the ops on foreign handles (a resource variable, a table whose
creation fails), and table creations with random and absurd attributes (bounded: whatever may
succeed stays small in address space, mappings and memory; what is huge must fail, e.g. with
ResourceExhausted), up to six of which (dims up to 8192, capacities down to 1) also get every
op. Every call picks an op, a variant and fresh inputs: empty, scalar,
wrong-rank and wrong-size tensors, huge/negative/NaN/Inf values, row addresses that are
garbage, real (often from a training lookup just before), of another table, bit-flipped or
stale (after remove/clear/restore/eviction), and checkpoint directories in a temporary
directory (/dev/shm when available: saves fsync) that are fresh, existing, files, missing,
too long, with NUL bytes, saves of other tables or deltas, or corrupted copies, with real or
random save ids and rank ids. Now and then: a checkpoint round trip (save, commit, change,
delta save, commit, restore into this session's or the previous session's table, apply the
delta), a table destroyed under its handle, a session replaced (the previous one stays open
one period, so that tables shared between sessions and restores served from memory are
exercised).

A call either succeeds or raises an OpError of a clean kind (InvalidArgument,
ResourceExhausted, FailedPrecondition, NotFound, OutOfRange, Unimplemented, AlreadyExists,
DataLoss, PermissionDenied), counted by kind. Any other kind (Internal, Unknown...) or another
Python exception is an unexpected error, reported with its op, variant and inputs.

Table invariants, checked every few hundred calls, when a session closes and at the end, on
every table: the size op equals the number of exported keys; exported keys are unique; a
lookup of them finds all of them, with the exported values; the stats' size and capacity
equal the size and capacity ops; size <= capacity (a fixed table's capacity as configured);
counters >= 0; no NaN/Inf in the rows or slots of a table given only finite, moderate
values and hyperparameters since it was last emptied or replaced (four tables are only ever
given such values; the others get wild ones too; checkpoint directories carry the state of
their table); and in the round trips, a checkpoint the table has just written restores (no
DataLoss), after which (and the delta) it holds exactly the keys and values it had at its
last save.

The calls are split into chunks (default: one per 50,000 calls), each run by a child process
in turn with a time limit: a crash (signal) or a hang (timeout) is counted as a loss, reported
with the command that replays the chunk and the last call it started. Prints one summary line
(with the fewest calls any op got); exits non-zero on any crash, hang, invariant violation or
unexpected error.
"""

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

OPS = (
    "ApplyAdagrad",
    "ApplyFtrl",
    "ApplyGradientDescent",
    "ApplyLazyAdam",
    "ApplyMomentum",
    "EmbeddingTable",
    "GatherRowsByIndex",
    "KeyAccessStats",
    "SumRowsByIndex",
    "TableApplyDelta",
    "TableCapacity",
    "TableClear",
    "TableCommitSave",
    "TableConfigureAdmission",
    "TableEvict",
    "TableExport",
    "TableExportAccess",
    "TableFindOrInsert",
    "TableFindOrInsertRows",
    "TableGather",
    "TableImport",
    "TableLookup",
    "TableReadRows",
    "TableRemove",
    "TableRestore",
    "TableRestrict",
    "TableSave",
    "TableSetAccessThreshold",
    "TableSize",
    "TableStats",
    "TableUpsert",
    "TableWriteRows",
    "TrainableRows",
    "UniqueKeys",
)
# Relative frequency of the ops: table creation stays a minority, checkpoint ops (file I/O)
# and clear (it empties the table the other ops work on) are rarer; the rest are equal.
WEIGHTS = dict(
    {op: 1.0 for op in OPS},
    EmbeddingTable=0.5,
    TableSave=0.6,
    TableRestore=0.6,
    TableApplyDelta=0.5,
    TableCommitSave=0.6,
    TableClear=0.5,
    TableImport=0.7,
)
CLEAN = (
    "InvalidArgument",
    "ResourceExhausted",
    "FailedPrecondition",
    "NotFound",
    "OutOfRange",
    "Unimplemented",
    "AlreadyExists",
    "DataLoss",
    "PermissionDenied",
)
CALLS_PER_CHILD = 50_000
RESTART_EVERY = 20_000  # at most this many calls between session replacements
CHECK_EVERY = 300  # calls between invariant checks
MAX_DIRS = 40  # checkpoint directories kept in the pool
OPTIMIZERS = ("LazyAdam", "GradientDescent", "Adagrad", "Momentum", "Ftrl")

# The tables each child works on. guarded: only ever given finite, moderate floats (so the
# NaN check applies); the others get wild values too.
TABLES = (
    dict(name="fz_a", key_dtype="int64", dim=8, dynamic=True, guarded=True),
    dict(
        name="fz_b",
        key_dtype="int64",
        dim=4,
        dynamic=False,
        capacity=300,
        evict_when_full=True,
        track_access=True,
        guarded=True,
    ),
    dict(
        name="fz_c",
        key_dtype="int32",
        dim=3,
        dynamic=True,
        track_changes=True,
        share="trainer",
        guarded=True,
    ),
    dict(
        name="fz_d",
        key_dtype="int64",
        dim=8,
        dynamic=False,
        capacity=64,
        track_changes=True,
        guarded=False,
    ),
    dict(
        name="fz_e",
        key_dtype="int32",
        dim=1,
        dynamic=True,
        initial_capacity=100,
        share="reader",
        guarded=False,
    ),
    dict(
        name="fz_f",
        key_dtype="int64",
        dim=8,
        dynamic=True,
        track_changes=True,
        track_access=True,
        share="trainer",
        guarded=False,
    ),
    dict(
        name="fz_g",
        key_dtype="int64",
        dim=8,
        dynamic=False,
        capacity=2000,
        evict_when_full=True,
        track_changes=True,
        guarded=True,
    ),
    dict(name="fz_h", key_dtype="int64", dim=37, dynamic=True, container="fz_other", guarded=False),
    dict(
        name="fz_a",
        key_dtype="int32",
        dim=8,
        dynamic=True,
        container="fz_other",
        track_access=True,
        guarded=False,
    ),
)


def _max_map_count():
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _kind(exc):
    name = type(exc).__name__
    return name[:-5] if name.endswith("Error") else name


def _first_line(message):
    """The error's own first line (without TensorFlow's "Graph execution error:" header and
    the traceback of where the node was defined)."""
    lines = (message or "").splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("Node: ") and lines[i + 1].strip():
            return lines[i + 1].strip()
    for line in lines:
        line = line.strip()
        if line and line != "Graph execution error:" and not line.startswith("Detected at"):
            return line
    return ""


def _signature(message):
    """A message with its names, paths and numbers blanked: groups findings."""
    line = re.sub(r"'[^']*'", "'*'", _first_line(message))
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)[:160]


def _describe(x):
    """Short description of one input array (for reports and --verbose)."""
    import numpy as np

    x = np.asarray(x)
    if x.dtype == object:
        values = [v[:60] + (b"..." if len(v) > 60 else b"") for v in x.reshape(-1)[:3]]
        return "str%s%r" % (list(x.shape), values)
    if x.size <= 6:
        return "%s%s=%s" % (x.dtype, list(x.shape), x.reshape(-1).tolist())
    flat = x.reshape(-1)
    return "%s%s[%s, ...] min=%s max=%s" % (
        x.dtype,
        list(x.shape),
        ", ".join(str(v) for v in flat[:4].tolist()),
        flat.min(),
        flat.max(),
    )


class Variant:
    """One op node of the graph: what to fetch, which placeholders to feed, which table."""

    __slots__ = ("id", "op", "fetch", "feeds", "table", "tdesc", "kd", "dim", "attrs", "desc")

    def __init__(self, vid, op, fetch, feeds, table, tdesc, kd=None, dim=None, attrs=None):
        self.id, self.op, self.fetch, self.feeds = vid, op, fetch, feeds
        self.table, self.tdesc, self.kd, self.dim = table, tdesc, kd, dim
        self.attrs = attrs or {}
        where = tdesc["name"] if table is not None and table >= 0 else tdesc.get("label", "-")
        self.desc = "%s#%d on %s %s" % (
            op,
            vid,
            where,
            " ".join("%s=%s" % kv for kv in self.attrs.items()),
        )


class SessionState:
    def __init__(self, sess, gen, n_tables):
        self.sess, self.gen = sess, gen
        self.callables = {}
        self.addr = [None] * n_tables  # recent real addresses per table (numpy int64)
        self.last = [None] * n_tables  # the addresses of the last lookup of each table
        self.owner = [None] * n_tables  # the optimizer op that last trained each table
        self.save_ids = [[] for _ in range(n_tables)]
        self.taint = [False] * n_tables
        self.violated = set()


class Fuzzer:
    def __init__(self, seed, chunk, calls, root, verbose=False, crumb=None):
        import numpy as np

        self.np = np
        self.seed, self.chunk, self.calls, self.verbose = seed, chunk, calls, verbose
        self.rng = np.random.default_rng([seed, chunk])
        self.root = tempfile.mkdtemp(prefix="rec_sdk_fuzz_%d_" % chunk, dir=root)
        self.crumb_fd = os.open(crumb, os.O_WRONLY | os.O_CREAT, 0o644) if crumb else None
        self.counts = collections.Counter()
        self.outcomes = collections.Counter()
        self.op_outcomes = collections.defaultdict(collections.Counter)
        self.unexpected = collections.Counter()
        self.unexpected_examples = {}
        self.violations = []
        self.notes = collections.Counter()
        self.checks = 0
        self.nan_checks = 0
        self.taint_reasons = collections.Counter()
        self.verbose_errors = bool(os.environ.get("FUZZ_PER_OP"))
        self.error_sigs = collections.Counter()
        self.op_seconds = collections.Counter()
        self.build_rejected = collections.Counter()
        self.meta = collections.Counter()
        self.history = np.zeros(0, np.int64)  # addresses seen in any session (for stale ones)
        self.shared_taint = {}  # tables shared between sessions
        self.dirs = []  # checkpoint directories: dicts
        self.corrupted = set()  # directories with a file changed or removed
        self.fresh = 0
        self.fresh_addresses = False  # mostly the last lookup's addresses (after a pair)
        self.inject, self.inject_at = None, -1
        self._prepare_paths()

    # ----------------------------------------------------------------- temp directory
    def _prepare_paths(self):
        r = self.root
        os.makedirs(os.path.join(r, "emptydir"))
        os.makedirs(os.path.join(r, "metadir", "meta.txt"))
        with open(os.path.join(r, "plainfile"), "w") as f:
            f.write("not a checkpoint\n")
        self.bad_save = [
            os.path.join(r, "plainfile"),
            os.path.join(r, "plainfile", "sub"),
            os.path.join(r, "emptydir"),
            os.path.join(r, "nope", "deeper", "x"),
            "",
            os.path.join(r, "nul\0byte"),
            "\0",
            r,
            os.path.join(r, "n" * 300),
        ]
        self.bad_read = self.bad_save + [
            os.path.join(r, "missing"),
            os.path.join(r, "metadir"),
            "/",
            "relative/nonexistent",
            os.path.join(r, "."),
        ]

    def cleanup(self):
        shutil.rmtree(self.root, ignore_errors=True)
        if self.crumb_fd is not None:
            os.close(self.crumb_fd)

    # ----------------------------------------------------------------- random helpers
    def _count(self):
        r = self.rng.random()
        if r < 0.07:
            return 0
        if r < 0.55:
            return int(self.rng.integers(1, 17))
        if r < 0.92:
            return int(self.rng.integers(17, 257))
        if r < 0.998:
            return int(self.rng.integers(257, 4097))
        return int(self.rng.integers(4097, 50001))

    def _n(self, tdesc):
        """A batch size; for tables of large rows, at most 2^20 floats per batch."""
        n = self._count()
        return min(n, max(1, 2**20 // tdesc["dim"])) if tdesc.get("bounded") else n

    def _shape(self, n):
        r = self.rng.random()
        if r < 0.82:
            return (n,)
        if r < 0.87:
            return ()
        if r < 0.94:
            a = int(self.rng.integers(1, 5))
            return (a, n // a)
        if r < 0.97:
            return (1, n, 1)
        return (0, n) if r < 0.985 else (n, 0)

    def _rows_shape(self, shape, dim):
        """keys.shape + [dim] mostly, else something close to it."""
        if self.rng.random() < 0.85:
            return shape + (dim,)
        c = int(self.rng.integers(0, 6))
        size = int(self.np.prod(shape)) if shape else 1
        return (
            shape + (dim + 1,),
            shape,
            (size + 1, dim),
            shape + (max(dim - 1, 0),),
            (dim,),
            shape + (dim, 1),
        )[c]

    EXTREMES = (
        0,
        1,
        -1,
        2,
        2**31 - 1,
        -(2**31),
        2**31,
        -(2**31) - 1,
        2**32,
        2**40,
        2**52,
        2**62,
        2**63 - 1,
        -(2**63),
        -(2**63) + 1,
    )

    def _keys(self, tdesc, dtype, shape):
        np, rng = self.np, self.rng
        n = int(np.prod(shape)) if shape else 1
        space = tdesc["space"]
        r = rng.random()
        if tdesc.get("bounded"):  # a bounded number of distinct keys: rows may be large
            k = rng.integers(-space // 2, space, n)
            if r < 0.2:
                k[rng.random(n) < 0.1] = rng.choice(np.array(self.EXTREMES, np.int64))
        elif r < 0.6:
            k = rng.integers(0, space, n)
        elif r < 0.7:
            k = rng.integers(-space, space, n)
        elif r < 0.78:
            k = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
        elif r < 0.86:
            k = rng.choice(np.array(self.EXTREMES, np.int64), n)
        elif r < 0.93:
            k = np.full(n, rng.integers(0, space), np.int64)
        else:
            k = rng.integers(0, space, n)
            mask = rng.random(n) < 0.2
            k[mask] = rng.choice(np.array(self.EXTREMES, np.int64), int(mask.sum()))
        return k.astype(dtype).reshape(shape)

    WILD = (
        float("nan"),
        float("inf"),
        float("-inf"),
        3.4e38,
        -3.4e38,
        1e-45,
        -0.0,
        1e20,
        -1e20,
        1e-38,
    )

    def _floats(self, shape, tame):
        np, rng = self.np, self.rng
        scale = (1e-3, 1.0, 10.0, 30.0)[int(rng.integers(0, 4))]
        size = int(np.prod(shape)) if shape else 1
        if size > 4096:  # large batches: a random block repeated (drawing them all is slow)
            x = np.resize(rng.standard_normal(4099, dtype=np.float32), shape)
        else:
            x = np.asarray(rng.standard_normal(size=shape, dtype=np.float32))
        x = np.array(x * np.float32(scale), dtype=np.float32)
        if tame:
            return np.clip(x, -100, 100)
        r = rng.random()
        if r < 0.5 and x.size:
            mask = np.asarray(rng.random(x.shape) < (0.3 if r < 0.1 else 0.02))
            x[mask] = rng.choice(np.array(self.WILD, np.float32), int(mask.sum()))
        elif r < 0.6:
            x = x * np.float32(1e30)
        return x

    def _is_tame(self, x):
        np = self.np
        return x.size == 0 or bool(np.isfinite(x).all() and np.abs(x).max() <= 100)

    def _scalar(self, dtype, value, bad=0.08):
        np, r = self.np, self.rng.random()
        if r < 1 - bad:
            return np.asarray(value, dtype)
        if r < 1 - bad * 5 / 8:
            return np.asarray([value], dtype)
        if r < 1 - bad * 3 / 8:
            return np.zeros([0], dtype)
        return np.asarray([value, value], dtype)

    def _int64_value(self, small):
        """An int64 from a small valid-ish range mostly, else an extreme."""
        if self.rng.random() < 0.8:
            return int(self.rng.integers(small[0], small[1]))
        return int(self.rng.choice(self.np.array(self.EXTREMES + (-2, -5), self.np.int64)))

    def _addresses(self, S, table, shape):
        np, rng = self.np, self.rng
        n = int(np.prod(shape)) if shape else 1
        pool = S.addr[table] if table is not None and table >= 0 else None
        last = S.last[table] if table is not None and table >= 0 else None
        r = rng.random() * (0.35 if self.fresh_addresses else 1.0)
        if r < 0.3 and last is not None and last.size:
            a = rng.choice(last, n, replace=n > last.size)
        elif r < 0.5 and pool is not None and pool.size:
            a = rng.choice(pool, n)
        elif r < 0.55 and pool is not None and pool.size:
            a = rng.choice(pool, n)
            a[rng.random(n) < 0.5] = -1
        elif r < 0.65:
            others = [p for p in S.addr if p is not None and p.size]
            a = (
                rng.choice(others[int(rng.integers(0, len(others)))], n)
                if others
                else np.full(n, -1, np.int64)
            )
        elif r < 0.72 and pool is not None and pool.size:
            a = rng.choice(pool, n)
            bits = rng.integers(0, 63, n).astype(np.uint64)
            a = (a.view(np.uint64) ^ (np.uint64(1) << bits)).view(np.int64)
        elif r < 0.8:
            a = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
        elif r < 0.86:
            a = rng.integers(-5, 1000, n)
        elif r < 0.95 and self.history.size:
            a = rng.choice(self.history, n)
        else:
            a = np.full(n, -1, np.int64)
        return a.astype(np.int64).reshape(shape)

    def _remember(self, S, table, addresses):
        np = self.np
        a = np.asarray(addresses).reshape(-1)
        a = a[a != -1]
        if not a.size or table is None or table < 0:
            return
        S.last[table] = a[:4096]
        if a.size > 64:
            a = a[:64]
        old = S.addr[table]
        S.addr[table] = a if old is None else np.concatenate([old[-1984:], a])
        self.history = np.concatenate([self.history[-4032:], a])

    def _strings(self, paths, shape):
        np = self.np
        arr = np.empty(len(paths), dtype=object)
        arr[:] = [p.encode("utf-8", "surrogateescape") for p in paths]
        return arr.reshape(shape)

    def _read_dir(self, table, delta=False):
        """(path, taint) for restore/delta: a saved directory or a bad path."""
        r = self.rng.random()
        same = [d for d in self.dirs if d["table"] == table and d["delta"] == delta]
        if r < 0.3:
            same = [d for d in self.dirs if d["table"] == table]
        if r < 0.45 and same:
            d = same[-1 - int(self.rng.integers(0, min(len(same), 4)))]
            return d["path"], d["taint"]
        if r < 0.75 and self.dirs:
            d = self.dirs[int(self.rng.integers(0, len(self.dirs)))]
            return d["path"], d["taint"]
        return self.bad_read[int(self.rng.integers(0, len(self.bad_read)))], True

    def _save_dir(self):
        r = self.rng.random()
        if r < 0.75:
            self.fresh += 1
            return os.path.join(self.root, "s%d" % self.fresh)
        if r < 0.85 and self.dirs:
            return self.dirs[int(self.rng.integers(0, len(self.dirs)))]["path"]
        return self.bad_save[int(self.rng.integers(0, len(self.bad_save)))]

    # ----------------------------------------------------------------- graph
    def build(self):
        import numpy as np
        import tensorflow as tf

        self.tf = tf
        from rec_sdk.ops.loader import load_ops

        ops = load_ops()
        rng = self.rng
        self.graph = tf.Graph()
        self.placeholders = {}
        self.variants = collections.defaultdict(list)
        kinds = {"int64": tf.int64, "int32": tf.int32}
        npk = {"int64": np.int64, "int32": np.int32}
        with self.graph.as_default():

            def ph(dtype, i):
                key = (dtype, i)
                if key not in self.placeholders:
                    self.placeholders[key] = tf.compat.v1.placeholder(
                        dtype, None, name="p_%s_%d" % (dtype.name, i)
                    )
                return self.placeholders[key]

            def finish(t, handle):
                """A table's admission, destroy and check ops."""
                t["handle"] = handle
                thresholds = [(-1, -1)] + [
                    (
                        int(rng.choice([-1, 0, 1, 2, 3, 2**62])),
                        int(rng.choice([-1, 0, 1, 10, 1000, 2**63 - 1])),
                    )
                    for _ in range(2)
                ]
                t["configured"] = [
                    (
                        ops.rec_sdk_table_configure_admission(
                            handle, access_threshold=a, eviction_threshold=e
                        ),
                        a,
                        e,
                    )
                    for a, e in thresholds
                ]
                t["destroy"] = tf.raw_ops.DestroyResourceOp(
                    resource=handle, ignore_lookup_error=True
                )
                t["check"] = dict(
                    size=ops.rec_sdk_table_size(handle),
                    capacity=ops.rec_sdk_table_capacity(handle),
                    stats=ops.rec_sdk_table_stats(handle),
                    export=ops.rec_sdk_table_export(
                        handle, key_dtype=kinds[t["key_dtype"]], dim=t["dim"]
                    ),
                    keys=tf.compat.v1.placeholder(kinds[t["key_dtype"]], [None]),
                )
                t["check"]["lookup"] = ops.rec_sdk_table_lookup(
                    handle, t["check"]["keys"], dim=t["dim"]
                )

            # Main tables.
            self.tables = []
            for i, spec in enumerate(TABLES):
                t = dict(spec)
                t.setdefault("capacity", 0)
                t.setdefault("share", "")
                t["space"] = int(rng.choice([64, 500, 3000]))
                t["init"] = self._tame_initializer(t["dim"])
                t["np_kd"] = npk[t["key_dtype"]]
                t["label"] = "%s/%s" % (t.get("container", ""), t["name"])
                handle = ops.rec_sdk_embedding_table(
                    table_name=t["name"],
                    key_dtype=kinds[t["key_dtype"]],
                    dim=t["dim"],
                    dynamic_expansion=t["dynamic"],
                    capacity=t["capacity"],
                    initial_capacity=t.get("initial_capacity", 0),
                    evict_when_full=t.get("evict_when_full", False),
                    track_changes=t.get("track_changes", False),
                    track_access=t.get("track_access", False),
                    share=t["share"],
                    container=t.get("container", ""),
                    shared_name=t["name"],
                    name="table%d" % i,
                    **t["init"],
                )
                finish(t, handle)
                self.tables.append(t)

            # Handles that are not tables of this library, or fail.
            var_handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="fz_var")
            broken = ops.rec_sdk_embedding_table(
                table_name="fz_broken",
                key_dtype=tf.int64,
                dim=2,
                dynamic_expansion=False,
                capacity=0,
                initializer="constant",
                shared_name="fz_broken",
            )
            foreign = [(-1, var_handle, "a resource variable"), (-2, broken, "a broken table")]
            foreign = [
                (idx, h, label, [(ops.rec_sdk_table_configure_admission(h), -1, -1)])
                for idx, h, label in foreign
            ]

            vid = [0]

            canonical = [False]

            def add(op, fetch, feeds, table, tdesc, kd=None, dim=None, attrs=None):
                v = Variant(vid[0], op, fetch, feeds, table, tdesc, kd, dim, attrs)
                vid[0] += 1
                self.variants[op].append(v)
                if canonical[0]:  # the table's own variant, for the round trips
                    self.tables[table].setdefault("canon", {}).setdefault(op, v)
                return v

            def pick_target(extra):
                """(table index, handle, tdesc) for the n-th variant: every table once, then
                random tables and now and then a foreign handle."""
                for i, t in enumerate(self.tables):
                    yield i, t, False
                for k in range(extra):
                    if k < len(foreign):  # each op once on each foreign handle
                        idx, h, label, configured = foreign[k]
                        desc = dict(
                            name=label,
                            label=label,
                            dim=int(rng.choice([1, 4, 8])),
                            key_dtype=str(rng.choice(["int32", "int64"])),
                            space=100,
                            guarded=False,
                            handle=h,
                            configured=configured,
                            capacity=0,
                            dynamic=True,
                        )
                        yield idx, desc, True
                    else:
                        i = int(rng.integers(0, len(self.tables)))
                        yield i, self.tables[i], True

            def kd_for(t, randomize):
                if randomize and rng.random() < 0.3:
                    return "int32" if t["key_dtype"] == "int64" else "int64"
                return t["key_dtype"]

            def dim_for(t, randomize):
                if randomize and rng.random() < 0.3:
                    return int(rng.choice([1, t["dim"] + 1, 8192]))
                return t["dim"]

            # Table creations with random attributes; a few of those that may succeed also get
            # every op (no invariant needs them to exist).
            self.main_count = len(self.tables)
            candidates = self._build_creations(ops, add, tf)
            order = rng.permutation(len(candidates))
            dims = set()
            for c in order:
                handle, attrs, kd, name = candidates[c]
                if attrs["dim"] in dims or len(dims) >= 6:
                    continue
                dims.add(attrs["dim"])
                t = dict(
                    name=name,
                    key_dtype=kd,
                    dim=attrs["dim"],
                    dynamic=attrs["dynamic_expansion"],
                    capacity=attrs["capacity"],
                    initial_capacity=attrs["initial_capacity"],
                    evict_when_full=attrs["evict_when_full"],
                    emb_dtype=attrs.get("emb_dtype", "float32"),
                    slot_dtype=attrs.get("slot_dtype", "float32"),
                    track_changes=attrs["track_changes"],
                    track_access=attrs["track_access"],
                    share=attrs["share"],
                    container=attrs["container"],
                    guarded=False,
                    pool=True,
                    bounded=True,
                    space=256,
                    np_kd=npk[kd],
                    label="%s/%s (created with random attributes)" % (attrs["container"], name),
                )
                finish(t, handle)
                self.tables.append(t)

            i64, i32, f32, st, bl = tf.int64, tf.int32, tf.float32, tf.string, tf.bool
            for i, t in enumerate(self.tables):
                kd = t["key_dtype"]
                t["lookup_variant"] = add(
                    "TableFindOrInsert",
                    ops.rec_sdk_table_find_or_insert(
                        t["handle"], ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2), is_train=True
                    ),
                    [ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2)],
                    i,
                    t,
                    kd,
                    attrs=dict(key_dtype=kd, is_train=True, admission="raw"),
                )
            for i, t, rnd in pick_target(6):
                canonical[0] = not rnd
                h = t["handle"]
                kd = kd_for(t, rnd)
                # find_or_insert: raw or configured handle, train or eval
                for _ in range(2):
                    is_train = bool(rng.random() < 0.7)
                    conf = t["configured"][int(rng.integers(0, len(t["configured"])))]
                    use_conf = is_train and rng.random() < 0.6
                    hh = conf[0] if use_conf else h
                    add(
                        "TableFindOrInsert",
                        ops.rec_sdk_table_find_or_insert(
                            hh, ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2), is_train=is_train
                        ),
                        [ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2)],
                        i,
                        t,
                        kd,
                        attrs=dict(
                            key_dtype=kd,
                            is_train=is_train,
                            admission=(conf[1], conf[2]) if use_conf else "raw",
                        ),
                    )
                    kd = kd_for(t, rnd)
                # the one-op lookup (find_or_insert + the rows), any dim asked for
                is_train = bool(rng.random() < 0.7)
                dim = dim_for(t, rnd)
                add(
                    "TableFindOrInsertRows",
                    list(
                        ops.rec_sdk_table_find_or_insert_rows(
                            h, ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2), is_train=is_train, dim=dim
                        )
                    ),
                    [ph(kinds[kd], 0), ph(i64, 1), ph(i64, 2)],
                    i,
                    t,
                    kd,
                    dim=dim,
                    attrs=dict(key_dtype=kd, is_train=is_train, dim=dim, admission="raw"),
                )
                kd = kd_for(t, rnd)
                conf = t["configured"][int(rng.integers(0, len(t["configured"])))]
                add(
                    "TableConfigureAdmission",
                    conf[0].op,
                    [],
                    i,
                    t,
                    attrs=dict(access_threshold=conf[1], eviction_threshold=conf[2]),
                )
                hc = conf[0] if rng.random() < 0.5 else h
                add(
                    "TableSetAccessThreshold",
                    ops.rec_sdk_table_set_access_threshold(hc, ph(i64, 0)),
                    [ph(i64, 0)],
                    i,
                    t,
                )
                add("TableEvict", list(ops.rec_sdk_table_evict(hc)), [], i, t)
                by = str(rng.choice(["last_seen", "count"]))
                add(
                    "TableRestrict",
                    ops.rec_sdk_table_restrict(h, ph(i64, 0), by=by),
                    [ph(i64, 0)],
                    i,
                    t,
                    attrs=dict(by=by),
                )
                add(
                    "TableSave",
                    list(ops.rec_sdk_table_save(h, ph(st, 0), ph(bl, 0))),
                    [ph(st, 0), ph(bl, 0)],
                    i,
                    t,
                )
                add(
                    "TableCommitSave",
                    ops.rec_sdk_table_commit_save(h, ph(i64, 0)),
                    [ph(i64, 0)],
                    i,
                    t,
                )
                add(
                    "TableApplyDelta",
                    ops.rec_sdk_table_apply_delta(h, ph(st, 0)),
                    [ph(st, 0)],
                    i,
                    t,
                )
                add(
                    "TableRestore",
                    list(ops.rec_sdk_table_restore(h, ph(st, 0), ph(i64, 0), ph(i64, 1))),
                    [ph(st, 0), ph(i64, 0), ph(i64, 1)],
                    i,
                    t,
                )
                add("TableStats", ops.rec_sdk_table_stats(h), [], i, t)
                add("TableExportAccess", list(ops.rec_sdk_table_export_access(h)), [], i, t)
                dim = dim_for(t, rnd)
                add(
                    "TableGather",
                    ops.rec_sdk_table_gather(h, ph(i64, 0), dim=dim),
                    [ph(i64, 0)],
                    i,
                    t,
                    dim=dim,
                    attrs=dict(dim=dim),
                )
                # rows with an optimizer's slots by address (the generic optimizer path)
                layout = dict(
                    slot_optimizer=str(rng.choice(OPTIMIZERS + ("Generic", ""))),
                    slot_initial_values=[
                        float(x)
                        for x in rng.choice(
                            [0.0, 0.0, 1.0, 0.1, float("nan")],
                            int(rng.choice([0, 1, 2, 2, 3, 4, 5])),
                        )
                    ],
                )
                add(
                    "TableReadRows",
                    list(ops.rec_sdk_table_read_rows(h, ph(i64, 0), **layout)),
                    [ph(i64, 0)],
                    i,
                    t,
                    attrs=layout,
                )
                add(
                    "TableWriteRows",
                    ops.rec_sdk_table_write_rows(h, ph(i64, 0), ph(f32, 0), ph(f32, 1), **layout),
                    [ph(i64, 0), ph(f32, 0), ph(f32, 1)],
                    i,
                    t,
                    attrs=layout,
                )
                for _ in range(2):
                    kd, dim = kd_for(t, rnd), dim_for(t, rnd)
                    slot = int(rng.choice([-1, -1, -1, 0, 1, 2, 3, 4, 100]))
                    attrs = dict(
                        key_dtype=kd,
                        dim=dim,
                        init_missing=bool(rng.random() < 0.4),
                        slot=slot,
                        slot_default=float(rng.choice([0.0, 1.5, float("nan"), float("inf")])),
                        slot_optimizer=str(rng.choice(("",) * 4 + OPTIMIZERS + ("bogus",))),
                    )
                    add(
                        "TableLookup",
                        list(
                            ops.rec_sdk_table_lookup(
                                h,
                                ph(kinds[kd], 0),
                                **{k: x for k, x in attrs.items() if k != "key_dtype"},
                            )
                        ),
                        [ph(kinds[kd], 0)],
                        i,
                        t,
                        kd,
                        dim,
                        attrs,
                    )
                kd = kd_for(t, rnd)
                add(
                    "TableUpsert",
                    ops.rec_sdk_table_upsert(h, ph(kinds[kd], 0), ph(f32, 0)),
                    [ph(kinds[kd], 0), ph(f32, 0)],
                    i,
                    t,
                    kd,
                    attrs=dict(key_dtype=kd),
                )
                kd = kd_for(t, rnd)
                add(
                    "TableRemove",
                    ops.rec_sdk_table_remove(h, ph(kinds[kd], 0)),
                    [ph(kinds[kd], 0)],
                    i,
                    t,
                    kd,
                    attrs=dict(key_dtype=kd),
                )
                add("TableSize", ops.rec_sdk_table_size(h), [], i, t)
                add("TableCapacity", ops.rec_sdk_table_capacity(h), [], i, t)
                add("TableClear", ops.rec_sdk_table_clear(h), [], i, t)
                kd, dim = kd_for(t, rnd), dim_for(t, rnd)
                add(
                    "TableExport",
                    list(ops.rec_sdk_table_export(h, key_dtype=kinds[kd], dim=dim)),
                    [],
                    i,
                    t,
                    kd,
                    dim,
                    dict(key_dtype=kd, dim=dim),
                )
                kd = kd_for(t, rnd)
                add(
                    "TableImport",
                    ops.rec_sdk_table_import(h, ph(kinds[kd], 0), ph(f32, 0), ph(f32, 1)),
                    [ph(kinds[kd], 0), ph(f32, 0), ph(f32, 1)],
                    i,
                    t,
                    kd,
                    attrs=dict(key_dtype=kd),
                )
                # optimizers
                unique = bool(rng.random() < 0.3)
                add(
                    "ApplyLazyAdam",
                    ops.rec_sdk_apply_lazy_adam(
                        h,
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        ph(f32, 2),
                        ph(f32, 3),
                        ph(f32, 4),
                        ph(i64, 1),
                        unique_addresses=unique,
                    ),
                    [
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        ph(f32, 2),
                        ph(f32, 3),
                        ph(f32, 4),
                        ph(i64, 1),
                    ],
                    i,
                    t,
                    attrs=dict(unique_addresses=unique),
                )
                add(
                    "ApplyGradientDescent",
                    ops.rec_sdk_apply_gradient_descent(
                        h, ph(i64, 0), ph(f32, 0), ph(f32, 1), ph(f32, 2), unique_addresses=unique
                    ),
                    [ph(i64, 0), ph(f32, 0), ph(f32, 1), ph(f32, 2)],
                    i,
                    t,
                    attrs=dict(unique_addresses=unique),
                )
                acc, acc_class = self._attr_float("Adagrad", t["guarded"])
                add(
                    "ApplyAdagrad",
                    ops.rec_sdk_apply_adagrad(
                        h,
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        initial_accumulator_value=acc,
                        unique_addresses=unique,
                    ),
                    [ph(i64, 0), ph(f32, 0), ph(f32, 1)],
                    i,
                    t,
                    attrs=dict(
                        initial_accumulator_value=acc, attr_class=acc_class, unique_addresses=unique
                    ),
                )
                nesterov = bool(rng.random() < 0.5)
                add(
                    "ApplyMomentum",
                    ops.rec_sdk_apply_momentum(
                        h,
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        ph(f32, 2),
                        use_nesterov=nesterov,
                        unique_addresses=unique,
                    ),
                    [ph(i64, 0), ph(f32, 0), ph(f32, 1), ph(f32, 2)],
                    i,
                    t,
                    attrs=dict(use_nesterov=nesterov, unique_addresses=unique),
                )
                acc, acc_class = self._attr_float("Ftrl", t["guarded"])
                add(
                    "ApplyFtrl",
                    ops.rec_sdk_apply_ftrl(
                        h,
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        ph(f32, 2),
                        ph(f32, 3),
                        ph(f32, 4),
                        ph(f32, 5),
                        initial_accumulator_value=acc,
                        unique_addresses=unique,
                    ),
                    [
                        ph(i64, 0),
                        ph(f32, 0),
                        ph(f32, 1),
                        ph(f32, 2),
                        ph(f32, 3),
                        ph(f32, 4),
                        ph(f32, 5),
                    ],
                    i,
                    t,
                    attrs=dict(
                        initial_accumulator_value=acc, attr_class=acc_class, unique_addresses=unique
                    ),
                )
                add("TrainableRows", ops.rec_sdk_trainable_rows(h, ph(f32, 0)), [ph(f32, 0)], i, t)
            canonical[0] = False
            # Ops without a table.
            nodesc = dict(name="-", label="-", dim=1, space=1000, guarded=False)
            for kd in ("int64", "int32"):
                add(
                    "UniqueKeys",
                    list(ops.rec_sdk_unique_keys(ph(kinds[kd], 0))),
                    [ph(kinds[kd], 0)],
                    None,
                    nodesc,
                    kd,
                    attrs=dict(T=kd),
                )
            add(
                "KeyAccessStats",
                list(ops.rec_sdk_key_access_stats(ph(i32, 0), ph(i32, 1), ph(i64, 0), ph(i64, 1))),
                [ph(i32, 0), ph(i32, 1), ph(i64, 0), ph(i64, 1)],
                None,
                nodesc,
            )
            add(
                "GatherRowsByIndex",
                ops.rec_sdk_gather_rows_by_index(ph(f32, 0), ph(i32, 0)),
                [ph(f32, 0), ph(i32, 0)],
                None,
                nodesc,
            )
            add(
                "SumRowsByIndex",
                ops.rec_sdk_sum_rows_by_index(ph(f32, 0), ph(i32, 0), ph(i32, 1)),
                [ph(f32, 0), ph(i32, 0), ph(i32, 1)],
                None,
                nodesc,
            )
            # Run the tables' creation first in every session (a creation variant with the
            # same name and another configuration must not take the name first).
            self.create_all = [t["handle"].op for t in self.tables if not t.get("pool")]
        self.table_log = [collections.deque(maxlen=25) for _ in self.tables]
        self.graph.finalize()
        self.op_weights = np.array([WEIGHTS[op] for op in OPS], np.float64)
        self.op_weights /= self.op_weights.sum()
        missing = [op for op in OPS if not self.variants[op]]
        assert not missing, missing

    def _tame_initializer(self, dim):
        rng = self.rng
        kind = str(rng.choice(["constant", "random_uniform", "random_normal", "truncated_normal"]))
        init = dict(
            initializer=kind,
            init_value=float(rng.uniform(-1, 1)),
            init_minval=-0.5,
            init_maxval=0.5,
            init_mean=float(rng.uniform(-1, 1)),
            init_stddev=float(rng.uniform(0.01, 2)),
            init_seed=int(rng.integers(0, 2**31)),
            init_scale=float(rng.uniform(0.1, 2)),
        )
        if kind == "constant" and rng.random() < 0.3:
            init["init_values"] = [float(v) for v in rng.uniform(-1, 1, dim)]
        return init

    def _creation_attrs(self, budget):
        """Random attributes of an EmbeddingTable op: what may succeed stays small (address
        space, mappings and committed memory within `budget`), what is huge must fail."""
        rng = self.rng
        dim = int(rng.choice([1, 1, 2, 8, 8, 64, 1000, 8192, 8193, 100000, 2**31, 2**62]))
        dynamic = bool(rng.random() < 0.5)
        r = rng.random()
        if r < 0.6:
            capacity = int(rng.choice([1, 2, 16, 100, 1000, 5000]))
        elif r < 0.75:
            capacity = int(rng.choice([0, 2**40 + 1, 2**62, 2**63 - 1]))
        elif r < 0.9:
            capacity = int(rng.choice([2**33, 2**36, 2**40 - 1, 2**40]))
        else:
            capacity = int(rng.choice([2**16, 2**20, 2**22]))
        initial = (
            0
            if rng.random() < 0.6
            else int(rng.choice([1, 100, 5000, 2**20, 2**36, 2**40, 2**40 + 1, 2**62]))
        )
        track_changes = bool(rng.random() < 0.3)
        may_succeed = (
            1 <= dim <= 8192 and 0 <= initial <= 2**40 and (dynamic or 1 <= capacity <= 2**40)
        )
        if 1 <= dim <= 8192:
            shift = 4
            while shift < 19 and (1 << (shift + 1)) * dim * 4 <= (2 << 20):
                shift += 1
            row_bytes = (24 + 4 * dim + 7) // 8 * 8
            rows = initial if dynamic else capacity
            if dynamic or 1 <= capacity <= 2**40:
                chunks = -(-rows // (1 << shift))
                size = chunks * (1 << shift) * row_bytes
                # The table's reservation check: at most 2^24 chunks, 32 TiB, and half the
                # memory mappings the process has left (fewer than vm.max_map_count).
                limit = _max_map_count()
                surely_fails = (
                    chunks > 2**24
                    or size > 2**45
                    or (limit is not None and 2 * chunks > limit // 2)
                )
                if surely_fails:
                    # Should it succeed after all, it reserves address space only.
                    track_changes = False
                    may_succeed = False
                else:
                    if chunks > 256:
                        return None  # may or may not fit the mappings left: not fuzzed
                    cost = (2 * chunks, size, (chunks << shift) if track_changes else 0)
                    if any(b + c > m for b, c, m in zip(budget, cost, (6000, 2**36, 2**27))):
                        return None
                    budget[:] = [b + c for b, c in zip(budget, cost)]
        init = self._tame_initializer(max(1, min(dim, 16)))
        r = rng.random()
        may_succeed = may_succeed and r >= 0.25 and len(init.get("init_values", [0] * dim)) == dim
        if r < 0.1:
            init[
                str(
                    rng.choice(
                        [
                            "init_value",
                            "init_minval",
                            "init_maxval",
                            "init_mean",
                            "init_stddev",
                            "init_scale",
                        ]
                    )
                )
            ] = float(rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, -1.0, 0.0]))
        elif r < 0.15:
            init["initializer"] = str(rng.choice(["", "bogus", "Constant", "zeros"]))
        elif r < 0.2:
            init["init_values"] = [1.0] * int(rng.choice([1, 3, 9]))
        elif r < 0.25:
            init["init_seed"] = int(rng.choice([-1, -(2**63), 2**63 - 1]))
        return dict(
            _may_succeed=may_succeed,
            key_dtype=str(rng.choice(["int32", "int64"])),
            dim=dim,
            dynamic_expansion=dynamic,
            capacity=capacity,
            initial_capacity=initial,
            evict_when_full=bool(rng.random() < 0.3),
            track_changes=track_changes,
            track_access=bool(rng.random() < 0.3),
            emb_dtype=str(rng.choice(["float32", "float32", "bfloat16", "float16"])),
            slot_dtype=str(rng.choice(["float32", "float32", "bfloat16"])),
            share=str(rng.choice(["", "", "reader", "trainer"])),
            container=str(rng.choice(["", "", "", "fz_pool"])),
            **init,
        )

    def _build_creations(self, ops, add, tf):
        rng = self.rng
        budget = [0, 0, 0]
        made, tries, names, candidates = 0, 0, [], []
        kinds = {"int64": tf.int64, "int32": tf.int32}
        while made < 60 and tries < 2000:
            tries += 1
            attrs = self._creation_attrs(budget)
            if attrs is None:
                continue
            r = rng.random()
            if r < 0.6:
                name = "fz_pool_%d" % made
            elif r < 0.8:
                t = self.tables[int(rng.integers(0, self.main_count))]
                name = t["name"]
                if rng.random() < 0.5:  # the same configuration: a second handle
                    attrs.pop("init_values", None)
                    attrs.update(
                        key_dtype=t["key_dtype"],
                        dim=t["dim"],
                        dynamic_expansion=t["dynamic"],
                        capacity=t["capacity"],
                        initial_capacity=t.get("initial_capacity", 0),
                        evict_when_full=t.get("evict_when_full", False),
                        track_changes=t.get("track_changes", False),
                        track_access=t.get("track_access", False),
                        emb_dtype=t.get("emb_dtype", "float32"),
                        slot_dtype=t.get("slot_dtype", "float32"),
                        share=t["share"],
                        container=t.get("container", ""),
                        **t["init"],
                    )
            elif r < 0.95 and names:
                name = names[int(rng.integers(0, len(names)))]
            else:
                name = str(rng.choice(["", "_lead", "a/b", "x" * 1000, "nul\0name"]))
            shared = name if rng.random() < 0.9 else ""
            kd = attrs.pop("key_dtype")
            may_succeed = (
                attrs.pop("_may_succeed") and name.startswith("fz_pool_") and shared == name
            )
            try:
                handle = ops.rec_sdk_embedding_table(
                    table_name=name,
                    key_dtype=kinds[kd],
                    shared_name=shared,
                    name="create%d" % made,
                    **attrs,
                )
            except (ValueError, TypeError, tf.errors.OpError) as e:
                self.build_rejected["EmbeddingTable " + _kind(e)] += 1
                continue
            names.append(name)
            desc = dict(name=name or "''", label="create", dim=attrs["dim"], space=1, guarded=False)
            add(
                "EmbeddingTable",
                handle.op,
                [],
                None,
                desc,
                kd,
                attrs=dict(
                    name=name[:20],
                    shared_name=shared[:20],
                    key_dtype=kd,
                    **{k: v for k, v in attrs.items() if not k.startswith("init_")},
                ),
            )
            if may_succeed:  # its name is not given to another configuration
                candidates.append((handle, attrs, kd, name))
                names.pop()
            made += 1
        # Attributes the op definition itself rejects (checked when the graph is built).
        for bad in (
            dict(dim=0),
            dict(dim=-1),
            dict(capacity=-1),
            dict(share="bogus"),
            dict(initial_capacity=-5),
            dict(slot_dtype="float16"),
        ):
            attrs = dict(
                table_name="fz_bad",
                key_dtype=tf.int64,
                dim=1,
                dynamic_expansion=True,
                capacity=0,
                initializer="constant",
                shared_name="fz_bad",
            )
            attrs.update(bad)
            try:
                ops.rec_sdk_embedding_table(**attrs)
                self.notes["graph accepted invalid attribute %s" % bad] += 1
            except (ValueError, TypeError, tf.errors.OpError) as e:
                self.build_rejected["EmbeddingTable " + _kind(e)] += 1
        for bad in (dict(access_threshold=-2), dict(eviction_threshold=-3)):
            try:
                ops.rec_sdk_table_configure_admission(self.tables[0]["handle"], **bad)
                self.notes["graph accepted invalid attribute %s" % bad] += 1
            except (ValueError, TypeError, tf.errors.OpError) as e:
                self.build_rejected["TableConfigureAdmission " + _kind(e)] += 1
        return candidates

    # ----------------------------------------------------------------- hyperparameters
    # name: (tame low, tame high, invalid values, valid but wild values)
    HYPER = {
        "LazyAdam": dict(
            learning_rate=(
                1e-4,
                0.5,
                (-1.0, float("nan"), float("inf"), -float("inf")),
                (1e30, 3e38, 0.0),
            ),
            beta1=(0.5, 0.99, (0.0, 1.0, 1.5, -0.1, float("nan")), (1e-30, 0.9999999)),
            beta2=(0.5, 0.999, (-0.1, 1.01, float("nan")), (0.0, 1.0)),
            epsilon=(1e-8, 0.1, (0.0, -1.0, 2.0, float("nan")), (1e-45, 1.0)),
        ),
        "GradientDescent": dict(
            learning_rate=(0.0, 0.5, (-1.0, float("nan"), float("inf")), (1e30, 3e38)),
            weight_decay=(0.0, 0.1, (-0.1, 1.1, float("nan"), float("inf")), (1.0,)),
        ),
        "Adagrad": dict(
            learning_rate=(0.0, 0.5, (-1.0, float("nan"), float("inf")), (1e30,)),
            initial_accumulator_value=(
                0.01,
                10.0,
                (0.0, -1.0, float("nan"), float("inf")),
                (1e-45, 1e30),
            ),
        ),
        "Momentum": dict(
            learning_rate=(0.0, 0.5, (-1.0, float("nan"), float("inf")), (1e30,)),
            momentum=(0.0, 0.9, (-0.5, float("nan"), float("inf")), (1.5, 1e10)),
        ),
        "Ftrl": dict(
            learning_rate=(1e-3, 0.5, (0.0, -1.0, float("nan"), float("inf")), (1e30,)),
            learning_rate_power=(
                -1.0,
                0.0,
                (0.5, float("nan"), float("inf"), -float("inf")),
                (-100.0, -1e10),
            ),
            l1=(0.0, 1.0, (-1.0, float("nan"), float("inf")), (1e30,)),
            l2=(0.0, 1.0, (-1.0, float("nan"), float("inf")), (1e30,)),
            l2_shrinkage=(0.0, 1.0, (-1.0, float("nan"), float("inf")), (1e30,)),
            initial_accumulator_value=(
                0.1,
                10.0,
                (-1.0, float("nan"), float("inf")),
                (0.0, 1e-45, 1e30),
            ),
        ),
    }

    def _hyper(self, optimizer, name, guarded, valid=False):
        """(value, class) with class in tame / invalid / wild (valid but may overflow)."""
        low, high, invalid, wild = self.HYPER[optimizer][name]
        r = self.rng.random()
        if valid:
            r = 0.0 if guarded or r < 0.8 else 1.0
        if r < (0.88 if guarded else 0.6):
            return float(self.rng.uniform(low, high)), "tame"
        if r < (1.0 if guarded else 0.8):
            return float(invalid[int(self.rng.integers(0, len(invalid)))]), "invalid"
        return float(wild[int(self.rng.integers(0, len(wild)))]), "wild"

    def _attr_float(self, optimizer, guarded):
        return self._hyper(
            optimizer, "initial_accumulator_value", guarded, valid=self.rng.random() < 0.6
        )

    # ----------------------------------------------------------------- sessions
    def new_session(self, gen):
        tf = self.tf
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=2, inter_op_parallelism_threads=1
        )
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        config.graph_options.optimizer_options.do_constant_folding = False
        sess = tf.compat.v1.Session(graph=self.graph, config=config)
        S = SessionState(sess, gen, len(self.tables))
        for i, t in enumerate(self.tables):
            if t.get("pool"):
                S.taint[i] = True  # random initializers may give any value
            elif t["share"]:
                S.taint[i] = self.shared_taint.setdefault(i, False)
        sess.run(self.create_all)
        return S

    def _callable(self, S, v):
        """The variant as a Session callable (the C++ MakeCallable API: about twice as fast
        per call as Session.run, whose error path also rebuilds Python tracebacks)."""
        fn = S.callables.get(v.id)
        if fn is None:
            from tensorflow.core.protobuf import config_pb2

            fetches = v.fetch if isinstance(v.fetch, list) else [v.fetch]
            options = config_pb2.CallableOptions(
                feed=[p.name for p in v.feeds],
                fetch=[f.name for f in fetches if isinstance(f, self.tf.Tensor)],
                target=[f.name for f in fetches if not isinstance(f, self.tf.Tensor)],
            )
            make = getattr(S.sess, "_make_callable_from_options", None)
            if make is None:  # another TensorFlow: the public, slower API
                fn = S.sess.make_callable(v.fetch, feed_list=v.feeds)
            else:
                single = not isinstance(v.fetch, list)
                raw = make(options)
                fn = (lambda *a: raw(*a)[0]) if single and options.fetch else raw
            S.callables[v.id] = fn
        return fn

    def _taint(self, S, table):
        if table is None or table < 0:
            return
        S.taint[table] = True
        if self.tables[table]["share"]:
            self.shared_taint[table] = True
            for other in self.sessions:
                if other is not None:
                    other.taint[table] = True

    # ----------------------------------------------------------------- inputs per op
    def gen(self, v, S):
        """(inputs, info): info['dirty'] says the call writes non-tame data when it succeeds,
        info['dirty_always'] whatever its outcome (a failed upsert may keep some rows)."""
        np, rng, t = self.np, self.rng, v.tdesc
        op = v.op
        guarded = bool(t.get("guarded"))
        info = {}
        if op in (
            "TableFindOrInsert",
            "TableFindOrInsertRows",
            "TableLookup",
            "TableRemove",
            "TableUpsert",
            "TableImport",
            "UniqueKeys",
        ):
            n = self._n(t)
            shape = self._shape(n)
            if op == "TableImport" and rng.random() < 0.85:
                shape = (n,)
            if op == "UniqueKeys" and rng.random() < 0.9:
                shape = (n,)
            keys = self._keys(t, v.kd, shape)
            if op in ("TableLookup", "TableRemove", "UniqueKeys"):
                return [keys], info
            if op in ("TableFindOrInsert", "TableFindOrInsertRows"):
                r = rng.random()
                if r < 0.6:
                    counts = np.zeros([0], np.int64)
                elif r < 0.85:
                    counts = rng.integers(0, 4, shape).astype(np.int64)
                elif r < 0.9:
                    counts = rng.integers(-3, 4, max(0, keys.size + int(rng.integers(-1, 2))))
                else:
                    counts = rng.choice(
                        np.array([-1, 0, 2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**63)], np.int64),
                        keys.size,
                    )
                r = rng.random()
                if r < 0.4:
                    times = np.zeros([0], np.int64)
                elif r < 0.6:
                    times = np.asarray([self._int64_value((0, 1000))], np.int64)
                elif r < 0.9:
                    base = int(rng.integers(0, 1000))
                    times = (base + rng.integers(0, 50, keys.size)).astype(np.int64)
                else:
                    times = rng.choice(
                        np.array(self.EXTREMES, np.int64),
                        max(0, keys.size + int(rng.integers(-1, 3))),
                    )
                return [keys, counts.astype(np.int64), times.astype(np.int64)], info
            dim = self.tables[v.table]["dim"] if v.table is not None and v.table >= 0 else t["dim"]
            values = self._floats(self._rows_shape(keys.shape, dim), guarded)
            info["dirty_always"] = not self._is_tame(values)
            if op == "TableUpsert":
                return [keys, values], info
            r = rng.random()
            if r < 0.5:
                slots = np.zeros([0], np.float32)
            elif r < 0.9:
                ns = int(rng.choice([1, 2, 2, 3, 4, 5]))
                slots = self._floats((ns,) + values.shape, guarded)
                if guarded:
                    slots = np.clip(np.abs(slots), 0.1, 100)
            else:
                slots = self._floats(
                    (int(rng.integers(0, 3)), int(rng.integers(0, 4)), dim), guarded
                )
                if guarded:
                    slots = np.clip(np.abs(slots), 0.1, 100)
            info["dirty_always"] = info["dirty_always"] or not (
                self._is_tame(slots) and (slots.size == 0 or slots.min() >= 0.1)
            )
            return [keys, values, slots], info
        if op == "TableGather":
            return [self._addresses(S, v.table, self._shape(self._n(t)))], info
        if op in ("TableReadRows", "TableWriteRows"):
            n = self._n(t)
            addresses = self._addresses(S, v.table, (n,) if rng.random() < 0.9 else self._shape(n))
            # Slots start at (or are read as) the layout's initial values, NaN included.
            info["dirty"] = any(x != x for x in v.attrs["slot_initial_values"])
            if op == "TableReadRows":
                return [addresses], info
            dim = self.tables[v.table]["dim"] if v.table is not None and v.table >= 0 else t["dim"]
            k = len(v.attrs["slot_initial_values"])
            rows = addresses.shape[0] if addresses.ndim else 1
            shape = (rows, dim) if rng.random() < 0.9 else self._rows_shape(addresses.shape, dim)
            values = self._floats(shape, guarded)
            slots = self._floats(
                (k,) + shape if rng.random() < 0.9 else (int(rng.integers(0, 3)),) + shape, guarded
            )
            info["dirty"] = info["dirty"] or not (self._is_tame(values) and self._is_tame(slots))
            return [addresses, values, slots], info
        if op.startswith("Apply"):
            name = {
                "ApplyLazyAdam": "LazyAdam",
                "ApplyGradientDescent": "GradientDescent",
                "ApplyAdagrad": "Adagrad",
                "ApplyMomentum": "Momentum",
                "ApplyFtrl": "Ftrl",
            }[op]
            n = self._n(t)
            shape = (n,) if rng.random() < 0.9 else self._shape(n)
            addresses = self._addresses(S, v.table, shape)
            dim = self.tables[v.table]["dim"] if v.table is not None and v.table >= 0 else t["dim"]
            gshape = (n, dim) if rng.random() < 0.85 else self._rows_shape(shape, dim)
            grads = self._floats(gshape, guarded)
            classes = ["tame" if self._is_tame(grads) else "wild"]
            if "attr_class" in v.attrs:
                classes.append(v.attrs["attr_class"])
            inputs = [addresses, grads]
            names = [k for k in self.HYPER[name] if k != "initial_accumulator_value"]
            valid = rng.random() < 0.75  # all hyperparameters valid, else each at random
            for k in names:
                value, c = self._hyper(name, k, guarded, valid)
                classes.append(c)
                inputs.append(self._scalar(np.float32, value, 0.01 if valid else 0.08))
            if name == "LazyAdam":
                r = rng.random()
                if r < 0.9:
                    inputs.append(
                        self._scalar(np.int64, int(rng.integers(1, 10**6)), 0.01 if valid else 0.08)
                    )
                else:
                    inputs.append(
                        self._scalar(np.int64, int(rng.choice([0, -1, -(2**63), 2**62, 2**63 - 1])))
                    )
                    # A huge step is valid and harmless (beta ** step underflows to 0).
                    classes.append(
                        "invalid" if inputs[-1].size and inputs[-1].flat[0] < 1 else "tame"
                    )
            info["dirty"] = any(c != "tame" for c in classes)
            info["invalid"] = "invalid" in classes
            return inputs, info
        if op == "TableSetAccessThreshold":
            return [self._scalar(np.int64, self._int64_value((-1, 6)))], info
        if op == "TableRestrict":
            return [self._scalar(np.int64, self._int64_value((0, t["space"] * 2)))], info
        if op == "TableSave":
            info["path"] = self._save_dir()
            delta = np.asarray(bool(rng.random() < 0.4))
            if rng.random() < 0.03:
                delta = np.zeros([int(rng.integers(0, 3))], np.bool_)
            shape = () if rng.random() < 0.95 else (int(rng.integers(0, 3)),)
            return [
                self._strings([info["path"]] * (int(np.prod(shape)) if shape else 1), shape),
                delta,
            ], info
        if op == "TableCommitSave":
            ids = S.save_ids[v.table] if v.table is not None and v.table >= 0 else []
            r = rng.random()
            if r < 0.5 and ids:
                value = ids[-1]
            elif r < 0.6 and ids:
                value = ids[-1 - int(rng.integers(0, min(3, len(ids))))]
            elif r < 0.7:
                others = [x for ln in S.save_ids for x in ln]
                value = others[int(rng.integers(0, len(others)))] if others else 1
            else:
                value = self._int64_value((-2, 50))
            return [self._scalar(np.int64, value)], info
        if op == "TableApplyDelta":
            path, taint = self._read_dir(v.table, delta=True)
            info["dirty"] = taint
            return [self._strings([path], ())], info
        if op == "TableRestore":
            r = rng.random()
            count = 1 if r < 0.75 else (0 if r < 0.8 else int(rng.integers(2, 4)))
            picked = [self._read_dir(v.table) for _ in range(count)]
            info["dirty"] = any(taint for _, taint in picked)
            shape = (count,) if (count != 1 or rng.random() < 0.5) else ()
            if rng.random() < 0.03 and count:
                shape = (1, count)
            paths = self._strings([p for p, _ in picked], shape)
            if rng.random() < 0.8:
                rank_id, rank_size = 0, 1
            else:
                rank_size = self._int64_value((1, 4))
                rank_id = self._int64_value((0, 4))
            return [paths, self._scalar(np.int64, rank_id), self._scalar(np.int64, rank_size)], info
        if op == "TrainableRows":
            n = self._n(t)
            return [
                self._floats(self._shape(n) + ((t["dim"],) if rng.random() < 0.7 else ()), False)
            ], info
        if op == "KeyAccessStats":
            return self._gen_key_access_stats(), info
        if op == "GatherRowsByIndex":
            u = int(rng.integers(0, 65))
            dim = int(rng.choice([1, 2, 3, 8, 16, 0, 8192, 8193]))
            vshape = (u, dim) if rng.random() < 0.9 else self._shape(u)
            if dim >= 8192 and u > 4:
                vshape = (4, dim)
                u = 4
            values = self._floats(vshape, False)
            n = self._count() if rng.random() < 0.9 else 0
            if dim >= 8192:
                n = min(n, 64)
            index = self._index(n, u)
            if rng.random() < 0.05:
                index = index.reshape(1, -1)
            return [values, index], info
        if op == "SumRowsByIndex":
            n = self._count()
            dim = int(rng.choice([1, 2, 3, 8, 16, 0, 8193]))
            rows = int(rng.integers(0, 65))
            vshape = (n, dim) if rng.random() < 0.9 else self._rows_shape((n,), dim)
            if dim == 8193:
                vshape = (min(n, 16), dim)
            values = self._floats(vshape, False)
            index = self._index(vshape[0] if vshape else 1, rows)
            r = rng.random()
            if r < 0.1:
                index = self._index(int(rng.integers(0, 20)), rows)
            elif r < 0.15:
                rows = int(rng.choice([-1, -(2**31), 2**20]))
                if rows > 0 and dim > 16:
                    rows = 1000
            elif r < 0.17 and dim >= 1024:
                rows = 2**31 - 1  # far beyond memory: the allocation fails cleanly
            return [values, index, self._scalar(np.int32, rows)], info
        # Ops whose only input is the table (or nothing: creation, configure).
        return [], info

    def gen_pair(self, v):
        """Valid inputs of a training lookup (the first half of a lookup-then-update pair)."""
        np, rng, t = self.np, self.rng, v.tdesc
        n = int(rng.integers(1, 257))
        if t.get("bounded"):
            n = min(n, max(1, 2**20 // t["dim"]))
        keys = rng.integers(0, t["space"], n).astype(t["np_kd"])
        counts = np.zeros([0], np.int64) if rng.random() < 0.5 else np.full(n, 3, np.int64)
        times = (
            np.zeros([0], np.int64)
            if rng.random() < 0.5
            else (int(rng.integers(0, 1000)) + rng.integers(0, 50, n)).astype(np.int64)
        )
        return [keys, counts, times], {}

    def _index(self, n, u):
        np, rng = self.np, self.rng
        if rng.random() < 0.8 and u > 0:
            return rng.integers(0, u, n).astype(np.int32)
        bad = np.array([-1, u, u + 1, 2**31 - 1, -(2**31)], np.int32)
        index = rng.integers(0, max(u, 1), n).astype(np.int32)
        mask = rng.random(n) < 0.3
        index[mask] = rng.choice(bad, int(mask.sum()))
        return index

    def _gen_key_access_stats(self):
        np, rng = self.np, self.rng
        samples = int(rng.integers(0, 40))
        r = rng.random()
        if r < 0.5:
            shape = (samples,)
        elif r < 0.85:
            shape = (samples, int(rng.integers(0, 6)))
        elif r < 0.95:
            shape = (samples, int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        else:
            shape = ()
        n = int(np.prod(shape)) if shape else 1
        u = int(rng.integers(0, 64))
        inverse = self._index(n, u).reshape(shape)
        r = rng.random()
        if r < 0.85:
            num_unique = u
        elif r < 0.95:
            num_unique = int(rng.choice([-1, 0, 1, 2**20]))
        else:
            num_unique = int(rng.integers(0, 128))
        r = rng.random()
        if r < 0.4:
            weights = np.asarray(int(rng.integers(0, 5)), np.int64)
        elif r < 0.8:
            weights = rng.integers(0, 5, shape).astype(np.int64)
        elif r < 0.88:
            weights = rng.integers(0, 5, max(0, n + int(rng.choice([-1, 1, 2])))).astype(np.int64)
        elif r < 0.92:
            weights = np.zeros([0], np.int64)
        else:
            weights = rng.choice(
                np.array([-1, 2**62, 2**63 - 1, -(2**63)], np.int64), max(n, 1)
            ).reshape(shape if n else (1,))
        r = rng.random()
        if r < 0.3:
            times = np.zeros([0], np.int64)
        elif r < 0.5:
            times = np.asarray([self._int64_value((0, 100))], np.int64)
        elif r < 0.9:
            times = rng.integers(0, 1000, samples).astype(np.int64)
        else:
            times = rng.choice(
                np.array(self.EXTREMES, np.int64), max(0, samples + int(rng.choice([-1, 1, 3])))
            )
        return [inverse, self._scalar(np.int32, num_unique), weights, times]

    # ----------------------------------------------------------------- after a call
    def post(self, v, S, inputs, info, result, error):
        t = v.table
        ok = error is None
        if t is not None and t >= 0:
            if (
                ok
                and v.op in ("TableClear", "TableRestore", "TableImport")
                and not self.tables[t]["share"]
                and not self.tables[t].get("pool")
            ):
                # The table's rows (and slots) are now only what the call gave it.
                S.taint[t] = False
            if info.get("dirty_always") or (ok and info.get("dirty")):
                if not S.taint[t] and self.tables[t]["guarded"]:
                    self.taint_reasons[v.op] += 1
                self._taint(S, t)
            if ok and info.get("invalid"):
                self.notes["%s accepted an invalid hyperparameter" % v.op] += 1
        if not ok:
            return
        if v.op == "TableFindOrInsert":
            self._remember(S, t, result)
        elif v.op == "TableFindOrInsertRows":
            self._remember(S, t, result[0])
        elif v.op.startswith("Apply") and t is not None and t >= 0:
            S.owner[t] = v.op
        served = v.op == "TableRestore" and b"no files were read" in bytes(result[1])
        if served:
            self.meta["restores served by a table in memory"] += 1
        if v.op in ("TableRestore", "TableApplyDelta") and not served and self.corrupted:
            paths = {bytes(p).decode(errors="replace") for p in inputs[0].reshape(-1)}
            if paths & self.corrupted:
                self.notes["%s succeeded on a corrupted checkpoint directory" % v.op] += 1
        if v.op == "TableSave" and t is not None and t >= 0:
            S.save_ids[t] = (S.save_ids[t] + [int(result[1])])[-8:]
        if v.op == "TableSave" and "path" in info and os.path.isdir(info["path"]):
            self._add_dir(
                info["path"],
                t,
                S.taint[t] if t is not None and t >= 0 else True,
                bool(inputs[1].any()) if inputs[1].size else False,
            )

    def _add_dir(self, path, table, taint, delta=False):
        if any(d["path"] == path for d in self.dirs):
            return
        self.dirs.append(dict(path=path, table=table, taint=taint, delta=delta))
        while len(self.dirs) > MAX_DIRS:
            old = self.dirs.pop(0)
            shutil.rmtree(old["path"], ignore_errors=True)

    def after_failed_save(self, info):
        """A failed save may leave a directory behind: keep it as a (tainted) pool entry so
        that it is removed in time."""
        path = info.get("path")
        if path and path.startswith(self.root + os.sep + "s") and os.path.isdir(path):
            self._add_dir(path, None, True)

    # ----------------------------------------------------------------- meta actions
    def corrupt(self):
        """Changes one file of a pooled checkpoint directory: a flipped bit, a truncation, a
        deletion, appended bytes, or a changed value in meta.txt."""
        if not self.dirs:
            return
        rng = self.rng
        d = self.dirs[int(rng.integers(0, len(self.dirs)))]
        d["taint"] = True
        try:
            names = sorted(
                n for n in os.listdir(d["path"]) if os.path.isfile(os.path.join(d["path"], n))
            )
        except OSError:
            return
        if not names:
            return
        path = os.path.join(d["path"], names[int(rng.integers(0, len(names)))])
        action = int(rng.integers(0, 5))
        try:
            size = os.path.getsize(path)
            if action == 0 and size:
                with open(path, "r+b") as f:
                    f.seek(int(rng.integers(0, size)))
                    byte = f.read(1)
                    f.seek(-1, 1)
                    f.write(bytes([byte[0] ^ (1 << int(rng.integers(0, 8)))]))
            elif action == 1 and size:
                with open(path, "r+b") as f:
                    f.truncate(int(rng.integers(0, size)))
            elif action in (0, 1, 2):
                os.remove(path)
            elif action == 3:
                with open(path, "ab") as f:
                    f.write(bytes(rng.integers(0, 256, int(rng.integers(1, 64))).astype("u1")))
            else:
                meta = os.path.join(d["path"], "meta.txt")
                if not os.path.isfile(meta):
                    return
                with open(meta) as f:
                    lines = f.read().splitlines()
                if not lines:
                    return
                i = int(rng.integers(0, len(lines)))
                lines[i] = (
                    lines[i].split(" ")[0]
                    + " "
                    + str(int(rng.choice([-1, 0, 2**63 - 1, 99999999999])))
                )
                with open(meta, "w") as f:
                    f.write("\n".join(lines) + "\n")
        except OSError:
            return
        self.corrupted.add(d["path"])
        self.meta["checkpoint files corrupted"] += 1

    # ----------------------------------------------------------------- round trips
    def roundtrip(self, call, S):
        """Save a table, commit, (with track_changes: change it, save a delta, commit),
        restore the full save into the same table of this session or of the previous one
        (for shared tables: served from memory when the table still holds it), apply the
        delta, and check that it holds exactly the keys and values it had at the last save.
        Every step is a counted call of the table's own op variants. Returns the calls made."""
        np, rng = self.np, self.rng
        i = int(rng.integers(0, self.main_count))
        t = self.tables[i]
        canon = t["canon"]
        target = self.sessions[1] if self.sessions[1] is not None and rng.random() < 0.5 else S
        made = [0]
        failed = []

        def step(Sx, v, inputs, info=None):
            kind, result, error = self.call_op(call + made[0], Sx, v, inputs, info or {})
            made[0] += 1
            if kind != "ok":
                failed.append(
                    "%s -> %s: %s" % (v.op, kind, _signature(getattr(error, "message", str(error))))
                )
            return kind == "ok", result

        def export(Sx):
            ok, result = step(Sx, canon["TableExport"], [])
            if not ok:
                return None
            keys, values = result[0], result[1]
            order = np.argsort(keys, kind="stable")
            return keys[order], values[order]

        def save(delta):
            self.fresh += 1
            path = os.path.join(self.root, "s%d" % self.fresh)
            ok, result = step(
                S,
                canon["TableSave"],
                [self._strings([path], ()), np.asarray(delta)],
                dict(path=path),
            )
            if ok:
                step(S, canon["TableCommitSave"], [np.asarray(int(result[1]), np.int64)])
            return path if ok else None

        full = save(False)
        if full is None:
            return made[0]
        expected = export(S)
        delta = None
        if t.get("track_changes"):
            step(S, t["lookup_variant"], *self.gen_pair(t["lookup_variant"]))
            expected = export(S)
            delta = save(True)
        taint_full = S.taint[i]
        before = len(failed)
        ok, result = step(
            target,
            canon["TableRestore"],
            [self._strings([full], ()), np.asarray(0, np.int64), np.asarray(1, np.int64)],
            dict(dirty=taint_full),
        )
        restore_error = None
        if not ok and "DataLoss" in failed[before]:
            restore_error = failed[before]
        if ok and delta is not None:
            step(
                target,
                canon["TableApplyDelta"],
                [self._strings([delta], ())],
                dict(dirty=S.taint[i]),
            )
        got = export(target)
        self.meta["checkpoint round trips"] += 1
        if restore_error:
            # A checkpoint the table has just written must restore.
            if (target.gen, i) not in target.violated:
                target.violated.add((target.gen, i))
                self.violations.append(
                    dict(
                        table=t["label"],
                        session=target.gen,
                        where="round trip at call %d" % call,
                        problems=["its own fresh checkpoint does not restore: " + restore_error],
                        recent=list(self.table_log[i]),
                    )
                )
            return made[0]
        if failed:
            self.notes["round trip of %s: %s" % (t["label"], "; ".join(failed))] += 1
            return made[0]
        same = (
            expected is not None
            and got is not None
            and np.array_equal(expected[0], got[0])
            and np.array_equal(expected[1], got[1], equal_nan=True)
        )
        if not same and (target.gen, i) not in target.violated:
            target.violated.add((target.gen, i))
            self.violations.append(
                dict(
                    table=t["label"],
                    session=target.gen,
                    where="round trip at call %d" % call,
                    problems=[
                        "after save%s and restore%s the table holds %s keys, not the %s "
                        "it had"
                        % (
                            " + delta" if delta else "",
                            " + apply_delta" if delta else "",
                            got[0].size if got else "?",
                            expected[0].size if expected else "?",
                        )
                    ],
                    recent=list(self.table_log[i]),
                )
            )
        return made[0]

    # ----------------------------------------------------------------- invariants
    def check(self, S, where):
        np = self.np
        for i, t in enumerate(self.tables):
            if (S.gen, i) in S.violated:
                continue
            c = t["check"]
            problems = []
            if t.get("pool"):
                try:  # a table created with random attributes may not exist
                    S.sess.run(c["size"])
                except self.tf.errors.OpError:
                    continue
            self.checks += 1
            try:
                size = int(S.sess.run(c["size"]))
                capacity = int(S.sess.run(c["capacity"]))
                stats = S.sess.run(c["stats"])
                keys, values, slots = S.sess.run(c["export"])
                found_values, exists = S.sess.run(c["lookup"], {c["keys"]: keys})
            except Exception as e:  # noqa: BLE001 -- any failure of a check is a violation
                problems.append(
                    "a check op failed: %s: %s"
                    % (_kind(e), _signature(getattr(e, "message", str(e))))
                )
            else:
                n = keys.shape[0]
                if size != n:
                    problems.append("size %d but %d keys exported" % (size, n))
                if values.shape != (n, t["dim"]) or (
                    slots.size and slots.shape[1:] != (n, t["dim"])
                ):
                    problems.append("export shapes %s %s" % (values.shape, slots.shape))
                if np.unique(keys).size != n:
                    problems.append(
                        "exported keys are not unique (%d distinct of %d)"
                        % (np.unique(keys).size, n)
                    )
                if not exists.all():
                    problems.append("lookup misses %d exported keys" % int((~exists).sum()))
                elif not np.array_equal(found_values, values, equal_nan=True):
                    problems.append("lookup values differ from exported values")
                if stats[0] != size or stats[1] != capacity:
                    problems.append(
                        "stats size/capacity %d/%d vs size %d capacity %d"
                        % (stats[0], stats[1], size, capacity)
                    )
                if size > capacity:
                    problems.append("size %d > capacity %d" % (size, capacity))
                if not t["dynamic"] and capacity != t["capacity"]:
                    problems.append(
                        "capacity %d of a fixed table of %d" % (capacity, t["capacity"])
                    )
                if (stats[2:6] < 0).any():
                    problems.append("negative counters %s" % stats.tolist())
                if not S.taint[i]:
                    self.nan_checks += 1
                if not S.taint[i] and not (np.isfinite(values).all() and np.isfinite(slots).all()):
                    problems.append("NaN/Inf in rows or slots of a table only given tame values")
            if problems:
                S.violated.add((S.gen, i))
                self.violations.append(
                    dict(
                        table=t["label"],
                        session=S.gen,
                        where=where,
                        problems=problems,
                        recent=list(self.table_log[i]),
                    )
                )

    def _inject(self):
        """--inject: a deliberate loss, to check that the harness counts it."""
        if self.inject == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif self.inject == "hang":
            time.sleep(10**6)
        elif self.inject == "error":
            self.unexpected["(injected) Internal: a deliberate unexpected error"] += 1
        elif self.inject == "violation":
            self.violations.append(
                dict(
                    table="(injected)",
                    session=0,
                    where="injected",
                    problems=["a deliberate violation"],
                    recent=[],
                )
            )

    # ----------------------------------------------------------------- main loop
    def call_op(self, call, S, v, inputs, info):
        tf, op = self.tf, v.op
        if self.crumb_fd is not None:  # survives a crash: names the call that was running
            crumb = "call %d session %d %s <- %s\n" % (
                call,
                S.gen,
                v.desc,
                ", ".join("%s%s" % (x.dtype, list(x.shape)) for x in inputs),
            )
            os.pwrite(self.crumb_fd, crumb.encode()[:1000].ljust(1000), 0)
        if self.verbose:
            print(
                "call %d session %d %s <- %s"
                % (call, S.gen, v.desc, ", ".join(_describe(x) for x in inputs)),
                flush=True,
            )
        result, error = None, None
        began = time.perf_counter()
        try:
            # A kernel that cannot be built (e.g. bad attributes) fails here: no callable is
            # kept, so that each call of the variant tries again.
            result = self._callable(S, v)(*inputs)
            kind = "ok"
        except tf.errors.OpError as e:
            error = e
            kind = _kind(e)
        except Exception as e:  # noqa: BLE001 -- any other exception is a finding
            error = e
            kind = "python:" + type(e).__name__
        self.op_seconds[op] += time.perf_counter() - began
        self.counts[op] += 1
        self.outcomes[kind] += 1
        self.op_outcomes[op][kind] += 1
        if self.verbose:
            print(
                "    -> %s %s"
                % (
                    kind,
                    "" if error is None else _signature(getattr(error, "message", str(error))),
                ),
                flush=True,
            )
        if error is not None and self.verbose_errors:
            self.error_sigs[
                "%s %s: %s" % (op, kind, _signature(getattr(error, "message", str(error))))
            ] += 1
        if v.table is not None and v.table >= 0:
            self.table_log[v.table].append("%d s%d %s -> %s" % (call, S.gen, v.desc, kind))
        if kind != "ok" and kind not in CLEAN:
            message = getattr(error, "message", str(error))
            sig = "%s %s: %s" % (op, kind, _signature(message))
            self.unexpected[sig] += 1
            if sig not in self.unexpected_examples:
                self.unexpected_examples[sig] = dict(
                    call=call,
                    session=S.gen,
                    variant=v.desc,
                    inputs=[_describe(x) for x in inputs],
                    message=_first_line(message)[:300],
                )
        self.post(v, S, inputs, info, result, error)
        if op == "TableSave" and error is not None:
            self.after_failed_save(info)
        return kind, result, error

    def run(self):
        self.build()
        tf = self.tf
        rng = self.rng
        self.sessions = [None, None]  # current, previous
        gen = 0
        self.sessions[0] = self.new_session(gen)
        op_index = rng.choice(len(OPS), size=self.calls, p=self.op_weights)
        start = time.time()
        call = 0
        restart_every = max(2000, min(RESTART_EVERY, self.calls // 3))
        next_restart, next_check = restart_every, CHECK_EVERY
        while call < self.calls:
            if 0 <= self.inject_at <= call:
                self.inject_at = -1
                self._inject()
            if call >= next_restart:
                next_restart += restart_every
                old = self.sessions[1]
                if old is not None:
                    self.check(old, "closing session %d" % old.gen)
                    old.sess.close()
                gen += 1
                self.sessions = [self.new_session(gen), self.sessions[0]]
                self.meta["session replacements"] += 1
            if call >= next_check:
                next_check += CHECK_EVERY
                self.check(self.sessions[0], "call %d" % call)
                if self.sessions[1] is not None and next_check % (CHECK_EVERY * 5) == 0:
                    self.check(self.sessions[1], "call %d" % call)
            r = rng.random()
            if r < 0.0015 and call + 12 < self.calls:
                call += self.roundtrip(call, self.sessions[0])
                continue
            if r < 0.0017:
                self.corrupt()
            elif r < 0.0022:
                S = self.sessions[0]
                i = int(rng.integers(0, self.main_count))
                try:
                    S.sess.run(self.tables[i]["destroy"])
                    S.sess.run(self.tables[i]["handle"].op)
                    self.meta["tables destroyed under their handles"] += 1
                except tf.errors.OpError as e:
                    self.notes["destroying and re-creating a table failed: %s" % _kind(e)] += 1
            S = (
                self.sessions[1]
                if (self.sessions[1] is not None and rng.random() < 0.1)
                else self.sessions[0]
            )
            op = OPS[op_index[call]]
            choices = self.variants[op]
            if op.startswith("Apply") and rng.random() < 0.7:
                # Mostly a table this optimizer may train (one sparse optimizer per table).
                mine = [
                    c
                    for c in choices
                    if c.table is not None and c.table >= 0 and S.owner[c.table] in (None, op)
                ]
                choices = mine or choices
            v = choices[int(rng.integers(0, len(choices)))]
            if (
                (op == "TableGather" or op.startswith("Apply"))
                and v.table is not None
                and v.table >= 0
                and call + 1 < self.calls
                and rng.random() < 0.4
            ):
                # A training lookup of the table first, as a training step does: its
                # addresses are fresh (the counted call is a find_or_insert).
                pair = self.tables[v.table]["lookup_variant"]
                self.call_op(call, S, pair, *self.gen_pair(pair))
                call += 1
                self.fresh_addresses = True
            inputs, info = self.gen(v, S)
            self.fresh_addresses = False
            self.call_op(call, S, v, inputs, info)
            call += 1
        for S in self.sessions:
            if S is not None:
                self.check(S, "end")
                S.sess.close()
        return dict(
            calls=self.calls,
            seconds=time.time() - start,
            counts=dict(self.counts),
            outcomes=dict(self.outcomes),
            op_outcomes={k: dict(c) for k, c in self.op_outcomes.items()},
            unexpected=dict(self.unexpected),
            examples=self.unexpected_examples,
            violations=self.violations,
            checks=self.checks,
            nan_checks=self.nan_checks,
            taint_reasons=dict(self.taint_reasons),
            notes=dict(self.notes),
            build_rejected=dict(self.build_rejected),
            meta=dict(self.meta),
            error_sigs=dict(self.error_sigs),
            op_seconds=dict(self.op_seconds),
            variants=sum(len(v) for v in self.variants.values()),
        )


def run_chunk(args, root=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import warnings

    import numpy as np
    import tensorflow as tf

    warnings.filterwarnings("ignore")
    np.seterr(all="ignore")
    tf.compat.v1.disable_eager_execution()
    calls = chunk_calls(args.calls, args.children)[args.chunk]
    own_root = root is None
    root = root or temp_root()
    fuzzer = Fuzzer(args.seed, args.chunk, calls, root, verbose=args.verbose, crumb=args.crumb)
    if args.inject and args.chunk == 0:
        fuzzer.inject, fuzzer.inject_at = args.inject, min(100, calls - 1)
    try:
        result = fuzzer.run()
        result["chunk"] = args.chunk
        return result
    finally:
        fuzzer.cleanup()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


def chunk_calls(calls, children):
    return [calls // children + (1 if i < calls % children else 0) for i in range(children)]


def default_children(calls):
    return max(2, -(-calls // CALLS_PER_CHILD))


def temp_root():
    """/dev/shm when it can be used (checkpoint files are fsync'ed: 5x faster on tmpfs)."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="rec_sdk_fuzz_", dir=base)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--children",
        type=int,
        default=None,
        help="chunks (child processes); default: one per %d calls" % CALLS_PER_CHILD,
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="run only this chunk, in this process (to reproduce a loss)",
    )
    parser.add_argument("--verbose", action="store_true", help="with --chunk: print every call")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--crumb", help=argparse.SUPPRESS)
    parser.add_argument(
        "--inject", choices=["crash", "hang", "error", "violation"], help=argparse.SUPPRESS
    )  # a deliberate loss in chunk 0 (self-test)
    parser.add_argument("--timeout", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.children = args.children or default_children(args.calls)
    me = os.path.abspath(__file__)
    base = [
        sys.executable,
        me,
        "--calls",
        str(args.calls),
        "--seed",
        str(args.seed),
        "--children",
        str(args.children),
    ]
    if args.chunk is not None:
        result = run_chunk(args, args.root if args.child else None)
        if args.child:
            print("RESULT " + json.dumps(result), flush=True)
            return 0
        result["chunks"] = 1
        return report(args, [result], [], time.time() - result["seconds"], me)

    start = time.time()
    results, losses = [], []
    root = temp_root()
    try:
        for i, calls in enumerate(chunk_calls(args.calls, args.children)):
            crumb = os.path.join(root, "crumb%d" % i)
            command = base + ["--chunk", str(i)]
            limit = args.timeout or 120 + 0.004 * calls
            inject = ["--inject", args.inject] if args.inject else []
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
            try:
                done = subprocess.run(
                    command + ["--child", "--root", root, "--crumb", crumb] + inject,
                    capture_output=True,
                    text=True,
                    timeout=limit,
                    env=env,
                )
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode == 0 and lines:
                    results.append(json.loads(lines[-1][7:]))
                    continue
                if done.returncode < 0:
                    try:
                        what = "crash (%s)" % signal.Signals(-done.returncode).name
                    except ValueError:
                        what = "crash (signal %d)" % -done.returncode
                else:
                    what = "child failed (exit %d: %s)" % (
                        done.returncode,
                        done.stderr.strip()[-300:].replace("\n", " | "),
                    )
                losses.append(("crash", i, what, command, crumb))
            except subprocess.TimeoutExpired:
                losses.append(("hang", i, "no result within %d s" % limit, command, crumb))
    finally:
        crumbs = {}
        for _kind, i, _what, _command, crumb in losses:
            try:
                with open(crumb, "rb") as f:
                    crumbs[i] = f.read().rstrip(b" \0\n").decode(errors="replace")
            except OSError:
                crumbs[i] = "unknown"
        shutil.rmtree(root, ignore_errors=True)
    losses = [
        (kind, i, what + "; last call started: " + crumbs.get(i, "unknown"), command)
        for kind, i, what, command, crumb in losses
    ]
    return report(args, results, losses, start, me)


def report(args, results, losses, start, me):
    counts, outcomes, unexpected, notes, rejected, meta = (collections.Counter() for _ in range(6))
    op_outcomes = collections.defaultdict(collections.Counter)
    examples, violations, checks, nan_checks = {}, [], 0, 0
    for r in results:
        counts.update(r["counts"])
        outcomes.update(r["outcomes"])
        unexpected.update(r["unexpected"])
        notes.update(r["notes"])
        rejected.update(r["build_rejected"])
        meta.update(r["meta"])
        for op, c in r["op_outcomes"].items():
            op_outcomes[op].update(c)
        for sig, ex in r["examples"].items():
            examples.setdefault(sig, dict(ex, chunk=r.get("chunk")))
        violations += r["violations"]
        checks += r["checks"]
        nan_checks += r["nan_checks"]
    calls = sum(counts.values())
    least = min(OPS, key=lambda op: counts.get(op, 0))
    crashes = [ln for ln in losses if ln[0] == "crash"]
    hangs = [ln for ln in losses if ln[0] == "hang"]
    for kind, i, what, command in losses:
        print("LOSS %s in chunk %d: %s\n    reproduce: %s" % (kind, i, what, " ".join(command)))
    for v in violations:
        print(
            "INVARIANT %s (session %d, %s): %s\n    recent calls on it:\n      %s"
            % (
                v["table"],
                v["session"],
                v["where"],
                "; ".join(v["problems"]),
                "\n      ".join(v["recent"][-10:]),
            )
        )
    for sig, n in unexpected.most_common():
        ex = examples.get(sig, {})
        print(
            "UNEXPECTED x%d %s\n    e.g. chunk %s call %s: %s <- %s\n    message: %s"
            % (
                n,
                sig,
                ex.get("chunk"),
                ex.get("call"),
                ex.get("variant"),
                ", ".join(ex.get("inputs", [])),
                ex.get("message"),
            )
        )
    for note, n in notes.most_common():
        print("NOTE x%d %s" % (n, note))
    if os.environ.get("FUZZ_PER_OP"):
        sigs = collections.Counter()
        for r in results:
            sigs.update(r.get("error_sigs", {}))
        seconds, reasons = collections.Counter(), collections.Counter()
        for r in results:
            seconds.update(r.get("op_seconds", {}))
            reasons.update(r.get("taint_reasons", {}))
        print("guarded tables given wild values by:", dict(reasons))
        for op in OPS:
            print("OP %-24s %5.1f s %s" % (op, seconds[op], dict(op_outcomes[op].most_common())))
            for sig, n in sorted(
                ((s, n) for s, n in sigs.items() if s.startswith(op + " ")), key=lambda x: -x[1]
            )[:6]:
                print("      %6d %s" % (n, sig[len(op) + 1 :]))
    print(
        "also: %s; rejected when the graph was built: %s"
        % (
            ", ".join("%s %s" % (format(n, ","), k) for k, n in sorted(meta.items())),
            ", ".join("%s %s" % (format(n, ","), k) for k, n in sorted(rejected.items())),
        )
    )
    print(
        "calls per op: " + ", ".join("%s=%s" % (op, format(counts.get(op, 0), ",")) for op in OPS)
    )
    bad = len(losses) + len(violations) + sum(unexpected.values())
    print(
        "fuzz: %s calls of %d ops (seed %d, %d chunks) in %.0f s: %d crashes, %d hangs, "
        "%d invariant violations (%s table checks, %s with the NaN check), %d unexpected "
        "errors; min calls per op %s (%s); "
        "outcomes %s%s"
        % (
            format(calls, ",")
            if calls == args.calls or args.chunk is not None
            else "%s of %s" % (format(calls, ","), format(args.calls, ",")),
            len(OPS),
            args.seed,
            args.children if args.chunk is None else 1,
            time.time() - start,
            len(crashes),
            len(hangs),
            len(violations),
            format(checks, ","),
            format(nan_checks, ","),
            sum(unexpected.values()),
            format(counts.get(least, 0), ","),
            least,
            ", ".join("%s=%s" % (k, format(n, ",")) for k, n in outcomes.most_common()),
            ""
            if not bad
            else "; LOSS: "
            + "; ".join(
                ["%s in chunk %d" % (ln[0], ln[1]) for ln in losses[:3]]
                + ["invariant %s" % v["table"] for v in violations[:3]]
                + ["%dx %s" % (n, s[:100]) for s, n in unexpected.most_common(3)]
            ),
        )
    )
    return 1 if bad or len(results) == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
