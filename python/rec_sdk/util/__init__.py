"""Process configuration and utilities (mirrors mx_rec.util): init,
terminate_config_initializer, ConfigInitializer, hccl_ops and import_host_pipeline_ops, as the
SDK's package exports them (get_dense_and_sparse_variable: rec_sdk.util.variable, which sits
above the table code that this package's modules are below)."""

from rec_sdk.util import communication  # noqa: F401  (mx_rec.util.communication.hccl_ops)
from rec_sdk.util.communication import hccl_ops  # noqa: F401
from rec_sdk.util.initialize import ConfigInitializer, init, terminate_config_initializer  # noqa: F401
from rec_sdk.util.ops import import_host_pipeline_ops  # noqa: F401
