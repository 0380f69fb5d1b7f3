"""Serving updates of tables sharded over ranks: each rank writes the rows it owns.

Rank 0 pushes (push.Pusher), as it saves: it has a handle of every rank's shard, and the ops
it builds on a shard run on that shard's task (rec_sdk.distribute.ranks). For each table and rank
r, RankParts builds on rank r's device the ops that take the shard's changes (TakeChanges),
add them to the changes since the chain's base that the chain's newest update holds (rank
r's files of it, read and checked on rank r) and write both, the changes alone (step
files) and the sum, into the update's temporary directory (table<i>.rank<r>.*, written and
fsync'ed by the WriteUpdateFile op on rank r). Only their sizes, fingerprints and row counts
go to rank 0, which writes the MANIFEST and publishes the update once every rank's files are
durable (update_files.StagedUpdate): no row passes through rank 0. The push directory is
shared by the ranks (as checkpoints are).
"""

import collections

import tensorflow as tf

from rec_sdk.base.log import logger
from rec_sdk.distribute import ranks as rank_ops
from rec_sdk.ops import serving_ops
from rec_sdk.serving import update_files
from rec_sdk.serving.apply import checked_contents
from rec_sdk.serving.indexed import IndexedTable, choose_layout
from rec_sdk.serving.mutable import (
    ABSENT_KEY,
    LOAD_BATCH,
    ServedTable,
    default_of,
    isin,
    memory_layout,
    part_of_op,
)

KINDS = (("keys", tf.int64), ("values", tf.float32), ("removed", tf.int64))

# What rank r's ops report of table i: the push ids its changes follow and end at, whether
# they are the whole shard, the rows and removed keys of the changes alone and of the sum,
# and {file name: (bytes, fingerprint)} of the files written.
PartReport = collections.namedtuple(
    "PartReport", "since push_id replace step_rows step_removed rows removed files"
)


def is_over_ranks(table):
    """Whether a rec_sdk table is sharded over more than one rank."""
    ranks = getattr(table, "ranks", None)
    return ranks is not None and ranks.size > 1


def rank_shards(table):
    """[shard of rank r] of a table over ranks (rank 0's handles)."""
    if table.ranks.rank != 0:
        raise ValueError(
            "table %r: serving exports and pushes of tables over ranks run on "
            "rank 0 (this is rank %d)" % (table.table_name, table.ranks.rank)
        )
    shards = rank_ops.shards_of(table)
    return [shards[r] for r in range(table.ranks.size)]


def write_checked(path, tensor):
    """(bytes, fingerprint) of `tensor` written to `path` by the task the ops are placed on;
    the fingerprint is of the file as read back."""
    size = serving_ops.write_update_file(path, tensor)
    with tf.control_dependencies([size]):
        print_ = update_files.fingerprint_op(tf.io.read_file(path))
    return size, print_


def accumulate(prior, new):
    """(keys, values, removed): the changes `prior` then `new` (each (keys, values,
    removed)), as push.accumulate with TensorFlow ops."""
    pk, pv, pr = prior
    nk, nv, nr = new
    kept = tf.logical_not(isin(pk, tf.concat([nk, nr], 0)))
    keys = tf.concat([tf.boolean_mask(pk, kept), nk], 0)
    values = tf.concat([tf.boolean_mask(pv, kept), nv], 0)
    removed = tf.unique(tf.concat([tf.boolean_mask(pr, tf.logical_not(isin(pr, nk))), nr], 0)).y
    return keys, values, removed


