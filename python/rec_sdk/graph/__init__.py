"""Graph modification and the slicer hooks (mirrors mx_rec.graph)."""

from rec_sdk.graph.hooks import (  # noqa: F401  (mx_rec.graph.*)
    ACGPushOpsToDatasetHook,
    LookupSubgraphSlicerHook,
    OrphanLookupKeySlicerHook,
)
