"""Graph modification and the slicer hooks (mirrors mx_rec.graph)."""
from rec_sdk.graph.hooks import (ACGPushOpsToDatasetHook,  # noqa: F401  (mx_rec.graph.*)
                                 LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook)
