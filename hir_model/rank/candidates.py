"""The candidates the served path scores for each query: the BoM index probed by the query vector and the user's
heaviest recent items, co-engagement's best, the largest priors and the arrivals' own (hir_model.rank.recommender's
docstring, step 1); a cold user takes every item. `rec`: a Recommender, `batch`: its Batch (no import back)."""

from __future__ import annotations

import math

import numpy as np

from hir_model.protocol.metrics import in_sorted
from hir_model.rank.coengagement import coengagement_rows, top_of_row
from hir_model.rank.head import kernel_items, recent_items

KERNEL_PROBES = 3  # the heaviest recent items probed beside the query vector


def candidates(rec, batch, k: int, probe_factor: float | None = None, include_seen: bool = False,
               scope: str = "all", upto: int | None = None) -> list[np.ndarray]:
    """Per query, the item rows `rec`'s head scores within `rec.scope_range(scope, upto)`, sorted, the user's engaged
    items left out unless `include_seen`; every item of the range without an index."""
    seen = batch.queries.context
    lo, hi = rec.scope_range(scope, upto)
    if rec.retriever is None or not rec.retriever.codebooks:
        every = np.arange(lo, hi)
        return [every if include_seen else np.setdiff1d(every, seen.row(q)) for q in range(len(batch.queries))]
    factor = rec.probe_factor if probe_factor is None else probe_factor
    vectors = rec.query_vectors(batch)
    recent = kernel_items(batch.queries, rec.config.recent_half_life_days, rec.config.deep_weight)
    co = None
    if rec.items.coengagement is not None and batch.warm.any() and scope != "new":
        co = coengagement_rows(batch.queries, rec.items.coengagement, rec.config.coengagement_half_life_days,
                               rec.config.deep_weight)
    retriever = rec.window_retriever if scope == "window" else rec.retriever
    profiles = None  # (Q, C) the users' content profiles, where the head scores arrivals' content (its content term)
    if scope != "window" and hi > rec.n_window and rec.items.content is not None and rec.items.content_weight:
        profiles = recent_items(batch.queries, rec.items.content, None, rec.config.deep_weight)
    out = []
    for q in range(len(batch.queries)):
        skip = np.zeros(0, np.int64) if include_seen else np.unique(seen.row(q))
        budget = min(math.ceil(factor * max(k, rec.budget_k)), rec.state.n_items)

        def fresh(rows: np.ndarray, n: int) -> np.ndarray:
            return rows[~in_sorted(skip, rows)][:n]  # np.isin's table grows with the catalogue

        if not batch.warm[q]:  # a cold user: every item in range (module docstring)
            every = np.arange(lo, hi)
            out.append(every if include_seen else every[~in_sorted(skip, every)])
            continue
        parts = []
        if scope != "new":
            probed = retriever.probe_vector(vectors[q], budget + len(skip), floor=k + len(skip))[0]
            parts.append(fresh(probed, max(budget, k)))
            per_item = math.ceil(budget / KERNEL_PROBES)
            for item in recent[q][0][:KERNEL_PROBES]:
                parts.append(fresh(retriever.probe_vector(rec.items.vectors[item], per_item + len(skip))[0], per_item))
            if co is not None and batch.warm[q]:  # the items the co-engagement term scores highest
                parts.append(fresh(top_of_row(co, q, budget + len(skip)), budget))
            parts.append(fresh(rec.prior_order[:math.ceil(budget / 2) + len(skip)], math.ceil(budget / 2)))
        if scope != "window" and hi > rec.n_window:  # the arrivals: their own candidates (module docstring)
            profile = None if profiles is None else profiles[q]
            parts.append(fresh(arrival_rows(rec, vectors[q], recent[q][0][:KERNEL_PROBES], budget + len(skip), hi,
                                                  profile), budget + len(skip)))
        rows = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        out.append(rows[(rows >= lo) & (rows < hi)])
    return out

def arrival_rows(rec, vector: np.ndarray, recent: np.ndarray, budget: int, hi: int,
                  profile: np.ndarray | None = None) -> np.ndarray:
    """Increment rows [n_window, hi) nearest the query vector (`budget` of them), nearest each recent item
    (budget / KERNEL_PROBES each) and, with a content profile, nearest it by content (the head's content term): all
    of them when they are fewer. Exact dot products: a week's arrivals are few beside the window's items."""
    rows = np.arange(rec.n_window, hi)
    if len(rows) <= budget:
        return rows
    block = rec.items.vectors[rec.n_window:hi]  # (m, W)
    picked = [rows[np.argsort(-(block @ vector), kind="stable")[:budget]]]
    per_item = math.ceil(budget / KERNEL_PROBES)
    for item in recent:
        picked.append(rows[np.argsort(-(block @ rec.items.vectors[item]), kind="stable")[:per_item]])
    if profile is not None and profile.any():
        picked.append(rows[np.argsort(-(rec.items.content[rec.n_window:hi] @ profile), kind="stable")[:budget]])
    return np.unique(np.concatenate(picked))
