"""The faiss index over the ranking head's items, the BoM retriever (probing the inverted index with a query vector) and
item-to-item similarity. Everything is stored as plain files (Parquet, faiss.write_index): nothing is pickled.

Files under `bom_index/<window>/`: `tokens.parquet`, `postings.parquet`, `items.parquet` (row -> entity_id, entity_type;
row r is faiss id r and the ranking head's item row r), `items.faiss`, `codebook.parquet` (token, level, centroid: the
query side's codebook) and `probe.json` (the tuned candidate budget, hir_model.rank.bom_index).

Probing. An entity's stored bag holds its top-k primitives per level (k = 3), too few to cover a user's exact top-100:
a fine primitive's list holds ~3 x items / K_fine items, and a coarse one's is cut to its heaviest 5%. So a query is
widened like an IVF probe over the finest level: each posting gets the priority cos(query, its primitive's centroid) +
weight_prior x log(its soft-assignment weight), and items come best priority first (weight_prior 0: nearest primitive
first, each list heaviest first). Coarser levels follow only if the finest is exhausted. With a `margin`, a query takes
only the items whose priority is within it of its best one (at least `floor`): IVF's adaptive nprobe. The served path
(hir_model.rank.recommender) decides what to probe with and how many candidates to take.

Large catalogues. The finest level has as many primitives as the hierarchy was trained with (128 on MovieLens, 36 on
the synthetic presets), whatever the catalogue's size, so its lists grow with the items: at 215k items one list holds
~18k items, cut to its heaviest 5% (10,750), and a budget of 1,600 reads a sixth of the nearest list in weight order,
not by closeness to the query (served recall@100 0.76 at the synthetic `large` preset). Above `exact_max` items the
faiss index is therefore an IndexIVFFlat (nlist = ivf_lists_per_sqrt x sqrt(items), spherical k-means on the unit item
vectors) and a query vector probes it instead: its top-`limit` items by dot product over the nearest lists holding
about ivf_scan x limit items (nprobe grows with the budget, not with the catalogue). Its priority is the dot product
itself. Up to `exact_max`, an IndexFlatIP, and probing reads the BoM postings as above.
"""

from __future__ import annotations

import copy
import json
import math
import threading
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

BOM_ASSET = "bom_index"
ITEMS_FILE, FAISS_FILE, CODEBOOK_FILE, PROBE_FILE = "items", "items.faiss", "codebook", "probe.json"
DEFAULT_PROBE_FACTOR = 3.0  # for an index without probe.json


@dataclass(frozen=True)
class IndexConfig:
    exact_max: int = 50_000  # items up to this many: IndexFlatIP (exact), probing reads the BoM postings; above:
    # IndexIVFFlat (approximate), probing reads its nearest lists (module docstring)
    ivf_lists_per_sqrt: float = 1.0  # IVF lists: this x sqrt(items) (faiss' nlist ~ C sqrt(N); 464 at 215k items)
    ivf_scan: float = 8.0  # a probe for n items reads the nearest lists holding about this x n items (8: the top 1,600
    # by dot product at ~0.999 recall on the synthetic medium preset's items; 4: ~0.985)
    ivf_train_per_list: int = 64  # k-means trains on at most this many items per list (faiss' max_points_per_centroid)
    ivf_iterations: int = 10  # k-means iterations (faiss' default for IVF)
    max_posting_share: float = 0.05  # a token's posting list keeps at most this share of the items (its heaviest)
    weight_prior: float = 0.05  # probing: a posting's priority is cos(query, centroid) + this x log(weight) (0: list by list)
    probe_factor: float | None = None  # a top-k query scores this x k candidates (None: tuned per window, see above)
    target_recall: float = 0.95  # the tuning's target mean recall@k (served vs the head's exact top-k) on calibration users
    max_candidate_share: float = 0.5  # the tuning's ceiling on the mean share of the items a query scores (a top-100 is
    # 7.5% of MovieLens' 1,330 items by the demo's eighth window: a tenth cannot hold it at 0.95, see docs/history.md)
    calibration_users: int = 300  # users the budget is tuned on (none of them among the recall check's)
    recall_k: int = 100
    recall_users: int = 200  # users sampled for the recall measurement
    seed: int = 0