def served_table_over_ranks(sess, table, index, staging, default):
    """-> (ServedTable, push ids, rows) of a table over ranks for export_serving_model: each
    rank writes the rows it owns, split by the served table's sub-tables, into `staging`
    (a directory the ranks share): table<index>.part<p>.rank<r>.keys/.values, as write_rows
    writes them (rows equal to the default and reserved keys left out)."""
    shards = rank_shards(table)
    devices = table.ranks.devices
    default = default_of(default, table.dim)
    graph = table.handle.graph
    with graph.as_default():
        fence = rank_ops.fence(table)
        with tf.control_dependencies([fence] if fence is not None else []):
            sizes = []
            for r, shard in enumerate(shards):
                with tf.device(devices[r]):
                    sizes.append(shard.size_tensor())
    rows = int(sum(sess.run(sizes)))
    indexed = choose_layout(rows, table.dim) == "indexed"
    parts, buckets = (1, None) if indexed else memory_layout(rows)
    stems = [
        ["%s/table%d.part%d.rank%d." % (staging, index, p, r) for r in range(len(shards))]
        for p in range(parts)
    ]
    with graph.as_default(), tf.name_scope("rec_sdk_export_ranks"):
        ops = []
        for r, shard in enumerate(shards):
            with tf.device(devices[r]):
                keys, values, _, _, _, push_id = shard.take_changes(True)
                keys = tf.cast(keys, tf.int64)
                values = tf.reshape(values, [-1, table.dim])
                kept = tf.logical_and(
                    keys > ABSENT_KEY,
                    tf.logical_not(tf.reduce_all(tf.equal(values, default), axis=1)),
                )
                keys, values = tf.boolean_mask(keys, kept), tf.boolean_mask(values, kept)
                where = part_of_op(keys, parts)
                counts = []
                for p in range(parts):
                    mine = tf.equal(where, p)
                    k, v = tf.boolean_mask(keys, mine), tf.boolean_mask(values, mine)
                    n = tf.size(k, out_type=tf.int64)
                    pad = (-n) % LOAD_BATCH  # whole batches, as write_rows pads
                    written = [
                        serving_ops.write_update_file(stems[p][r] + "keys", tf.pad(k, [[0, pad]])),
                        serving_ops.write_update_file(
                            stems[p][r] + "values", tf.pad(v, [[0, pad], [0, 0]])
                        ),
                    ]
                    with tf.control_dependencies(written):
                        counts.append(tf.identity(n))
                ops.append((tf.stack(counts), push_id))
    done = sess.run(ops)
    files = [
        [
            (stems[p][r] + "keys", stems[p][r] + "values", int(counts[p]))
            for r, (counts, _) in enumerate(done)
        ]
        for p in range(parts)
    ]
    if indexed:
        served = IndexedTable.from_files(
            table.table_name, table.dim, default, files[0], len(shards)
        )
    else:
        served = ServedTable.from_files(
            table.table_name, table.dim, default, parts, buckets, files, len(shards)
        )
    return served, [int(push_id) for _, push_id in done], rows


def write_rows_over_ranks(sess, table, staging, index):
    """Has each rank write its rows of a table over ranks into `staging` (a directory the
    ranks share): table<index>.rank<r>.keys (int64) and .values (float32 [n, dim]), its whole
    shard at one step (after the fence). Returns [(keys file, values file, rows) of rank
    r] (export_saved_model's tables over ranks)."""
    shards = rank_shards(table)
    stems = ["%s/table%d.rank%d." % (staging, index, r) for r in range(len(shards))]
    with table.handle.graph.as_default(), tf.name_scope("rec_sdk_export_ranks"):
        fence = rank_ops.fence(table)
        ops = []
        for r, shard in enumerate(shards):
            with tf.device(table.ranks.devices[r]):
                with tf.control_dependencies([fence] if fence is not None else []):
                    keys, values, _ = shard.export()
                written = [
                    serving_ops.write_update_file(stems[r] + "keys", tf.cast(keys, tf.int64)),
                    serving_ops.write_update_file(stems[r] + "values", values),
                ]
                with tf.control_dependencies(written):
                    ops.append(tf.size(keys, out_type=tf.int64))
    return [(stem + "keys", stem + "values", int(n)) for stem, n in zip(stems, sess.run(ops))]


