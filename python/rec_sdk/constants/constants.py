"""Public constants (mirrors mx_rec.constants.constants): graph-collection names, limits, the
environment variables rec_sdk reads, and the SDK's enums.

This module is the one place that holds these facts; `rec_sdk` re-exports the collection
names, and the rest of the package imports them from here. It imports nothing heavy, so
scripts may read it before TensorFlow is configured.
"""

import enum
import os

# ----------------------------------------------------------------------------------------
# Graph collections.
# Training lookups add the rows of their unique keys [n_unique, dim] here ...
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
# ... and, at the same positions, the row addresses of those keys [n_unique] (int64): pair
# tf.gradients(loss, <LOCAL_EMB>) with these in a *_by_addr optimizer's apply_gradients.
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
# The SDK's "sum same id gradients and apply" flow reads the lookups' deduplicated keys as
# row addresses from here (same positions as LOCAL_EMB). A rec_sdk lookup already maps each
# distinct key once, so its entry is the same address tensor as in ID_OFFSET.
ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
# Per-sample timestamp tensors (int seconds) of the batches, for eviction of tensor lookups.
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
# The ids tensor of every tensor lookup (in lookup order), as the SDK records its lookups.
ASCEND_SPARSE_LOOKUP_ENTRANCE = "ASCEND_SPARSE_LOOKUP_ENTRANCE"
# The SDK's name of the collection of its tables; rec_sdk keeps its table objects in
# TABLE_COLLECTION (get_dense_and_sparse_variable returns them).
ASCEND_GLOBAL_HASHTABLE_COLLECTION = "ASCEND_GLOBAL_HASHTABLE_COLLECTION"
# Initializers of the initializable iterators built by graph modification.
ASCEND_CUTTING_POINT_INITIALIZER = "ASCEND_CUTTING_POINT_INITIALIZER"
# Every rec_sdk table (SparseEmbedding object) of a graph.
TABLE_COLLECTION = "REC_SDK_TABLES"
# The graph-collection pairs one training lookup fills, in this order, at the same index.
LOOKUP_COLLECTIONS = (
    ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
    ASCEND_SPARSE_LOOKUP_ID_OFFSET,
    ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS,
)

# ----------------------------------------------------------------------------------------
# Limits.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
MAX_VOCABULARY_SIZE = 10**9
MAX_DEVICE_VOCABULARY_SIZE = 10**9
# Lookups of one table (the SDK's MULTI_LOOKUP_TIMES).
MULTI_LOOKUP_TIMES = 128
MIN_SIZE = 1
MAX_RANK_SIZE = 4095
MIN_RANK_SIZE = 1
MAX_DEVICE_ID = 15
# EvictHook's default evict_time_interval (seconds).
DEFAULT_EVICT_TIME_INTERVAL = 60 * 60 * 24
# The SDK's host-to-device data channels: 0 trains, 1 evaluates.
TRAIN_CHANNEL_ID = 0
EVAL_CHANNEL_ID = 1
HASHTABLE_COLLECTION_NAME_LENGTH = 30
EMPTY_STR = ""
GET_CONFIG_INSTANCE_ERR_MSG = (
    "rec_sdk is not initialised: call rec_sdk.util.initialize.init(...) first"
)
# Prefix of the identity ops the SDK puts on lookup ids not computed from a dataset.
ORPHAN_LOOKUP_KEY_PREFIX = "orphan"
ANCHOR_DATASET_NAME = "PrefetchDataset"
# Names of the SDK's op libraries; rec_sdk.util.ops.import_host_pipeline_ops accepts them
# and returns rec_sdk's host pipeline ops (rec_sdk has one op library).
LIBASC_OPS_SO = "libasc_ops.so"
LIBREC_EOS_OPS_SO = "librec_eos_ops.so"
LIBREC_TF_REC_V1_CPU_SO = "librec_tf_rec_v1_cpu.so"
# Checkpoint kinds of incremental checkpoints.
BASE_MODEL = "base"
DELTA_MODEL = "delta"
SAVE_FILE_MODE = 0o640
SAVE_DIR_MODE = 0o750
SAVE_FILE_FLAG = os.O_WRONLY | os.O_CREAT


# ----------------------------------------------------------------------------------------
# Enums.
class BaseEnum(enum.Enum):
    """An Enum whose members can be looked up by value: `Mode.mapping("train")`."""

    @classmethod
    def mapping(cls, key):
        """The member whose value is `key` (or `key.value` for a member); KeyError naming the
        allowed values otherwise (None included: an unset environment variable)."""
        value = key.value if isinstance(key, BaseEnum) else key
        for member in cls:
            if member.value == value:
                return member
        raise KeyError(
            "%s has no member with value %r (%s); choose one of %s"
            % (cls.__name__, key, type(key).__name__, [m.value for m in cls])
        )


