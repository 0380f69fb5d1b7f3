"""rec_sdk's logger (public as rec_sdk.util.log, mirroring mx_rec.util.log): `logger`.

Every rec_sdk module logs through it. Its level comes from the SDK's environment variable
MXREC_LOG_LEVEL: DEBUG, INFO (the default), WARNING or ERROR; any other value is an error at
import. Records go to stderr as "[rec_sdk][time] [LEVEL] message", and also propagate to the
root logger: when the root logger has handlers of its own (logging.basicConfig, pytest), they
print the record and rec_sdk's handler stays silent, so nothing is printed twice.
"""

import logging
import os

from rec_sdk.constants.constants import EnvOption, RecPyLogLevel

LOGGER_NAME = "rec_sdk"
LEVELS = tuple(level.value for level in RecPyLogLevel) + ("WARNING",)


def _level_from_env():
    name = EnvOption.MXREC_LOG_LEVEL.value
    value = os.environ.get(name, RecPyLogLevel.INFO.value)
    if value not in LEVELS:
        raise ValueError(
            "environment variable %s=%r: allowed values are %s" % (name, value, list(LEVELS))
        )
    return value


class _UnlessRootPrints(logging.Filter):
    def filter(self, record):
        return not logging.getLogger().handlers


def get_logger(log_level=None):
    """The rec_sdk logger, set to `log_level` (default: from MXREC_LOG_LEVEL)."""
    level = _level_from_env() if log_level is None else log_level
    if level not in LEVELS:
        raise ValueError("log_level must be one of %s, got %r" % (list(LEVELS), level))
    rec_logger = logging.getLogger(LOGGER_NAME)
    if not any(
        isinstance(h, logging.StreamHandler)
        and any(isinstance(f, _UnlessRootPrints) for f in h.filters)
        for h in rec_logger.handlers
    ):
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                fmt="[rec_sdk][%(asctime)s] [%(levelname)s] %(message)s",
                datefmt="%m/%d/%Y %H:%M:%S",
            )
        )
        handler.addFilter(_UnlessRootPrints())
        rec_logger.addHandler(handler)
    rec_logger.setLevel(level)
    return rec_logger


logger = get_logger()
