"""A stand-in for the `content_embeddings` asset: hashed TF-IDF of an entity's text, randomly projected.

Used when the content asset is not materialised (or to compare against it), so the content-only baseline
always has vectors. Deterministic (crc32 hashing, seeded projection); IDF comes from the rows marked as the
fitting corpus (the items known by end(t)), so the vocabulary statistics never look past the window.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class TextVectorConfig:
    buckets: int = 1 << 14  # hashed vocabulary size
    dim: int = 256  # width of the random projection (cosines are kept to about 1 / sqrt(dim))
    seed: int = 0


def text_vectors(texts: list[str | None], corpus: np.ndarray, config: TextVectorConfig = TextVectorConfig()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(n, dim) float32 vectors and (n,) has-text flags; `corpus` (n,) bool marks the rows that define the IDF."""
    buckets = [_buckets(text or "", config.buckets) for text in texts]
    rows = np.repeat(np.arange(len(texts)), [len(b) for b in buckets])
    cols = np.concatenate(buckets) if buckets else np.zeros(0, np.int64)
    n = len(texts)
    tf = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, config.buckets))
    tf.sum_duplicates()
    df = np.bincount(tf[np.flatnonzero(corpus)].indices, minlength=config.buckets)
    idf = np.log((1.0 + corpus.sum()) / (1.0 + df)) + 1.0
    tfidf = tf.multiply(idf[None, :]).tocsr()
    norm = np.sqrt(np.asarray(tfidf.multiply(tfidf).sum(1))).ravel()
    tfidf = sp.diags(np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)) @ tfidf
    proj = np.random.default_rng(config.seed).normal(0, 1 / np.sqrt(config.dim), (config.buckets, config.dim))
    return np.asarray(tfidf @ proj, np.float32), norm > 0


@lru_cache(maxsize=1 << 17)
def _buckets(text: str, n_buckets: int) -> np.ndarray:
    """Hashed token ids of a text (cached: a catalogue's texts repeat from window to window)."""
    return np.array([zlib.crc32(t.encode()) % n_buckets for t in TOKEN.findall(text.lower())], np.int64)


def entity_text(title: str | None, description: str | None, category: str | None) -> str | None:
    parts = [p for p in (title, description, category) if isinstance(p, str) and p]  # nulls may arrive as NaN
    return " ".join(parts) if parts else None


def stand_in_table(catalog: pa.Table, config: TextVectorConfig = TextVectorConfig()) -> pa.Table:
    """A `content_embeddings`-shaped table (entity_id, embedding; null for a row without text) of a catalogue's title,
    description and category; IDF over the rows with text (a window's catalogue: nothing after its end)."""
    texts = [entity_text(t, d, c) for t, d, c in zip(*(catalog.column(k).to_pylist() for k in ("title", "description", "category")))]
    mat, has = text_vectors(texts, np.array([t is not None for t in texts], bool), config)  # (M, C), (M,)
    flat = pa.array(np.where(has[:, None], mat, 0).astype(np.float32).reshape(-1))
    return pa.table({"entity_id": catalog.column("entity_id"),
                     "embedding": pa.FixedSizeListArray.from_arrays(flat, mat.shape[1], mask=pa.array(~has))})
