"""Constants of the SDK's API (mirrors mx_rec.constants): see constants.py."""
