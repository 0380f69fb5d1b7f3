"""de.keras: Keras layers on de.Variables (TFRA's dynamic_embedding.keras)."""
from rec_sdk.dynamic_embedding.keras import layers  # noqa: F401

__all__ = ["layers"]
