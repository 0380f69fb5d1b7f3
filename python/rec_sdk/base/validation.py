"""Argument checks shared by the public API: every error names the parameter, the value and
what is allowed."""

import numbers

import tensorflow as tf

from rec_sdk.constants.constants import MAX_INT32 as INT32_MAX  # noqa: F401 (re-exported)


def check_int(name, value, low, high):
    """value must be an int (not bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            "%s must be an int in [%d, %d], got %r (%s)"
            % (name, low, high, value, type(value).__name__)
        )
    if not low <= value <= high:
        raise ValueError("%s must be in [%d, %d], got %d" % (name, low, high, value))
    return int(value)


# What an admission or eviction threshold may be: -1 (off) or an int up to 2**31-1 (the range
# the core checks again).
THRESHOLD_RANGE = (-1, INT32_MAX)


def check_threshold(name, value):
    """An admission or eviction threshold: an int in THRESHOLD_RANGE."""
    return check_int(name, value, *THRESHOLD_RANGE)


def check_float(name, value, low, high, low_open=False, high_open=False):
    """value must be a real number in the given (half-)open or closed interval."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, got %r (%s)" % (name, value, type(value).__name__))
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        raise ValueError(
            "%s must be in %s%g, %g%s, got %r"
            % (name, "(" if low_open else "[", low, high, ")" if high_open else "]", value)
        )
    return float(value)


def check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError("%s must be a bool, got %r (%s)" % (name, value, type(value).__name__))
    return value


def check_dtype_name(name, value, allowed, what):
    """value (a tf.DType, NumPy dtype or name) as the name of one of `allowed` (dtype names);
    a ValueError naming the parameter, `what` it is and the allowed names otherwise."""
    try:
        dtype = tf.as_dtype(value).name
    except TypeError:
        dtype = None
    if dtype not in allowed:
        raise ValueError(
            "%s must be one of %s (%s), got %r" % (name, ", ".join(allowed), what, value)
        )
    return dtype
