"""Serving: exports of trained models for stock TensorFlow, and in-place updates.

- export_saved_model / export_keras_model (static.py): a frozen SavedModel, tables in
  StaticHashTables; a new model version is a new export.
- export_serving_model (mutable.py): tables in stock mutable hash tables filled from the
  SavedModel's assets, dense variables kept as variables, and an "apply_update" signature
  that applies the updates a Pusher (push.py) publishes (update_files.py), in place.
"""
from rec_sdk.serving.static import ServingGraph, export_keras_model, export_saved_model
from rec_sdk.serving.export import export_estimator_serving_model, export_serving_model
from rec_sdk.serving.follow import RestModel, ServedModel, follow, watch
from rec_sdk.serving.push import PushCallback, PushHook, Pusher, push_after_save
from rec_sdk.serving.update_files import UpdateError
from rec_sdk.serving.keras_export import export_keras_serving_model
