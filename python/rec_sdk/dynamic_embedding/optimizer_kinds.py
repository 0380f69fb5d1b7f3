"""Which stock optimizers a de.Variable's rows can be trained by, in three families:

  "v1"     tf.compat.v1.train optimizers;
  "legacy" Keras OptimizerV2 (tf.keras.optimizers.legacy, and TensorFlow's own copy in
           tensorflow.python.keras.optimizer_v2);
  "keras"  the Keras 2 optimizers (tf.keras.optimizers).

Each optimizer gets a kind: a rec_sdk fused kernel ("adam", "adagrad", "momentum", "ftrl",
"sgd") where its update is one of them, else "generic" (the optimizer's own update runs on the
step's rows and slots, gathered from and written back to the table). `kind` and `slot_info`
are what de.Variable.get_slot_variables and DynamicEmbeddingOptimizer use.
"""

import numbers
import sys

import numpy as np
import tensorflow as tf

from rec_sdk.dynamic_embedding.rowwise_adagrad import RowwiseAdagradOptimizer

_V1 = tf.compat.v1.train


_REQUIRED = object()  # private_state without a default: the attribute must exist


def private_state(owner, attribute, default=_REQUIRED):
    """State of a stock optimizer that TensorFlow keeps only in private attributes, read here,
    by name, so that one place knows they are private (checked on TensorFlow 2.15 and 2.21):
    the tf.compat.v1.train optimizers' hyperparameters (_learning_rate, _lr, _beta1, _beta2,
    _epsilon, _momentum, _use_nesterov, _learning_rate_power, _l1/_l2_regularization_strength,
    _l2_shrinkage_regularization_strength, _initial_accumulator_value,
    _initial_gradient_squared_accumulator_value, _centered), their slot dict _slots and their
    non-slot variables' _non_slot_dict; legacy Keras optimizers' (OptimizerV2) _momentum, _slots,
    _slot_names, _hyper, _weights and their module's _var_key; Keras 2 optimizers' _variables. The
    de optimizer's generic path reads and extends them to run an optimizer's own update on a table's
    rows."""
    if default is _REQUIRED:
        return getattr(owner, attribute)
    return getattr(owner, attribute, default)


def private_call(owner, method, *args, **kwargs):
    """Calls a private method of a stock optimizer, by name, here for the same reason as
    private_state: Keras optimizers' _create_all_weights, _get_hyper, _decayed_lr, _prepare,
    _resource_apply_dense, _transform_gradients, _clip_gradients; the v1 FTRL's
    _compute_current_learning_rate."""
    return getattr(owner, method)(*args, **kwargs)


# (class, kernel kind, slot names), most specific first.
_KINDS = (
    (_V1.AdamOptimizer, "adam", ("m", "v")),
    (_V1.AdagradOptimizer, "adagrad", ("accumulator",)),
    (RowwiseAdagradOptimizer, "rowwise_adagrad", ("accumulator",)),
    (_V1.MomentumOptimizer, "momentum", ("momentum",)),
    (_V1.FtrlOptimizer, "ftrl", ("accum", "linear")),
    (_V1.GradientDescentOptimizer, "sgd", ()),
)
# v1 optimizers without a rec_sdk kernel: TensorFlow's own kernel runs on the gathered rows
# and slots. (class, slot names with their initial values), as each class's _create_slots.
_GENERIC = (
    (_V1.AdadeltaOptimizer, lambda o: (("accum", 0.0), ("accum_update", 0.0))),
    (
        _V1.AdagradDAOptimizer,
        lambda o: (
            ("gradient_accumulator", 0.0),
            (
                "gradient_squared_accumulator",
                float(private_state(o, "_initial_gradient_squared_accumulator_value")),
            ),
        ),
    ),
    (
        _V1.ProximalAdagradOptimizer,
        lambda o: (("accumulator", float(hyper(private_state(o, "_initial_accumulator_value")))),),
    ),
    (_V1.ProximalGradientDescentOptimizer, lambda o: ()),
    (
        _V1.RMSPropOptimizer,
        lambda o: (
            (("rms", 1.0),)
            + ((("mg", 0.0),) if private_state(o, "_centered") else ())
            + (("momentum", 0.0),)
        ),
    ),
)
# The name under which each kernel attaches its slots to a table (sparse_optimizers.cc).
_KERNEL_NAMES = {
    "adam": "LazyAdam",
    "adagrad": "Adagrad",
    "rowwise_adagrad": "RowwiseAdagrad",
    "momentum": "Momentum",
    "ftrl": "Ftrl",
    "sgd": "GradientDescent",
}
# Keras classes (both families) with a fused kernel, by class name, and their slot names.
_KERAS_FUSED = {
    "Adam": ("adam", ("m", "v")),
    "Adagrad": ("adagrad", ("accumulator",)),
    "Ftrl": ("ftrl", ("accumulator", "linear")),
    "SGD": ("sgd", ()),
}
_KERAS_MODULES = ("keras.", "tensorflow.python.keras.", "tf_keras.")
SUPPORTED = (
    "tf.compat.v1.train optimizers (%s), Keras optimizers (tf.keras.optimizers and "
    "tf.keras.optimizers.legacy)"
    % ", ".join([c.__name__ for c, _, _ in _KINDS] + [c.__name__ for c, _ in _GENERIC])
)


