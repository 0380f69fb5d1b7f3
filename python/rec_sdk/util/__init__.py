"""Process configuration and utilities (mirrors mx_rec.util): init,
terminate_config_initializer, ConfigInitializer, hccl_ops, import_host_pipeline_ops and
get_dense_and_sparse_variable, as the SDK's package exports them."""
from rec_sdk.util import communication  # noqa: F401  (mx_rec.util.communication.hccl_ops)
from rec_sdk.util.communication import hccl_ops  # noqa: F401
from rec_sdk.util.initialize import (ConfigInitializer, init,  # noqa: F401
                                     terminate_config_initializer)
from rec_sdk.util.ops import import_host_pipeline_ops  # noqa: F401


def __getattr__(name):
    # Lazy: rec_sdk.util.variable imports the table code, which imports this package.
    if name == "get_dense_and_sparse_variable":
        from rec_sdk.util.variable import (  # pylint: disable=import-outside-toplevel
            get_dense_and_sparse_variable)
        return get_dense_and_sparse_variable
    raise AttributeError("module 'rec_sdk.util' has no attribute %r" % name)