def build_faiss(vectors: np.ndarray, config: IndexConfig = IndexConfig()) -> faiss.Index:
    """IndexFlatIP up to config.exact_max items, IndexIVFFlat above (with its direct map: rows reconstruct)."""
    vectors = np.ascontiguousarray(vectors, np.float32)  # (I, W)
    dim = vectors.shape[1]
    if len(vectors) <= config.exact_max:
        index = faiss.IndexFlatIP(dim)
        index.add(vectors)
        return index
    nlist = max(1, min(len(vectors), round(config.ivf_lists_per_sqrt * math.sqrt(len(vectors)))))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.spherical, index.cp.niter = True, config.ivf_iterations
    index.cp.max_points_per_centroid, index.cp.seed = config.ivf_train_per_list, config.seed
    index.train(vectors)
    index.add(vectors)
    index.make_direct_map()
    return index


def codebook_table(primitives: pa.Table) -> pa.Table:
    """interest_hierarchy's primitives (level, primitive, centroid) -> (token, level, centroid): the query codebook."""
    tokens = [token_name(lv, p) for lv, p in zip(primitives["level"].to_pylist(), primitives["primitive"].to_pylist())]
    return pa.table({"token": pa.array(tokens, pa.string()), "level": primitives["level"].cast(pa.int32()),
                     "centroid": primitives["centroid"]})


def write_index(folder: Path, item_ids: np.ndarray, item_types: np.ndarray, item_vectors: np.ndarray, tokens: pa.Table,
                postings: pa.Table, config: IndexConfig = IndexConfig(), primitives: pa.Table | None = None) -> int:
    """Write the index files over the items (row r: faiss id r; the ranking head's items in its order), `primitives`:
    interest_hierarchy's table, for probing (None: queries use their stored tokens only); returns the items indexed."""
    pq.write_table(tokens, folder / f"{TOKENS_FILE}.parquet")
    pq.write_table(postings, folder / f"{POSTINGS_FILE}.parquet")
    pq.write_table(pa.table({"entity_id": pa.array(list(item_ids), pa.string()),
                             "entity_type": pa.array(list(item_types), pa.string())}), folder / f"{ITEMS_FILE}.parquet")
    faiss.write_index(build_faiss(item_vectors, config), str(folder / FAISS_FILE))
    if primitives is not None:
        pq.write_table(codebook_table(primitives), folder / f"{CODEBOOK_FILE}.parquet")
    return len(item_ids)


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
class Probing:
    """How a query widens its stored tokens (module docstring); probe.json holds the tuned values."""

    factor: float = DEFAULT_PROBE_FACTOR  # a top-k query gathers ceil(factor x k) candidates by probing (0: none)
    weight_prior: float = 0.0  # a posting's priority: cos(query, its centroid) + this x log(its weight)
    margin: float | None = None  # only items within this of the query's best priority (None: the whole budget)
    ivf_scan: float = IndexConfig.ivf_scan  # an IVF index: a probe for n items reads lists holding about this x n


@dataclass(frozen=True)
class Hit:
    entity_id: str
    entity_type: str
    score: float


