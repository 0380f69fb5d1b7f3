"""Tables and lookups (mirrors mx_rec.core)."""
