"""tf.compat.v1 optimizers' processor lookup for rec_sdk's objects.

TensorFlow's optimizers pick a "processor" per variable (tensorflow.python.training.
optimizer._get_processor): what compute_gradients differentiates (target()) and how
apply_gradients updates it (update_op). rec_sdk's objects that stand where variables stand
(an SDK table in a var_list, a de lookup's trainable) get processors of their own: the lookup
is patched once, here (rec_sdk.base.tf_patches), and each kind registers a function giving
its processor (or None).
"""

from rec_sdk.base import tf_patches

_factories = []


def register(factory):
    """factory(v) -> a processor for v (target(), update_op(optimizer, grad)), or None."""
    if factory not in _factories:
        _factories.append(factory)


def _get_processor(original, v):
    for factory in _factories:
        processor = factory(v)
        if processor is not None:
            return processor
    return original(v)


tf_patches.install("optimizer._get_processor", _get_processor)
