"""Validation of a content-embeddings table, and how well its vectors recover planted interests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.content.vectors import to_matrix

VECTOR_COLUMNS = ("embedding", "text_embedding", "image_embedding")
NORM_TOLERANCE = 1e-3  # |norm - 1| allowed for a unit vector (float32 rounding)


@dataclass(frozen=True)
class EmbeddingReport:
    rows: int
    missing: int  # catalogue entities without a row
    missing_sample: list[str]
    unexpected: int  # rows whose entity is not in the catalogue
    with_vector: int  # rows with a fused vector
    no_content: int  # rows with neither text nor image (null vector by design)
    vector_without_content: int  # a fused vector on a row that has neither modality, or none on a row that has one
    nonfinite: int  # non-null vectors (any column) with a NaN or inf
    max_norm_error: float  # max |norm - 1| over non-null vectors (any column)
    dims: dict[str, int]  # vector column -> width
    versions: list[str]  # distinct encoder_version values

    @property
    def covered(self) -> bool:
        return self.missing == 0 and self.unexpected == 0 and self.vector_without_content == 0


def embedding_report(table: pa.Table, catalog_ids: pa.Array | pa.ChunkedArray) -> EmbeddingReport:
    ids = table.column("entity_id")
    missing = pc.filter(catalog_ids, pc.invert(pc.is_in(catalog_ids, value_set=ids.combine_chunks())))
    unexpected = pc.sum(pc.invert(pc.is_in(ids, value_set=pa.chunked_array([catalog_ids]).combine_chunks()))).as_py() or 0
    has_any = np.asarray(table.column("has_text").to_numpy(), bool) | np.asarray(table.column("has_image").to_numpy(), bool)
    nonfinite, norm_err, dims = 0, 0.0, {}
    valid_fused = None
    for name in VECTOR_COLUMNS:
        mat, valid = to_matrix(table.column(name))
        dims[name] = mat.shape[1]
        if name == "embedding":
            valid_fused = valid
        if valid.any() and mat.shape[1]:
            rows = mat[valid]
            finite = np.isfinite(rows).all(axis=1)
            nonfinite += int((~finite).sum())
            if finite.any():
                norm_err = max(norm_err, float(np.abs(np.linalg.norm(rows[finite], axis=1) - 1).max()))
    return EmbeddingReport(
        rows=table.num_rows, missing=len(missing), missing_sample=missing.slice(0, 5).to_pylist(), unexpected=int(unexpected),
        with_vector=int(valid_fused.sum()), no_content=int((~has_any).sum()),
        vector_without_content=int((valid_fused != has_any).sum()), nonfinite=nonfinite, max_norm_error=norm_err, dims=dims,
        versions=sorted(set(table.column("encoder_version").to_pylist())))


def neighbour_agreement(vectors: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """Mean share of each row's k nearest neighbours (cosine, itself excluded) that carry its label."""
    import faiss

    n = len(vectors)
    if n < 2:
        return float("nan")
    k = min(k, n - 1)
    x = np.ascontiguousarray(vectors, np.float32)  # (N, D) unit rows
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, nbr = index.search(x, k + 1)  # (N, k+1), usually itself first
    own = nbr == np.arange(n)[:, None]
    keep = np.where(own.any(1)[:, None], ~own, np.arange(k + 1)[None, :] < k)  # drop itself, else the farthest
    nbr = nbr[keep].reshape(n, k)
    return float((labels[nbr] == labels[:, None]).mean())


def chance_agreement(labels: np.ndarray) -> float:
    """The same share for random neighbours: P(two distinct rows share a label)."""
    n = len(labels)
    counts = np.unique(labels, return_counts=True)[1].astype(np.float64)
    return float((counts * (counts - 1)).sum() / max(n * (n - 1), 1))


def interest_agreement(table: pa.Table, truth: pa.Table, k: int = 10, label: str = "interest_l2",
                       entity_types: tuple[str, ...] = ("product",)) -> dict[str, float]:
    """k-NN label agreement of fused, text-only and image-only vectors, over the entities that have both
    modalities (so the three are compared on the same rows), plus chance and the row count."""
    rows = table.filter(pc.is_in(table.column("entity_type"), pa.array(entity_types)))
    both = pc.and_(rows.column("has_text"), rows.column("has_image"))
    rows = rows.filter(both) if pc.any(both).as_py() else rows.filter(pc.is_valid(rows.column("embedding")))
    lookup = dict(zip(truth.column("entity_id").to_pylist(), truth.column(label).to_pylist()))
    labels = np.array([lookup.get(e, -1) for e in rows.column("entity_id").to_pylist()])
    rows, labels = rows.filter(pa.array(labels >= 0)), labels[labels >= 0]
    out = {"n": float(len(labels)), "chance": chance_agreement(labels) if len(labels) else float("nan")}
    for name, column in (("fused", "embedding"), ("text", "text_embedding"), ("image", "image_embedding")):
        mat, valid = to_matrix(rows.column(column))
        out[name] = neighbour_agreement(mat[valid], labels[valid], k) if valid.sum() > 1 and mat.shape[1] else float("nan")
    return out
