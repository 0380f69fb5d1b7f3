"""Values of de.Variables of other dtypes than float32 in rec_sdk's float32 rows.

A table row holds 32-bit words. A value of `dim` elements of another dtype is stored as its
bytes: ceil(dim * itemsize / 4) words (float64 and int64 take two words per element; half,
bfloat16, int16 two elements per word; int8, uint8 and bool four, padded with zero bytes).
Storing, reading, exporting and checkpointing copy words, so the values come back bit for bit.
Only float32 rows are trained (the optimizers compute on float32); rows of other dtypes are
stored and read. All-zero bytes are zero (or False) in every dtype, so a table of another
dtype initializes missing keys to zeros and the variable applies its own defaults.

float16 and bfloat16 are the exception: the tables store them natively (half-precision rows,
tf_ops/core/row_precision.h), so their rows are one element per value, initialized by the
table's initializer and trained (in float32, rounded stochastically into the rows).
"""

import tensorflow as tf

VALUE_DTYPES = (
    tf.float32,
    tf.float64,
    tf.float16,
    tf.bfloat16,
    tf.int64,
    tf.int32,
    tf.int16,
    tf.int8,
    tf.uint8,
    tf.bool,
)


def check(value_dtype):
    """value_dtype as a tf.DType, or a TypeError naming the dtypes rec_sdk stores."""
    value_dtype = tf.as_dtype(value_dtype)
    if value_dtype not in VALUE_DTYPES:
        raise TypeError(
            "value_dtype %s is not supported: rec_sdk stores %s values"
            % (value_dtype.name, ", ".join(d.name for d in VALUE_DTYPES))
        )
    return value_dtype


# Value dtypes the tables store as their own row dtype (TableSpec.emb_dtype).
NATIVE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def native(dtype):
    """Whether the tables hold values of dtype as rows of that dtype (read and written as
    float32, trained)."""
    return dtype in NATIVE_DTYPES


def _itemsize(dtype):
    return 1 if dtype == tf.bool else dtype.size


def stored_dim(dtype, dim):
    """Words (elements, for a native dtype) of a row holding dim elements of dtype."""
    if native(dtype):
        return dim
    return -(-dim * _itemsize(dtype) // 4)


def _per_word(dtype):
    """Elements per word (dtypes narrower than 4 bytes)."""
    return 4 // _itemsize(dtype)


def encode(values, dtype, dim):
    """Rows [n, dim] of dtype -> float32 rows [n, stored_dim] holding their bytes (native
    dtypes: their values)."""
    if native(dtype):
        return tf.cast(values, tf.float32)
    rows = tf.reshape(values, [-1, dim])
    if dtype == tf.bool:
        rows = tf.cast(rows, tf.uint8)
    size = _itemsize(dtype)
    words = stored_dim(dtype, dim)
    if size == 8:
        return tf.reshape(tf.bitcast(rows, tf.float32), [-1, words])
    if size == 4:
        return tf.bitcast(rows, tf.float32)
    per = _per_word(dtype)
    rows = tf.pad(rows, [[0, 0], [0, words * per - dim]])
    return tf.bitcast(tf.reshape(rows, [-1, words, per]), tf.float32)


def decode(rows, dtype, dim):
    """float32 rows [n, stored_dim] -> values [n, dim] of dtype (the inverse of encode)."""
    if native(dtype):
        return tf.cast(rows, dtype)
    size = _itemsize(dtype)
    if size == 8:
        return tf.bitcast(tf.reshape(rows, [-1, dim, 2]), dtype)
    if size == 4:
        return tf.bitcast(rows, dtype)
    narrow = tf.uint8 if dtype == tf.bool else dtype
    values = tf.reshape(tf.bitcast(rows, narrow), [-1, stored_dim(dtype, dim) * _per_word(dtype)])[
        :, :dim
    ]
    return tf.not_equal(values, 0) if dtype == tf.bool else values
