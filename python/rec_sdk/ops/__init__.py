"""Thin wrappers over rec_sdk's TensorFlow op library (loaded lazily by loader.py)."""
