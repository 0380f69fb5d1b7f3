"""The FeatureSpec data pipeline (mirrors mx_rec.core.asc): key preprocessing in tf.data."""