class Retriever:
    """Queries by entity id: its BoM tokens (widened by probing, see the module docstring) -> union of their postings ->
    reranked by embedding dot product."""

    def __init__(self, index: faiss.Index, item_ids: np.ndarray, item_types: np.ndarray, tokens: pa.Table, postings: pa.Table,
                 emb: EntityEmbeddings, codebooks: list[Codebook] | None = None, probing: Probing = Probing()):
        self.index, self.item_ids, self.item_types, self.codebooks = index, item_ids, item_types, codebooks or []
        self.size = len(item_ids)  # items this retriever serves: faiss ids [0, size) (the index may hold later ones)
        self._index_lock = threading.Lock()  # shared by `extended` copies: faiss adds and searches never overlap
        self.extra_vectors: dict[str, np.ndarray] = {}  # vectors of items without a published row (increments)
        self.probe_factor, self.weight_prior = probing.factor, probing.weight_prior
        self.probe_margin = probing.margin  # None: every query takes its whole budget
        self.ivf, self.ivf_scan = faiss.try_extract_index_ivf(index), probing.ivf_scan  # ivf None: probe the postings
        self.item_vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d), np.float32)
        self.item_row = {e: i for i, e in enumerate(item_ids)}
        self.postings = read_postings(postings, self.item_row)
        self.emb, self.emb_row = emb, {e: i for i, e in enumerate(emb.entity_id)}
        ent, tok, w = (tokens[c].to_pylist() for c in ("entity_id", "token", "weight"))
        self.tokens: dict[str, list[tuple[str, float]]] = {}
        for e, t, x in zip(ent, tok, w):
            self.tokens.setdefault(e, []).append((t, x))

    @classmethod
    def load(cls, folder: Path, emb: EntityEmbeddings, probe_factor: float | None = None,
             weight_prior: float | None = None) -> Retriever:
        """The index in `folder` with probe.json's settings (without it: DEFAULT_PROBE_FACTOR, weight prior 0, fixed
        budgets). An explicit `probe_factor` gives fixed budgets of that factor; `weight_prior` overrides the stored one."""
        folder = Path(folder)
        missing = [f for f in (f"{TOKENS_FILE}.parquet", f"{POSTINGS_FILE}.parquet", f"{ITEMS_FILE}.parquet", FAISS_FILE)
                   if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} has no BoM index ({', '.join(missing)} missing)")
        items = pq.read_table(folder / f"{ITEMS_FILE}.parquet")
        codebook, probe = folder / f"{CODEBOOK_FILE}.parquet", folder / PROBE_FILE
        stored = json.loads(probe.read_text()) if probe.is_file() else {}
        margin = stored.get("probe_margin") if probe_factor is None else None  # an explicit factor: fixed budgets
        probe_factor = stored.get("probe_factor", DEFAULT_PROBE_FACTOR) if probe_factor is None else probe_factor
        weight_prior = stored.get("weight_prior", 0.0) if weight_prior is None else weight_prior
        return cls(faiss.read_index(str(folder / FAISS_FILE)), np.asarray(items["entity_id"].to_pylist(), object),
                   np.asarray(items["entity_type"].to_pylist(), object), pq.read_table(folder / f"{TOKENS_FILE}.parquet"),
                   pq.read_table(folder / f"{POSTINGS_FILE}.parquet"), emb,
                   read_codebooks(pq.read_table(codebook)) if codebook.is_file() else None,
                   Probing(probe_factor, weight_prior, margin, stored.get("ivf_scan", IndexConfig.ivf_scan)))

    def with_probe_factor(self, probe_factor: float) -> Retriever:
        """The same index with a fixed budget of probe_factor x k for every query (0: the stored tokens alone)."""
        other = copy.copy(self)
        other.probe_factor, other.probe_margin = probe_factor, None
        return other

    def with_probe_margin(self, margin: float, probe_factor: float) -> Retriever:
        """The same index with adaptive budgets: items within `margin` of the query's best priority, k to factor x k."""
        other = copy.copy(self)
        other.probe_factor, other.probe_margin = probe_factor, margin
        return other

    def budget(self, k: int) -> int:
        """Candidates a top-k query gathers by probing (0: no probing)."""
        return math.ceil(self.probe_factor * k) if self.codebooks else 0

    def vector(self, entity: str) -> np.ndarray:
        if entity in self.extra_vectors:
            return self.extra_vectors[entity]
        if entity not in self.emb_row:
            raise KeyError(f"{entity!r} has no embedding in this window")
        return self.emb.vectors[self.emb_row[entity]]

    def extended(self, ids: np.ndarray, types: np.ndarray, vectors: np.ndarray, tokens: pa.Table) -> Retriever:
        """A retriever over these items plus `ids` (rows size .. size + m), the faiss index extended in place (no
        retraining, no rebuild: the new vectors are added to it) and each new item put into its tokens' posting lists by
        weight. This retriever keeps serving exactly its own items: its searches stay within faiss ids [0, size) and its
        posting lists are not touched (the copy replaces the lists it extends)."""
        vectors = np.ascontiguousarray(vectors, np.float32)
        other = copy.copy(self)
        with self._index_lock:
            if self.index.ntotal != self.size:  # another extension of this retriever went first: branch on a copy of
                other.index = faiss.clone_index(self.index)  # its own items (an IVF keeps its trained lists' centroids)
                other.index.reset()
                other.index.add(np.ascontiguousarray(self.item_vectors, np.float32))
                other._index_lock = threading.Lock()
                other.ivf = faiss.try_extract_index_ivf(other.index)
            if len(vectors):
                other.index.add(vectors)
        other.item_ids = np.concatenate([self.item_ids, np.asarray(ids, object)])
        other.item_types = np.concatenate([self.item_types, np.asarray(types, object)])
        other.size = len(other.item_ids)
        other.item_vectors = np.concatenate([self.item_vectors, vectors]) if len(vectors) else self.item_vectors
        other.item_row = dict(self.item_row)
        other.item_row.update({e: self.size + i for i, e in enumerate(ids)})
        other.extra_vectors = {**self.extra_vectors, **{e: vectors[i] for i, e in enumerate(ids)}}
        other.tokens, other.postings = dict(self.tokens), dict(self.postings)
        ent, tok, w = (tokens[c].to_pylist() for c in ("entity_id", "token", "weight"))
        added: dict[str, list[tuple[int, float]]] = {}
        for e, t, x in zip(ent, tok, w):
            if e in other.item_row and other.item_row[e] >= self.size:
                other.tokens.setdefault(e, []).append((t, x))
                added.setdefault(t, []).append((other.item_row[e], x))
        for t, pairs in added.items():  # each extended list re-sorted by weight (descending), ties by row
            rows, weights = self.postings.get(t, (np.zeros(0, np.int64), np.zeros(0, np.float32)))
            rows = np.concatenate([rows, np.array([r for r, _ in pairs], np.int64)])
            weights = np.concatenate([weights, np.array([x for _, x in pairs], np.float32)])
            order = np.lexsort((rows, -weights))
            other.postings[t] = (rows[order], weights[order])
        return other

    def _search(self, q: np.ndarray, n: int, nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """faiss search of one or more query rows within this retriever's items (ids < size; IVF: `nprobe` lists)."""
        q = np.ascontiguousarray(np.atleast_2d(q), np.float32)
        with self._index_lock:
            sel = faiss.IDSelectorRange(0, self.size) if self.index.ntotal > self.size else None
            if self.ivf is not None:
                params = faiss.SearchParametersIVF(nprobe=nprobe or self.ivf.nprobe, sel=sel) if sel is not None else \
                    faiss.SearchParametersIVF(nprobe=nprobe or self.ivf.nprobe)
            else:
                params = faiss.SearchParameters(sel=sel) if sel is not None else None
            return self.index.search(q, n, params=params)

    def candidates(self, entity: str, k: int = 20) -> np.ndarray:
        """int64 [c]: item rows in the union of the query's tokens' postings (see the module docstring), sorted."""
        budget = self.budget(k)
        if budget <= 0:
            lists = [self.postings[t][0] for t, _ in self.tokens.get(entity, ()) if t in self.postings]
            return np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int64)
        return np.sort(self.probe_order(entity, budget, self.probe_margin, floor=k))

    def probe_order(self, entity: str, limit: int, margin: float | None = None, floor: int = 0) -> np.ndarray:
        """int64 [<= limit]: distinct item rows in the order probing reaches them (see the module docstring); with a
        `margin`, only the finest level's items within it of the best priority, but at least `floor` rows."""
        return self.probe_ranked(entity, limit, margin, floor)[0]

    def probe_ranked(self, entity: str, limit: int, margin: float | None = None, floor: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64 [n], priorities float64 [n], descending) of probe_order; rows reached through a coarser level
        (the finest exhausted) have priority -inf."""
        return self.probe_vector(self.vector(entity), limit, margin, floor)

    def probe_vector(self, q: np.ndarray, limit: int, margin: float | None = None, floor: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """probe_ranked for a query vector q (W,) (e.g. the ranking head's query for a user)."""
        if not self.codebooks:
            return np.zeros(0, np.int64), np.zeros(0)
        if self.ivf is not None:
            return self._ivf_probe(q, limit, margin, floor)
        rows, prio = self._merged_probe(self.codebooks[0], self.codebooks[0].centroids @ q, limit, margin, floor)
        want = limit if margin is None else min(floor, limit)  # adaptive: coarser levels only to reach the floor
        if len(rows) >= want or len(self.codebooks) == 1:
            return rows, prio
        taken = np.zeros(len(self.item_ids), bool)
        taken[rows] = True
        out, count = [rows], len(rows)
        for book in self.codebooks[1:]:  # the finest exhausted: nearest primitive first, each list heaviest first
            for p in np.argsort(-(book.centroids @ q), kind="stable"):
                if count >= want:
                    break
                got = self.postings.get(book.tokens[p], (None,))[0]  # (n,) heaviest first
                if got is None:
                    continue
                new = got[~taken[got]][: want - count]
                taken[new] = True
                out.append(new)
                count += len(new)
        rows = np.concatenate(out)
        return rows, np.concatenate([prio, np.full(len(rows) - len(prio), -np.inf)])

    def _merged_probe(self, book: Codebook, sims: np.ndarray, limit: int, margin: float | None,
                      floor: int) -> tuple[np.ndarray, np.ndarray]:
        """The finest level's part of probe_ranked: the best `limit` items by priority (ties keep reading order:
        nearest list first, each heaviest first), cut to those within `margin` of the best but no fewer than `floor`.
        Lists are read nearest first, and no further once no unread one can change the answer: an entry's priority
        is at most its list's centroid similarity (weights are <= 1)."""
        best = np.full(len(self.item_ids), -np.inf)
        seen, total, top = [], 0, -np.inf
        kth_limit = kth_floor = -np.inf  # the limit-th (floor-th) best priority read so far
        floor = min(floor, limit)
        for p in np.argsort(-sims, kind="stable"):  # nearest primitive first
            if total >= limit and sims[p] <= kth_limit:
                break
            if margin is not None and total >= floor and (floor == 0 or sims[p] <= kth_floor) and sims[p] < top - margin:
                break
            rows, weights = self.postings.get(book.tokens[p], (None, None))
            if rows is None:
                continue
            prio = sims[p] + self.weight_prior * np.log(np.maximum(weights, 1e-6))  # (n,)
            fresh = rows[np.isneginf(best[rows])]
            best[rows] = np.maximum(best[rows], prio)
            top = max(top, float(prio.max(initial=-np.inf)))
            seen.append(fresh)
            total += len(fresh)
            if total >= floor > 0 or total >= limit:
                values = best[np.concatenate(seen)]
                if total >= limit:
                    kth_limit = np.partition(values, total - limit)[total - limit]
                if total >= floor > 0:
                    kth_floor = np.partition(values, total - floor)[total - floor]
        if not seen:
            return np.zeros(0, np.int64), np.zeros(0)
        cand = np.concatenate(seen)
        order = np.lexsort((np.arange(len(cand)), -best[cand]))[:limit]
        return _within_margin(cand[order], best[cand[order]], margin, floor)

    def _ivf_probe(self, q: np.ndarray, limit: int, margin: float | None, floor: int) -> tuple[np.ndarray, np.ndarray]:
        """probe_vector over an IVF index: the top `limit` items by dot product over the nearest lists holding about
        ivf_scan x limit items (nprobe doubled until they hold `limit`), cut by `margin` as _merged_probe is."""
        n = min(limit, self.size)
        if n <= 0:
            return np.zeros(0, np.int64), np.zeros(0)
        nlist = self.ivf.nlist
        nprobe = min(nlist, max(1, math.ceil(self.ivf_scan * n * nlist / self.size)))
        while True:
            scores, rows = self._search(q, n, nprobe)  # (1, n) best first
            if rows[0, -1] >= 0 or nprobe >= nlist:
                break
            nprobe = min(nlist, 2 * nprobe)
        ok = rows[0] >= 0
        return _within_margin(rows[0][ok].astype(np.int64), scores[0][ok].astype(np.float64), margin, floor)

    def _top(self, rows: np.ndarray, scores: np.ndarray, k: int, exclude: str | None) -> list[Hit]:
        keep = self.item_ids[rows] != exclude if exclude is not None else np.ones(len(rows), bool)
        rows, scores = rows[keep], scores[keep]
        order = np.lexsort((rows, -scores))[:k]
        return [Hit(str(self.item_ids[rows[i]]), str(self.item_types[rows[i]]), float(scores[i])) for i in order]

    def retrieve(self, entity: str, k: int = 20, exact: bool = False, exclude_self: bool = False) -> list[Hit]:
        q = self.vector(entity)  # (W,)
        exclude = entity if exclude_self else None
        if exact:
            n = min(self.size, k + int(exclude_self))
            every = self.ivf.nlist if self.ivf is not None else None  # IVF: every list
            scores, rows = self._search(q, n, every) if n else (np.zeros((1, 0)), np.zeros((1, 0), np.int64))
            ok = rows[0] >= 0
            return self._top(rows[0][ok].astype(np.int64), scores[0][ok], k, exclude)
        rows = self.candidates(entity, k + int(exclude_self))
        return self._top(rows, self.item_vectors[rows] @ q, k, exclude)

    def similar(self, entity: str, k: int = 20, exact: bool = False) -> list[Hit]:
        """Items like `entity` (itself excluded)."""
        return self.retrieve(entity, k, exact, exclude_self=True)


def _within_margin(rows: np.ndarray, prio: np.ndarray, margin: float | None, floor: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows (best priority first) whose priority is within `margin` of the best, at least `floor` of them (None: all)."""
    if margin is None or not len(rows):
        return rows, prio
    keep = max(int(np.searchsorted(-prio, margin - prio[0], side="right")), floor)  # prio >= prio[0] - margin
    return rows[:keep], prio[:keep]
