"""Vector columns as NumPy: the light half of the content package (NumPy and PyArrow only), so that readers of
`content_embeddings` (training, hierarchy, retrieval, evaluation) do not import the text and image towers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

CONTENT_ASSET, CONTENT_FILE = "content_embeddings", "embeddings"  # the asset and its published table


def to_matrix(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A fixed_size_list<float32> column as ((N, D) float32 with NaN rows for nulls, (N,) bool valid)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    d = arr.type.list_size
    values = arr.values.slice(arr.offset * d, len(arr) * d).to_numpy(zero_copy_only=False)
    mat = np.array(values, np.float32).reshape(len(arr), d)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
    mat[~valid] = np.nan
    return mat, valid
