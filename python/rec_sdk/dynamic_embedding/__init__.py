"""rec_sdk.dynamic_embedding: TensorFlow Recommenders-Addons' `dynamic_embedding` API on
rec_sdk tables. Port a TFRA script by changing

    import tensorflow_recommenders_addons.dynamic_embedding as de
to
    import rec_sdk.dynamic_embedding as de

Graph mode (tf.compat.v1.Session, tf.estimator) and TF2 (eager, tf.function, Keras). Each shard of a
de.Variable is one rec_sdk table holding the embedding, the optimizer's slots and the access
statistics of a key in one row, so a training step probes the hash index once per key for all of
them (TFRA: one hash table per slot, a lookup and an upsert each per step).

Where rec_sdk differs from TFRA 0.7.2 (docs/DYNAMIC_EMBEDDING.md has the full list):
* tf initializers run per key in C++ and are deterministic (seeded per key): a missing key
  reads the same values on every lookup, and training starts from exactly those values
  (TFRA draws new random values on every run). An array initializer gives each element its
  own value (TFRA broadcasts the first element).
* embedding_lookup deduplicates ids: the gradients of a key met twice in a batch are summed
  (TFRA's plain embedding_lookup keeps the last occurrence's update only).
* Updates are always in-place deltas on the current row (TFRA's bp_v2=True behaviour).
* Keys of any shape work with several shards (TFRA needs rank-1 keys there).
* String keys are stored under 63-bit fingerprints (a dictionary gives exports their
  strings back; see rec_sdk.dynamic_embedding.key_codec).
* Restrict policies rank keys by statistics kept in the rows (last training step / number of
  training updates); keys inserted by upsert count as seen when inserted.
* Checkpoints: tf.compat.v1.train.Saver (and Estimator) save the shards with their slots as
  rec_sdk table files next to the TensorFlow checkpoint, and restore them from there; the
  TensorFlow checkpoint also holds TFRA's `<table>-keys` / `-values` tensors of every shard
  (written only, for TFRA's warm-start recipes; enable_tfra_checkpoint_tensors(False) drops
  them). tf.train.Checkpoint (de.train.DECheckpoint) and SavedModel save them as tensors.
"""

from rec_sdk.dynamic_embedding import (  # noqa: F401 (TFRA's submodules)
    data_flow,
    data_flow_grad,
    keras,
    math,
    ragged_embedding_ops,
    shadow_ops,
    string_values,  # noqa: F401 (string-valued Variables)
    train,
)
from rec_sdk.dynamic_embedding.kv_creator import (
    CuckooHashTableConfig,
    CuckooHashTableCreator,
    FileSystemSaver,
    HkvHashTableConfig,
    HkvHashTableCreator,
    KVCreator,
    RedisTableConfig,
    RedisTableCreator,
    TieredTableCreator,
)
from rec_sdk.dynamic_embedding.lookup import (
    embedding_lookup,
    embedding_lookup_sparse,
    embedding_lookup_unique,
    safe_embedding_lookup_sparse,
)
from rec_sdk.dynamic_embedding.mode import (
    ModelMode,
    enable_inference_mode,
    enable_train_mode,
    get_model_mode,
)
from rec_sdk.dynamic_embedding.optimizer import DynamicEmbeddingOptimizer
from rec_sdk.dynamic_embedding.rowwise_adagrad import RowwiseAdagradOptimizer
from rec_sdk.dynamic_embedding.shadow_ops import TrainableWrapper
from rec_sdk.dynamic_embedding.slots_and_policies import (
    FrequencyRestrictPolicy,
    RestrictPolicy,
    SlotVariable,
    TimestampRestrictPolicy,
)
from rec_sdk.dynamic_embedding.variable import Variable, default_partition_fn, get_variable
from rec_sdk.dynamic_embedding.warm_start import GraphKeys, WarmStartHook, warm_start
from rec_sdk.ops.loader import load_ops_if_built
from rec_sdk.saver.patches import enable_tfra_checkpoint_tensors

# As importing TFRA does: a ps task that imports this module and starts a bare
# tf.distribute.Server serves the tables placed on it.
load_ops_if_built()

__all__ = [
    "Variable",
    "get_variable",
    "default_partition_fn",
    "embedding_lookup",
    "embedding_lookup_unique",
    "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse",
    "DynamicEmbeddingOptimizer",
    "RowwiseAdagradOptimizer",
    "RestrictPolicy",
    "TimestampRestrictPolicy",
    "FrequencyRestrictPolicy",
    "SlotVariable",
    "ModelMode",
    "enable_train_mode",
    "enable_inference_mode",
    "get_model_mode",
    "math",
    "data_flow",
    "KVCreator",
    "CuckooHashTableConfig",
    "CuckooHashTableCreator",
    "FileSystemSaver",
    "RedisTableConfig",
    "RedisTableCreator",
    "HkvHashTableConfig",
    "HkvHashTableCreator",
    "TieredTableCreator",
    "GraphKeys",
    "enable_tfra_checkpoint_tensors",
    "warm_start",
    "WarmStartHook",
    "keras",
    "shadow_ops",
    "train",
    "TrainableWrapper",
    "ragged_embedding_ops",
]
