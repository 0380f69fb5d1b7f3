"""The SDK-style scripts' data (as the SDK's examples generate theirs): deterministic batches
of Zipf-distributed user and item ids, labels that depend on them, and per-batch timestamps
that advance 10 seconds a batch."""

import numpy as np

BATCH, USER_FEATS, ITEM_FEATS = 32, 8, 4
USER_VOCAB, ITEM_VOCAB = 3000, 400


def make_data(n_batches, seed):
    rng = np.random.RandomState(seed)
    n = n_batches * BATCH
    users = (rng.zipf(1.2, size=(n, USER_FEATS)) % USER_VOCAB).astype(np.int64)
    items = (rng.zipf(1.3, size=(n, ITEM_FEATS)) % ITEM_VOCAB).astype(np.int64)
    return {
        "user_ids": users,
        "item_ids": items,
        "label_0": (users[:, 0] % 3 == 0).astype(np.float32),
        "label_1": (items[:, 0] % 2 == 0).astype(np.float32),
        "timestamp": (1000 + 10 * (np.arange(n) // BATCH)).astype(np.int64),
    }
