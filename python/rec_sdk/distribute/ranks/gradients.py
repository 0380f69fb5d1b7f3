"""The gradients of a batch of lookups sent back to the keys' owners, summed per key over
the ranks (owner_gradients, split_table_gradient)."""

import tensorflow as tf

from rec_sdk.distribute.ranks.batching import batch_lookups, lookup_of, pending_train_tokens
from rec_sdk.distribute.ranks.exchange import batch_gradients


def owner_gradients(pairs):
    """[(token, gradients [n, dim] of the rows its lookup returned)] -> [(row addresses in
    this rank's shard, the gradients summed over every rank's lookups of the same keys)] for
    the keys this rank owns, per lookup: each rank sends each owner the gradients of the keys
    it asked that owner for, those of a whole batch of lookups in one all-to-all. Batches the
    lookups first (batch_lookups) if they were not, with every other training lookup of the
    graph not batched yet: the optimizers of a step share one forward exchange (their
    gradients go one optimizer after the other)."""
    tokens = [token for token, _ in pairs]
    batch_lookups(tokens + pending_train_tokens(tokens))
    by_batch = {}
    for token, grads in pairs:
        lookup = lookup_of(token)
        entry = by_batch.setdefault(id(lookup.batch), (lookup.batch, {}))
        grads = tf.reshape(tf.cast(grads, tf.float32), [-1, lookup.table.dim])
        previous = entry[1].get(lookup.segment)
        entry[1][lookup.segment] = grads if previous is None else previous + grads
    out = []
    for batch, by_segment in by_batch.values():
        out.extend(batch_gradients(batch, by_segment))
    return out


def split_table_gradient(grad):
    """The IndexedSlices gradient of a table sharded over ranks (one lookup's, or several
    concatenated by tf.gradients) -> [(token, gradient rows)] per lookup; None when `grad`
    is not keyed by lookup tokens."""
    indices = grad.indices
    while indices.op.type == "Identity":
        indices = indices.op.inputs[0]
    if lookup_of(indices) is not None:
        return [(indices, grad.values)]
    if indices.op.type != "ConcatV2":
        return None
    tokens = list(indices.op.inputs[:-1])
    for i, token in enumerate(tokens):
        while token.op.type == "Identity":
            token = token.op.inputs[0]
        if lookup_of(token) is None:
            return None
        tokens[i] = token
    sizes = [tf.shape(token)[0] for token in tokens]
    return list(zip(tokens, tf.split(grad.values, sizes, axis=0)))
