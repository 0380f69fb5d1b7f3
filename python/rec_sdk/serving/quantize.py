"""Rows of a frozen serving export in less memory: float16, or int8 quantized row by row.

int8 (as FBGEMM's 8-bit row-wise tables): each row keeps dim int8 codes and two float32
numbers, a scale and a bias, so that value = code * scale + bias with scale = (max - min) / 255
of the row; a value is off by at most scale / 2 = (max - min) / 510 of its row (plus float32
rounding). At dim 64 a row takes 72 bytes instead of 256 (0.28x), at dim 16 24 instead of 64.
The export measures the largest error over all rows and logs it.
"""

import numpy as np
import tensorflow as tf

from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_dtype_name

ROW_DTYPES = ("float32", "float16", "int8")


def check_row_dtype(value, parameter="row_dtype"):
    """value as one of ROW_DTYPES (a name or tf/NumPy dtype), else a ValueError naming
    `parameter`."""
    return check_dtype_name(parameter, value, ROW_DTYPES, "the dtype of the served rows")


def quantize(values):
    """float32 rows [n, dim] -> (int8 codes [n, dim], float32 [n, 2] scale and bias)."""
    values = np.asarray(values, np.float32)
    low, high = values.min(axis=1), values.max(axis=1)
    scale = ((high.astype(np.float64) - low) / 255.0).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0))  # a constant row: exact with any
    codes = np.rint((values - low[:, None]) / scale[:, None]) - 128
    codes = np.clip(codes, -128, 127).astype(np.int8)
    bias = (low + 128 * scale).astype(np.float32)
    return codes, np.stack([scale, bias], axis=1).astype(np.float32)


def dequantize_numpy(codes, scale_bias):
    """What the served graph computes (dequantize), in NumPy."""
    return codes.astype(np.float32) * scale_bias[:, :1] + scale_bias[:, 1:]


def dequantize(codes, scale_bias):
    """Served rows from gathered int8 codes [..., dim] and their scale and bias [..., 2]."""
    return tf.cast(codes, tf.float32) * scale_bias[..., :1] + scale_bias[..., 1:]


class StoredRows:
    """A table's exported rows [n, dim] (float32) as the serving graph keeps them in
    `row_dtype`: .arrays (the NumPy arrays to store, one or two) and .rows(gathered arrays)
    -> float32 rows; .max_error is the largest absolute difference from the float32 rows."""

    def __init__(self, values, row_dtype, what):
        values = np.asarray(values, np.float32)
        self.row_dtype = row_dtype
        if row_dtype == "int8":
            codes, scale_bias = quantize(values)
            self.arrays = [codes, scale_bias]
            served = dequantize_numpy(codes, scale_bias)
        elif row_dtype == "float16":
            self.arrays = [values.astype(np.float16)]
            served = self.arrays[0].astype(np.float32)
        else:
            self.arrays = [values]
            served = values
        self.max_error = float(np.max(np.abs(served - values))) if values.size else 0.0
        if row_dtype != "float32":
            logger.info(
                "serving export: %s rows of %s: largest error %.3g (largest |value| %.3g)",
                row_dtype,
                what,
                self.max_error,
                float(np.max(np.abs(values))) if values.size else 0.0,
            )

    def rows(self, gathered):
        """float32 rows from the arrays gathered at the same rows."""
        if self.row_dtype == "int8":
            return dequantize(*gathered)
        return tf.cast(gathered[0], tf.float32)
