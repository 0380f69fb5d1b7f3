"""Ids as a table's keys: the one cast of ids of other dtypes (float ids from
tf.strings.to_number, narrower or unsigned integers) to a table's key dtype, checked."""

import tensorflow as tf


def as_keys(ids, key_dtype, what):
    """`ids` as keys of `key_dtype` (tf.int64 or tf.int32), as the SDK's pipeline casts ids
    of other dtypes where it inserts them (e.g. tf.strings.to_number's float32). A cast that
    would lose information fails when it runs, with an InvalidArgumentError naming `what` and
    the first such value: a float that is not a whole number (or NaN), a value outside the
    key range. Ids that are not numbers are a TypeError naming `what`."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype == key_dtype:
        return ids
    if not (ids.dtype.is_integer or ids.dtype.is_floating):
        raise TypeError(
            "%s must be integer (or whole-number float) ids for keys of type %s, "
            "got %s" % (what, key_dtype.name, ids.dtype.name)
        )
    if ids.dtype.is_integer and (
        ids.dtype.size < key_dtype.size
        or (ids.dtype.size == key_dtype.size and not ids.dtype.is_unsigned)
    ):
        return tf.cast(ids, key_dtype)  # every value is a key: no check needed
    low, high = key_dtype.min, key_dtype.max
    if ids.dtype.is_floating:
        # -2^63 (or -2^31) and 2^63 are exact in every float type: the whole numbers in
        # [low, high + 1) are the keys.
        whole = tf.math.equal(ids, tf.math.floor(ids))
        valid = (
            whole
            & (ids >= tf.cast(float(low), ids.dtype))
            & (ids < tf.cast(float(high) + 1.0, ids.dtype))
        )
        rule = "whole numbers in [%d, %d]" % (low, high)
    else:
        valid = (
            ids <= tf.cast(high, ids.dtype)
            if ids.dtype.is_unsigned
            else (ids >= tf.cast(low, ids.dtype)) & (ids <= tf.cast(high, ids.dtype))
        )
        rule = "in [%d, %d]" % (low, high)
    valid = tf.reshape(valid, [-1])
    first_bad = tf.boolean_mask(tf.reshape(ids, [-1]), tf.logical_not(valid))[:1]
    # (TensorFlow escapes quotes in an assertion's strings: the message has none.)
    check = tf.debugging.Assert(
        tf.reduce_all(valid),
        [
            "%s (%s) are cast to %s keys, which needs values %s; got"
            % (what.replace("'", ""), ids.dtype.name, key_dtype.name, rule),
            first_bad,
        ],
        summarize=1,
        name="check_ids_cast",
    )
    with tf.control_dependencies([check]):
        return tf.cast(ids, key_dtype)
