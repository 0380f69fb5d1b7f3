"""Sparse optimizers for rec_sdk tables (mirrors mx_rec.optimizers).

Each module has `create_hash_optimizer(...)` (fixed-capacity tables, trained with
`apply_gradients(zip(tf.gradients(loss, tables), tables))`) and the `*_by_addr` modules
`create_hash_optimizer_by_address(...)` (dynamic expansion, trained with
`apply_gradients(zip(tf.gradients(loss, local_embs), addresses))`).
"""
