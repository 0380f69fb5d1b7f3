"""An optimizer's own update on a table's rows: the rows at some addresses and their slots
are read into resource variables, the optimizer's TensorFlow ops update those variables, and
the results are written back (TableReadRows / TableWriteRows). What trains tables with
optimizers that have no fused rec_sdk kernel: de.DynamicEmbeddingOptimizer's generic path
and the SDK's CustomizedOptimizer subclasses. Three ops, so unlike the fused kernels not
atomic against another thread training the same table at once."""

import tensorflow as tf

from rec_sdk.ops import optimizer_ops


def row_variable(dim, name, trainable=False):
    """A resource variable of rows [any, dim] (the rows of a step, or a slot of them): of
    unknown row count, so that no shape inference takes a step's rows for the initial 0
    rows. A local variable: the rows live in the table, which checkpoints them."""
    return tf.compat.v1.Variable(
        tf.zeros([0, dim]),
        trainable=trainable,
        use_resource=True,
        shape=tf.TensorShape([None, dim]),
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        name=name,
    )


def through_variables(table, addresses, owner, initial, rows, slots, update, loads=()):
    """The rows at unique addresses and their slots (of `owner`, starting at `initial`)
    loaded into the variables `rows` and `slots`, the optimizer's `update()` run on them,
    and the results written back. Returns the write op."""
    values, slot_values = optimizer_ops.read_rows(table.handle, addresses, owner, initial)
    loads = (
        list(loads)
        + [rows.assign(values, read_value=False)]
        + [var.assign(slot_values[i], read_value=False) for i, var in enumerate(slots)]
    )
    with tf.control_dependencies(loads):
        op = update()
    with tf.control_dependencies(_ops_of(op)):
        new_values = rows.read_value()
        new_slots = (
            tf.stack([var.read_value() for var in slots])
            if slots
            else tf.zeros([0, tf.shape(addresses)[0], table.dim])
        )
        return optimizer_ops.write_rows(
            table.handle, addresses, new_values, new_slots, owner, initial
        )


def _ops_of(result):
    """The ops an update returned: ops, tensors, or variables from an update's assign or
    scatter (tf.compat.v1.scatter_nd_add on a resource variable returns one, whose op is the
    update), in any nest."""
    found = []
    for item in tf.nest.flatten(result, expand_composites=False):
        if isinstance(item, (tf.Operation, tf.Tensor)):
            found.append(item)
        elif isinstance(getattr(item, "op", None), tf.Operation):
            found.append(item.op)
    return found
