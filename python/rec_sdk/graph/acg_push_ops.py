"""The earlier SDK's module path of ACGPushOpsToDatasetHook (mirrors
mx_rec.graph.acg_push_ops); see rec_sdk.graph.hooks."""

from rec_sdk.graph.hooks import ACGPushOpsToDatasetHook  # noqa: F401
