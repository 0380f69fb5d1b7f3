"""TFRA's model modes: whether lookups built from now on train (the default) or only read.

In inference mode a lookup reads its rows and nothing else: it makes no trainable, so no
optimizer can update through it, and the graph it builds never writes to a table, so many
threads may run it at once. Set the mode before building the graph, as in TFRA.
"""


class ModelMode:
    """The process-wide model mode (TFRA's `de.ModelMode`)."""

    TRAIN = "train"
    INFERENCE = "inference"
    CURRENT_SETTING = TRAIN


def enable_train_mode():
    """Lookups built from now on are trainable (the default)."""
    ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode():
    """Lookups built from now on only read their rows (no trainable, no write)."""
    ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def get_model_mode():
    """ "train" or "inference"."""
    return ModelMode.CURRENT_SETTING


def training():
    """Whether lookups built now are trainable."""
    return ModelMode.CURRENT_SETTING != ModelMode.INFERENCE
