"""Example data loaders and training scripts for rec_sdk."""
