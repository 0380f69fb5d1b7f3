"""Thin wrappers over the sparse optimizer ops (tf_ops/ops/optimizer_ops.cc)."""
from rec_sdk.ops.loader import load_ops


def apply_lazy_adam(table, addresses, grads, learning_rate, beta1, beta2, epsilon, step,
                    name=None):
    return load_ops().rec_sdk_apply_lazy_adam(table, addresses, grads, learning_rate, beta1,
                                              beta2, epsilon, step, name=name)


def apply_gradient_descent(table, addresses, grads, learning_rate, weight_decay, name=None):
    return load_ops().rec_sdk_apply_gradient_descent(table, addresses, grads, learning_rate,
                                                     weight_decay, name=name)


def apply_adagrad(table, addresses, grads, learning_rate, initial_accumulator_value, name=None):
    return load_ops().rec_sdk_apply_adagrad(
        table, addresses, grads, learning_rate,
        initial_accumulator_value=initial_accumulator_value, name=name)


def apply_momentum(table, addresses, grads, learning_rate, momentum, use_nesterov=False,
                   name=None):
    return load_ops().rec_sdk_apply_momentum(table, addresses, grads, learning_rate, momentum,
                                             use_nesterov=use_nesterov, name=name)


def apply_ftrl(table, addresses, grads, learning_rate, learning_rate_power, l1, l2, l2_shrinkage,
               initial_accumulator_value, name=None):
    return load_ops().rec_sdk_apply_ftrl(
        table, addresses, grads, learning_rate, learning_rate_power, l1, l2, l2_shrinkage,
        initial_accumulator_value=initial_accumulator_value, name=name)
