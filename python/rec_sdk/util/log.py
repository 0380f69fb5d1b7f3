"""rec_sdk's logger under the SDK's module path (mx_rec.util.log): `from rec_sdk.util.log import
logger`. It is rec_sdk.base.log's."""

from rec_sdk.base.log import logger

__all__ = ["logger"]
