"""The faiss index over item embeddings, the BoM retriever (postings union, reranked by dot product) and its recall
against exact search. Everything is stored as plain files (Parquet, faiss.write_index): nothing is pickled.

Files under `bom_index/<window>/`: `tokens.parquet`, `postings.parquet`, `items.parquet` (row -> entity_id, entity_type;
row r is faiss id r), `items.faiss` and `codebook.parquet` (token, level, centroid: the query side's codebook).

Candidates. An entity's stored bag holds its top-k primitives per level (k = 3), which for a user is too few to cover
its exact top-100: a fine primitive's list holds ~3 x items / K_fine items, and a coarse one's is cut to its heaviest
5%, mostly far from the user. So a query's bag is widened like an IVF probe: its finest-level primitives, nearest
centroid first (the first k are its stored fine tokens), until the union of their postings holds `probe_factor` x k
items (the last list contributes its heaviest entries only, so a query scores exactly that many when the level has
them); coarser levels follow only if the finest is exhausted. `probe_factor = 0`: the stored tokens' postings alone.

The budget a window needs depends on how clustered its embeddings are (a trained synthetic window reaches recall@100
0.95 with 9% of the items; a MovieLens window whose embeddings average cosine 0.96 needs ~25%), so by default it is
tuned per window like an IVF's nprobe: the smallest factor whose mean recall@k reaches `target_recall` on calibration
users (disjoint from the users the recall check samples), at most `max_candidate_share` of the items. It is stored in
`probe.json` and read back by `Retriever.load`.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hir_model.content import to_matrix
from hir_model.embed import EntityEmbeddings
from hir_model.retrieval.tokens import POSTINGS_FILE, TOKENS_FILE, read_postings, token_name

ITEMS_FILE, FAISS_FILE, CODEBOOK_FILE, PROBE_FILE = "items", "items.faiss", "codebook", "probe.json"
DEFAULT_PROBE_FACTOR = 3.0  # for an index without probe.json
ITEM_TYPES = ("product", "advertiser")


@dataclass(frozen=True)
class IndexConfig:
    exact_max: int = 50_000  # items up to this many: IndexFlatIP (exact); above: HNSW (approximate)
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    max_posting_share: float = 0.05  # a token's posting list keeps at most this share of the items (its heaviest)
    probe_factor: float | None = None  # a top-k query scores this x k candidates (None: tuned per window, see above)
    target_recall: float = 0.95  # the tuning's target mean recall@k on the calibration users
    max_candidate_share: float = 0.5  # the tuning's ceiling: more than this share of the items is no index at all
    calibration_users: int = 200  # users the budget is tuned on (none of them among the recall check's)
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


def codebook_table(primitives: pa.Table) -> pa.Table:
    """interest_hierarchy's primitives (level, primitive, centroid) -> (token, level, centroid): the query codebook."""
    tokens = [token_name(lv, p) for lv, p in zip(primitives["level"].to_pylist(), primitives["primitive"].to_pylist())]
    return pa.table({"token": pa.array(tokens, pa.string()), "level": primitives["level"].cast(pa.int32()),
                     "centroid": primitives["centroid"]})


def write_index(folder: Path, emb: EntityEmbeddings, tokens: pa.Table, postings: pa.Table, config: IndexConfig = IndexConfig(),
                primitives: pa.Table | None = None) -> int:
    """Write the index files (`primitives`: interest_hierarchy's table, for probing; None: queries use their stored
    tokens only); returns the number of items indexed."""
    items = np.isin(emb.entity_type, ITEM_TYPES)
    pq.write_table(tokens, folder / f"{TOKENS_FILE}.parquet")
    pq.write_table(postings, folder / f"{POSTINGS_FILE}.parquet")
    pq.write_table(pa.table({"entity_id": pa.array(list(emb.entity_id[items]), pa.string()),
                             "entity_type": pa.array(list(emb.entity_type[items]), pa.string())}), folder / f"{ITEMS_FILE}.parquet")
    faiss.write_index(build_faiss(emb.vectors[items], config), str(folder / FAISS_FILE))
    if primitives is not None:
        pq.write_table(codebook_table(primitives), folder / f"{CODEBOOK_FILE}.parquet")
    return int(items.sum())


