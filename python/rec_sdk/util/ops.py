"""The SDK's host pipeline ops on CPU (mirrors mx_rec.util.ops.import_host_pipeline_ops).

The SDK's scripts reach a few of its op-library ops directly:
`ConfigInitializer.get_instance().host_pipeline_ops` or `import_host_pipeline_ops()` give an
object whose methods build them. rec_sdk has one op library and does key preprocessing in
tf.data, so the object offers what such scripts call, built on rec_sdk's table ops:

* `set_threshold(threshold, emb_name=..., ids_name=...)`: an op that sets table `emb_name`'s
  feature-admission threshold to the first element of the int tensor `threshold` when it
  runs (run-time values, e.g. from a schedule); returns int32 1. A negative value fails the
  op. The table must have feature admission (its lookups count keys). The threshold is the
  table's (all its lookups); ids_name, if given, must name one of its lookups.
* `return_timestamp(x)`: an int64 scalar, the wall-clock Unix time in seconds when the op runs
  (x only orders it; e.g. inside dataset.map to stamp each batch).
* `clear_channel(channel_id)`: the SDK resets the step counters of a host-to-device data
  channel before an evaluation is re-run. rec_sdk's input is the tf.data iterator itself,
  which starts afresh when initialized, so there is nothing to reset: a no-op op for channel 0
  (training) or 1 (evaluation).

Importing this module also gives tf.data datasets the SDK's `eos_map(librec, channel_id,
max_train_steps=-1, max_eval_steps=-1)` (see eos_map below).

Other ops of the SDK's NPU data channel (read_emb_key_v2, embedding_lookup_by_address, ...)
have no CPU counterpart: asking for one is an AttributeError that says what to use instead.
"""

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_int
from rec_sdk.constants.constants import (
    EVAL_CHANNEL_ID,
    LIBASC_OPS_SO,
    LIBREC_EOS_OPS_SO,
    LIBREC_TF_REC_V1_CPU_SO,
    MAX_INT32,
    TABLE_COLLECTION,
    TRAIN_CHANNEL_ID,
)

_SDK_LIBRARIES = (None, LIBASC_OPS_SO, LIBREC_EOS_OPS_SO, LIBREC_TF_REC_V1_CPU_SO)


class HostPipelineOps:
    """Builders of the SDK's host pipeline ops that scripts call (see the module doc)."""

    def set_threshold(self, input, emb_name="", ids_name="", name=None):  # noqa: A002 (SDK name)
        if not isinstance(emb_name, str) or not emb_name:
            raise ValueError("set_threshold: emb_name must name a table, got %r" % (emb_name,))
        if not isinstance(ids_name, str):
            raise TypeError("set_threshold: ids_name must be a str, got %r" % (ids_name,))
        threshold = tf.convert_to_tensor(input)
        if not threshold.dtype.is_integer:
            raise TypeError(
                "set_threshold: the threshold tensor must be int32 (or int64), got "
                "%s" % threshold.dtype.name
            )
        graph = tf.compat.v1.get_default_graph()
        tables = {t.table_name: t for t in graph.get_collection(TABLE_COLLECTION)}
        if emb_name not in tables:
            raise ValueError(
                "set_threshold: emb_name=%r is not a table of this graph; the "
                "tables are %s" % (emb_name, sorted(tables))
            )
        names = tables[emb_name].lookups.names
        if ids_name and ids_name not in names:
            raise ValueError(
                "set_threshold: ids_name=%r is not a lookup of table %r (its "
                "lookups: %s); the threshold is the table's, for all its lookups"
                % (ids_name, emb_name, sorted(names))
            )
        with tf.name_scope(name or "set_threshold"):
            value = tf.reshape(tf.cast(threshold, tf.int64), [-1])[0]
            check = tf.debugging.Assert(
                value >= 0,
                [
                    tf.strings.format(
                        "set_threshold: table %s: the threshold must be >= 0, got {}" % emb_name,
                        value,
                    )
                ],
                name="check_threshold",
            )
            with tf.control_dependencies([check]):
                update = tables[emb_name].set_access_threshold(value)
            logger.debug("set_threshold op for table %s (lookup %s)", emb_name, ids_name)
            with tf.control_dependencies([update]):
                return tf.constant(1, tf.int32, name="done")

    def return_timestamp(self, input, name=None):  # noqa: A002 (SDK name)
        with tf.name_scope(name or "return_timestamp"):
            with tf.control_dependencies([tf.convert_to_tensor(input)]):
                return tf.cast(tf.timestamp(), tf.int64)

    def clear_channel(self, channel_id, name=None):
        _check_channel("clear_channel", channel_id)
        return tf.no_op(name=name or "clear_channel_%d" % channel_id)

    def __getattr__(self, op_name):
        if op_name.startswith("__"):
            raise AttributeError(op_name)
        raise AttributeError(
            "host pipeline op %r belongs to the SDK's NPU data channel and has no CPU "
            "counterpart in rec_sdk: keys are preprocessed in tf.data (get_asc_insert_func) "
            "and rows are read and updated by sparse_lookup and the sparse optimizers. "
            "Available: set_threshold, return_timestamp, clear_channel" % op_name
        )


def _check_channel(where, channel_id):
    if isinstance(channel_id, bool) or channel_id not in (TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID):
        raise ValueError(
            "%s: channel_id must be %d (training) or %d (evaluation), got %r"
            % (where, TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID, channel_id)
        )


_HOST_PIPELINE_OPS = HostPipelineOps()


def import_host_pipeline_ops(so_pkg_name=None):
    """rec_sdk's host pipeline ops (see the module doc). so_pkg_name may name one of the
    SDK's op libraries (they are all rec_sdk's one library here)."""
    if so_pkg_name not in _SDK_LIBRARIES:
        raise ValueError(
            "so_pkg_name must be None or one of %s, got %r"
            % (list(_SDK_LIBRARIES[1:]), so_pkg_name)
        )
    return _HOST_PIPELINE_OPS


def eos_map(dataset, librec, channel_id, max_train_steps=-1, max_eval_steps=-1):
    """The SDK's `dataset.eos_map(...)`: the dataset's elements unchanged, ending after
    max_train_steps elements on channel 0 (training) or max_eval_steps on channel 1
    (evaluation); -1 does not limit. The SDK also ends every rank's dataset when the first
    rank's ends; one process has nothing to synchronise."""
    if not isinstance(librec, HostPipelineOps):
        raise TypeError(
            "eos_map: librec must come from "
            "rec_sdk.util.ops.import_host_pipeline_ops(...), got %r" % (librec,)
        )
    _check_channel("eos_map", channel_id)
    limit = max_train_steps if channel_id == TRAIN_CHANNEL_ID else max_eval_steps
    name = "max_train_steps" if channel_id == TRAIN_CHANNEL_ID else "max_eval_steps"
    limit = check_int(name, limit, -1, MAX_INT32)
    return dataset if limit < 0 else dataset.take(limit)


tf_patches.add("Dataset.eos_map", eos_map)
