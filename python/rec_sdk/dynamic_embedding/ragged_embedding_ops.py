"""TFRA's module path of the sparse lookups that take RaggedTensor ids: rec_sdk's sparse
lookups take SparseTensors and RaggedTensors alike (rec_sdk.dynamic_embedding.lookup), and
a safe lookup fills the empty rows of ragged ids [rows, (k)] in ragged form."""

from rec_sdk.dynamic_embedding.lookup import (
    embedding_lookup_sparse,
    fill_empty_ragged_rows,
    safe_embedding_lookup_sparse,
)

__all__ = ["embedding_lookup_sparse", "safe_embedding_lookup_sparse", "fill_empty_ragged_rows"]

# TFRA's name of the helper.
_fill_empty_rows = fill_empty_ragged_rows
