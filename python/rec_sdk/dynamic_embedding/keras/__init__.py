"""de.keras: Keras layers on de.Variables and model saving (TFRA's dynamic_embedding.keras)."""
from rec_sdk.dynamic_embedding.keras import layers, models  # noqa: F401

__all__ = ["layers", "models"]
