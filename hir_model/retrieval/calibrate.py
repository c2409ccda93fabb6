"""Recall of the BoM retriever against exact search, and the per-window tuning of its candidate budget (fixed probe
factor or adaptive margin, see hir_model.retrieval.index) on calibration users, written to `probe.json`."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
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


MARGINS = np.linspace(0.0, 2.0, 401)  # adaptive margins tried; priorities are cosines plus a log-weight term: 2 spans them


@dataclass(frozen=True)
class BudgetCurves:
    """Mean recall@k over calibration queries against the candidate budget, for fixed and adaptive budgets."""

    k: int
    fixed: np.ndarray  # (limit,) mean recall with a fixed budget of b + 1 candidates
    margins: np.ndarray  # (M,) ascending
    margin_recall: np.ndarray  # (M,) mean recall with adaptive budgets at each margin
    margin_size: np.ndarray  # (M,) mean candidates per query at each margin

    def factor(self, target: float) -> float:
        """The smallest fixed probe factor reaching `target` (the largest budget when none does)."""
        reached = np.flatnonzero(self.fixed >= target)
        budget = int(reached[0]) + 1 if len(reached) else len(self.fixed)
        return math.ceil(100 * budget / self.k) / 100

    def margin(self, target: float) -> tuple[float, float]:
        """(margin, mean candidates at it): the smallest margin reaching `target` (the widest when none does)."""
        reached = np.flatnonzero(self.margin_recall >= target)
        i = reached[0] if len(reached) else len(self.margins) - 1
        return round(float(self.margins[i]), 4), float(self.margin_size[i])

    def margin_within(self, mean_budget: float) -> float:
        """The widest margin whose mean candidates per query stay within `mean_budget`."""
        return float(self.margins[max(int(np.searchsorted(self.margin_size, mean_budget, side="right")) - 1, 0)])


def budget_curves(retriever: Retriever, queries: list[str], k: int, max_candidates: int,
                  margins: np.ndarray = MARGINS) -> BudgetCurves:
    """One probe per query (up to max_candidates) against its exact top-k: recall with a fixed budget of b is the share
    of the exact top-k among the first b rows of the probe order (the rerank keeps all of them), and with a margin m
    the share among the rows within m of the best priority (k to max_candidates of them)."""
    limit = min(max_candidates, retriever.index.ntotal)
    fixed = np.zeros(limit + 1)  # fixed[b]: recall mass first reached at budget b + 1
    recall, size = np.zeros(len(margins)), np.zeros(len(margins))
    for q in queries:
        _, truth = retriever.index.search(retriever.vector(q)[None].astype(np.float32), min(k, retriever.index.ntotal))
        truth = truth[0][truth[0] >= 0]
        share = 1.0 / max(len(truth), 1)
        rows, prio = retriever.probe_ranked(q, limit)
        position = np.full(retriever.index.ntotal, limit, np.int64)
        position[rows] = np.arange(len(rows))
        found = np.sort(position[truth])  # where each of the exact top-k sits in the probe order
        np.add.at(fixed, found, share)
        n = np.searchsorted(prio[0] - prio, margins, side="right") if len(prio) else np.zeros(len(margins), np.int64)
        n = np.clip(n, min(k, len(rows)), len(rows))  # (M,) the budget each margin takes
        recall += np.searchsorted(found, n, side="left") * share
        size += n
    q = max(len(queries), 1)
    return BudgetCurves(k, np.cumsum(fixed[:limit]) / q, margins, recall / q, size / q)


def tune_probe_factor(retriever: Retriever, queries: list[str], k: int, target: float, max_candidates: int) -> float:
    """The smallest probe factor whose mean recall@k over `queries` reaches `target` (capped at max_candidates / k)."""
    return budget_curves(retriever, queries, k, max_candidates).factor(target)


def calibration_users(emb: EntityEmbeddings, exclude: list[str], config: IndexConfig) -> list[str]:
    """The users a window's budget is tuned on: sampled with seed + 1, none of `exclude` (the recall check's)."""
    pool = set(exclude)
    users = [u for u in sample_users(emb, config.calibration_users + len(pool), config.seed + 1) if u not in pool]
    return users[: config.calibration_users]


def calibrate(folder: Path, emb: EntityEmbeddings, exclude: list[str], config: IndexConfig = IndexConfig()) -> float:
    """Tune the window's probe budget on users not in `exclude` (or take config.probe_factor) and write probe.json;
    returns the probe factor (adaptive: the per-query ceiling, whose margin probe.json also holds)."""
    retriever = Retriever.load(folder, emb, weight_prior=config.weight_prior)
    users = calibration_users(emb, exclude, config)
    factor, margin = config.probe_factor, None
    if factor is None and not (users and retriever.codebooks):
        factor = DEFAULT_PROBE_FACTOR
    elif factor is None:
        cap = max(config.recall_k, math.ceil(config.max_candidate_share * retriever.index.ntotal))
        curves = budget_curves(retriever, users, config.recall_k, cap)
        factor = curves.factor(config.target_recall)
        if config.adaptive:  # kept only where it needs fewer candidates than the fixed budget for the same target
            tuned, mean = curves.margin(config.target_recall)
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
