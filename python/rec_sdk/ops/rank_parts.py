"""The exchange's routing and packing ops over ranks (RecSdk>RankRouteKeys,
RecSdk>RankFillParts; tf_ops/core/rank_parts.h), used by rec_sdk.distribute.ranks.exchange."""

import tensorflow as tf

from rec_sdk.ops.loader import load_ops


def route_keys(keys, dest_of_owner, parts, name=None):
    """Each of the int64 `keys` [n]'s part in an exchange (the part of its owner, abs(key %
    R), in dest_of_owner [R] int32) and slot there (a stable sort by part): -> (dest [n],
    within [n], per_dest [parts]) int32. One pass."""
    return tuple(
        load_ops().rec_sdk_rank_route_keys(keys, dest_of_owner, parts=int(parts), name=name)
    )


def fill_parts(values, dest, within, cap, parts, head=None, take=None, name=None):
    """[parts, H + cap, width] of values' dtype: head ([parts, H, width], default none) then,
    at row H + within[i] of part dest[i], values[take[i]] (values[i] without take) for each
    entry whose slot fits in cap; zeros elsewhere. One pass."""
    if head is None:
        head = tf.zeros(tf.stack([parts, 0, tf.shape(values)[1]]), values.dtype)
    if take is None:
        take = tf.zeros([0], tf.int32)
    return load_ops().rec_sdk_rank_fill_parts(
        values, take, dest, within, head, cap, parts=int(parts), name=name
    )
