"""One table description from the API to the core: TableSpec (checked once, frozen), its op
attributes and back, shard names formatted and parsed in one module, no module writing a
table's configuration after construction, and the TensorFlow patches' one convention."""

import ast
import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk.base import tf_patches
from rec_sdk.core.embedding import create_table
from rec_sdk.tables import shard_names, tier
from rec_sdk.tables import table as table_module
from rec_sdk.tables.initializer_spec import describe_initializer
from rec_sdk.tables.table import SparseEmbedding, table_from_op
from rec_sdk.tables.table_spec import RankPlacement, TableSpec
from rec_sdk.util.initialize import init, terminate_config_initializer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INIT = describe_initializer(0.5, "t")


def _round_trip(spec):
    """The spec of the table op made from `spec`, read back from the op."""
    with tf.Graph().as_default():
        table = table_module.create(spec)
        return TableSpec.from_op(table.handle.op, is_save=spec.is_save), table


@pytest.mark.parametrize("kind", ["fixed", "dynamic", "tiered bounded", "tiered unbounded"])
def test_spec_to_op_attributes_and_back(tmp_path, kind):
    paths = (str(tmp_path),)
    spec = {
        "fixed": TableSpec(
            "t",
            tf.int64,
            8,
            INIT,
            dynamic_expansion=False,
            capacity_rows=100,
            initial_rows=100,
            evict_when_full=True,
            track_changes=True,
        ),
        "dynamic": TableSpec("t", tf.int32, 4, INIT, initial_rows=64, track_access=True),
        "tiered bounded": TableSpec(
            "t",
            tf.int64,
            4,
            INIT,
            dynamic_expansion=False,
            capacity_rows=30,
            tier=tier.make(10, 20, paths),
        ),
        "tiered unbounded": TableSpec(
            "t", tf.int64, 4, INIT, tier=tier.make(10, None, paths, True)
        ),
    }[kind]
    back, table = _round_trip(spec)
    assert back.op_attrs() == spec.op_attrs()
    for field in (
        "name",
        "key_dtype",
        "dim",
        "dynamic_expansion",
        "capacity_rows",
        "tier",
        "evict_when_full",
        "track_changes",
        "track_access",
    ):
        assert getattr(back, field) == getattr(spec, field), field
    assert table.spec is spec  # the table keeps the spec it was made from


def test_spec_checks_itself_once():
    with pytest.raises(ValueError, match="key_dtype"):
        TableSpec("t", tf.float32, 4, INIT)
    with pytest.raises(ValueError, match="dim must be in"):
        TableSpec("t", tf.int64, 0, INIT)
    with pytest.raises(ValueError, match="capacity_rows must be None"):
        TableSpec("t", tf.int64, 4, INIT, capacity_rows=10)
    with pytest.raises(ValueError, match="capacity of at least one row"):
        TableSpec("t", tf.int64, 4, INIT, dynamic_expansion=False)
    with pytest.raises(ValueError, match="evict_when_full"):
        TableSpec("t", tf.int64, 4, INIT, evict_when_full=True)
    with pytest.raises(ValueError, match="unbounded"):
        TableSpec("t", tf.int64, 4, INIT, tier=tier.make(10, 20, ("/tmp",)))
    with pytest.raises(ValueError, match="memory_rows"):
        tier.make(0, None, ("/tmp",))
    spec = TableSpec("t", tf.int64, 4, INIT)
    with pytest.raises(AttributeError):
        spec.dim = 8  # frozen
    assert spec.replace(dim=8).dim == 8 and spec.dim == 4


def test_table_configuration_is_read_only():
    with tf.Graph().as_default():
        table = table_module.create(TableSpec("t", tf.int64, 4, INIT))
        for field in (
            "dim",
            "table_name",
            "is_save",
            "tier",
            "ranks",
            "track_access",
            "padding_keys",
            "access_threshold",
        ):
            with pytest.raises(AttributeError):
                setattr(table, field, None)


def test_a_spec_holds_placement_only():
    """A table over ranks: its spec holds where its shards are (a frozen RankPlacement), not
    the shards' table objects, so a spec stays what it was when made."""
    placement = RankPlacement(None, 1, 2, ["/job:worker/task:0", "/job:worker/task:1"])
    assert placement.devices == ("/job:worker/task:0", "/job:worker/task:1")
    assert placement.device == "/job:worker/task:1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.rank = 0
    with pytest.raises(ValueError, match="rank=2, size=2 and 2 devices"):
        RankPlacement(None, 2, 2, ["a", "b"])
    spec = TableSpec("t", tf.int64, 4, INIT, placement=placement)
    assert spec.placement is placement
    # The initializer's description is the one dict (the op's attributes are made from it).
    assert [
        f.name
        for f in dataclasses.fields(spec)
        if isinstance(getattr(spec, f.name), (dict, list, set))
    ] == ["initializer"]


