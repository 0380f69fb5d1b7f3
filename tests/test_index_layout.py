"""The table's hash index layouts (create_table(index_layout=...), TableConfig::IndexLayout):
a compact index (8-byte entries, keys read back from rows) trains, evicts, removes, grows and
checkpoints exactly as the full one (whose results test_optimizers checks against NumPy), "auto"
resolves by row dtype, and bad layouts are refused by name."""

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk
import rec_sdk.dynamic_embedding as de
from helpers import new_session, sorted_export
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import table_ops
from rec_sdk.saver import restore_tables, save_tables
from rec_sdk.tables.table_spec import TableSpec
from rec_sdk.util.initialize import init, terminate_config_initializer
from test_optimizers import DIM, OPTIMIZERS


def _scenario(layout, optimizer, fixed, emb_dtype=tf.float32):
    """Every observable result of a run: training with admission (threshold 2), duplicate
    keys, per-sample clocks and eviction, a fixed table that evicts when full, removals,
    evaluation lookups of present and missing keys, the final export and stats."""
    terminate_config_initializer()
    graph = tf.Graph()
    with graph.as_default():
        init(use_dynamic_expansion=not fixed)
        table = create_table(
            tf.int64,
            DIM,
            "t",
            tf.compat.v1.random_normal_initializer(seed=3),
            device_vocabulary_size=48 if fixed else 8,
            evict_when_full=fixed,
            emb_dtype=emb_dtype,
            index_layout=layout,
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        times = tf.compat.v1.placeholder(tf.int64, [None])
        emb = sparse_lookup(
            table,
            ids,
            timestamps=times,
            access_and_evict_config={"access_threshold": 2, "eviction_threshold": 4000},
        )
        loss = tf.reduce_sum(tf.square(emb - 0.5))
        if fixed:
            train = OPTIMIZERS[optimizer][0]().minimize(loss)
        else:  # the SDK's by-address flow
            grads = tf.gradients(
                loss, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
            )
            train = OPTIMIZERS[optimizer][1]().apply_gradients(
                zip(grads, tf.compat.v1.get_collection(rec_sdk.ASCEND_SPARSE_LOOKUP_ID_OFFSET))
            )
        probe = tf.constant(np.arange(-5, 200, dtype=np.int64))
        looked_up = table.lookup(probe)
        removed = table.remove(tf.constant([3, 5, 7, 11, 13, 1000], tf.int64))
        evict = table.evict()
        out = []
        rng = np.random.RandomState(7)
        with new_session(graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(60):
                batch = rng.zipf(1.3, size=40).astype(np.int64) % 150  # duplicates, hot keys
                # A clock per position: no two keys share a last-seen clock, so which rows a
                # full table evicts does not depend on the order of rows (ties would).
                out.append(
                    sess.run(
                        [train, loss],
                        {ids: batch, times: step * 100 + np.arange(batch.size, dtype=np.int64)},
                    )[1]
                )
                if step % 10 == 9:
                    out.extend(sess.run(evict))
                if step == 30:
                    out.append(sess.run(removed))
            out.extend(sess.run(looked_up))
            out.extend(sorted_export(*sess.run(table.export())))
            out.append(sorted(sess.run(table.stats()).items()))
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, list):
            assert x == y
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("fixed", [False, True], ids=["growing", "fixed_evict_when_full"])
@pytest.mark.parametrize("optimizer", ["lazy_adam", "adagrad_rowwise", "ftrl"])
def test_compact_index_gives_the_full_index_results(optimizer, fixed):
    full = _scenario("full", optimizer, fixed)
    _assert_same(_scenario("compact", optimizer, fixed), full)
    # Sanity of the scenario: rows were admitted, evicted and removed.
    stats = dict(full[-1])
    assert stats["admitted"] > 48 and stats["evicted"] > 0 and stats["rejected"] > 0


def test_auto_is_compact_for_half_rows_and_results_match_a_full_index():
    auto = _scenario("auto", "lazy_adam", True, tf.bfloat16)
    _assert_same(_scenario("full", "lazy_adam", True, tf.bfloat16), auto)


def test_a_compact_index_grows_and_checkpoints_into_a_full_one(tmp_path):
    """100,000 keys (the index rehashes many times, reading keys back from rows), removals
    (backward-shift deletion), then a checkpoint restored into a table of the other layout."""
    init(use_dynamic_expansion=True)
    rng = np.random.RandomState(1)
    keys = np.unique(rng.randint(-(1 << 62), 1 << 62, size=100000, dtype=np.int64))
    values = rng.normal(size=(keys.size, 4)).astype(np.float32)
    compact = create_table(
        tf.int64, 4, "c", tf.compat.v1.zeros_initializer(), index_layout="compact"
    )
    full = create_table(tf.int64, 4, "f", tf.compat.v1.zeros_initializer(), index_layout="full")
    gone = keys[::3]
    with new_session() as sess:
        sess.run(compact.upsert(keys, values))
        assert sess.run(compact.remove(gone)) == gone.size
        got, exists = sess.run(compact.lookup(keys))
        kept = np.ones(keys.size, bool)
        kept[::3] = False
        np.testing.assert_array_equal(exists, kept)
        np.testing.assert_array_equal(got[kept], values[kept])
        assert not got[~kept].any()
        save_tables(sess, str(tmp_path / "ckpt"), tables=[compact])
    (tmp_path / "ckpt" / "c").rename(tmp_path / "ckpt" / "f")
    with new_session() as sess:
        restore_tables(sess, str(tmp_path / "ckpt"), tables=[full])
        got, exists = sess.run(full.lookup(keys))
        np.testing.assert_array_equal(exists, kept)
        np.testing.assert_array_equal(got[kept], values[kept])


def test_layouts_resolve_and_a_second_handle_must_agree():
    init(use_dynamic_expansion=True)
    table = create_table(tf.int64, 4, "x", tf.compat.v1.zeros_initializer(), index_layout="compact")
    assert table.spec.index_layout == "compact"
    # A graph loaded from a MetaGraph keeps the layout in the op.
    spec = TableSpec.from_op(table.handle.op, True)
    assert spec.index_layout == "compact"
    # The kernel reads it: a handle of the same table asking for a full index is refused.
    other = table_ops.create_table(
        shared_name=table.shared_name, **spec.replace(index_layout="full").op_attrs()
    )
    with new_session() as sess:
        sess.run(table.size_tensor())
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"compact index \(index_layout\): true vs false"
        ):
            sess.run(table_ops.size(other))
        # "auto" is full for float32 rows: the same table as an explicit "full" one.
        auto = table_ops.create_table(
            shared_name="y", **spec.replace(name="y", index_layout="auto").op_attrs()
        )
        full = table_ops.create_table(
            shared_name="y", **spec.replace(name="y", index_layout="full").op_attrs()
        )
        sess.run([table_ops.size(auto), table_ops.size(full)])


def test_bad_index_layouts_are_refused_naming_the_parameter(tmp_path):
    init(use_dynamic_expansion=True)
    for bad in ("small", None, True):
        with pytest.raises(
            ValueError, match="index_layout must be one of 'auto', 'full', 'compact'"
        ):
            create_table(tf.int64, 4, "bad", tf.compat.v1.zeros_initializer(), index_layout=bad)
        with pytest.raises(ValueError, match="index_layout must be one of"):
            de.CuckooHashTableCreator(index_layout=bad)
    with pytest.raises(
        ValueError, match='index_layout="compact" needs a table without an SSD tier'
    ):
        create_table(
            tf.int64,
            4,
            "tiered",
            tf.compat.v1.zeros_initializer(),
            host_vocabulary_size=8,
            ssd_vocabulary_size=8,
            ssd_data_path=str(tmp_path),
            index_layout="compact",
        )


def test_de_variable_takes_the_layout_from_its_creator():
    v = de.get_variable("v", dim=2, kv_creator=de.CuckooHashTableCreator(index_layout="compact"))
    assert v.tables[0].spec.index_layout == "compact"
    assert de.get_variable("w", dim=2).tables[0].spec.index_layout == "auto"
