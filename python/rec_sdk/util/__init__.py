"""Process configuration and utilities (mirrors mx_rec.util)."""
from rec_sdk.util import communication  # noqa: F401  (mx_rec.util.communication.hccl_ops)
