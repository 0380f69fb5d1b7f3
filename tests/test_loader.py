"""Tests for rec_sdk.ops.loader: errors for a missing or mismatched op library, and the
'RecSdk>' prefix of every op."""

import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session
from tensorflow.python.framework import op_def_registry

import rec_sdk
from rec_sdk.base import release
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.ops import loader
from rec_sdk.optimizers import lazy_adam
from rec_sdk.util.initialize import init

PREFIX = "RecSdk>"
INSTALLED = os.path.join(os.path.dirname(loader.__file__), loader.LIBRARY_FILE)


@pytest.fixture
def fresh_loader(monkeypatch):
    """Makes the next load_ops() load again; the loaded library is restored afterwards."""
    loader.load_ops()  # make sure the real library is loaded (and restored) whatever the order
    monkeypatch.setattr(loader, "_library", None)
    return monkeypatch


def test_library_path_default_and_env(monkeypatch):
    monkeypatch.delenv(loader.LIBRARY_ENV, raising=False)
    assert loader.library_path() == INSTALLED
    monkeypatch.setenv(loader.LIBRARY_ENV, "")
    assert loader.library_path() == INSTALLED
    monkeypatch.setenv(loader.LIBRARY_ENV, "/somewhere/lib.so")
    assert loader.library_path() == "/somewhere/lib.so"


def test_installed_library_and_version_file():
    assert os.path.exists(INSTALLED)
    version_file = os.path.join(os.path.dirname(INSTALLED), loader.VERSION_FILE)
    with open(version_file) as f:
        assert f.read().strip() == tf.__version__


def test_missing_library_error(fresh_loader, tmp_path):
    missing = str(tmp_path / "no_such_dir" / "_rec_sdk_ops.so")
    fresh_loader.setenv(loader.LIBRARY_ENV, missing)
    with pytest.raises(loader.OpLibraryError) as info:
        loader.load_ops()
    message = str(info.value)
    assert missing in message
    assert tf.__version__ in message
    assert "`%s`" % loader.REBUILD_COMMAND in message
    assert isinstance(info.value, RuntimeError)
    assert loader._library is None
    # The error reaches the public API too.
    init()
    with pytest.raises(loader.OpLibraryError, match="missing"):
        create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())


def test_version_mismatch_error(fresh_loader, tmp_path):
    copy = tmp_path / loader.LIBRARY_FILE
    shutil.copyfile(INSTALLED, copy)
    (tmp_path / loader.VERSION_FILE).write_text("2.99.7\n")
    fresh_loader.setenv(loader.LIBRARY_ENV, str(copy))
    with pytest.raises(loader.OpLibraryError) as info:
        loader.load_ops()
    message = str(info.value)
    assert "2.99.7" in message
    assert tf.__version__ in message
    assert str(copy) in message
    # A library outside a checkout is an installed wheel's: match TensorFlow to it. In the
    # checkout, rebuild.
    assert "`pip install tensorflow-cpu==2.99.7`" in message
    assert "`%s`" % loader.REBUILD_COMMAND in loader._remedy(INSTALLED, "2.99.7")
    assert loader._library is None
    # `import rec_sdk` checks the same (a wheel next to the wrong TensorFlow).
    with pytest.raises(loader.OpLibraryError, match="built for TensorFlow 2.99.7"):
        loader.check_built_version()


def test_a_wheel_for_another_tensorflow_names_both_pip_commands(monkeypatch):
    """An installed wheel (outside a checkout) for another supported TensorFlow: install that
    TensorFlow, or the wheel for this one; for this TensorFlow's minor version, only the
    first; next to a TensorFlow rec_sdk has no wheel for, which ones it has."""
    wheel_library = "/site-packages/rec_sdk/ops/" + loader.LIBRARY_FILE
    here = release.minor(tf.__version__)
    other = next(row.tensorflow for minor, row in release.RELEASES.items() if minor != here)
    remedy = loader._remedy(wheel_library, other)
    assert (
        "This rec_sdk wheel (%s %s) needs TensorFlow %s: `%s`"
        % (
            release.distribution(other),
            release.VERSION,
            other,
            release.install_tensorflow_command(other, installed=tf.__version__),
        )
        in remedy
    )
    assert (
        "install the rec_sdk wheel for TensorFlow %s: `%s`"
        % (here, release.install_wheel_command(tf.__version__, replacing=other))
        in remedy
    )
    assert "make wheel TF=%s" % here in remedy
    same_minor = here + ".99"
    remedy = loader._remedy(wheel_library, same_minor)
    assert "needs TensorFlow %s" % same_minor in remedy
    assert "install the rec_sdk wheel" not in remedy and "uninstall" not in remedy
    monkeypatch.setattr(tf, "__version__", "2.14.1")
    remedy = loader._remedy(wheel_library, other)
    assert (
        "rec_sdk has wheels for TensorFlow %s; 2.14.1 is not one of them" % release.supported()
        in remedy
    )
    assert "`%s`" % release.install_tensorflow_command(other, installed="2.14.1") in remedy


def test_two_installed_wheels_are_warned_about(tmp_path, caplog):
    """rec_sdk's wheels for two TensorFlows in one site-packages own the same files: importing
    warns and names the command that keeps the one for this TensorFlow."""
    site = tmp_path / "site-packages"
    (site / "rec_sdk" / "ops").mkdir(parents=True)
    library = str(site / "rec_sdk" / "ops" / loader.LIBRARY_FILE)
    (site / "rec_sdk_tf2_15-0.1.0.dist-info").mkdir()
    with caplog.at_level("WARNING", logger="rec_sdk"):
        loader._warn_if_several_wheels(library)
    assert not caplog.records
    (site / "rec_sdk_tf2_21-0.1.0.dist-info").mkdir()
    with caplog.at_level("WARNING", logger="rec_sdk"):
        loader._warn_if_several_wheels(library)
    (record,) = caplog.records
    keep = release.distribution(tf.__version__)
    wanted = "pip uninstall -y %s && pip install %s" % (
        " ".join(sorted({"rec-sdk-tf2-15", "rec-sdk-tf2-21", keep})),
        keep,
    )
    assert "rec-sdk-tf2-15, rec-sdk-tf2-21 are all installed" in record.getMessage()
    assert wanted in record.getMessage()


