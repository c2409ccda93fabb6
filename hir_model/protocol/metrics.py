"""Ranking metrics over full rankings: Recall@K and NDCG@K, vectorised over users.

Definitions (binary relevance, every candidate ranked, never sampled negatives):
- Recall@K = |top-K ∩ targets| / |targets| (the LightGCN / RecBole convention; it can stay below 1
  when a user has more than K targets).
- NDCG@K = DCG@K / IDCG@K with DCG@K = sum over ranks r <= K of hit_r / log2(r + 1) and IDCG@K the DCG of
  min(K, |targets|) hits at the top.
Both are averaged over users with at least one target (macro average); each of those users' own values are kept
too (`RankingMetrics.per_user`), so two methods can be compared user by user (a paired bootstrap, `protocol.stats`).

Excluded columns (items the user already engaged with) get -inf and so rank after every other candidate.
Ties are broken by a fixed order of the columns (`tie_order`, a permutation: earlier wins), the same for
every method, so a method that cannot tell candidates apart scores at chance rather than by id order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CHUNK_CELLS = 4_000_000  # users x candidates sorted at once (bounds the memory of a ranking)


@dataclass(frozen=True)
class Ragged:
    """Per row, a set of column indices: row r holds idx[ptr[r]:ptr[r + 1]] (a CSR pattern without values)."""

    ptr: np.ndarray  # (R + 1,) int64, non-decreasing, ptr[0] == 0
    idx: np.ndarray  # (nnz,) int64 column indices

    @classmethod
    def from_pairs(cls, rows: np.ndarray, cols: np.ndarray, n_rows: int) -> Ragged:
        """Rows and columns of the pairs (any order; duplicates are kept)."""
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        order = np.argsort(rows, kind="stable")
        ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))]).astype(np.int64)
        return cls(ptr, cols[order])

    @classmethod
    def from_lists(cls, lists: list[list[int]]) -> Ragged:
        ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
        return cls(ptr, np.asarray([c for x in lists for c in x], np.int64))

    @property
    def n_rows(self) -> int:
        return len(self.ptr) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.ptr)

    @property
    def row_of(self) -> np.ndarray:
        """(nnz,) the row of each entry."""
        return np.repeat(np.arange(self.n_rows), self.sizes)

    def row(self, r: int) -> np.ndarray:
        return self.idx[self.ptr[r]:self.ptr[r + 1]]

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ptr of the sub-rows `rows` and the positions of their entries (to take aligned arrays too)."""
        rows = np.asarray(rows, np.int64)
        sizes = self.sizes[rows]
        ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return ptr, np.arange(ptr[-1]) + np.repeat(self.ptr[rows] - ptr[:-1], sizes)

    def take(self, rows: np.ndarray) -> Ragged:
        ptr, pos = self.gather(rows)
        return Ragged(ptr, self.idx[pos])

    def within(self, lo: int, hi: int) -> Ragged:
        """Only the columns in [lo, hi), shifted to start at 0 (a candidate range of the item space)."""
        keep = (self.idx >= lo) & (self.idx < hi)
        return Ragged.from_pairs(self.row_of[keep], self.idx[keep] - lo, self.n_rows)

    def to_mask(self, n_cols: int, rows: slice | None = None) -> np.ndarray:
        """(R, n_cols) boolean membership (or only the rows of `rows`, a contiguous slice)."""
        lo, hi = (0, self.n_rows) if rows is None else (rows.start, rows.stop)
        mask = np.zeros((hi - lo, n_cols), bool)
        a, b = self.ptr[lo], self.ptr[hi]
        mask[np.repeat(np.arange(hi - lo), np.diff(self.ptr[lo:hi + 1])), self.idx[a:b]] = True
        return mask


@dataclass(frozen=True)
class RankingMetrics:
    n_users: int  # users with at least one target (the ones averaged over)
    n_targets: int  # their targets in total
    recall: dict[int, float]  # K -> mean Recall@K
    ndcg: dict[int, float]  # K -> mean NDCG@K
    # metric name (as in as_dict) -> (n_users,) each averaged user's value, their means are `recall` / `ndcg`;
    # empty when read back from a published metrics table
    per_user: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)  # (n_users,) their rows of `scores`

    def as_dict(self) -> dict[str, float]:
        return {f"recall@{k}": v for k, v in self.recall.items()} | {f"ndcg@{k}": v for k, v in self.ndcg.items()}


