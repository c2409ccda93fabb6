"""Scoring a window's split: which judged users each slice evaluates, and every method's metrics over them.

A slice (users x item group x target kind) with more than `max_users` judged users is evaluated on a seeded sample
of that many; queries are scored in blocks of at most `score_batch` rows (fewer where a block would pass
`score_cells`), each block ranked at once, so no users x items matrix is ever held.

A method whose answer on the items first seen in t+1 depends on the moment it is asked (`timed`: HIR's served row, whose
increments are published over the week) is judged there target by target: each judged user is asked again at the
moment of each target's first engagement (`Queries.as_of`), and each target is placed in the answer of its moment
(hir_model.protocol.metrics.timed_ranking_metrics). Every other slice, and every other method, is scored as above.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hir_model.eval.audience import AudienceEvalConfig
from hir_model.eval.lift import LiftConfig
from hir_model.eval.text_vectors import TextVectorConfig
from hir_model.protocol.method import Method
from hir_model.protocol.metrics import Ragged, RankingMetrics, ranking_metrics, timed_ranking_metrics
from hir_model.protocol.split import ITEM_GROUPS, TARGET_KINDS, SplitConfig, WindowSplit


@dataclass(frozen=True)
class EvalConfig:
    split: SplitConfig = SplitConfig()
    recall_ks: tuple[int, ...] = (10, 20, 50)
    ndcg_ks: tuple[int, ...] = (10, 20)
    content: str = "auto"  # "asset" (content_embeddings), "text" (hashed TF-IDF stand-in), "auto" (asset if there)
    text: TextVectorConfig = TextVectorConfig()
    lift: LiftConfig = LiftConfig()
    lift_method: str | None = "mf_als"  # whose warm-user pair score is the extra lift block (the asset: "hir")
    score_batch: int = 1024  # queries scored at once (fewer when a block would pass score_cells)
    score_cells: int = 64_000_000  # queries x items scored at once (256 MB of float32 scores)
    # judged users per slice (and users of the lift's pairs) above which a fixed, seeded sample of this many is
    # evaluated; larger than any window of MovieLens or the `small` synthetic preset (4,200 users), so those are never sampled
    max_users: int = 5_000
    seed: int = 0  # of the candidates' tie-break order (shared by every method) and of the user samples
    audience: AudienceEvalConfig | None = AudienceEvalConfig()  # the audience slice (hir_model.eval.audience); None: off


@dataclass(frozen=True)
class SliceResult:
    method: str
    users: str  # "warm" | "cold"
    items: str  # "known" (known by end(t)) | "new" (first seen in t+1)
    target: str  # "deep_funnel" | "engagement"
    candidates: int  # items ranked for every user of the slice (the whole item group)
    metrics: RankingMetrics  # over metrics.n_users users: all judged users, or a seeded sample of max_users of them
    # (metrics.n_users,) object: the user behind each of metrics.per_user's values (None when read back without them)
    user_ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    judged: int | None = field(default=None, compare=False)  # users with a target before sampling (None: metrics.n_users)


@dataclass(frozen=True)
class MethodTiming:
    method: str
    fit_s: float
    score_s: float


def query_blocks(n: int, n_items: int, config: EvalConfig) -> list[tuple[int, int]]:
    """[lo, hi) query blocks of score_batch rows, fewer where a block would pass score_cells."""
    batch = max(1, min(config.score_batch, config.score_cells // max(n_items, 1)))
    return [(lo, min(lo + batch, n)) for lo in range(0, n, batch)]


def _tie_order(key: str, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, zlib.crc32(key.encode()), n]).permutation(n)


def user_priority(user_ids: np.ndarray, key: str, seed: int) -> np.ndarray:
    """(U,) uint32 a user's fixed place in the window's samples: a seeded hash of the id (the same for every method,
    slice and run); a sample of k is the k lowest, so samples of nested populations are nested."""
    salt = zlib.crc32(f"{seed}:{key}".encode())
    return np.fromiter((zlib.crc32(str(u).encode(), salt) for u in user_ids), np.uint32, len(user_ids))


def sample_rows(rows: np.ndarray, priority: np.ndarray, cap: int) -> np.ndarray:
    """`rows` (ascending) when at most `cap`, else the `cap` of them with the lowest priority[rows], ascending."""
    if len(rows) <= cap:
        return rows
    return np.sort(rows[np.argsort(priority[rows], kind="stable")[:cap]])


def merge_metrics(parts: Sequence[RankingMetrics], offsets: Sequence[int]) -> RankingMetrics:
    """One RankingMetrics of consecutive row blocks (block i's rows start at offsets[i]): the per-user values in
    order and their means, as ranking_metrics over the stacked blocks would give them."""
    per_user = {name: np.concatenate([p.per_user[name] for p in parts]) for name in parts[0].per_user}
    rows = np.concatenate([p.rows + o for p, o in zip(parts, offsets)])
    recall = {k: float(np.mean(per_user[f"recall@{k}"])) for k in parts[0].recall}
    ndcg = {k: float(np.mean(per_user[f"ndcg@{k}"])) for k in parts[0].ndcg}
    return RankingMetrics(sum(p.n_users for p in parts), sum(p.n_targets for p in parts), recall, ndcg, per_user, rows)


@dataclass(frozen=True)
class _Slice:
    items: str
    target: str
    lo: int
    hi: int
    targets: Ragged  # (judged rows) the slice's targets, columns within [lo, hi)
    exclude: Ragged  # (judged rows) the context within [lo, hi)
    rows: np.ndarray  # (n,) the group's query rows evaluated (ascending): every judged row, or a sample of them
    judged: int  # rows with a target before sampling
    target_ts: np.ndarray | None = None  # (nnz,) aligned with targets.idx: the user's first t+1 engagement with it


def _slices(split: WindowSplit, group, config: EvalConfig) -> list[_Slice]:
    """The group's slices with at least one judged user, each with its (sampled) rows."""
    out, priority = [], None
    for items in ITEM_GROUPS:
        lo, hi = split.items.group(items)
        if hi == lo or len(group.queries) == 0:
            continue
        exclude = group.queries.context.within(lo, hi)
        for target in TARGET_KINDS:
            whole = group.targets(target)
            tg = whole.within(lo, hi)
            judged = np.flatnonzero(tg.sizes > 0)
            if len(judged) == 0:
                continue
            if len(judged) > config.max_users and priority is None:
                priority = user_priority(group.queries.user_ids, split.window, config.seed)
            rows = sample_rows(judged, priority, config.max_users) if len(judged) > config.max_users else judged
            times = group.target_times(target)
            if times is not None:  # within() keeps the kept entries' order, take() gathers them by position
                times = times[(whole.idx >= lo) & (whole.idx < hi)][tg.gather(rows)[1]]
            out.append(_Slice(items, target, lo, hi, tg.take(rows), exclude.take(rows), rows, len(judged), times))
    return out


def evaluate_split(split: WindowSplit, methods: Sequence[Method], config: EvalConfig = EvalConfig()
                   ) -> tuple[tuple[SliceResult, ...], tuple[MethodTiming, ...]]:
    """Fit every method on the split's train set, score warm and cold users, compute every slice's metrics.

    Queries are scored in blocks and each block is ranked at once, so no users x items matrix is ever held. A slice
    with more than `max_users` judged users is evaluated on a seeded sample of that many (SliceResult.judged says of
    how many); only users some slice evaluates are scored. Without sampling the blocks are today's batches of every
    query of the group, so the values are those of scoring the whole matrix."""
    results, timings = [], []
    known_items = split.items.known()
    ties = {g: _tie_order(f"{split.window}:{g}", hi - lo, config.seed) for g in ITEM_GROUPS
            for lo, hi in [split.items.group(g)]}
    plans = [(group, _slices(split, group, config)) for group in (split.warm, split.cold)]
    for method in methods:
        t0 = time.perf_counter()
        method.fit(split.train, known_items)
        fit_s, score_s = time.perf_counter() - t0, 0.0
        timed = bool(getattr(method, "timed", False))
        for group, all_slices in plans:
            # a timed method's new-item slices are judged target by target, at each target's moment (module docstring)
            at_moment = [sl for sl in all_slices if timed and sl.items == "new" and sl.target_ts is not None]
            slices = [sl for sl in all_slices if sl not in at_moment]
            done: dict[int, SliceResult] = {}
            for sl in at_moment:
                t1 = time.perf_counter()
                m = _timed_metrics(method, split, group, sl, config, ties[sl.items])
                score_s += time.perf_counter() - t1
                done[id(sl)] = SliceResult(method.name, group.name, sl.items, sl.target, sl.hi - sl.lo, m,
                                           group.queries.user_ids[sl.rows[m.rows]], sl.judged)
            if slices:
                sampled = any(len(sl.rows) < sl.judged for sl in slices)
                scored = (np.unique(np.concatenate([sl.rows for sl in slices])) if sampled
                          else np.arange(len(group.queries)))  # (S,) ascending query rows
                parts: list[list[tuple[RankingMetrics, int]]] = [[] for _ in slices]
                for a, b in query_blocks(len(scored), len(split.items), config):
                    t1 = time.perf_counter()
                    block = method.score(group.queries.take(scored[a:b]), split.items)  # (b - a, N)
                    score_s += time.perf_counter() - t1
                    for sl, part in zip(slices, parts):
                        first, last = np.searchsorted(sl.rows, [scored[a], scored[b - 1] + 1])
                        if first == last:
                            continue
                        at = np.searchsorted(scored[a:b], sl.rows[first:last])  # their rows of the block
                        take = np.arange(first, last)
                        m = ranking_metrics(block[at, sl.lo:sl.hi], sl.targets.take(take), sl.exclude.take(take),
                                            config.recall_ks, config.ndcg_ks, ties[sl.items])
                        part.append((m, int(first)))
                for sl, part in zip(slices, parts):
                    m = merge_metrics([p for p, _ in part], [o for _, o in part])
                    done[id(sl)] = SliceResult(method.name, group.name, sl.items, sl.target, sl.hi - sl.lo, m,
                                               group.queries.user_ids[sl.rows[m.rows]], sl.judged)
            results += [done[id(sl)] for sl in all_slices]
        timings.append(MethodTiming(method.name, round(fit_s, 4), round(score_s, 4)))
    return tuple(results), tuple(timings)


def _timed_metrics(method: Method, split: WindowSplit, group, sl: _Slice, config: EvalConfig,
                   tie_order: np.ndarray) -> RankingMetrics:
    """A slice judged target by target: each judged user asked at the moment of each of its targets' first engagement
    (one query per distinct (user, moment)), each target placed in the answer of its moment."""
    user = np.repeat(np.arange(len(sl.rows)), sl.targets.sizes)  # (nnz,) judged row of each target
    pairs, answer = np.unique(np.stack([user, sl.target_ts]), axis=1, return_inverse=True)  # (2, A) distinct (row, moment)
    answer = np.asarray(answer).reshape(-1)
    queries = group.queries.take(sl.rows[pairs[0]]).at(pairs[1])
    scores = np.zeros((len(queries), sl.hi - sl.lo), np.float32)
    for a, b in query_blocks(len(queries), len(split.items), config):
        scores[a:b] = method.score(queries.take(np.arange(a, b)), split.items)[:, sl.lo:sl.hi]
    return timed_ranking_metrics(scores, answer, sl.targets, sl.exclude, config.recall_ks, config.ndcg_ks, tie_order)