@dataclass(frozen=True)
class Codebook:
    """One level's primitives: the query side of probing."""

    tokens: list[str]  # [K] token names, `L<level>:<stable id>`
    centroids: np.ndarray  # float32 [K, W], unit rows


def read_codebooks(table: pa.Table) -> list[Codebook]:
    """Per level, finest first."""
    out = []
    for lv in sorted(set(table["level"].to_pylist()), reverse=True):
        rows = table.filter(pc.equal(table["level"], lv))
        centroids, _ = to_matrix(rows["centroid"])
        out.append(Codebook(rows["token"].to_pylist(), np.ascontiguousarray(centroids, np.float32)))
    return out


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
    """Queries by entity id: its BoM tokens (widened by probing, see the module docstring) -> union of their postings ->
    reranked by embedding dot product."""

    def __init__(self, index: faiss.Index, item_ids: np.ndarray, item_types: np.ndarray, tokens: pa.Table, postings: pa.Table,
                 emb: EntityEmbeddings, codebooks: list[Codebook] | None = None, probe_factor: float = DEFAULT_PROBE_FACTOR):
        self.index, self.item_ids, self.item_types = index, item_ids, item_types
        self.codebooks, self.probe_factor = codebooks or [], probe_factor
        self.item_vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d), np.float32)
        self.item_row = {e: i for i, e in enumerate(item_ids)}
        self.postings = read_postings(postings, self.item_row)
        self.emb, self.emb_row = emb, {e: i for i, e in enumerate(emb.entity_id)}
        ent, tok, w = (tokens[c].to_pylist() for c in ("entity_id", "token", "weight"))
        self.tokens: dict[str, list[tuple[str, float]]] = {}
        for e, t, x in zip(ent, tok, w):
            self.tokens.setdefault(e, []).append((t, x))

    @classmethod
    def load(cls, folder: Path, emb: EntityEmbeddings, probe_factor: float | None = None) -> Retriever:
        """The index in `folder`; `probe_factor` None: the tuned one in probe.json (DEFAULT_PROBE_FACTOR without it)."""
        folder = Path(folder)
        missing = [f for f in (f"{TOKENS_FILE}.parquet", f"{POSTINGS_FILE}.parquet", f"{ITEMS_FILE}.parquet", FAISS_FILE)
                   if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} has no BoM index ({', '.join(missing)} missing)")
        items = pq.read_table(folder / f"{ITEMS_FILE}.parquet")
        codebook, probe = folder / f"{CODEBOOK_FILE}.parquet", folder / PROBE_FILE
        if probe_factor is None:
            probe_factor = json.loads(probe.read_text())["probe_factor"] if probe.is_file() else DEFAULT_PROBE_FACTOR
        return cls(faiss.read_index(str(folder / FAISS_FILE)), np.asarray(items["entity_id"].to_pylist(), object),
                   np.asarray(items["entity_type"].to_pylist(), object), pq.read_table(folder / f"{TOKENS_FILE}.parquet"),
                   pq.read_table(folder / f"{POSTINGS_FILE}.parquet"), emb,
                   read_codebooks(pq.read_table(codebook)) if codebook.is_file() else None, probe_factor)

    def with_probe_factor(self, probe_factor: float) -> Retriever:
        """The same index with another candidate budget (0: the stored tokens alone)."""
        other = copy.copy(self)
        other.probe_factor = probe_factor
        return other

    def budget(self, k: int) -> int:
        """Candidates a top-k query gathers by probing (0: no probing)."""
        return math.ceil(self.probe_factor * k) if self.codebooks else 0

    def vector(self, entity: str) -> np.ndarray:
        if entity not in self.emb_row:
            raise KeyError(f"{entity!r} has no embedding in this window")
        return self.emb.vectors[self.emb_row[entity]]

    def candidates(self, entity: str, k: int = 20) -> np.ndarray:
        """int64 [c]: item rows in the union of the query's tokens' postings (see the module docstring), sorted."""
        budget = self.budget(k)
        if budget <= 0:
            lists = [self.postings[t][0] for t, _ in self.tokens.get(entity, ()) if t in self.postings]
            return np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int64)
        return np.sort(self.probe_order(entity, budget))

    def probe_order(self, entity: str, limit: int) -> np.ndarray:
        """int64 [<= limit]: distinct item rows in the order probing reaches them: the finest level's primitives by
        centroid similarity to the entity, each list heaviest first (coarser levels after the finest is exhausted)."""
        q = self.vector(entity)  # (W,)
        taken = np.zeros(len(self.item_ids), bool)
        out, count = [], 0
        for book in self.codebooks:  # finest first
            for p in np.argsort(-(book.centroids @ q), kind="stable"):  # (K,) nearest primitive first
                rows = self.postings.get(book.tokens[p], (None,))[0]  # (n,) heaviest first
                if rows is None:
                    continue
                new = rows[~taken[rows]][: limit - count]
                taken[new] = True
                out.append(new)
                count += len(new)
                if count >= limit:
                    return np.concatenate(out)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

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
        rows = self.candidates(entity, k + int(exclude_self))
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
        cands.append(len(retriever.candidates(q, k)))
    n = len(queries)
    return RecallReport(float(np.mean(found)) if found else 1.0, k, n, retriever.index.ntotal,
                        float(np.mean(cands)) if cands else 0.0, n / max(t1 - t0, 1e-9), n / max(t2 - t1, 1e-9))


