"""HIR's ranking head: the one function that turns window t's representation into scores for a user.

Everything that ranks HIR calls `head_scores`: `hir retrieve`, `hir serve`, the Python API (hir_model.rank.recommender),
the BoM recall check and the evaluation's `hir`, `hir_exact` and `hir_embeddings` rows. Its inputs are the window's
published head state (hir_model.rank.state): the items' vectors and priors, the fitted weights, each user's history.

- Warm users (a history before end(t)). The query is (1 - recent_weight) x their published row + recent_weight x the
  unit mean of their history's item vectors, each event weighted by its stage (a conversion counts `deep_weight` times)
  and by 2^(-age / half-life), age counted back from the user's own last event: long-run interests plus the last
  session (PinnerSage / PinnerFormer's long- plus short-term user). The score is (1 - kernel_weight) x query.v +
  kernel_weight x the interest kernel, temp x log sum_c w_c exp(v_c.v / temp) over the user's distinct recent items
  c: a soft maximum of the item's similarity to each of them, so a user with two interests is not matched halfway.
- Cold users (no history; a context of events). Their vector is the frozen encoder's reading of the context over
  graph(t) (hir_model.rank.inductive). Where the encoder reads structural encodings the score blends it with the
  structural readout: (1 - cold_structure_weight) x vector.v + cold_structure_weight x the cosine between the user's
  place in graph(t) (the stage-weighted unit mean of its context items' encodings) and each item's encoding.
- The item prior. log p(item | user) = PMI + log p(item); unit-norm rows carry the first, so the head adds the second
  as matrix factorisation's item bias: prior_weight x temp x log prior(item), temp the checkpoint's engagement
  temperature, prior(item) its decayed engagement in graph(t) (or, with `prior_half_life_days`, in window t's history).
  Cold users take the new users' prior instead (the engagements made in their users' first days) where the structural
  readout applies; elsewhere their score has the rows' form (a vector's dot product) and takes the rows' prior weight.
  Weights and priors are fitted at end(t) (hir_model.rank.fit).
- Co-engagement. Warm users add coengagement_weight x their history's recency-weighted item-to-item co-engagement with
  the item (hir_model.rank.coengagement): what the sequence says and the vectors carry only in part. Its weight, like
  the prior's, comes from the earlier heads' track record (hir_model.rank.track).
- Content, for items first seen after end(t). Such an item has no prior and no co-engagement, and its vector is placed
  from its content neighbours' rows (hir_model.embed.content_map); every user adds content_weight x the cosine between
  the item's content vector and the user's content profile (the stage-weighted unit mean of its context items' content
  vectors, as content kNN reads a user): what content says directly, beside where the metric space puts it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import scipy.sparse as sp

from hir_model.protocol.method import context_weights
from hir_model.protocol.split import Queries
from hir_model.rank.coengagement import coengagement_at, context_matrix


KERNEL_TILE = 4096  # item columns of the interest kernel's soft maximum at once (its (C, tile) temporaries stay in cache)
FLAT_COLUMNS = 64  # at most this many item columns: the kernel over every query at once (an audience's few items), not a
# loop over queries; the same values to float32 rounding

@dataclass(frozen=True)
class HeadConfig:
    deep_weight: float = 2.0  # a converted event weighs this much in the recent items, the kernel and the priors
    recent_weight: float = 0.7  # a warm user's query: (1 - w) x published row + w x recent items; 0: the row
    recent_half_life_days: float = 2.0  # recency of the recent items, counted back from the user's last event
    kernel_weight: float = 0.7  # a warm user's score: (1 - k) x query.v + k x interest kernel; 0: off
    kernel_temp: float = 0.1  # the kernel's temperature on cosines (-> 0: the best single recent item; large: their mean)
    kernel_min_share: float = 1e-3  # recent items below this share of the user's heaviest are left out of the kernel
    cold_structure_weight: float = 0.85  # a cold user's score: (1 - s) x encoder vector.v + s x structural readout; 0: off
    prior_half_life_days: float | None = None  # the item prior: window t's engagements decayed at this half-life from the
    # cutoff (1 per event, deep_weight per conversion); None: the items' decayed strength in graph(t)
    prior_weight: float = 1.0  # the item prior's weight in the training's logit units; where calibration fits none
    rows_prior_weight: float | None = None  # its weight beside the published rows alone until the track record has
    # evidence (None: the head's; the held-out fit judges only the recent-items part, the rows have seen its days)
    calibrate_days: float | None = 7.0  # fit the prior's weight on window t's last days (hir_model.rank.fit); None: off
    track_min_users: int | None = 100  # once earlier heads' track records (hir_model.rank.track) hold this many judged
    # users, the prior's weights come from them instead of the held-out fit; None: the fit only
    rows_track_min_users: int | None = 20  # the rows' own weight (one of 11, the full score's pair one of 88) comes from
    # the track once it holds this many judged users; None: at track_min_users
    cold_prior_days: float | None = 7.0  # cold users' prior: engagements in their users' first days; None: the warm prior
    cold_prior_weight: float = 0.7  # in the training's logit units, like prior_weight
    cold_prior_half_life_days: float = 30.0  # the new users' prior decays engagements from end(t) at this half-life
    coengagement: bool = True  # warm users' co-engagement with their recent items (hir_model.rank.coengagement); False: off
    coengagement_weight: float = 16.0  # its weight until the earlier heads' track record chooses one; 0: none till then
    coengagement_half_life_days: float | None = 7.0  # a history event's weight in it halves every this many days
    content_weight: float = 1.0  # items first seen after end(t): + this x cosine(user's content profile, item's content)
    # (1: the score and content kNN's in equal shares; decided on decision world 4 at medium, docs/decisions.md); 0: off

    def __post_init__(self) -> None:
        shares = {"recent_weight": self.recent_weight, "kernel_weight": self.kernel_weight,
                  "cold_structure_weight": self.cold_structure_weight}
        if not all(0.0 <= v <= 1.0 for v in shares.values()):
            raise ValueError(f"{', '.join(shares)} must be in [0, 1], got {shares}")
        positive = {"kernel_temp": self.kernel_temp, "recent_half_life_days": self.recent_half_life_days,
                    "cold_prior_half_life_days": self.cold_prior_half_life_days, "calibrate_days": self.calibrate_days,
                    "prior_half_life_days": self.prior_half_life_days, "cold_prior_days": self.cold_prior_days,
                    "coengagement_half_life_days": self.coengagement_half_life_days}
        if any(v is not None and v <= 0 for v in positive.values()):
            raise ValueError(f"{', '.join(positive)} must be > 0 (or None where optional), got {positive}")
        for name in ("track_min_users", "rows_track_min_users"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or None), got {getattr(self, name)}")
        weights = {"prior_weight": self.prior_weight, "rows_prior_weight": self.rows_prior_weight,
                   "cold_prior_weight": self.cold_prior_weight, "coengagement_weight": self.coengagement_weight,
                   "content_weight": self.content_weight}
        if any(v is not None and v < 0 for v in weights.values()) or self.deep_weight <= 0:
            raise ValueError(f"{', '.join(weights)} must be >= 0 and deep_weight > 0, got {weights}, {self.deep_weight}")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict) -> HeadConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def embeddings_only(self) -> HeadConfig:
        """What the learned representation carries: published rows (encoder vectors for cold users) plus the item prior,
        no recent items, no kernel, no co-engagement, no structural readout, no content term, the warm prior for everyone."""
        return replace(self, recent_weight=0.0, kernel_weight=0.0, cold_structure_weight=0.0, cold_prior_days=None,
                       coengagement=False, content_weight=0.0)


@dataclass(frozen=True)
class ItemSide:
    """What the head reads of the items it ranks (rows aligned with the queries' context indices)."""

    vectors: np.ndarray  # (N, W) float32 unit rows in the window's metric space
    prior: np.ndarray | None  # (N,) float32 the warm users' prior term, weight x temp x log prior (None: no prior)
    cold_prior: np.ndarray | None  # (N,) float32 the cold users' prior term (None: they take `prior`)
    structure: np.ndarray | None  # (N, S) structural encodings (None: no structural readout)
    coengagement: sp.csr_matrix | None = None  # (N, N) weight x item-to-item co-engagement (None: no such term)
    content: np.ndarray | None = None  # (N, C) float32 unit content vectors, zero rows for none (None: no content term)
    fresh: np.ndarray | None = None  # (N,) bool items first seen after end(t): the content term's items
    content_weight: float = 0.0

    def __len__(self) -> int:
        return len(self.vectors)


def content_scores(queries: Queries, items: ItemSide, deep_weight: float, columns: np.ndarray | None = None,
                   profile: np.ndarray | None = None) -> np.ndarray | None:
    """(Q, C) content_weight x cosine(each query's content profile, each fresh item's content) over the item rows
    `columns` (None: all), zero for items not fresh; None when the item side has no content term or no fresh column.
    `profile`: the queries' content profiles, when already made (UserTerms)."""
    if items.content is None or items.fresh is None or not items.content_weight:
        return None
    fresh = items.fresh if columns is None else items.fresh[columns]
    if not fresh.any():
        return None
    at = np.flatnonzero(fresh) if columns is None else np.asarray(columns)[fresh]
    if profile is None:
        profile = recent_items(queries, items.content, None, deep_weight)  # (Q, C) unit, zero without content
    out = np.zeros((len(queries), len(fresh)), np.float32)
    out[:, fresh] = items.content_weight * (profile @ items.content[at].T)
    return out


def recent_items(queries: Queries, item_vectors: np.ndarray, half_life_days: float | None, deep_weight: float) -> np.ndarray:
    """(Q, W) unit rows: each query's context item vectors weighted by stage and recency (None: no recency); zero for a
    query without context."""
    ctx = queries.context
    w = context_weights(queries, half_life_days, deep_weight)
    # (Q, N) each query's summed weight per item, times the item rows: np.add.at's sum without an (events x W) copy
    weights = sp.csr_matrix((w, (ctx.row_of, ctx.idx)), shape=(len(queries), len(item_vectors)))
    out = np.asarray(weights @ item_vectors, np.float64)
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return np.divide(out, norm, out=np.zeros_like(out), where=norm > 0).astype(np.float32)


def kernel_items(queries: Queries, half_life_days: float | None, deep_weight: float,
                 min_share: float = 1e-3) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query, (distinct recent items, their weights summing to 1) as the interest kernel reads them, heaviest first;
    items below `min_share` of the query's heaviest are left out."""
    ctx = queries.context
    w = context_weights(queries, half_life_days, deep_weight)
    out = []
    for q in range(len(queries)):
        lo, hi = ctx.ptr[q], ctx.ptr[q + 1]
        if hi == lo:
            out.append((np.zeros(0, np.int64), np.zeros(0)))
            continue
        items, inverse = np.unique(ctx.idx[lo:hi], return_inverse=True)
        weight = np.bincount(inverse, weights=w[lo:hi])
        keep = weight >= min_share * weight.max()
        items, weight = items[keep], weight[keep] / weight[keep].sum()
        order = np.argsort(-weight, kind="stable")
        out.append((items[order], weight[order]))
    return out


def interest_kernel(queries: Queries, item_vectors: np.ndarray, half_life_days: float | None, deep_weight: float,
                    temp: float, min_share: float = 1e-3, columns: np.ndarray | None = None,
                    plan: KernelPlan | None = None) -> np.ndarray:
    """(Q, C) temp x log sum_c w_c exp(v_c . v_i / temp) over each query's kernel items c (`kernel_items`) and the item
    rows `columns` (None: every item). Zero without context. `plan`: these queries' kernel_plan, when already made."""
    target = item_vectors if columns is None else item_vectors[columns]
    if columns is not None and len(columns) <= FLAT_COLUMNS:
        plan = plan or kernel_plan(queries, len(item_vectors), half_life_days, deep_weight, min_share)
        return _flat_kernel(plan, item_vectors, target, temp)
    out = np.zeros((len(queries), len(target)), np.float32)
    for q, (items, weight) in enumerate(kernel_items(queries, half_life_days, deep_weight, min_share)):
        if not len(items):
            continue
        sims = item_vectors[items] @ target.T  # (C, N) one product per query, as scored everywhere (BLAS sums by shape)
        for lo in range(0, sims.shape[1], KERNEL_TILE):  # the soft maximum column by column, a cache-sized tile at a time
            part = sims[:, lo:lo + KERNEL_TILE]
            top = part.max(0)
            out[q, lo:lo + KERNEL_TILE] = temp * np.log((weight[:, None] * np.exp((part - top) / temp)).sum(0)) + top
    return out


@dataclass(frozen=True)
class KernelPlan:
    """kernel_items' selection for every query at once, as flat arrays: the kept (query, item) pairs sorted by query,
    their weights summing to 1 per query; what the flat kernel reads (computed once per user batch by UserTerms)."""

    n_queries: int
    item: np.ndarray  # (K,) item rows
    weight: np.ndarray  # (K,)
    present: np.ndarray  # (P,) the queries with kept items, ascending
    starts: np.ndarray  # (P,) each one's first pair
    sizes: np.ndarray  # (P,) its pairs


def kernel_plan(queries: Queries, n_items: int, half_life_days: float | None, deep_weight: float,
                min_share: float) -> KernelPlan:
    ctx, nq = queries.context, len(queries)
    if not len(ctx.idx):
        empty = np.zeros(0, np.int64)
        return KernelPlan(nq, empty, np.zeros(0), empty, empty, empty)
    key, inverse = np.unique(ctx.row_of.astype(np.int64) * n_items + ctx.idx, return_inverse=True)  # distinct (query, item)
    weight = np.bincount(inverse.reshape(-1), weights=context_weights(queries, half_life_days, deep_weight))
    row, item = key // n_items, key % n_items  # sorted by query: each query's items are one segment
    present, starts = np.unique(row, return_index=True)
    heaviest = np.maximum.reduceat(weight, starts)
    keep = weight >= min_share * np.repeat(heaviest, np.diff(np.r_[starts, len(row)]))
    row, item, weight = row[keep], item[keep], weight[keep]
    present, starts = np.unique(row, return_index=True)
    sizes = np.diff(np.r_[starts, len(row)])
    return KernelPlan(nq, item, weight / np.repeat(np.add.reduceat(weight, starts), sizes), present, starts, sizes)


def _flat_kernel(plan: KernelPlan, item_vectors: np.ndarray, target: np.ndarray, temp: float) -> np.ndarray:
    """interest_kernel over a few target rows (C, W) for every query at once (kernel_plan's pairs), the soft maximum
    reduced per query."""
    out = np.zeros((plan.n_queries, len(target)), np.float32)
    if not len(plan.item):
        return out
    sims = item_vectors[plan.item] @ target.T  # (K, C) every kept (query, item)'s cosine with the targets
    top = np.maximum.reduceat(sims, plan.starts, axis=0)  # (P, C) per query present
    acc = np.add.reduceat(plan.weight[:, None] * np.exp((sims - np.repeat(top, plan.sizes, axis=0)) / temp), plan.starts,
                          axis=0)
    out[plan.present] = temp * np.log(acc) + top
    return out


def interest_kernel_at(queries: Queries, item_vectors: np.ndarray, half_life_days: float | None, deep_weight: float,
                       temp: float, min_share: float, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(P,) float32 interest_kernel(...)[q, c] (every item a column): each query's product over every item as there (so
    the same values), the soft maximum only at its cells (q, c)."""
    out = np.zeros(len(q), np.float32)
    order = np.argsort(q, kind="stable")
    bounds = np.searchsorted(q[order], np.arange(len(queries) + 1))
    for i, (items, weight) in enumerate(kernel_items(queries, half_life_days, deep_weight, min_share)):
        at = order[bounds[i]:bounds[i + 1]]
        if not len(items) or not len(at):
            continue
        part = (item_vectors[items] @ item_vectors.T)[:, c[at]]  # (C, cells)
        top = part.max(0)
        out[at] = temp * np.log((weight[:, None] * np.exp((part - top) / temp)).sum(0)) + top
    return out


def warm_query(queries: Queries, item_vectors: np.ndarray, rows: np.ndarray | None, config: HeadConfig) -> np.ndarray:
    """(Q, W) a warm user's query: (1 - recent_weight) x row + recent_weight x recent items (rows None: recent items)."""
    if rows is not None and not config.recent_weight:
        return rows
    recent = recent_items(queries, item_vectors, config.recent_half_life_days, config.deep_weight)
    return recent if rows is None else (1 - config.recent_weight) * rows + config.recent_weight * recent


def warm_scores(queries: Queries, item_vectors: np.ndarray, rows: np.ndarray | None, config: HeadConfig,
                columns: np.ndarray | None = None, query: np.ndarray | None = None,
                plan: KernelPlan | None = None) -> np.ndarray:
    """(Q, C) a warm user's score before the prior (module docstring) over item rows `columns` (None: all). rows: (Q, W)
    the users' published rows, or None for the recent-items part alone (the calibration's: rows have seen its days);
    `query` / `plan`: their warm_query / kernel_plan, when already made (UserTerms)."""
    target = item_vectors if columns is None else item_vectors[columns]
    query = warm_query(queries, item_vectors, rows, config) if query is None else query
    out = (1 - config.kernel_weight) * (query @ target.T)
    if config.kernel_weight:
        out += config.kernel_weight * interest_kernel(queries, item_vectors, config.recent_half_life_days, config.deep_weight,
                                                      config.kernel_temp, config.kernel_min_share, columns, plan)
    return out


@dataclass(frozen=True)
class UserTerms:
    """What head_scores computes of a batch of users alone, whatever the items (made once by `user_terms`, then scored
    over any columns by `scores`): an audience scores the same users over many entities."""

    queries: Queries
    warm: np.ndarray  # (Q,) bool
    hot: np.ndarray  # the warm queries' indices
    cold: np.ndarray  # the cold ones'
    hot_queries: Queries | None
    warm_query: np.ndarray | None  # (H, W) warm_query of the warm ones
    plan: KernelPlan | None  # the warm ones' kernel_plan (the kernel on a few columns)
    context: sp.csr_matrix | None  # (H, N) the warm ones' context_matrix (co-engagement: context @ similarity)
    cold_vectors: np.ndarray | None  # (C, W)
    placed: np.ndarray | None  # (C, S) the cold ones' structural readout
    profile: np.ndarray | None  # (Q, D) every query's content profile (the content term of fresh items)


def user_terms(queries: Queries, items: ItemSide, config: HeadConfig, rows: np.ndarray | None, warm: np.ndarray,
               cold_vectors: np.ndarray | None) -> UserTerms:
    """head_scores' per-user part (arguments as head_scores takes them)."""
    hot, cold = np.flatnonzero(warm), np.flatnonzero(~warm)
    sub = wq = plan = context = vectors = placed = profile = None
    if len(hot):
        sub = queries.take(hot)
        wq = warm_query(sub, items.vectors, rows[hot], config)
        if config.kernel_weight:
            plan = kernel_plan(sub, len(items.vectors), config.recent_half_life_days, config.deep_weight,
                               config.kernel_min_share)
        if items.coengagement is not None:
            context = context_matrix(sub, items.coengagement.shape[0], config.coengagement_half_life_days,
                                     config.deep_weight)
    if len(cold):
        if cold_vectors is None:
            raise ValueError("cold queries need their encoder vectors")
        vectors = cold_vectors[cold]
        if items.structure is not None and config.cold_structure_weight:
            placed = recent_items(queries.take(cold), items.structure, None, config.deep_weight)
    if items.content is not None and items.fresh is not None and items.content_weight and items.fresh.any():
        profile = recent_items(queries, items.content, None, config.deep_weight)  # (Q, D) unit, zero without content
    return UserTerms(queries, np.asarray(warm, bool), hot, cold, sub, wq, plan, context, vectors, placed, profile)


def scores(terms: UserTerms, items: ItemSide, config: HeadConfig, columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) float32 head_scores of `terms`' users over the item rows `columns` (None: all)."""
    cols = slice(None) if columns is None else columns
    n = len(items) if columns is None else len(columns)
    out = np.zeros((len(terms.queries), n), np.float32)
    hot, cold = terms.hot, terms.cold
    if len(hot):
        out[hot] = warm_scores(terms.hot_queries, items.vectors, None, config, columns, terms.warm_query, terms.plan)
        if items.prior is not None:
            out[hot] += items.prior[cols][None, :]
        if terms.context is not None:
            sim = items.coengagement if columns is None else items.coengagement[:, columns]
            out[hot] += (terms.context @ sim).toarray().astype(np.float32)
    if len(cold):
        cold_part = terms.cold_vectors @ items.vectors[cols].T
        if terms.placed is not None:
            s = config.cold_structure_weight
            cold_part = (1 - s) * cold_part + s * (terms.placed @ items.structure[cols].T)
        out[cold] = cold_part
        prior = items.cold_prior if items.cold_prior is not None else items.prior
        if prior is not None:
            out[cold] += prior[cols][None, :]
    if terms.profile is not None:
        fresh = content_scores(terms.queries, items, config.deep_weight, columns, terms.profile)
        if fresh is not None:
            out += fresh
    return out


def head_scores(queries: Queries, items: ItemSide, config: HeadConfig, rows: np.ndarray | None, warm: np.ndarray,
                cold_vectors: np.ndarray | None, columns: np.ndarray | None = None) -> np.ndarray:
    """(Q, C) float32 scores of every query over the item rows `columns` (None: all).

    queries: context indices are rows of `items`; warm: (Q,) bool, a user with a history (its context) and a published
    row in `rows` (Q, W); the others are cold, `cold_vectors` (Q, W) their encoder vectors (rows of warm queries unused)."""
    return scores(user_terms(queries, items, config, rows, warm, cold_vectors), items, config, columns)


def head_scores_at(queries: Queries, items: ItemSide, config: HeadConfig, rows: np.ndarray | None, warm: np.ndarray,
                   cold_vectors: np.ndarray | None, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(P,) float32 head_scores(queries, items, config, rows, warm, cold_vectors)[q, c]: the same products and the same
    float32 steps, the interest kernel's soft maximum only at the cells asked for (a few items of each query, not all)."""
    out = np.zeros(len(q), np.float32)
    hot, cold = np.flatnonzero(warm), np.flatnonzero(~warm)
    on_hot = warm[q]
    if len(hot) and on_hot.any():
        sub, cells = queries.take(hot), np.flatnonzero(on_hot)
        hq, hc = np.searchsorted(hot, q[cells]), c[cells]  # the cells' rows among the warm queries
        vals = (1 - config.kernel_weight) * (warm_query(sub, items.vectors, rows[hot], config) @ items.vectors.T)[hq, hc]
        if config.kernel_weight:
            vals += config.kernel_weight * interest_kernel_at(sub, items.vectors, config.recent_half_life_days,
                                                              config.deep_weight, config.kernel_temp,
                                                              config.kernel_min_share, hq, hc)
        if items.prior is not None:
            vals += items.prior[hc]
        if items.coengagement is not None:
            vals += coengagement_at(sub, items.coengagement, config.coengagement_half_life_days, config.deep_weight, hq, hc)
        out[cells] = vals
    if len(cold) and (~on_hot).any():
        cells = np.flatnonzero(~on_hot)
        out[cells] = head_scores(queries.take(cold), items, config, None, np.zeros(len(cold), bool),
                                 cold_vectors[cold])[np.searchsorted(cold, q[cells]), c[cells]]
    if items.fresh is not None and (cells := np.flatnonzero(items.fresh[c] & warm[q])).size:  # cold cells have theirs
        fresh = content_scores(queries, items, config.deep_weight)  # (Q, N): the products head_scores takes
        if fresh is not None:
            out[cells] += fresh[q[cells], c[cells]]
    return out