def legacy_var_key(optimizer):
    """The function keying a legacy Keras optimizer's slot dict (its module's _var_key)."""
    base = next(c for c in type(optimizer).__mro__ if c.__name__ == "OptimizerV2")
    return private_state(sys.modules[base.__module__], "_var_key")


def family(optimizer):
    """ "v1", "legacy" or "keras"; TypeError for anything else."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return "v1"
    for cls in type(optimizer).__mro__:
        if cls.__name__ == "OptimizerV2" and cls.__module__.startswith(_KERAS_MODULES):
            return "legacy"
        if cls.__name__ == "_BaseOptimizer" and cls.__module__.startswith(_KERAS_MODULES):
            return "keras"
        if cls.__name__ == "BaseOptimizer" and cls.__module__.startswith("keras."):
            raise TypeError(
                "DynamicEmbeddingOptimizer: %r is a Keras 3 optimizer (tf.keras on TensorFlow "
                "%s), which cannot train rows of rec_sdk tables: use Keras 2's, "
                "tf_keras.optimizers (or set TF_USE_LEGACY_KERAS=1 before importing "
                "TensorFlow so that tf.keras is tf_keras), or a tf.compat.v1.train optimizer"
                % (optimizer, tf.__version__)
            )
    raise TypeError(
        "DynamicEmbeddingOptimizer: the optimizer it wraps must be one of %s; "
        "got %r" % (SUPPORTED, optimizer)
    )


def _generic_slots(optimizer):
    """[(slot name, initial value)] of a v1 optimizer of the generic path, else None."""
    for cls, slots in _GENERIC:
        if isinstance(optimizer, cls):
            return list(slots(optimizer))
    return None


def _is_keras_class(optimizer):
    return type(optimizer).__module__.startswith(_KERAS_MODULES)


def _constant(value):
    """A Python number of a hyperparameter that is a constant (number, constant tensor or
    variable), else None (a schedule, a callable)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Number):
        return float(value)
    if isinstance(value, tf.Variable):
        return None  # may be changed while training
    static = tf.get_static_value(value) if isinstance(value, tf.Tensor) else None
    return None if static is None else float(np.asarray(static))


def _keras_kind(optimizer, fam):
    """(kind, slot names) of a Keras optimizer (both families)."""
    name = type(optimizer).__name__
    if not _is_keras_class(optimizer) or name not in _KERAS_FUSED:
        return "generic", None  # subclasses run their own update
    if fam == "keras" and (optimizer.weight_decay or getattr(optimizer, "use_ema", False)):
        return "generic", None  # the optimizer's own apply_gradients does them
    if name == "Adam" and optimizer.amsgrad:
        return "generic", None
    if name == "SGD":
        if fam == "legacy":
            if not private_state(optimizer, "_momentum"):
                return "sgd", ()
            return "momentum", ("momentum",)
        momentum = _constant(optimizer.momentum)
        if momentum == 0.0:
            return "sgd", ()
        return "momentum", ("momentum",)
    return _KERAS_FUSED[name]


def kind(optimizer):
    """(kernel family, slot names) of a supported optimizer (slot names None: a generic Keras
    optimizer, whose slots are known once built); TypeError otherwise."""
    fam = family(optimizer)
    if fam != "v1":
        return _keras_kind(optimizer, fam)
    for cls, kernel, slots in _KINDS:
        if type(optimizer) is cls:  # pylint: disable=unidiomatic-typecheck
            return kernel, slots
    for cls, kernel, slots in _KINDS:
        if isinstance(optimizer, cls):
            return kernel, slots
    generic = _generic_slots(optimizer)
    if generic is not None:
        return "generic", tuple(name for name, _ in generic)
    raise TypeError(
        "DynamicEmbeddingOptimizer supports %s; got %s" % (SUPPORTED, type(optimizer).__name__)
    )


def kernel_name(optimizer, kernel):
    """The name under which the fused kernel `kernel` of `optimizer` owns a table's slots."""
    if kernel == "momentum" and family(optimizer) != "v1":
        return "KerasMomentum"  # a velocity (sparse_optimizers.h), not v1's accumulation
    return _KERNEL_NAMES[kernel]


def initial_accumulator(optimizer):
    """Adagrad's and Ftrl's initial accumulator value, in any family."""
    for attr in ("_initial_accumulator_value", "initial_accumulator_value"):
        if hasattr(optimizer, attr):
            return float(hyper(getattr(optimizer, attr)))
    return 0.1


def slot_info(optimizer, generic_slots=None):
    """[(slot name, initial value)] of a supported optimizer, and the name its kernel gives
    the slots of a table. generic_slots(optimizer) gives a generic Keras optimizer's."""
    fam = family(optimizer)
    kernel, names = kind(optimizer)
    if kernel == "generic":
        if fam == "v1":
            # The slots of a table are bound to one optimizer class (and its initial values).
            return _generic_slots(optimizer), type(optimizer).__name__
        return generic_slots(optimizer), "Keras" + type(optimizer).__name__
    initial = [0.0] * len(names)
    if kernel in ("adagrad", "rowwise_adagrad", "ftrl"):
        initial[0] = initial_accumulator(optimizer)
    return list(zip(names, initial)), kernel_name(optimizer, kernel)


def hyper(value):
    """A hyperparameter's value (TF optimizers may hold callables)."""
    return value() if callable(value) else value


def name_of(optimizer):
    """An optimizer's name in any family."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return optimizer.get_name()
    return private_state(optimizer, "_name", None) or optimizer.name
