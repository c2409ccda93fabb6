"""Recall of the BoM retriever against exact search, and the per-window tuning of its candidate budget (fixed probe
factor or adaptive margin, see hir_model.retrieval.index) on calibration users, written to `probe.json`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from hir_model.embed import EntityEmbeddings
from hir_model.retrieval.index import DEFAULT_PROBE_FACTOR, PROBE_FILE, IndexConfig, RecallReport, Retriever


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


def margin_curve(retriever: Retriever, queries: list[str], k: int, max_candidates: int,
                 margins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean recall@k, mean candidates) per margin in `margins` (ascending) with adaptive budgets of k to max_candidates:
    one probe per query, its priorities give the budget every margin would take."""
    limit = min(max_candidates, retriever.index.ntotal)
    recall, size = np.zeros(len(margins)), np.zeros(len(margins))
    for q in queries:
        _, truth = retriever.index.search(retriever.vector(q)[None].astype(np.float32), min(k, retriever.index.ntotal))
        truth = truth[0][truth[0] >= 0]
        rows, prio = retriever.probe_ranked(q, limit)
        position = np.full(retriever.index.ntotal, limit, np.int64)
        position[rows] = np.arange(len(rows))
        found = np.sort(position[truth])  # where each of the exact top-k sits in the probe order
        n = np.searchsorted(prio[0] - prio, margins, side="right") if len(prio) else np.zeros(len(margins), np.int64)
        n = np.clip(n, min(k, len(rows)), len(rows))  # (M,) the budget each margin takes
        recall += np.searchsorted(found, n, side="left") / max(len(truth), 1)
        size += n
    return recall / max(len(queries), 1), size / max(len(queries), 1)


def tune_probe_margin(retriever: Retriever, queries: list[str], k: int, target: float, max_candidates: int,
                      steps: int = 400) -> tuple[float, float]:
    """(margin, mean candidates per query at it): the smallest margin whose mean recall@k over `queries` reaches
    `target` with budgets of k to max_candidates (the widest margin tried when none does)."""
    margins = np.linspace(0.0, 2.0, steps + 1)  # priorities are cosines plus a log-weight term: 2 spans them
    recall, size = margin_curve(retriever, queries, k, max_candidates, margins)
    reached = np.flatnonzero(recall >= target)
    i = reached[0] if len(reached) else len(margins) - 1
    return round(float(margins[i]), 4), float(size[i])


def calibrate(folder: Path, emb: EntityEmbeddings, exclude: list[str], config: IndexConfig = IndexConfig()) -> float:
    """Tune the window's probe budget on users not in `exclude` (or take config.probe_factor) and write probe.json;
    returns the probe factor (adaptive: the per-query ceiling, whose margin probe.json also holds)."""
    retriever = Retriever.load(folder, emb, weight_prior=config.weight_prior)
    pool = set(exclude)
    users = [u for u in sample_users(emb, config.calibration_users + len(pool), config.seed + 1) if u not in pool]
    users = users[: config.calibration_users]
    factor, margin = config.probe_factor, None
    if factor is None and not (users and retriever.codebooks):
        factor = DEFAULT_PROBE_FACTOR
    elif factor is None:
        cap = max(config.recall_k, math.ceil(config.max_candidate_share * retriever.index.ntotal))
        factor = tune_probe_factor(retriever, users, config.recall_k, config.target_recall, cap)
        if config.adaptive:  # kept only where it needs fewer candidates than the fixed budget for the same target
            tuned, mean = tune_probe_margin(retriever, users, config.recall_k, config.target_recall, cap)
            if mean < factor * config.recall_k:
                margin, factor = tuned, cap / config.recall_k
    (Path(folder) / PROBE_FILE).write_text(json.dumps({
        "probe_factor": factor, "probe_margin": margin, "weight_prior": config.weight_prior,
        "tuned": config.probe_factor is None, "k": config.recall_k, "target_recall": config.target_recall,
        "calibration_users": len(users)}) + "\n")
    return factor


def sample_users(emb: EntityEmbeddings, n: int, seed: int = 0) -> list[str]:
    users = np.sort(emb.entity_id[emb.entity_type == "user"].astype(str))
    rng = np.random.default_rng(seed)
    return list(rng.choice(users, size=min(n, len(users)), replace=False)) if len(users) else []
