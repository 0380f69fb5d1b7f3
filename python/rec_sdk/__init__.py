"""rec_sdk: huge, growing sparse embedding tables for recommendation models on stock TensorFlow.

Module paths mirror the NPU Rec SDK's `mx_rec` so that porting a script is an import rename:
`rec_sdk.util.initialize`, `rec_sdk.core.embedding`, `rec_sdk.optimizers.*`.
"""

__version__ = "0.1.0"

# Graph collections filled by training lookups, as in the SDK's dynamic-expansion flow:
# the looked-up embeddings and the row addresses they came from.
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
# Graph collection holding every rec_sdk table of a graph.
TABLE_COLLECTION = "REC_SDK_TABLES"
# Graph collection of per-sample timestamp tensors (seconds) for eviction with tensor ids.
TIMESTAMP_COLLECTION = "REC_SDK_TIMESTAMPS"
