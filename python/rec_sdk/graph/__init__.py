"""Graph modification and the slicer hooks (mirrors mx_rec.graph)."""

_HOOKS = ("LookupSubgraphSlicerHook", "OrphanLookupKeySlicerHook", "ACGPushOpsToDatasetHook")


def __getattr__(name):
    # Lazy: the table code imports rec_sdk.graph.anchors, and the hooks import the table code.
    if name in _HOOKS:
        from rec_sdk.graph import hooks  # pylint: disable=import-outside-toplevel
        return getattr(hooks, name)
    raise AttributeError("module 'rec_sdk.graph' has no attribute %r" % name)
