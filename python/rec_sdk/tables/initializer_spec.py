"""Describes a TensorFlow initializer so the C++ core can initialise rows itself.

Supported: truncated normal, random normal, random uniform, constant (scalar), zeros and ones,
from tf.compat.v1 (e.g. tf.compat.v1.truncated_normal_initializer()), TF2 (tf.initializers.*)
or Keras (tf.keras.initializers.*), and plain Python numbers. A seed of None is replaced by a
seed derived from the table name, so a table's initial values are reproducible run to run.

Shape-dependent initializers (variance scaling: tf.compat.v1.variance_scaling_initializer,
Glorot, He, LeCun) are supported for tables with a shape, as in the SDK's HBM mode: the
fixed-capacity table is a [rows, dim] variable to them (fan_in = rows, fan_out = dim, as
TensorFlow computes fans of a 2-D shape), and each new row gets values of the distribution
they describe (a truncated normal, normal or uniform of the scale they compute), deterministic
per key. A table without a shape (dynamic expansion) refuses them, as the SDK does.
"""

import math
import numbers
import zlib

import numpy as np

SUPPORTED = (
    "truncated_normal",
    "random_normal",
    "random_uniform",
    "constant",
    "zeros",
    "ones",
    "variance scaling (Glorot, He, LeCun) for fixed-capacity tables",
    "or a Python number",
)

_KIND_BY_CLASS = {
    "TruncatedNormal": "truncated_normal",
    "RandomNormal": "random_normal",
    "RandomUniform": "random_uniform",
    "Constant": "constant",
    "Zeros": "constant",
    "Ones": "constant",
}


def _spec(kind, seed, scale, value=0.0, minval=0.0, maxval=1.0, mean=0.0, stddev=1.0):
    return {
        "kind": kind,
        "value": float(value),
        "minval": float(minval),
        "maxval": float(maxval),
        "mean": float(mean),
        "stddev": float(stddev),
        "seed": int(seed) & (2**63 - 1),
        "scale": float(scale),
    }


def default_seed(table_name):
    return zlib.crc32(table_name.encode("utf-8"))


# TensorFlow's truncated normal of variance scaling: the stddev of a standard normal truncated
# to [-2, 2], which the stddev is divided by so that the values have the asked-for variance.
_TRUNCATED_STDDEV = 0.87962566103423978


def _is_variance_scaling(initializer):
    return any(c.__name__ == "VarianceScaling" for c in type(initializer).__mro__) and all(
        hasattr(initializer, a) for a in ("scale", "mode", "distribution")
    )


def _variance_scaling(initializer, table_name, scale, param_name, shape):
    """The row distribution of a variance-scaling initializer for a [rows, dim] table."""
    cls = type(initializer).__name__
    if shape is None:
        raise ValueError(
            "%s %s depends on the table's shape (its fan-in and fan-out), and table %r has "
            "none: it grows without bound (a de.Variable, or create_table under "
            "init(use_dynamic_expansion=True)). Use it with a fixed-capacity create_table "
            "table (the SDK's HBM mode), or a shape-free initializer: %s"
            % (param_name, cls, table_name, ", ".join(SUPPORTED[:-2] + SUPPORTED[-1:]))
        )
    fan_in, fan_out = float(shape[0]), float(shape[1])
    mode = initializer.mode
    if mode == "fan_in":
        n = fan_in
    elif mode == "fan_out":
        n = fan_out
    elif mode == "fan_avg":
        n = (fan_in + fan_out) / 2.0
    else:
        raise ValueError(
            "%s %s: mode must be fan_in, fan_out or fan_avg, got %r" % (param_name, cls, mode)
        )
    variance = float(initializer.scale) / max(1.0, n)
    seed = getattr(initializer, "seed", None)
    if seed is None:
        seed = default_seed(table_name)
    distribution = initializer.distribution
    if distribution in ("truncated_normal", "normal"):
        return _spec(
            "truncated_normal", seed, scale, stddev=math.sqrt(variance) / _TRUNCATED_STDDEV
        )
    if distribution == "untruncated_normal":
        return _spec("random_normal", seed, scale, stddev=math.sqrt(variance))
    if distribution == "uniform":
        limit = math.sqrt(3.0 * variance)
        return _spec("random_uniform", seed, scale, minval=-limit, maxval=limit)
    raise ValueError(
        "%s %s: distribution must be truncated_normal, untruncated_normal or "
        "uniform, got %r" % (param_name, cls, distribution)
    )


def describe_initializer(
    initializer, table_name, scale=1.0, param_name="emb_initializer", shape=None
):
    """Returns the dict of parameters of the table op's initializer attributes.

    shape: (rows, dim) of a table with a fixed shape, which shape-dependent initializers
    (variance scaling) take their fans from; None for a table without one.
    Raises ValueError naming `param_name` when the initializer cannot be described.
    """
    if isinstance(initializer, bool):
        raise TypeError("%s must be an initializer or a number, got %r" % (param_name, initializer))
    if isinstance(initializer, numbers.Real):
        return _spec("constant", 0, scale, value=initializer)
    if _is_variance_scaling(initializer):
        return _variance_scaling(initializer, table_name, scale, param_name, shape)
    cls = type(initializer).__name__
    kind = _KIND_BY_CLASS.get(cls)
    if kind is None or not hasattr(initializer, "get_config"):
        raise ValueError(
            "%s %r cannot be run by rec_sdk's C++ row initialiser: supported are %s"
            % (param_name, cls if kind is None else initializer, ", ".join(SUPPORTED))
        )
    config = initializer.get_config()
    for key in ("value", "minval", "maxval", "mean", "stddev"):
        value = config.get(key)
        if value is not None and not isinstance(value, (numbers.Real, np.ndarray, list, tuple)):
            raise ValueError(
                "%s %s: parameter %s=%r must be a number for a rec_sdk table"
                % (param_name, cls, key, value)
            )
    seed = config.get("seed")
    if seed is None:
        seed = default_seed(table_name)
    if cls == "Zeros":
        return _spec("constant", seed, scale, value=0.0)
    if cls == "Ones":
        return _spec("constant", seed, scale, value=1.0)
    if kind == "constant":
        value = np.asarray(config.get("value", 0.0))
        if value.size != 1:
            raise ValueError(
                "%s: a constant initializer must have a scalar value for a "
                "rec_sdk table, got shape %s" % (param_name, value.shape)
            )
        return _spec("constant", seed, scale, value=float(value.reshape(())))
    if kind == "random_uniform":
        # tf.compat.v1.random_uniform_initializer leaves maxval None, meaning 1 for floats.
        minval, maxval = config.get("minval"), config.get("maxval")
        return _spec(
            kind,
            seed,
            scale,
            minval=0.0 if minval is None else minval,
            maxval=1.0 if maxval is None else maxval,
        )
    mean, stddev = config.get("mean"), config.get("stddev")
    return _spec(
        kind,
        seed,
        scale,
        mean=0.0 if mean is None else mean,
        stddev=1.0 if stddev is None else stddev,
    )