def top_k(scores: np.ndarray, k: int, exclude: np.ndarray | None = None, tie_order: np.ndarray | None = None) -> np.ndarray:
    """(U, min(k, C)) the columns of each row's k best scores, best first.

    scores: (U, C); exclude: (U, C) boolean, excluded cells rank last; tie_order: (C,) a permutation of the
    columns, the earlier column wins a tie (default: column order).
    """
    s = _rankable(scores)
    if exclude is not None:
        s[np.asarray(exclude, bool)] = -np.inf
    return _best(s, k, tie_order)


def _rankable(scores: np.ndarray) -> np.ndarray:
    """A copy of `scores` that -inf can be written into (floats keep their dtype: the order is the same as in float64)."""
    scores = np.asarray(scores)
    if np.isnan(scores).any():
        raise ValueError("scores hold NaN: a method must return finite scores (or -inf for 'never')")
    return scores.astype(scores.dtype if np.issubdtype(scores.dtype, np.floating) else np.float64, copy=True)


def _best(s: np.ndarray, k: int, tie_order: np.ndarray | None) -> np.ndarray:
    """(U, min(k, C)) top_k of `s` (excluded cells already -inf): each row's cells ordered by (-score, place in the tie
    order), the first k.

    Only a superset of each row's top k is sorted: the cells at or above a lower bound of the row's k-th largest score
    (the k-th largest of every `step`-th column), or, where that bound is -inf, the finite cells and the first k columns
    in tie order (the -inf cells a top k can hold are among those). Where ties make that set large (a constant score),
    the rows are ranked in tie order instead, as a stable sort (`_best_in_tie_order`). Both give the same columns."""
    n_rows, n_cols = s.shape
    k = min(k, n_cols)
    if k == n_cols or n_rows == 0:
        return _best_in_tie_order(s, k, tie_order)
    step = max(1, int(np.sqrt(n_cols / k) / 2))  # about sqrt(k C) / 2 columns bound about k step cells a row
    sub = s[:, ::step]
    if sub.shape[1] <= k:
        sub = s
    bound = np.partition(sub, sub.shape[1] - k, axis=1)[:, sub.shape[1] - k:sub.shape[1] - k + 1]  # (U, 1) <= k-th largest
    keep = s >= bound
    low = np.flatnonzero(bound[:, 0] == -np.inf)
    if len(low):
        order = np.arange(n_cols) if tie_order is None else np.asarray(tie_order)
        keep[low] = s[low] > -np.inf
        keep[low[:, None], order[None, :k]] = True
    row, col = np.divmod(np.flatnonzero(keep), n_cols)  # row-major (np.nonzero of a 2-d mask is several times slower)
    if len(row) > max(s.size // 16, 4 * n_rows * k):  # ties: sorting this many costs more than ranking in tie order
        return _best_in_tie_order(s, k, tie_order)
    place = col if tie_order is None else _places(tie_order)[col]
    first = np.lexsort((place, -s[row, col], row))  # by row, then score descending, then tie order
    starts = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n_rows))[:-1]])
    return col[first[starts[:, None] + np.arange(k)]]


def _places(tie_order: np.ndarray) -> np.ndarray:
    """(C,) each column's place in the tie order (the inverse permutation)."""
    order = np.asarray(tie_order)
    place = np.empty(len(order), np.int64)
    place[order] = np.arange(len(order))
    return place