class RankParts:
    """The ops with which rank 0 has every rank write its part of an update of `tables`
    (rec_sdk tables over the same ranks, in the chain's order)."""

    def __init__(self, tables):
        self.tables = tables
        self.size = tables[0].ranks.size
        for table in tables:
            if table.ranks.size != self.size:
                raise ValueError(
                    "tables over ranks of one served model must be over the same "
                    "ranks: %r is over %d, %r over %d"
                    % (tables[0].table_name, self.size, table.table_name, table.ranks.size)
                )
        self.stage = tf.compat.v1.placeholder(tf.string, [], name="rec_sdk_push_stage")
        self.prior = tf.compat.v1.placeholder(tf.string, [], name="rec_sdk_push_prior")
        self.full = tf.compat.v1.placeholder(tf.bool, [], name="rec_sdk_push_full")
        self.prior_files = {}  # (table, rank) -> ([3] sizes, [3] fingerprints) placeholders
        self.fence = rank_ops.fence(tables[0])
        self.ops = [
            [self._part(i, table, r, shard) for r, shard in enumerate(rank_shards(table))]
            for i, table in enumerate(tables)
        ]

    def _part(self, i, table, r, shard):
        with tf.device(table.ranks.devices[r]), tf.name_scope("rec_sdk_push_rank%d" % r):
            sizes = tf.compat.v1.placeholder(tf.int64, [3])
            prints = tf.compat.v1.placeholder(tf.int64, [3])
            self.prior_files[i, r] = (sizes, prints)
            control = [self.fence] if self.fence is not None else []
            with tf.control_dependencies(control):
                keys, values, removed, replace, since, push_id = shard.take_changes(self.full)
            keys, removed = tf.cast(keys, tf.int64), tf.cast(removed, tf.int64)
            values = tf.reshape(values, [-1, table.dim])
            # The hash tables' reserved keys are not served (mutable.without_reserved_keys);
            # a key removed and written again since the last push is not removed.
            served = keys > ABSENT_KEY
            keys, values = tf.boolean_mask(keys, served), tf.boolean_mask(values, served)
            removed = tf.boolean_mask(
                removed, tf.logical_and(removed > ABSENT_KEY, tf.logical_not(isin(removed, keys)))
            )
            new = (keys, values, removed)

            def path(name):
                return tf.strings.join([self.stage, "/", name])

            def write(parts, step):
                out = {}
                for (kind, _), tensor in zip(KINDS, parts):
                    name = update_files.table_file(i, kind, step, r)
                    out[name] = write_checked(path(name), tensor)
                return out

            def read_prior():
                out = []
                for k, (kind, dtype) in enumerate(KINDS):
                    name = update_files.table_file(i, kind, False, r)
                    path = tf.strings.join([self.prior, "/", name])
                    out.append(
                        checked_contents(path, tf.io.read_file(path), sizes[k], prints[k], dtype)[0]
                    )
                return out[0], tf.reshape(out[1], [-1, table.dim]), out[2]

            def no_prior():
                return (
                    tf.zeros([0], tf.int64),
                    tf.zeros([0, table.dim], tf.float32),
                    tf.zeros([0], tf.int64),
                )

            prior = tf.cond(tf.equal(self.prior, ""), no_prior, read_prior)
            total = accumulate(prior, new)
            files = write(total, False)
            # The changes alone: for a model at the previous version (not in whole updates).
            step_names = [update_files.table_file(i, kind, True, r) for kind, _ in KINDS]
            step = tf.cond(
                self.full,
                lambda: [(tf.constant(-1, tf.int64),) * 2] * 3,
                lambda: [write_checked(path(n), t) for n, t in zip(step_names, new)],
            )
            files.update(zip(step_names, [tuple(s) for s in step]))
            count = lambda t: tf.size(t, out_type=tf.int64)  # noqa: E731
            return PartReport(
                since,
                push_id,
                replace,
                count(keys),
                count(removed),
                count(total[0]),
                count(total[2]),
                files,
            )

    def run(self, sess, push_dir, stage, prior=None, full=False):
        """Has every rank write its files of every table into directory `stage`: the whole
        shards (full), or their changes and their sum with those in the update `prior` of
        push_dir (a manifest; None: nothing before them). Returns [[PartReport of rank r] of
        table i] with NumPy values (files of the changes alone have bytes -1 when full)."""
        feed = {
            self.stage: stage,
            self.full: full,
            self.prior: ""
            if prior is None
            else update_files.update_dir(push_dir, prior["version"]),
        }
        listed = (
            {}
            if prior is None
            else dict(zip(prior["files"], zip(prior["file_sizes"], prior["file_fingerprints"])))
        )
        for (i, r), (sizes, prints) in self.prior_files.items():
            names = [update_files.table_file(i, kind, False, r) for kind, _ in KINDS]
            if prior is not None and any(n not in listed for n in names):
                raise update_files.UpdateError(
                    "update %d lacks rank %d's files of table %d" % (prior["version"], r, i)
                )
            feed[sizes] = [listed[n][0] if prior is not None else 0 for n in names]
            feed[prints] = [listed[n][1] if prior is not None else 0 for n in names]
        return sess.run(self.ops, feed)


