"""Process topology (mirrors mx_rec.util.communication)."""

from rec_sdk.util.communication import hccl_ops  # noqa: F401  (mx_rec.util.communication.hccl_ops)
