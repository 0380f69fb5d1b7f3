"""Tables and lookups (mirrors mx_rec.core): create_table, sparse_lookup, FeatureSpec and
the feature pipeline, eviction. The tables themselves are in rec_sdk.tables."""
