"""de.keras: Keras layers on de.Variables, model saving and callbacks (TFRA's
dynamic_embedding.keras)."""

from rec_sdk.dynamic_embedding.keras import callbacks, file_system, layers, models  # noqa: F401

__all__ = ["callbacks", "layers", "models"]