def tune_probe_factor(retriever: Retriever, queries: list[str], k: int, target: float, max_candidates: int) -> float:
    """The smallest probe factor whose mean recall@k over `queries` reaches `target` (capped at max_candidates / k).

    One probe per query: recall with a budget of b candidates is the share of the exact top-k among the first b rows of
    its probe order (the rerank then keeps all of them), so the whole recall-vs-budget curve comes from one pass."""
    limit = min(max_candidates, retriever.index.ntotal)
    found = np.zeros(limit + 1)  # found[b]: recall mass first reached at budget b + 1
    for q in queries:
        _, truth = retriever.index.search(retriever.vector(q)[None].astype(np.float32), min(k, retriever.index.ntotal))
        truth = truth[0][truth[0] >= 0]
        position = np.full(retriever.index.ntotal, limit, np.int64)
        order = retriever.probe_order(q, limit)
        position[order] = np.arange(len(order))
        np.add.at(found, position[truth], 1.0 / max(len(truth), 1))
    curve = np.cumsum(found[:limit]) / max(len(queries), 1)  # (limit,) mean recall with a budget of b + 1
    reached = np.flatnonzero(curve >= target)
    budget = int(reached[0]) + 1 if len(reached) else limit
    return math.ceil(100 * budget / k) / 100


def calibrate(folder: Path, emb: EntityEmbeddings, exclude: list[str], config: IndexConfig = IndexConfig()) -> float:
    """Tune the window's probe factor on users not in `exclude` (or take config.probe_factor) and write probe.json."""
    retriever = Retriever.load(folder, emb)
    pool = set(exclude)
    users = [u for u in sample_users(emb, config.calibration_users + len(pool), config.seed + 1) if u not in pool]
    users = users[: config.calibration_users]
    factor = config.probe_factor
    if factor is None:
        cap = max(config.recall_k, math.ceil(config.max_candidate_share * retriever.index.ntotal))
        factor = tune_probe_factor(retriever, users, config.recall_k, config.target_recall, cap) if users and retriever.codebooks \
            else DEFAULT_PROBE_FACTOR
    (Path(folder) / PROBE_FILE).write_text(json.dumps({
        "probe_factor": factor, "tuned": config.probe_factor is None, "k": config.recall_k,
        "target_recall": config.target_recall, "calibration_users": len(users)}) + "\n")
    return factor


def sample_users(emb: EntityEmbeddings, n: int, seed: int = 0) -> list[str]:
    users = np.sort(emb.entity_id[emb.entity_type == "user"].astype(str))
    rng = np.random.default_rng(seed)
    return list(rng.choice(users, size=min(n, len(users)), replace=False)) if len(users) else []
