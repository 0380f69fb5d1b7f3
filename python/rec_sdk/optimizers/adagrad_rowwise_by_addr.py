"""Sparse row-wise Adagrad for dynamic-expansion tables, applied by row address."""

from rec_sdk.optimizers.adagrad_rowwise import create_hash_optimizer_by_address  # noqa: F401
