"""rec_sdk's logger under the SDK's module path (mx_rec.util.log): `from rec_sdk.util.log import
logger` (and get_logger). It is rec_sdk.base.log's."""

from rec_sdk.base.log import LEVELS, LOGGER_NAME, get_logger, logger

__all__ = ["LEVELS", "LOGGER_NAME", "get_logger", "logger"]
