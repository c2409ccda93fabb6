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

from collections.abc import Callable

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


def content_rows(content: pa.Table, ids) -> tuple[np.ndarray, np.ndarray]:
    """((n, C) float32 content vectors of `ids` from a content_embeddings table, zero rows where an id has no valid one;
    (n,) bool which have one)."""
    matrix, valid = to_matrix(content.column("embedding"))
    at = pd.Index(content.column("entity_id").to_pylist()).get_indexer(list(ids))
    has = at >= 0
    has[has] = valid[at[has]]
    out = np.zeros((len(at), matrix.shape[1]), np.float32)
    out[has] = np.nan_to_num(matrix[at[has]])
    return out, has


def warm_products(emb, content: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """((n, C) content, (n, W) rows) of the warm products with both: what every placement is fitted on. `emb`:
    EntityEmbeddings (entity_id, entity_type, vectors, cold_start)."""
    x, has = content_rows(content, emb.entity_id)
    use = (emb.entity_type == "product") & ~emb.cold_start & has
    return x[use], emb.vectors[use]


def fit_content_map(emb, content: pa.Table, ridge: float = RIDGE) -> np.ndarray | None:
    """(C, W) ridge regression from content vectors to published rows over the warm products that have both, the ridge
    a share of the content Gram matrix's mean diagonal. None with fewer such products than 10 or a tenth of the
    content's dimensions."""
    x, y = warm_products(emb, content)
    if len(x) < max(10, x.shape[1] // 10):
        return None
    x, y = x.astype(np.float64), y.astype(np.float64)  # (n, C), (n, W)
    gram = x.T @ x  # (C, C)
    gram[np.diag_indices_from(gram)] += ridge * max(float(np.trace(gram)) / len(gram), 1e-12)
    return np.linalg.solve(gram, x.T @ y).astype(np.float32)


def place(content: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """(n, W) float32 unit rows: content vectors (n, C) through the map."""
    mapped = np.nan_to_num(content).astype(np.float32) @ mapping
    return mapped / np.maximum(np.linalg.norm(mapped, axis=1, keepdims=True), 1e-12)


def fit_neighbours(emb, content: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """(unit content (n, C), rows (n, W)) of the warm products that have both; None with fewer than NEIGHBOURS."""
    x, y = warm_products(emb, content)
    if len(x) < NEIGHBOURS:
        return None
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), y.astype(np.float32)


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


def fit_placer(path: str, emb, content: pa.Table, ridge: float = RIDGE) -> Callable[[np.ndarray], np.ndarray] | None:
    """The `path`'s placement fitted on window t's warm products: content vectors (n, C) -> (n, W) unit rows; None for
    "encoder" or too few warm products with content (those items keep the single token)."""
    check_path(path, "new_items")
    if path == "neighbours":
        fitted = fit_neighbours(emb, content)
        return None if fitted is None else (lambda x: place_by_neighbours(x, fitted))
    if path == "content_map":
        mapping = fit_content_map(emb, content, ridge)
        return None if mapping is None else (lambda x: place(x, mapping))
    return None
