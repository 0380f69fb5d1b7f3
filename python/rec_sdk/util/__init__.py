"""Framework configuration and helpers (mirrors mx_rec.util)."""
