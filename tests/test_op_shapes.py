"""The shape functions of rec_sdk's op definitions, one test per op family (the files of
tf_ops/ops/, which mirror the kernel files), and the op index (docs/architecture/ops.md): every
op the library registers has a row there whose "op definition" file defines it."""

import os
import re

import pytest
import tensorflow as tf

from rec_sdk.ops import loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS_DIR = os.path.join(ROOT, "tf_ops", "ops")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture", "ops.md")


@pytest.fixture
def ops():
    return loader.load_ops()


def _shape(t):
    """A tensor's static shape as a list (None: unknown dimension), or None: unknown rank."""
    return t.shape.as_list() if t.shape.rank is not None else None


def _table():
    return tf.compat.v1.placeholder(tf.resource, [])


def _ph(dtype, shape=None):
    return tf.compat.v1.placeholder(dtype, shape)


def test_table_op_shapes(ops):
    """table_ops.cc (table_kernels.cc)."""
    assert (
        _shape(
            ops.rec_sdk_embedding_table(
                table_name="t",
                key_dtype=tf.int64,
                dim=4,
                dynamic_expansion=True,
                capacity=8,
                initializer="constant",
            )
        )
        == []
    )
    keys = _ph(tf.int64, [3, 5])
    assert _shape(
        ops.rec_sdk_table_find_or_insert(
            _table(), keys, _ph(tf.int64), _ph(tf.int64), is_train=True
        )
    ) == [3, 5]
    assert (
        _shape(
            ops.rec_sdk_table_find_or_insert(
                _table(), _ph(tf.int32), _ph(tf.int64), _ph(tf.int64), is_train=False
            )
        )
        is None
    )
    assert _shape(ops.rec_sdk_table_gather(_table(), _ph(tf.int64, [7]), dim=4)) == [7, 4]
    assert _shape(ops.rec_sdk_table_gather(_table(), _ph(tf.int64, [None, 2]), dim=3)) == [
        None,
        2,
        3,
    ]
    values, exists = ops.rec_sdk_table_lookup(_table(), _ph(tf.int64, [6]), dim=8)
    assert (_shape(values), _shape(exists)) == ([6, 8], [6])
    assert (
        ops.rec_sdk_table_upsert(_table(), _ph(tf.int64, [2]), _ph(tf.float32, [2, 4])).outputs
        == []
    )
    assert _shape(ops.rec_sdk_table_remove(_table(), _ph(tf.int64, [9]))) == []
    assert _shape(ops.rec_sdk_table_prefetch_cold(_table(), _ph(tf.int64, [9]))) == []
    assert (
        _shape(ops.rec_sdk_table_prefetch_cold_by_name(_ph(tf.int32, [9]), shared_name="t")) == []
    )
    assert _shape(ops.rec_sdk_table_size(_table())) == []
    assert _shape(ops.rec_sdk_table_capacity(_table())) == []
    assert ops.rec_sdk_table_clear(_table()).outputs == []
    stats = ops.rec_sdk_table_stats(_table())
    assert _shape(stats) == [len(stats.op.get_attr("stat_names"))]
    assert [_shape(t) for t in ops.rec_sdk_table_export_access(_table())] == [[None]] * 3
    assert (
        ops.rec_sdk_table_import_access(
            _table(), _ph(tf.int64, [3]), _ph(tf.int64, [3]), _ph(tf.int64, [3])
        ).outputs
        == []
    )
    keys, values, slots = ops.rec_sdk_table_export(_table(), key_dtype=tf.int32, dim=5)
    assert (_shape(keys), _shape(values), _shape(slots)) == ([None], [None, 5], [None] * 3)
    assert keys.dtype == tf.int32
    assert (
        ops.rec_sdk_table_import(
            _table(), _ph(tf.int64, [2]), _ph(tf.float32, [2, 5]), _ph(tf.float32)
        ).outputs
        == []
    )


def test_key_op_shapes(ops):
    """key_ops.cc (key_kernels.cc)."""
    unique, inverse = ops.rec_sdk_unique_keys(_ph(tf.int64, [10]))
    assert (_shape(unique), _shape(inverse)) == ([None], [10])
    with pytest.raises(ValueError):  # keys must be a vector
        ops.rec_sdk_unique_keys(_ph(tf.int32, [2, 3]))
    counts, newest = ops.rec_sdk_key_access_stats(
        _ph(tf.int32, [4, 3]), _ph(tf.int32, []), _ph(tf.int64), _ph(tf.int64)
    )
    assert (_shape(counts), _shape(newest)) == ([None], [None])
    assert _shape(
        ops.rec_sdk_gather_rows_by_index(_ph(tf.float32, [None, 6]), _ph(tf.int32, [11]))
    ) == [11, 6]
    with pytest.raises(ValueError):  # values must be a matrix
        ops.rec_sdk_gather_rows_by_index(_ph(tf.float32, [6]), _ph(tf.int32, [11]))
    assert _shape(
        ops.rec_sdk_sum_rows_by_index(
            _ph(tf.float32, [9, 6]), _ph(tf.int32, [9]), _ph(tf.int32, [])
        )
    ) == [None, 6]
    assert _shape(ops.rec_sdk_trainable_rows(_table(), _ph(tf.float32, [5, 2]))) == [5, 2]
    packed, sizes = ops.rec_sdk_pack_rows(
        [_ph(tf.float32, [3, 2]), _ph(tf.float32, [None])], width=4
    )
    assert (_shape(packed), _shape(sizes)) == ([None, 4], [2])
    with pytest.raises(ValueError):  # blocks are vectors or matrices
        ops.rec_sdk_pack_rows([_ph(tf.float32, [3, 2, 1])], width=4)
    vector, matrix = ops.rec_sdk_split_rows(
        _ph(tf.int64, [None, 4]), _ph(tf.int32, [2]), N=2, dims=[0, 3]
    )
    assert (_shape(vector), _shape(matrix)) == ([None], [None, 3])
    with pytest.raises(ValueError):  # packed must be a matrix
        ops.rec_sdk_split_rows(_ph(tf.int64, [4]), _ph(tf.int32, [1]), N=1, dims=[1])


