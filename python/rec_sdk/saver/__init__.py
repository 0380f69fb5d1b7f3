"""Checkpoints of rec_sdk tables (mirrors mx_rec.saver): the tables' directories beside
TensorFlow's checkpoint (tables.py: save_tables, restore_tables, export_npz, import_npz) and
the patches that make tf.compat.v1.train.Saver write and read them (patches.py)."""

from rec_sdk.saver.patches import enable_tfra_checkpoint_tensors, restore_tables_in_graph
from rec_sdk.saver.tables import (
    SPARSE_PREFIX,
    TABLE_META_FILE,
    commit_tables,
    existing_save,
    export_npz,
    import_npz,
    remove_leftovers,
    restore_tables,
    save_tables,
    sparse_dir,
    tables_of_session,
    write_tables,
)

__all__ = [
    "SPARSE_PREFIX",
    "TABLE_META_FILE",
    "commit_tables",
    "enable_tfra_checkpoint_tensors",
    "existing_save",
    "export_npz",
    "import_npz",
    "remove_leftovers",
    "restore_tables",
    "restore_tables_in_graph",
    "save_tables",
    "sparse_dir",
    "tables_of_session",
    "write_tables",
]
