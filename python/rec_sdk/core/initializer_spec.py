"""Describes a TensorFlow initializer so the C++ core can initialise rows itself.

Supported: truncated normal, random normal, random uniform, constant (scalar), zeros and ones,
from tf.compat.v1 (e.g. tf.compat.v1.truncated_normal_initializer()), TF2 (tf.initializers.*)
or Keras (tf.keras.initializers.*), and plain Python numbers. A seed of None is replaced by a
seed derived from the table name, so a table's initial values are reproducible run to run.
"""
import numbers
import zlib

import numpy as np

SUPPORTED = ("truncated_normal", "random_normal", "random_uniform", "constant", "zeros", "ones",
             "or a Python number")

_KIND_BY_CLASS = {
    "TruncatedNormal": "truncated_normal",
    "RandomNormal": "random_normal",
    "RandomUniform": "random_uniform",
    "Constant": "constant",
    "Zeros": "constant",
    "Ones": "constant",
}


def _spec(kind, seed, scale, value=0.0, minval=0.0, maxval=1.0, mean=0.0, stddev=1.0):
    return {"kind": kind, "value": float(value), "minval": float(minval), "maxval": float(maxval),
            "mean": float(mean), "stddev": float(stddev), "seed": int(seed) & (2**63 - 1),
            "scale": float(scale)}


def default_seed(table_name):
    return zlib.crc32(table_name.encode("utf-8"))


def describe_initializer(initializer, table_name, scale=1.0, param_name="emb_initializer"):
    """Returns the dict of parameters of the table op's initializer attributes.

    Raises ValueError naming `param_name` when the initializer cannot be described.
    """
    if isinstance(initializer, bool):
        raise TypeError("%s must be an initializer or a number, got %r" % (param_name, initializer))
    if isinstance(initializer, numbers.Real):
        return _spec("constant", 0, scale, value=initializer)
    cls = type(initializer).__name__
    kind = _KIND_BY_CLASS.get(cls)
    if kind is None or not hasattr(initializer, "get_config"):
        raise ValueError(
            "%s %r cannot be run by rec_sdk's C++ row initialiser: supported are %s"
            % (param_name, cls if kind is None else initializer, ", ".join(SUPPORTED)))
    config = initializer.get_config()
    for key in ("value", "minval", "maxval", "mean", "stddev"):
        value = config.get(key)
        if value is not None and not isinstance(value, (numbers.Real, np.ndarray, list, tuple)):
            raise ValueError("%s %s: parameter %s=%r must be a number for a rec_sdk table"
                             % (param_name, cls, key, value))
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
            raise ValueError("%s: a constant initializer must have a scalar value for a "
                             "rec_sdk table, got shape %s" % (param_name, value.shape))
        return _spec("constant", seed, scale, value=float(value.reshape(())))
    if kind == "random_uniform":
        # tf.compat.v1.random_uniform_initializer leaves maxval None, meaning 1 for floats.
        minval, maxval = config.get("minval"), config.get("maxval")
        return _spec(kind, seed, scale, minval=0.0 if minval is None else minval,
                     maxval=1.0 if maxval is None else maxval)
    mean, stddev = config.get("mean"), config.get("stddev")
    return _spec(kind, seed, scale, mean=0.0 if mean is None else mean,
                 stddev=1.0 if stddev is None else stddev)
