"""Thin wrappers over the sparse optimizer ops (tf_ops/ops/optimizer_ops.cc).

Each takes `unique_addresses`: False (the default) lets the kernel sum the gradients of
duplicate addresses (one update per row); True, from callers that deduplicated already
(rec_sdk.optimizers.base.SparseOptimizer.apply_gradients), skips that work.
"""

from rec_sdk.ops.loader import load_ops


def apply_lazy_adam(
    table,
    addresses,
    grads,
    learning_rate,
    beta1,
    beta2,
    epsilon,
    step,
    unique_addresses=False,
    bias_corrected=False,
    name=None,
):
    """bias_corrected: learning_rate is the corrected rate (step unused), else the kernel
    corrects it for `step` in double precision."""
    return load_ops().rec_sdk_apply_lazy_adam(
        table,
        addresses,
        grads,
        learning_rate,
        beta1,
        beta2,
        epsilon,
        step,
        unique_addresses=unique_addresses,
        bias_corrected=bias_corrected,
        name=name,
    )


def apply_gradient_descent(
    table, addresses, grads, learning_rate, weight_decay, unique_addresses=False, name=None
):
    return load_ops().rec_sdk_apply_gradient_descent(
        table,
        addresses,
        grads,
        learning_rate,
        weight_decay,
        unique_addresses=unique_addresses,
        name=name,
    )


def apply_adagrad(
    table,
    addresses,
    grads,
    learning_rate,
    initial_accumulator_value,
    unique_addresses=False,
    epsilon=0.0,
    epsilon_inside_sqrt=False,
    name=None,
):
    return load_ops().rec_sdk_apply_adagrad(
        table,
        addresses,
        grads,
        learning_rate,
        initial_accumulator_value=initial_accumulator_value,
        epsilon=epsilon,
        epsilon_inside_sqrt=epsilon_inside_sqrt,
        unique_addresses=unique_addresses,
        name=name,
    )


def apply_rowwise_adagrad(
    table,
    addresses,
    grads,
    learning_rate,
    initial_accumulator_value,
    epsilon,
    unique_addresses=False,
    name=None,
):
    """Row-wise Adagrad: one accumulator per row (a 1-float slot)."""
    return load_ops().rec_sdk_apply_rowwise_adagrad(
        table,
        addresses,
        grads,
        learning_rate,
        initial_accumulator_value=initial_accumulator_value,
        epsilon=epsilon,
        unique_addresses=unique_addresses,
        name=name,
    )


def apply_momentum(
    table,
    addresses,
    grads,
    learning_rate,
    momentum,
    use_nesterov=False,
    unique_addresses=False,
    velocity=False,
    name=None,
):
    return load_ops().rec_sdk_apply_momentum(
        table,
        addresses,
        grads,
        learning_rate,
        momentum,
        use_nesterov=use_nesterov,
        velocity=velocity,
        unique_addresses=unique_addresses,
        name=name,
    )


def apply_ftrl(
    table,
    addresses,
    grads,
    learning_rate,
    learning_rate_power,
    l1,
    l2,
    l2_shrinkage,
    initial_accumulator_value,
    unique_addresses=False,
    name=None,
):
    return load_ops().rec_sdk_apply_ftrl(
        table,
        addresses,
        grads,
        learning_rate,
        learning_rate_power,
        l1,
        l2,
        l2_shrinkage,
        initial_accumulator_value=initial_accumulator_value,
        unique_addresses=unique_addresses,
        name=name,
    )


def read_rows(table, addresses, slot_optimizer, slot_initial_values, name=None):
    """(values [n, dim], slots [len(slot_initial_values), n, dim]) of the rows at unique
    addresses, with the slots of `slot_optimizer` (attached on first use)."""
    return load_ops().rec_sdk_table_read_rows(
        table,
        addresses,
        slot_optimizer=slot_optimizer,
        slot_initial_values=list(slot_initial_values),
        name=name,
    )


def write_rows(table, addresses, values, slots, slot_optimizer, slot_initial_values, name=None):
    """Writes values [n, dim] and slots [k, n, dim] into the rows at unique addresses."""
    return load_ops().rec_sdk_table_write_rows(
        table,
        addresses,
        values,
        slots,
        slot_optimizer=slot_optimizer,
        slot_initial_values=list(slot_initial_values),
        name=name,
    )
