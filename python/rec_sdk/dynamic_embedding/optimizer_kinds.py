"""Which stock optimizers a de.Variable's rows can be trained by: each family's rec_sdk
kernel and slots (used by de.Variable.get_slot_variables and DynamicEmbeddingOptimizer)."""
import tensorflow as tf

_V1 = tf.compat.v1.train
# (class, kernel kind, slot names), most specific first.
_KINDS = (
    (_V1.AdamOptimizer, "adam", ("m", "v")),
    (_V1.AdagradOptimizer, "adagrad", ("accumulator",)),
    (_V1.MomentumOptimizer, "momentum", ("momentum",)),
    (_V1.FtrlOptimizer, "ftrl", ("accum", "linear")),
    (_V1.GradientDescentOptimizer, "sgd", ()),
)
# Optimizers without a rec_sdk kernel: TensorFlow's own kernel runs on the gathered rows and
# slots ("generic"). (class, slot names, their initial values), as each class's _create_slots.
_GENERIC = (
    (_V1.AdadeltaOptimizer, lambda o: (("accum", 0.0), ("accum_update", 0.0))),
    (_V1.AdagradDAOptimizer, lambda o: (
        ("gradient_accumulator", 0.0),
        ("gradient_squared_accumulator", float(o._initial_gradient_squared_accumulator_value)))),  # pylint: disable=protected-access
    (_V1.ProximalAdagradOptimizer, lambda o: (
        ("accumulator", float(hyper(o._initial_accumulator_value))),)),  # pylint: disable=protected-access
    (_V1.ProximalGradientDescentOptimizer, lambda o: ()),
    (_V1.RMSPropOptimizer, lambda o: (("rms", 1.0),) + ((("mg", 0.0),) if o._centered else ())  # pylint: disable=protected-access
     + (("momentum", 0.0),)),
)
# The name under which each kernel attaches its slots to a table (sparse_optimizers.cc).
_KERNEL_NAMES = {"adam": "LazyAdam", "adagrad": "Adagrad", "momentum": "Momentum",
                 "ftrl": "Ftrl", "sgd": "GradientDescent"}
SUPPORTED = "tf.compat.v1.train.%s" % ", ".join(
    [c.__name__ for c, _, _ in _KINDS] + [c.__name__ for c, _ in _GENERIC])


def _generic_slots(optimizer):
    """[(slot name, initial value)] of an optimizer of the generic path, else None."""
    for cls, slots in _GENERIC:
        if isinstance(optimizer, cls):
            return list(slots(optimizer))
    return None


def kind(optimizer):
    """(kernel family, slot names) of a supported optimizer; TypeError otherwise."""
    for cls, family, slots in _KINDS:
        if type(optimizer) is cls:  # pylint: disable=unidiomatic-typecheck
            return family, slots
    for cls, family, slots in _KINDS:
        if isinstance(optimizer, cls):
            return family, slots
    generic = _generic_slots(optimizer)
    if generic is not None:
        return "generic", tuple(name for name, _ in generic)
    raise TypeError("DynamicEmbeddingOptimizer supports %s; got %s (Keras optimizers: use "
                    "their tf.compat.v1.train counterparts in graph mode)"
                    % (SUPPORTED, type(optimizer).__name__))


def slot_info(optimizer):
    """[(slot name, initial value)] of a supported optimizer, and the name its kernel gives
    the slots of a table."""
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError("optimizer must be a tf.compat.v1.train optimizer, got %r"
                        % (optimizer,))
    family, names = kind(optimizer)
    if family == "generic":
        # The slots of a table are bound to one optimizer class (and its initial values).
        return _generic_slots(optimizer), type(optimizer).__name__
    initial = [0.0] * len(names)
    if family in ("adagrad", "ftrl"):
        initial[0] = float(hyper(optimizer._initial_accumulator_value))  # pylint: disable=protected-access
    return list(zip(names, initial)), _KERNEL_NAMES[family]


def hyper(value):
    """A hyperparameter's value (TF optimizers may hold callables)."""
    return value() if callable(value) else value