def test_unloadable_library_error(fresh_loader, tmp_path):
    bogus = tmp_path / loader.LIBRARY_FILE
    bogus.write_bytes(b"this is not a shared object")
    (tmp_path / loader.VERSION_FILE).write_text(tf.__version__)
    fresh_loader.setenv(loader.LIBRARY_ENV, str(bogus))
    with pytest.raises(loader.OpLibraryError) as info:
        loader.load_ops()
    message = str(info.value)
    assert str(bogus) in message
    assert tf.__version__ in message
    assert "Reinstall the rec_sdk wheel" in message


def test_library_loaded_once():
    assert loader.load_ops() is loader.load_ops()


def test_import_does_not_load_library():
    code = (
        "import rec_sdk, rec_sdk.core.embedding, rec_sdk.optimizers.lazy_adam, "
        "rec_sdk.util.variable\n"
        "from rec_sdk.ops import loader\n"
        "assert loader._library is None\n"
    )
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="3", REC_SDK_OPS_LIBRARY="/nonexistent/_rec_sdk_ops.so"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def _library_op_list():
    loader.load_ops()
    handle = pywrap_tf_session.TF_LoadLibrary(loader.library_path())
    return op_def_pb2.OpList.FromString(pywrap_tf_session.TF_GetOpList(handle))


def test_every_library_op_has_prefix():
    names = [op.name for op in _library_op_list().op]
    assert len(names) >= 15
    assert all(name.startswith(PREFIX) for name in names), names
    for name in names:
        assert op_def_registry.get(name) is not None
    # Without the prefix some names would clash with TensorFlow's own ops (its
    # ApplyGradientDescent takes a ref variable, not a table).
    tf_op = op_def_registry.get("ApplyGradientDescent")
    ours = op_def_registry.get(PREFIX + "ApplyGradientDescent")
    assert tf_op is not None and tf_op.input_arg[0].name == "var"
    assert ours.input_arg[0].name == "table"
    expected = {
        "EmbeddingTable",
        "TableFindOrInsert",
        "TableGather",
        "TableLookup",
        "TableUpsert",
        "TableRemove",
        "TablePrefetchCold",
        "TablePrefetchColdByName",
        "TableSize",
        "TableCapacity",
        "TableClear",
        "TableExport",
        "TableImport",
        "ApplyLazyAdam",
        "ApplyGradientDescent",
        "ApplyAdagrad",
        "ApplyFtrl",
    }
    assert {PREFIX + name for name in expected} <= set(names)


def test_graph_ops_carry_prefix():
    init(use_dynamic_expansion=False)
    library_ops = {op.name for op in _library_op_list().op}
    table = create_table(
        tf.int64, 4, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=10
    )
    emb = sparse_lookup(table, tf.constant([1, 2], tf.int64))
    lazy_adam.create_hash_optimizer().minimize(tf.reduce_sum(emb))
    table.export()
    types = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
    ours = types & library_ops
    assert {
        PREFIX + "EmbeddingTable",
        PREFIX + "TableFindOrInsertRows",
        PREFIX + "ApplyLazyAdam",
        PREFIX + "TableExport",
    } <= ours
    # No op of the graph looks like one of ours without the prefix.
    for op_type in types - ours:
        assert not op_type.startswith(("Table", "EmbeddingTable", "RecSdk")), op_type
    assert rec_sdk.ops.table_ops.GATHER_OP.startswith(PREFIX)
    assert rec_sdk.ops.table_ops.FIND_OR_INSERT_OP.startswith(PREFIX)
    assert rec_sdk.ops.table_ops.FIND_OR_INSERT_ROWS_OP.startswith(PREFIX)


def test_limits_and_stat_names_come_from_the_op_library():
    """The core writes the dim limit and the order of the table counters once; Python reads
    them from the op definitions, and they agree with what the kernels do."""
    from rec_sdk.core.embedding import create_table
    from rec_sdk.ops import table_ops as ops
    from rec_sdk.tables.initializer_spec import describe_initializer
    from rec_sdk.util.initialize import init

    init()
    table = create_table(
        tf.int64, 2, "t", tf.compat.v1.zeros_initializer(), device_vocabulary_size=10
    )
    insert = table.upsert(tf.constant([1, 2, 3], tf.int64), tf.zeros([3, 2]))
    too_wide = ops.create_table(
        "wide",
        tf.int64,
        ops.max_dim() + 1,
        True,
        capacity=0,
        initializer=describe_initializer(tf.compat.v1.zeros_initializer(), "wide"),
    )
    with tf.compat.v1.Session() as sess:
        sess.run(insert)
        stats = sess.run(table.stats())
        assert len(sess.run(ops.stats(table.handle))) == len(ops.stat_names())
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="must be in \\[1, %d\\]" % ops.max_dim()
        ):
            sess.run(too_wide)
    assert stats["size"] == 3 and stats["capacity"] == 10 and stats["pending"] == 0
    with pytest.raises(ValueError, match="dim must be in \\[1, %d\\]" % ops.max_dim()):
        create_table(tf.int64, ops.max_dim() + 1, "u", tf.compat.v1.zeros_initializer())