def push_over_ranks(pusher, parts, sess, head, expected, dense_values, dense_changed):
    """Pusher.push of tables over ranks (see the module doc): the next update of the chain
    (cumulative since its newest whole update, or whole), each rank writing its files.
    Returns the version published, or None when nothing changed."""
    push_dir = pusher.push_dir
    version = head["version"] + 1
    staged = update_files.StagedUpdate(push_dir, version)
    try:
        if head["whole"]:
            prior, base, base_rows = None, head["version"], sum(head["table_rows"])
        else:
            prior, base = head, head["base"]
            base_rows = sum(
                update_files.read_manifest(update_files.manifest_path(push_dir, base))["table_rows"]
            )
        try:
            reports = parts.run(sess, push_dir, staged.path, prior)
        except (tf.errors.OpError, update_files.UpdateError, OSError) as e:
            logger.warning(
                "serving push: the newest update in %s cannot be added to (%s): "
                "this push is a whole update",
                push_dir,
                e,
            )
            reports = None
        whole = reports is None
        if reports is not None:
            for shards, want in zip(reports, expected):
                if any(bool(p.replace) for p in shards) or not all(
                    int(p.since) == w for p, w in zip(shards, want)
                ):
                    pusher.whole_tables += 1
                    whole = True
            size = sum(int(p.rows) + int(p.removed) for shards in reports for p in shards)
            if size > pusher.base_fraction * base_rows:
                whole = True
            if (
                not whole
                and not dense_changed
                and not any(int(p.step_rows) or int(p.step_removed) for s in reports for p in s)
            ):
                pusher.took(head["version"], [[int(p.push_id) for p in s] for s in reports])
                staged.discard()
                return None
        if whole:
            staged.discard()
            staged = update_files.StagedUpdate(push_dir, version)
            reports = parts.run(sess, push_dir, staged.path, None, full=True)
            dense = [update_files.DenseUpdate(*d) for d in zip(pusher.dense_names, dense_values)]
            base = 0
        else:
            present = dict(zip(head["dense_names"], head["dense_present"])) if prior else {}
            dense = [
                update_files.DenseUpdate(
                    name, value if dense_changed or present.get(name) else None
                )
                for name, value in zip(pusher.dense_names, dense_values)
            ]
        tables = []
        for name, shards in zip(pusher.table_names, reports):
            for p in shards:
                for file_name, (size, print_) in sorted(p.files.items()):
                    if size >= 0:
                        staged.add(file_name, size, print_)
            tables.append(
                update_files.TableSummary(
                    name,
                    sum(int(p.rows) for p in shards),
                    sum(int(p.removed) for p in shards),
                    whole,
                    [int(p.push_id) for p in shards],
                    len(shards),
                )
            )
        staged.publish(base, pusher.chain, tables, dense, steps=not whole)
    except BaseException:
        staged.discard()
        raise
    pusher.took(version, [t.push_ids for t in tables], dense_values)
    pusher.pushes += 1
    pusher.whole_updates += int(whole)
    update_files.retire_old_updates(push_dir, pusher.keep_secs)
    return version
