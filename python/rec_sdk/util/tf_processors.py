"""tf.compat.v1 optimizers' processor lookup for rec_sdk's objects.

TensorFlow's optimizers pick a "processor" per variable (tensorflow.python.training.
optimizer._get_processor): what compute_gradients differentiates (target()) and how
apply_gradients updates it (update_op). rec_sdk's objects that stand where variables stand
(an SDK table in a var_list, a de lookup's trainable) get processors of their own; the lookup
is wrapped once, here, and each kind registers a function giving its processor (or None).
"""
from tensorflow.python.training import optimizer as tf_optimizer

_factories = []


def register(factory):
    """factory(v) -> a processor for v (target(), update_op(optimizer, grad)), or None."""
    if factory not in _factories:
        _factories.append(factory)


def _install():
    original = tf_optimizer._get_processor  # pylint: disable=protected-access
    if getattr(original, "_rec_sdk", False):
        return

    def get_processor(v):
        for factory in _factories:
            processor = factory(v)
            if processor is not None:
                return processor
        return original(v)

    get_processor._rec_sdk = True  # pylint: disable=protected-access
    get_processor.__doc__ = original.__doc__
    tf_optimizer._get_processor = get_processor  # pylint: disable=protected-access


_install()
