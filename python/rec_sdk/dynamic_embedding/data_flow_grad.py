"""TFRA's `data_flow_grad` module path: importing it makes the gradients of de.data_flow's
ops available. TFRA registers gradients of its own GPU data-flow kernels there; rec_sdk's
de.dynamic_partition and de.dynamic_stitch are TensorFlow's ops, whose gradients TensorFlow
registers itself, so the gradients here are TensorFlow's, by op type."""

from tensorflow.python.framework import ops as _ops

from rec_sdk.dynamic_embedding import data_flow  # noqa: F401  (the ops these are the gradients of)

_dynamic_partition_grads = _ops.gradient_registry.lookup("DynamicPartition")
_dynamic_stitch_grads = _ops.gradient_registry.lookup("DynamicStitch")
