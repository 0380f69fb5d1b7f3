"""Serving: exports of trained models for stock TensorFlow, and in-place updates.

- export_saved_model / export_keras_model (static.py): a frozen SavedModel, tables in
  StaticHashTables; a new model version is a new export.
- export_serving_model / export_estimator_serving_model / export_keras_serving_model
  (export.py, keras_export.py): tables in stock mutable hash tables filled from the
  SavedModel's assets (mutable.py; or rec_sdk tables, plugin.py), dense variables kept as
  variables, and an "apply_update" signature that applies, in place (apply.py), the updates
  Pushers (push.py) publish (update_files.py); replica.py applies them to a served model,
  and `python -m rec_sdk.serving.follow` (follow.py) beside TensorFlow Serving.
"""

from rec_sdk.serving.export import export_estimator_serving_model, export_serving_model
from rec_sdk.serving.keras_export import export_keras_serving_model
from rec_sdk.serving.push import PushCallback, Pusher, PushHook, push_after_save
from rec_sdk.serving.replica import GrpcModel, RestModel, ServedModel, follow, watch
from rec_sdk.serving.static import ServingGraph, export_keras_model, export_saved_model
from rec_sdk.serving.update_files import UpdateError

__all__ = [
    "GrpcModel",
    "PushCallback",
    "PushHook",
    "Pusher",
    "RestModel",
    "ServedModel",
    "ServingGraph",
    "UpdateError",
    "export_estimator_serving_model",
    "export_keras_model",
    "export_keras_serving_model",
    "export_saved_model",
    "export_serving_model",
    "follow",
    "push_after_save",
    "watch",
]
