"""Items without engagement placed by their content: a ridge map from content vectors to the published rows.

The encoder's single-token path (content + type + an id code the model never trained on) keeps little of what content
knows about an item (docs/decisions.md, "New items from their content"). Instead, at end(t) a ridge regression from
content vectors to the window's published rows is fitted over the warm products that have both; an item with content
but no engagement (a cold-start product of catalog(t), or an item first seen after end(t)) takes its content's image,
normalised: the place in the metric space where the rows of products with such content are. Items without content keep
the single token. Nothing after end(t) is read: the rows and the content are window t's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from hir_model.content import to_matrix

NEW_ITEM_PATHS = ("encoder", "content_map")  # how an item without engagement is embedded
RIDGE = 0.1  # the map's ridge, a share of the content Gram matrix's mean diagonal (not tuned)


def check_path(path: str, owner: str) -> None:
    if path not in NEW_ITEM_PATHS:
        raise ValueError(f"{owner}.new_items must be one of {NEW_ITEM_PATHS}, got {path!r}")


def fit_content_map(emb, content: pa.Table, ridge: float = RIDGE) -> np.ndarray | None:
    """(C, W) ridge regression from content vectors to published rows over the warm products that have both, the ridge
    a share of the content Gram matrix's mean diagonal. `emb`: EntityEmbeddings (entity_id, entity_type, vectors,
    cold_start); `content`: entity_id, embedding. None with fewer such products than 10 or a tenth of the content's
    dimensions."""
    matrix, valid = to_matrix(content.column("embedding"))
    at = pd.Index(content.column("entity_id").to_pylist()).get_indexer(emb.entity_id)  # (N,) content row of each entity
    use = (emb.entity_type == "product") & ~emb.cold_start & (at >= 0)
    use[use] = valid[at[use]]
    if use.sum() < max(10, matrix.shape[1] // 10):
        return None
    x, y = np.nan_to_num(matrix[at[use]]).astype(np.float64), emb.vectors[use].astype(np.float64)  # (n, C), (n, W)
    gram = x.T @ x  # (C, C)
    gram[np.diag_indices_from(gram)] += ridge * max(float(np.trace(gram)) / len(gram), 1e-12)
    return np.linalg.solve(gram, x.T @ y).astype(np.float32)


def place(content: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """(n, W) float32 unit rows: content vectors (n, C) through the map."""
    mapped = np.nan_to_num(content).astype(np.float32) @ mapping
    return mapped / np.maximum(np.linalg.norm(mapped, axis=1, keepdims=True), 1e-12)
