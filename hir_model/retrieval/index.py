"""The faiss index over item embeddings, the BoM retriever (postings union, reranked by dot product) and its recall
against exact search. Everything is stored as plain files (Parquet, faiss.write_index): nothing is pickled.

Files under `bom_index/<window>/`: `tokens.parquet`, `postings.parquet`, `items.parquet` (row -> entity_id, entity_type;
row r is faiss id r) and `items.faiss`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hir_model.embed import EntityEmbeddings
from hir_model.retrieval.tokens import POSTINGS_FILE, TOKENS_FILE, read_postings

ITEMS_FILE, FAISS_FILE = "items", "items.faiss"
ITEM_TYPES = ("product", "advertiser")


@dataclass(frozen=True)
class IndexConfig:
    exact_max: int = 50_000  # items up to this many: IndexFlatIP (exact); above: HNSW (approximate)
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    max_posting_share: float = 0.05  # a token's posting list keeps at most this share of the items (its heaviest)
    recall_k: int = 100
    recall_users: int = 200  # users sampled for the recall measurement
    seed: int = 0


def build_faiss(vectors: np.ndarray, config: IndexConfig = IndexConfig()) -> faiss.Index:
    vectors = np.ascontiguousarray(vectors, np.float32)  # (I, W)
    dim = vectors.shape[1]
    if len(vectors) <= config.exact_max:
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = config.hnsw_ef_search
    index.add(vectors)
    return index


def write_index(folder: Path, emb: EntityEmbeddings, tokens: pa.Table, postings: pa.Table, config: IndexConfig = IndexConfig()) -> int:
    """Write the four files; returns the number of items indexed."""
    items = np.isin(emb.entity_type, ITEM_TYPES)
    pq.write_table(tokens, folder / f"{TOKENS_FILE}.parquet")
    pq.write_table(postings, folder / f"{POSTINGS_FILE}.parquet")
    pq.write_table(pa.table({"entity_id": pa.array(list(emb.entity_id[items]), pa.string()),
                             "entity_type": pa.array(list(emb.entity_type[items]), pa.string())}), folder / f"{ITEMS_FILE}.parquet")
    faiss.write_index(build_faiss(emb.vectors[items], config), str(folder / FAISS_FILE))
    return int(items.sum())


@dataclass(frozen=True)
class Hit:
    entity_id: str
    entity_type: str
    score: float


@dataclass(frozen=True)
class RecallReport:
    recall: float  # mean |BoM top-k & exact top-k| / |exact top-k| over the sampled queries
    k: int
    queries: int
    items: int
    candidates_per_query: float  # items scored per BoM query (the union of its postings)
    bom_qps: float
    exact_qps: float


class Retriever:
    """Queries by entity id: its BoM tokens -> union of their postings -> reranked by embedding dot product."""

    def __init__(self, index: faiss.Index, item_ids: np.ndarray, item_types: np.ndarray, tokens: pa.Table, postings: pa.Table,
                 emb: EntityEmbeddings):
        self.index, self.item_ids, self.item_types = index, item_ids, item_types
        self.item_vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d), np.float32)
        self.item_row = {e: i for i, e in enumerate(item_ids)}
        self.postings = read_postings(postings, self.item_row)
        self.emb, self.emb_row = emb, {e: i for i, e in enumerate(emb.entity_id)}
        ent, tok, w = (tokens[c].to_pylist() for c in ("entity_id", "token", "weight"))
        self.tokens: dict[str, list[tuple[str, float]]] = {}
        for e, t, x in zip(ent, tok, w):
            self.tokens.setdefault(e, []).append((t, x))

    @classmethod
    def load(cls, folder: Path, emb: EntityEmbeddings) -> Retriever:
        folder = Path(folder)
        missing = [f for f in (f"{TOKENS_FILE}.parquet", f"{POSTINGS_FILE}.parquet", f"{ITEMS_FILE}.parquet", FAISS_FILE)
                   if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} has no BoM index ({', '.join(missing)} missing)")
        items = pq.read_table(folder / f"{ITEMS_FILE}.parquet")
        return cls(faiss.read_index(str(folder / FAISS_FILE)), np.asarray(items["entity_id"].to_pylist(), object),
                   np.asarray(items["entity_type"].to_pylist(), object), pq.read_table(folder / f"{TOKENS_FILE}.parquet"),
                   pq.read_table(folder / f"{POSTINGS_FILE}.parquet"), emb)

    def vector(self, entity: str) -> np.ndarray:
        if entity not in self.emb_row:
            raise KeyError(f"{entity!r} has no embedding in this window")
        return self.emb.vectors[self.emb_row[entity]]

    def candidates(self, entity: str) -> np.ndarray:
        """int64 [c]: item rows in the union of the entity's tokens' postings."""
        lists = [self.postings[t][0] for t, _ in self.tokens.get(entity, ()) if t in self.postings]
        return np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int64)

    def _top(self, rows: np.ndarray, scores: np.ndarray, k: int, exclude: str | None) -> list[Hit]:
        keep = self.item_ids[rows] != exclude if exclude is not None else np.ones(len(rows), bool)
        rows, scores = rows[keep], scores[keep]
        order = np.lexsort((rows, -scores))[:k]
        return [Hit(str(self.item_ids[rows[i]]), str(self.item_types[rows[i]]), float(scores[i])) for i in order]

    def retrieve(self, entity: str, k: int = 20, exact: bool = False, exclude_self: bool = False) -> list[Hit]:
        q = self.vector(entity)  # (W,)
        exclude = entity if exclude_self else None
        if exact:
            n = min(self.index.ntotal, k + int(exclude_self))
            scores, rows = self.index.search(q[None].astype(np.float32), n) if n else (np.zeros((1, 0)), np.zeros((1, 0), np.int64))
            ok = rows[0] >= 0
            return self._top(rows[0][ok].astype(np.int64), scores[0][ok], k, exclude)
        rows = self.candidates(entity)
        return self._top(rows, self.item_vectors[rows] @ q, k, exclude)

    def similar(self, entity: str, k: int = 20, exact: bool = False) -> list[Hit]:
        """Items like `entity` (itself excluded)."""
        return self.retrieve(entity, k, exact, exclude_self=True)


def recall_at_k(retriever: Retriever, queries: list[str], k: int = 100) -> RecallReport:
    """BoM top-k vs exact faiss top-k for each query entity."""
    found, cands = [], []
    t0 = time.perf_counter()
    bom = [retriever.retrieve(q, k) for q in queries]
    t1 = time.perf_counter()
    exact = [retriever.retrieve(q, k, exact=True) for q in queries]
    t2 = time.perf_counter()
    for q, b, e in zip(queries, bom, exact):
        truth = {h.entity_id for h in e}
        if truth:
            found.append(len(truth & {h.entity_id for h in b}) / len(truth))
        cands.append(len(retriever.candidates(q)))
    n = len(queries)
    return RecallReport(float(np.mean(found)) if found else 1.0, k, n, retriever.index.ntotal,
                        float(np.mean(cands)) if cands else 0.0, n / max(t1 - t0, 1e-9), n / max(t2 - t1, 1e-9))


def sample_users(emb: EntityEmbeddings, n: int, seed: int = 0) -> list[str]:
    users = np.sort(emb.entity_id[emb.entity_type == "user"].astype(str))
    rng = np.random.default_rng(seed)
    return list(rng.choice(users, size=min(n, len(users)), replace=False)) if len(users) else []
