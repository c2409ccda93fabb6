"""Items without engagement placed by their content, next to the warm products whose content is like theirs.

The encoder's single-token path (content + type + an id code the model never trained on) keeps little of what content
knows about an item (docs/decisions.md, "New items from their content"). Instead an item with content but no engagement
(a cold-start product of catalog(t), or an item first seen after end(t)) is placed from window t's warm products that
have both a published row and content:
- "neighbours" (the default): the rows of its NEIGHBOURS nearest warm products by content cosine, averaged with
  softmax(cos / NEIGHBOUR_TEMP) weights and normalised: content's neighbourhood kept, in the metric space;
- "content_map": a ridge regression from content vectors to those rows, its image normalised (a global linear map:
  at 20,000 products it loses what separates fine interests, docs/decisions.md).
Items without content keep the single token. Nothing after end(t) is read: the rows and the content are window t's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from hir_model.content import to_matrix

NEW_ITEM_PATHS = ("neighbours", "content_map", "encoder")  # how an item without engagement is embedded
NEIGHBOURS, NEIGHBOUR_TEMP = 10, 0.05  # the k warm products nearest in content and their weights' temperature (not tuned)
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


def fit_neighbours(emb, content: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """(unit content (n, C), rows (n, W)) of the warm products that have both; None with fewer than NEIGHBOURS."""
    matrix, valid = to_matrix(content.column("embedding"))
    at = pd.Index(content.column("entity_id").to_pylist()).get_indexer(emb.entity_id)
    use = (emb.entity_type == "product") & ~emb.cold_start & (at >= 0)
    use[use] = valid[at[use]]
    if use.sum() < NEIGHBOURS:
        return None
    x = np.nan_to_num(matrix[at[use]]).astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), emb.vectors[use].astype(np.float32)


def place_by_neighbours(content: np.ndarray, fitted: tuple[np.ndarray, np.ndarray], block: int = 1024) -> np.ndarray:
    """(n, W) float32 unit rows: each content vector's NEIGHBOURS nearest warm products (cosine), their rows averaged
    with softmax(cos / NEIGHBOUR_TEMP) weights."""
    unit, rows = fitted
    c = np.nan_to_num(content).astype(np.float32)
    c /= np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    out = np.zeros((len(c), rows.shape[1]), np.float32)
    for lo in range(0, len(c), block):
        sims = c[lo:lo + block] @ unit.T  # (b, n)
        top = np.argpartition(-sims, NEIGHBOURS - 1, axis=1)[:, :NEIGHBOURS]  # (b, k)
        s = np.take_along_axis(sims, top, 1)
        w = np.exp((s - s.max(1, keepdims=True)) / NEIGHBOUR_TEMP)
        out[lo:lo + block] = np.einsum("bk,bkw->bw", w / w.sum(1, keepdims=True), rows[top])
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
