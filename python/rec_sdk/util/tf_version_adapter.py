"""The SDK's TensorFlow adapter (mirrors mx_rec.util.tf_version_adapter): `hccl_ops` and
`npu_ops`, which the SDK takes from the NPU bridge, with their CPU meaning.

* `hccl_ops.allreduce(tensor, reduction)`: the reduction of `tensor` over the training
  processes ("sum", "max", "min" or "prod"): over the ranks of a cluster,
  rec_sdk.distribute.all_reduce (TensorFlow's CollectiveReduceV2); in one process, the
  tensor itself.
* `npu_ops.dropout(x, keep_prob, ...)`: dropout keeping each element with probability
  keep_prob and scaling kept ones by 1 / keep_prob (tf.nn.dropout with rate 1 - keep_prob).
"""

import types

import tensorflow as tf

from rec_sdk.distribute import cluster
from rec_sdk.util.communication import hccl_ops as _ranks

_REDUCTIONS = ("sum", "max", "min", "prod")


def _allreduce(tensor, reduction, fusion=1, fusion_id=-1, group="hccl_world_group"):
    del fusion, fusion_id, group
    if reduction not in _REDUCTIONS:
        raise ValueError(
            "allreduce: reduction must be one of %s, got %r" % (list(_REDUCTIONS), reduction)
        )
    if _ranks.get_rank_size() == 1:
        return tf.identity(tensor)
    return cluster.all_reduce(tensor, reduction)


def _dropout(x, keep_prob, noise_shape=None, seed=None, name=None):
    return tf.nn.dropout(x, rate=1.0 - keep_prob, noise_shape=noise_shape, seed=seed, name=name)


hccl_ops = types.SimpleNamespace(allreduce=_allreduce)
npu_ops = types.SimpleNamespace(dropout=_dropout)