# Attributes of a table that only its own module may set (every SparseEmbedding property).
_TABLE_FIELDS = {
    name
    for cls in SparseEmbedding.__mro__
    if cls.__module__.startswith("rec_sdk")
    for name, value in vars(cls).items()
    if isinstance(value, property)
}
# The modules of SparseEmbedding and its rec_sdk bases, which set their own fields.
_TABLE_MODULES = ("table.py", "admission.py")


def test_no_module_writes_a_tables_configuration():
    """Statically: outside tables/table.py and tables/admission.py, no assignment `x.<table field> =
    ...` where x is not `self` (a class setting its own attribute of the same name is no table)."""
    found = []
    for directory, _, files in os.walk(os.path.join(ROOT, "python", "rec_sdk")):
        for name in files:
            path = os.path.join(directory, name)
            if not name.endswith(".py") or any(
                path.endswith(os.path.join("tables", m)) for m in _TABLE_MODULES
            ):
                continue
            for node in ast.walk(ast.parse(open(path).read(), path)):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                    else []
                )
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr in _TABLE_FIELDS
                        and not (
                            isinstance(target.value, ast.Name)
                            and target.value.id in ("self", "cls")
                        )
                    ):
                        found.append(
                            "%s:%d %s" % (os.path.relpath(path, ROOT), node.lineno, target.attr)
                        )
    assert not found, found


def test_create_table_and_de_variable_build_specs():
    init(use_dynamic_expansion=False)
    try:
        with tf.Graph().as_default():
            table = create_table(
                tf.int64, 8, "user", 0.1, device_vocabulary_size=100, host_vocabulary_size=20
            )
            assert (table.spec.capacity_rows, table.spec.initial_rows) == (120, 100)
            assert not table.spec.dynamic_expansion and table.spec.is_save
            variable = de.get_variable("emb", dim=4, devices=["/CPU:0"] * 2, init_size=64)
            names = [t.table_name for t in variable.tables]
            assert names == shard_names.variable_shards("emb", 2)
            assert [t.spec.saved_by_owner for t in variable.tables] == [True, True]
            assert [t.device_vocabulary_size for t in variable.tables] == [32, 32]
            keep = variable.tables[1].shard_keys_filter(np.array([1, 2, 3], np.int64))
            assert keep.tolist() == [True, False, True]
            loaded = table_from_op(table.handle.op)
            assert loaded.spec.op_attrs() == table.spec.op_attrs()
            assert loaded.is_save and loaded.checkpoint_ops is not None
    finally:
        terminate_config_initializer()


def test_shard_names_format_and_parse():
    assert shard_names.variable_shards("a.b", 3) == ["a.b_mht_1of3", "a.b_mht_2of3", "a.b_mht_3of3"]
    assert shard_names.parse_variable_shard("x_1_mht_2of4") == ("x_1", 1, 4)
    assert shard_names.parse_variable_shard("plain") is None
    assert shard_names.rank_shard("t", 1, 4) == "t@1of4"
    assert shard_names.parse_rank_shard("t@1of4") == ("t", 1, 4)
    assert shard_names.parse_rank_shard("t_mht_1of2") is None
    assert shard_names.table_base_name("scope/emb") == "scope_emb"
    long = shard_names.table_base_name("x" * 200)
    assert len(long) == 79 and long != shard_names.table_base_name("x" * 201)
    assert shard_names.shard_file_name("e_mht_1of2", 3, 4) == "e_mht_1of2_rank3_size4"


def test_every_tensorflow_patch_is_installed_once_by_its_convention():
    assert tf_patches.installed() == sorted(tf_patches.PATCHES)
    saver_save = tf.compat.v1.train.Saver.save
    assert getattr(saver_save, tf_patches.PATCH_MARK) == "Saver.save"
    # A second install of an installed patch changes nothing and gives the original back.
    original = tf_patches.install("Saver.save", lambda original, *a, **k: None)
    assert tf.compat.v1.train.Saver.save is saver_save
    assert original is saver_save.__wrapped__
    assert getattr(original, tf_patches.PATCH_MARK, None) is None
    with pytest.raises(KeyError, match="no TensorFlow patch 'Saver.bogus'"):
        tf_patches.install("Saver.bogus", lambda original: None)
    for patch in tf_patches.PATCHES.values():
        assert patch.does and patch.why and patch.attr, patch.name
