"""What `hir retrieve` / `hir serve` cost and how close they stay to the ranking head's exact ranking, side by side in one
run: per-query latency (p50 / p99) of the served path (BoM candidates reranked by the head) and of the head over every
item, and recall@100 of the served top-100 against the head's exact top-100, with the share of items the head scored.

Cases:
- `store`: a materialised window (`--store`, default the configured source's storage; `--window`, default the newest
  window with a `bom_index`): the demo's catalogue, its ranking head, users and index as `hir retrieve` loads them.
- `synthetic_<N>k`: a synthetic catalogue of N items (default 100,000; --quick 20,000) in a 64-d space: items drawn
  around 2,000 interest centres with power-law popularity, users with a history of 5-60 items from 1-3 interests, the
  hierarchy as k-means prototypes (64 / 1,024 primitives, top-3 soft assignments), the index built and its budget
  tuned exactly as `bom_index` does (hir_model.rank.bom_index), with the share of items capped at a tenth. No encoder
  is trained: the subject is the serving path at scale, not the representation.

    .venv/bin/python benchmarks/retrieval.py [--quick] [--items N] [--users U] [--store PATH] [--window KEY]

Prints `key=value` lines: per case and path (`served`, `exact`) and k (20, 100): p50_ms, p99_ms; per case the
served/exact latency ratio, recall_at_100, candidate_fraction, the tuned probe factor and the faiss index's type
(IndexIVFFlat above IndexConfig.exact_max items: candidates from its lists). Single queries one after another on one
thread, the Python of the served path included.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 shared cores: threaded BLAS on small matrices is slower
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hir_model.protocol.split import Interactions  # noqa: E402
from hir_model.rank.head import HeadConfig  # noqa: E402
from hir_model.rank.recommender import Recommender  # noqa: E402
from hir_model.rank.state import HeadState  # noqa: E402
from hir_model.rank.tune import served_recall, tune_probe_factor  # noqa: E402
from hir_model.retrieval import Retriever, bom_tokens, build_postings, write_index  # noqa: E402
from hir_model.retrieval.index import IndexConfig  # noqa: E402

DAY_US = 86_400_000_000


def latency(rec: Recommender, users: list[str], k: int, exact: bool) -> np.ndarray:
    """Milliseconds per single query (recommend: batch assembly, candidates, scores, seen items removed)."""
    out = []
    for u in users:
        t0 = time.perf_counter()
        rec.recommend(u, k=k, exact=exact)
        out.append((time.perf_counter() - t0) * 1000)
    return np.asarray(out)


def report(case: str, rec: Recommender, users: list[str], tuned: float | None) -> None:
    latency(rec, users[:10], 100, False)  # warm-up: first calls pay for imports and caches
    for k in (20, 100):
        ms = {path: latency(rec, users, k, path == "exact") for path in ("served", "exact")}
        for path, x in ms.items():
            print(f"case={case} path={path} k={k} queries={len(users)} p50_ms={np.percentile(x, 50):.2f} "
                  f"p99_ms={np.percentile(x, 99):.2f}", flush=True)
        print(f"case={case} k={k} served_over_exact_p50={np.percentile(ms['served'], 50) / np.percentile(ms['exact'], 50):.3f}",
              flush=True)
    r = served_recall(rec, users, 100)
    print(f"case={case} items={rec.state.n_items} users={len(users)} recall_at_100={r.recall:.4f} "
          f"candidate_fraction={r.candidate_fraction:.4f} candidates_per_query={r.candidates_per_query:.0f} "
          f"probe_factor={rec.probe_factor:g} index={type(rec.retriever.index).__name__}"
          + (f" tuned={tuned:.4f}" if tuned is not None else ""), flush=True)


def store_case(root: Path, window: str | None, n_users: int) -> None:
    from hir_model.retrieval.index import BOM_ASSET
    from hir_model.storage import PartitionStore

    store = PartitionStore(root)
    window = window or max(store.partitions(BOM_ASSET), default=None)
    if window is None:
        print(f"case=store skipped=no bom_index under {root}", flush=True)
        return
    t0 = time.perf_counter()
    rec = Recommender.load(store, window)
    print(f"case=store window={window} load_s={time.perf_counter() - t0:.2f}", flush=True)
    users = sorted(u for u, i in rec.user_index.items() if rec.has_row[i])
    rng = np.random.default_rng(0)
    report("store", rec, list(rng.choice(users, min(n_users, len(users)), replace=False)), None)


def synthetic_world(n_items: int, n_users: int, dim: int = 64, interests: int = 2000, seed: int = 0):
    """(HeadState, user rows, assignments table, primitives table) of a synthetic catalogue (module docstring)."""
    import faiss

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(interests, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    item_interest = rng.integers(0, interests, n_items)
    vectors = centres[item_interest] + 0.6 * rng.normal(size=(n_items, dim)).astype(np.float32) / np.sqrt(dim) * 4
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    popularity = rng.pareto(1.2, n_items) + 1e-3
    ids = np.array([f"item:{i:07d}" for i in range(n_items)], object)
    by_interest = [np.flatnonzero(item_interest == c) for c in range(interests)]
    users, user_rows, hist_user, hist_item, hist_ts = [], [], [], [], []
    for u in range(n_users):
        mine = rng.choice(interests, rng.integers(1, 4), replace=False)
        pool = np.concatenate([by_interest[c] for c in mine])
        if not len(pool):
            continue
        n = int(min(rng.integers(5, 61), len(pool)))
        p = popularity[pool] / popularity[pool].sum()
        items = rng.choice(pool, n, replace=False, p=p)
        users.append(f"user:{u:07d}")
        row = vectors[items].mean(0)
        user_rows.append(row / np.linalg.norm(row))
        hist_user += [len(users) - 1] * n
        hist_item += list(items)
        hist_ts += list(np.sort(rng.integers(0, 30 * DAY_US, n)))
    end = 30 * DAY_US
    history = Interactions("synthetic", end, np.array(users, object), np.array(hist_user, np.int64), np.array(hist_item, np.int64),
                           np.array(hist_ts, np.int64), rng.random(len(hist_item)) < 0.1, n_items)
    log_prior = (0.1 * np.log(popularity)).astype(np.float32)
    state = HeadState("synthetic", end, HeadConfig(), ids, np.full(n_items, "product", object), vectors.astype(np.float32),
                      log_prior, None, None, 1.0, 0.1, history, prior_floor=float(log_prior.min()))
    levels, rows = [], []
    entity_ids = np.concatenate([ids, np.array(users, object)])
    everything = np.vstack([vectors, np.asarray(user_rows, np.float32)])
    for level, k in enumerate((64, 1024)):
        km = faiss.Kmeans(dim, k, niter=8, seed=seed, spherical=True)
        km.train(np.ascontiguousarray(vectors[rng.choice(n_items, min(n_items, 40 * k), replace=False)]))
        nearest = faiss.IndexFlatIP(dim)
        nearest.add(km.centroids)
        s, top = nearest.search(np.ascontiguousarray(everything), 3)
        w = np.exp(s / 0.1)
        w /= w.sum(1, keepdims=True)
        rows.append(pa.table({"entity_id": pa.array(list(np.repeat(entity_ids, 3)), pa.string()),
                              "level": pa.array(np.full(top.size, level), pa.int32()),
                              "rank": pa.array(np.tile(np.arange(3), len(entity_ids)), pa.int32()),
                              "primitive": pa.array(top.reshape(-1).astype(np.int64)),
                              "weight": pa.array(w.reshape(-1).astype(np.float32))}))
        levels.append(pa.table({"level": pa.array(np.full(k, level), pa.int32()), "primitive": pa.array(np.arange(k, dtype=np.int64)),
                                "centroid": pa.FixedSizeListArray.from_arrays(pa.array(km.centroids.reshape(-1)), dim)}))
    return state, np.asarray(user_rows, np.float32), pa.concat_tables(rows), pa.concat_tables(levels)


def synthetic_case(n_items: int, n_users: int, n_queries: int, n_calibration: int = 300) -> None:
    from hir_model.embed import EntityEmbeddings
    from hir_model.rank.bom_index import sample_users

    case = f"synthetic_{n_items // 1000}k"
    t0 = time.perf_counter()
    state, rows, assignments, primitives = synthetic_world(n_items, n_users)
    t1 = time.perf_counter()
    config = IndexConfig(max_candidate_share=0.1)
    tokens = bom_tokens(assignments)
    postings, _ = build_postings(tokens, state.item_ids, config.max_posting_share)
    with tempfile.TemporaryDirectory() as tmp:
        write_index(Path(tmp), state.item_ids, state.item_types, state.vectors, tokens, postings, config, primitives)
        users = state.history.user_ids
        emb = EntityEmbeddings(np.concatenate([state.item_ids, users]), np.concatenate([state.item_types, np.full(len(users), "user", object)]),
                               np.vstack([state.vectors, rows]), np.zeros(n_items + len(users), bool),
                               np.full(n_items + len(users), -1, np.int64))
        rec = Recommender(state, rows, np.ones(len(users), bool), Retriever.load(Path(tmp), emb))
        queries = sample_users(users, n_queries, 0)
        calibration = sample_users(np.setdiff1d(users.astype(str), queries), n_calibration, 1)
        factor, tuned = tune_probe_factor(rec, calibration, 100, config.target_recall, config.max_candidate_share)
        rec.probe_factor = factor
        t2 = time.perf_counter()
        print(f"case={case} build_s={t1 - t0:.1f} index_and_tune_s={t2 - t1:.1f}", flush=True)
        report(case, rec, queries, tuned)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 20,000-item synthetic catalogue, fewer queries")
    parser.add_argument("--items", type=int, help="items of the synthetic catalogue (default 100,000; --quick 20,000)")
    parser.add_argument("--users", type=int, default=200, help="query users per case (--quick: 50)")
    parser.add_argument("--store", type=Path, help="a materialised store (default: the configured source's storage)")
    parser.add_argument("--window", help="the store's window (default: the newest with a bom_index)")
    args = parser.parse_args()
    queries = 50 if args.quick else args.users
    if args.store or not args.quick:
        from hir_model.config import load_config

        root = args.store or Path(load_config().storage_uri)
        if root.exists():
            store_case(root, args.window, queries)
        else:
            print(f"case=store skipped=no store at {root} (make demo materialises one)", flush=True)
    items = args.items or (20_000 if args.quick else 100_000)
    synthetic_case(items, max(items // 10, 2000), queries, 100 if args.quick else 300)


if __name__ == "__main__":
    main()
