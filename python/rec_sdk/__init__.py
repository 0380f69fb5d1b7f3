"""rec_sdk: huge, growing sparse embedding tables for recommendation models on stock TensorFlow.

Module paths mirror the NPU Rec SDK's `mx_rec` so that porting a script is an import rename:
`rec_sdk.util.initialize`, `rec_sdk.core.embedding`, `rec_sdk.optimizers.*`,
`rec_sdk.constants.constants`.
"""

from rec_sdk.base.release import VERSION as __version__  # noqa: F401
from rec_sdk.constants.constants import (  # noqa: F401  (re-exported names)
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
    ASCEND_TIMESTAMP,
    TABLE_COLLECTION,
)
from rec_sdk.ops import loader as _loader

# An op library built for another TensorFlow (a wheel installed next to the wrong version)
# fails here, with what to do, not at the first op.
_loader.check_built_version()


def version():
    """The version of rec_sdk (the SDK's mx_rec.version())."""
    return __version__


# The SDK's process API (mx_rec.util: init, ...); importing it adds Dataset.eos_map, as
# importing mx_rec does.
from rec_sdk import util  # noqa: E402,F401  pylint: disable=wrong-import-position

# Checkpoints: TensorFlow's Saver saves and restores the tables of every process that uses
# rec_sdk (rec_sdk.saver.patches installs its hooks when imported).
from rec_sdk.saver import patches as _saver_patches  # noqa: E402,F401  pylint: disable=wrong-import-position

# The per-sample timestamp collection (int seconds) read by lookups with eviction: the SDK's
# ASCEND_TIMESTAMP.
TIMESTAMP_COLLECTION = ASCEND_TIMESTAMP