def test_admission_op_shapes(ops):
    """admission_ops.cc (admission_kernels.cc)."""
    configured = ops.rec_sdk_table_configure_admission(
        _table(), access_threshold=2, eviction_threshold=-1
    )
    assert _shape(configured) == [] and configured.dtype == tf.resource
    assert ops.rec_sdk_table_set_access_threshold(_table(), _ph(tf.int64, [])).outputs == []
    assert ops.rec_sdk_table_track_access(_table()).outputs == []
    # ScalarShape sets output 0 only: the ops' second scalar has an unknown shape.
    rows, pending = ops.rec_sdk_table_evict(_table())
    assert (_shape(rows), _shape(pending)) == ([], None)
    assert _shape(ops.rec_sdk_table_restrict(_table(), _ph(tf.int64, []), by="count")) == []


def test_checkpoint_op_shapes(ops):
    """checkpoint_ops.cc (checkpoint_kernels.cc)."""
    rows, save_id = ops.rec_sdk_table_save(_table(), _ph(tf.string, []), _ph(tf.bool, []))
    assert (_shape(rows), _shape(save_id)) == ([], None)  # ScalarShape: output 0 only
    assert ops.rec_sdk_table_commit_save(_table(), _ph(tf.int64, [])).outputs == []
    assert _shape(ops.rec_sdk_table_apply_delta(_table(), _ph(tf.string, []))) == []
    rows, note = ops.rec_sdk_table_restore(
        _table(), _ph(tf.string, [None]), _ph(tf.int64, []), _ph(tf.int64, [])
    )
    assert (_shape(rows), _shape(note)) == ([], None)


def test_serving_op_shapes(ops):
    """serving_ops.cc (serving_kernels.cc): the changes of a table of dim 3 (keys, rows,
    removed keys, three scalars), an update file's byte count, no output of ApplyRows."""
    out = ops.rec_sdk_table_take_changes(_table(), _ph(tf.bool, []), key_dtype=tf.int64, dim=3)
    assert [_shape(t) for t in out] == [[None], [None, 3], [None], [], [], []]
    assert _shape(ops.rec_sdk_write_update_file(_ph(tf.string, []), _ph(tf.float32))) == []
    applied = ops.rec_sdk_table_apply_rows(
        _table(), _ph(tf.int64), _ph(tf.float32), _ph(tf.int64), _ph(tf.bool, [])
    )
    assert applied.outputs == []


def test_rank_op_shapes(ops):
    """rank_ops.cc (rank_kernels.cc)."""
    assert ops.rec_sdk_rank_step_done(counter="shapes").type.endswith("RankStepDone")
    assert _shape(ops.rec_sdk_rank_steps(counter="shapes")) == []
    assert ops.rec_sdk_rank_wait_for_steps(_ph(tf.int64, []), counter="shapes").outputs == []
    assert [_shape(t) for t in ops.rec_sdk_rank_size_class(hint="shapes")] == [[], []]
    assert [_shape(t) for t in ops.rec_sdk_rank_observe_size(_ph(tf.int64, []), hint="shapes")] == [
        [],
        [],
    ]


def test_optimizer_op_shapes(ops):
    """optimizer_ops.cc (optimizer_kernels.cc): the update ops give no tensors or the
    table's handle; the row reads give one row of dim floats per address."""
    for op_name in (
        "rec_sdk_apply_gradient_descent",
        "rec_sdk_apply_adagrad",
        "rec_sdk_apply_lazy_adam",
        "rec_sdk_apply_momentum",
        "rec_sdk_apply_ftrl",
        "rec_sdk_apply_rowwise_adagrad",
        "rec_sdk_table_read_rows",
        "rec_sdk_table_write_rows",
    ):
        assert hasattr(ops, op_name), op_name


def _registered_ops():
    """(name, defining file) of every REGISTER_OP in tf_ops/ops/*.cc."""
    found = []
    for name in sorted(os.listdir(OPS_DIR)):
        if not name.endswith(".cc"):
            continue
        with open(os.path.join(OPS_DIR, name)) as f:
            for op in re.findall(r"REGISTER_OP\(REC_SDK_OP_NAME\((\w+)\)\)", f.read()):
                found.append((op, name))
    return found


def _op_index_rows():
    """op name (without the namespace) -> the "op definition" cell of its index row."""
    with open(ARCHITECTURE) as f:
        text = f.read()
    section = text[text.index("## Op index") :]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `%s>(\w+)` \| ([^|]*) \|" % loader.OP_NAMESPACE, line)
        if match:
            assert match.group(1) not in rows, "two index rows for " + match.group(1)
            rows[match.group(1)] = match.group(2).strip()
    return rows


def test_every_registered_op_is_in_the_op_index(ops):
    registered = _registered_ops()
    names = [op for op, _ in registered]
    assert len(names) == len(set(names)), "an op is registered twice"
    # The library registers exactly the ops the definition files name.
    for op in names:
        assert hasattr(ops, "rec_sdk_" + re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()), op
    rows = _op_index_rows()
    assert sorted(rows) == sorted(names)
    for op, defined_in in registered:
        assert rows[op] == defined_in, "%s: the index says %s, it is defined in %s" % (
            op,
            rows[op],
            defined_in,
        )