def _best_in_tie_order(s: np.ndarray, k: int, tie_order: np.ndarray | None) -> np.ndarray:
    """_best by ranking every cell: the columns put in tie order, a stable sort keeps that order among equals."""
    n_cols = s.shape[1]
    order = np.arange(n_cols) if tie_order is None else np.asarray(tie_order)
    s = s[:, order]
    if k < n_cols:  # keep exactly the k best of each row (ties at the k-th value: the earliest in tie order) ...
        kth = -np.partition(-s, k - 1, axis=1)[:, k - 1:k]  # (U, 1) the k-th largest value
        above, at = s > kth, s == kth
        need = k - above.sum(1, keepdims=True)
        keep = above | (at & (np.cumsum(at, axis=1) <= need))
        cols = np.nonzero(keep)[1].reshape(len(s), k)  # row-major: each row's kept columns in tie order
        best = np.take_along_axis(cols, np.argsort(-np.take_along_axis(s, cols, 1), axis=1, kind="stable"), 1)
    else:  # ... then sort those k (stable: ties keep the tie order)
        best = np.argsort(-s, axis=1, kind="stable")
    return order[best]


def in_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(keys.shape) bool: each key is in `sorted_keys` (ascending). A binary search: np.isin hashes or sorts the
    reference again on every call, a cost that grows with it (per query, per training step)."""
    if len(sorted_keys) == 0:
        return np.zeros(np.shape(keys), bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[pos] == keys


def _member(rag: Ragged, lo: int, hi: int, n_cols: int, cols: np.ndarray) -> np.ndarray:
    """(hi - lo, m) bool: cols[r - lo, j] is in row r of `rag` (rows lo..hi), without a dense (rows, n_cols) mask."""
    a, b = rag.ptr[lo], rag.ptr[hi]
    keys = np.sort(np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(rag.ptr[lo:hi + 1])) * n_cols + rag.idx[a:b])
    return in_sorted(keys, np.arange(hi - lo, dtype=np.int64)[:, None] * n_cols + cols)


def ranking_metrics(scores: np.ndarray, targets: Ragged, exclude: Ragged | None = None,
                    recall_ks: tuple[int, ...] = (10, 20, 50), ndcg_ks: tuple[int, ...] = (10, 20),
                    tie_order: np.ndarray | None = None) -> RankingMetrics:
    """Mean Recall@K and NDCG@K of `scores` (U, C) against `targets` (U rows of column sets).

    Rows without targets are skipped. `exclude` (U rows) are ranked last; a target that is also excluded
    still counts in the denominator (the caller removes such targets when that is the intent).
    """
    n_users, n_cols = scores.shape
    if targets.n_rows != n_users or (exclude is not None and exclude.n_rows != n_users):
        raise ValueError(f"scores have {n_users} rows, targets {targets.n_rows}, exclude {exclude and exclude.n_rows}")
    kmax = max(recall_ks + ndcg_ks)
    discount = 1.0 / np.log2(np.arange(2, kmax + 2))  # (kmax,)
    ideal = np.cumsum(discount)
    n_t = targets.sizes
    rows = np.flatnonzero(n_t > 0)
    hits_sum = {k: [] for k in recall_ks}
    dcg = {k: [] for k in ndcg_ks}
    chunk = max(1, CHUNK_CELLS // max(n_cols, 1))
    for lo in range(0, n_users, chunk):
        hi = min(n_users, lo + chunk)
        part = slice(lo, hi)
        s = _rankable(scores[part])  # (u, C)
        if exclude is not None:
            a, b = exclude.ptr[lo], exclude.ptr[hi]
            s[np.repeat(np.arange(hi - lo), np.diff(exclude.ptr[lo:hi + 1])), exclude.idx[a:b]] = -np.inf
        best = _best(s, kmax, tie_order)  # (u, kmax')
        hit = _member(targets, lo, hi, n_cols, best).astype(np.float64)
        if hit.shape[1] < kmax:  # fewer candidates than kmax: missing ranks are misses
            hit = np.pad(hit, ((0, 0), (0, kmax - hit.shape[1])))
        for k in recall_ks:
            hits_sum[k].append(hit[:, :k].sum(1))
        for k in ndcg_ks:
            dcg[k].append(hit[:, :k] @ discount[:k])
    if len(rows) == 0:
        empty = {f"{name}@{k}": np.zeros(0) for name, ks in (("recall", recall_ks), ("ndcg", ndcg_ks)) for k in ks}
        return RankingMetrics(0, 0, {k: float("nan") for k in recall_ks}, {k: float("nan") for k in ndcg_ks}, empty, rows)
    per_user = {f"recall@{k}": np.concatenate(hits_sum[k])[rows] / n_t[rows] for k in recall_ks}
    per_user |= {f"ndcg@{k}": np.concatenate(dcg[k])[rows] / ideal[np.minimum(k, n_t[rows]) - 1] for k in ndcg_ks}
    recall = {k: float(np.mean(per_user[f"recall@{k}"])) for k in recall_ks}
    ndcg = {k: float(np.mean(per_user[f"ndcg@{k}"])) for k in ndcg_ks}
    return RankingMetrics(int(len(rows)), int(n_t[rows].sum()), recall, ndcg, per_user, rows)


def timed_ranking_metrics(scores: np.ndarray, answer: np.ndarray, targets: Ragged, exclude: Ragged | None = None,
                          recall_ks: tuple[int, ...] = (10, 20, 50), ndcg_ks: tuple[int, ...] = (10, 20),
                          tie_order: np.ndarray | None = None) -> RankingMetrics:
    """Recall@K and NDCG@K with each target judged in the answer served at its own moment (an answer that changes as
    items arrive): `scores` (A, C) holds one row per answer, `answer` (nnz,) the row that judges each target (aligned
    with targets.idx); `targets` and `exclude` have one row per user.

    A target takes its place among the user's other candidates of its answer (the user's other targets left out,
    excluded columns ranked last, ties by `tie_order`); a target its answer does not hold (-inf, or excluded) is a miss.
    The user's targets are then merged in that order, the j-th (from 0) at its place + j: with every target of a user
    judged on one answer this is ranking_metrics' ranking exactly (for targets with a finite score), so a method whose
    answers never change gets the usual values."""
    scores = _rankable(scores)
    n_cols = scores.shape[1]
    if len(answer) != len(targets.idx):
        raise ValueError(f"{len(answer)} answers for {len(targets.idx)} targets")
    place = np.arange(n_cols) if tie_order is None else _places(tie_order)
    kmax = max(recall_ks + ndcg_ks)
    discount = 1.0 / np.log2(np.arange(2, kmax + 2))  # (kmax,)
    ideal = np.cumsum(discount)
    n_t = targets.sizes
    rows = np.flatnonzero(n_t > 0)
    per_user = {f"recall@{k}": np.zeros(len(rows)) for k in recall_ks} | {f"ndcg@{k}": np.zeros(len(rows)) for k in ndcg_ks}
    for i, u in enumerate(rows):
        cols, ans = targets.row(u), answer[targets.ptr[u]:targets.ptr[u + 1]]
        others = np.ones(n_cols, bool)
        others[cols] = False
        excluded = exclude.row(u) if exclude is not None else np.zeros(0, np.int64)
        others[excluded] = False
        keys = []  # (place among the others, -score, tie place) per target
        for c, a in zip(cols, ans):
            s = scores[a]
            if not np.isfinite(s[c]) or c in excluded:
                continue  # not in the answer: a miss
            ahead = others & ((s > s[c]) | ((s == s[c]) & (place < place[c])))
            keys.append((1 + int(ahead.sum()), -float(s[c]), int(place[c])))
        positions = np.array([k[0] + j for j, k in enumerate(sorted(keys))], np.int64)  # 1-based, merged
        for k in recall_ks:
            per_user[f"recall@{k}"][i] = (positions <= k).sum() / n_t[u]
        for k in ndcg_ks:
            hit = positions[positions <= k]
            per_user[f"ndcg@{k}"][i] = (1.0 / np.log2(hit + 1)).sum() / ideal[min(k, n_t[u]) - 1]
    if len(rows) == 0:
        return RankingMetrics(0, 0, {k: float("nan") for k in recall_ks}, {k: float("nan") for k in ndcg_ks}, per_user, rows)
    recall = {k: float(np.mean(per_user[f"recall@{k}"])) for k in recall_ks}
    ndcg = {k: float(np.mean(per_user[f"ndcg@{k}"])) for k in ndcg_ks}
    return RankingMetrics(int(len(rows)), int(n_t[rows].sum()), recall, ndcg, per_user, rows)
