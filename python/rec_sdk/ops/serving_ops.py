"""Wrappers of the serving-update ops (tf_ops/ops/serving_ops.cc): a training table's changes
taken for a push (take_changes, giving a named Changes), an update's file written by the task
that holds its rows (write_update_file), an update's rows applied to a served table as one
change (apply_rows)."""

import collections

from rec_sdk.ops.loader import load_ops

# What a table's TakeChanges returns: rows changed and keys removed since its last take,
# whether the rows are the whole table, the push id the changes start from and the one they
# end at (session.run of a Changes of tensors gives a Changes of arrays).
Changes = collections.namedtuple("Changes", "keys values removed replace since push_id")


def take_changes(table, key_dtype, dim, full=False, name=None):
    """The table's changes since its last push, for a serving update (track_changes tables):
    Changes(keys [n], values [n, dim], removed keys [m], replace, since, push_id): replace
    when the rows are the whole table, since the push id they follow (0 then)."""
    return Changes(
        *load_ops().rec_sdk_table_take_changes(table, full, key_dtype=key_dtype, dim=dim, name=name)
    )


def write_update_file(path, data, name=None):
    """Op writing the raw bytes of `data` (int32, int64 or float32; little-endian,
    row-major) to `path` (created or truncated), the file and its directory fsync'ed: a
    serving update's file, written on the task the op is placed on. -> bytes written."""
    return load_ops().rec_sdk_write_update_file(path, data, name=name)


def apply_rows(table, keys, values, removed, replace, name=None):
    """Op applying a serving update as one change (exclusive): removes `removed` (with
    replace: every key not among `keys`), then writes the rows."""
    return load_ops().rec_sdk_table_apply_rows(table, keys, values, removed, replace, name=name)