class ApplyGradientsStrategy(BaseEnum):
    """How a training script pairs looked-up rows with addresses (environment variable
    APPLY_GRADIENTS_STRATEGY). rec_sdk sums the gradients of the same key before every update
    in both cases; the choice says which collection a script reads the addresses from
    (ASCEND_SPARSE_LOOKUP_ID_OFFSET or ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS; both are filled)."""

    DIRECT_APPLY = "direct_apply"
    SUM_SAME_ID_GRADIENTS_AND_APPLY = "sum_same_id_gradients_and_apply"


class All2allGradientsOp(BaseEnum):
    """create_table(all2all_gradients_op=...): how gradients of keys owned by another rank are
    combined (sum, or sum divided by the number of ranks)."""

    SUM_GRADIENTS = "sum_gradients"
    SUM_GRADIENTS_AND_DIV_BY_RANKSIZE = "sum_gradients_and_div_by_ranksize"


class MxRecMode(BaseEnum):
    """The SDK's table mode (create_table(mode=...)); ASC, host hash tables, is the only one."""

    ASC = "ASC"


class CacheModeEnum(BaseEnum):
    """Where a table's rows live in the SDK: HBM (device only), DDR (device + host memory),
    SSD (device + host + disk). On CPU, HBM and DDR are both main memory."""

    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


class OptimizerType(enum.Enum):
    LAZY_ADAM = "LazyAdam"
    SGD = "SGD"

    @staticmethod
    def get_optimizer_state_meta(mode):
        """Names of the optimizer's per-row state."""
        meta = {OptimizerType.LAZY_ADAM: ["momentum", "velocity"], OptimizerType.SGD: []}
        if mode not in meta:
            raise ValueError("mode must be one of %s, got %r" % (list(meta), mode))
        return meta[mode]


class EnvOption(enum.Enum):
    """Environment variables of the SDK. rec_sdk reads MXREC_LOG_LEVEL (rec_sdk.base.log) and
    APPLY_GRADIENTS_STRATEGY (validated by init); init refuses a job whose
    OMPI_COMM_WORLD_SIZE (mpirun) is above 1, as rec_sdk trains in one process. The others
    configure NPU devices and the SDK's C++ threads and have no effect on CPU."""

    MXREC_LOG_LEVEL = "MXREC_LOG_LEVEL"
    APPLY_GRADIENTS_STRATEGY = "APPLY_GRADIENTS_STRATEGY"
    SAVE_EASY = "SAVE_EASY"
    RANK_TABLE_FILE = "RANK_TABLE_FILE"
    ASCEND_VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"
    CM_CHIEF_DEVICE = "CM_CHIEF_DEVICE"
    CM_WORKER_SIZE = "CM_WORKER_SIZE"
    TF_DEVICE = "TF_DEVICE"
    ACL_TIMEOUT = "AclTimeout"
    HD_CHANNEL_SIZE = "HD_CHANNEL_SIZE"
    KEY_PROCESS_THREAD_NUM = "KEY_PROCESS_THREAD_NUM"
    MAX_UNIQUE_THREAD_NUM = "MAX_UNIQUE_THREAD_NUM"
    FAST_UNIQUE = "FAST_UNIQUE"
    UPDATEEMB_V2 = "UpdateEmb_V2"
    HOT_EMB_UPDATE_STEP = "HOT_EMB_UPDATE_STEP"
    GLOG_STDERRTHREAHOLD = "GLOG_stderrthreshold"
    USE_COMBINE_FAAE = "USE_COMBINE_FAAE"
    STAT_ON = "STAT_ON"
    RECORD_KEY_COUNT = "RECORD_KEY_COUNT"
    OMPI_COMM_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
    OMPI_COMM_WORLD_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"
    OMPI_COMM_WORLD_RANK = "OMPI_COMM_WORLD_RANK"


class RecPyLogLevel(enum.Enum):
    """The values MXREC_LOG_LEVEL accepts."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    ERROR = "ERROR"


class RecCPPLogLevel(enum.Enum):
    TRACE = "-2"
    DEBUG = "-1"
    INFO = "0"
    WARN = "1"
    ERROR = "2"


class TFDevice(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"
    GPU = "GPU"
    NONE = "NONE"


class Flag(enum.Enum):
    TRUE = "1"
    FALSE = "0"


class DataName(enum.Enum):
    """Names of the per-table data a checkpoint holds."""

    KEY = "key"
    EMBEDDING = "embedding"
    FEATURE_MAPPING = "feature_mapping"
    OFFSET = "offset"
    THRESHOLD = "threshold"


class DataAttr(enum.Enum):
    SHAPE = "shape"
    DATATYPE = "data_type"


def apply_gradients_strategy():
    """The ApplyGradientsStrategy of this process: APPLY_GRADIENTS_STRATEGY, default
    direct_apply; a ValueError names the variable and the allowed values."""
    name = EnvOption.APPLY_GRADIENTS_STRATEGY.value
    value = os.environ.get(name, ApplyGradientsStrategy.DIRECT_APPLY.value)
    try:
        return ApplyGradientsStrategy.mapping(value)
    except KeyError:
        raise ValueError(
            "environment variable %s=%r: allowed values are %s"
            % (name, value, [m.value for m in ApplyGradientsStrategy])
        ) from None
