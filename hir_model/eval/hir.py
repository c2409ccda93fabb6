"""HIR as one more `Method`: window t's published embeddings and frozen encoder, scored by dot product plus an item prior.

Only the item prior's weight is fitted (on window t's own last days, below). `fit` checks that the artefacts are window
t's (the split's) and lines the published `entity_embeddings` up with the split's users and known items; `score` ranks the item space by dot product
(every published row is unit-norm, so this is a cosine) plus the item prior (below):
- Warm users: their published row (embedded at end(t) from their sampled neighbourhood), blended with the unit mean of
  their history's item rows weighted towards their own last events (`recent_weight`; hir_model.eval.readout); the
  score is that query's dot product blended with the interest kernel, a soft maximum of the item's similarity to each
  recent item (`kernel_weight`, `kernel_temp`; readout).
- Cold users, inductively with the frozen window-t encoder and no retraining: one token sequence per user, built
  like the teacher's broad view: the user's own token (deep-hash id code + type, no content) at depth 0; the
  distinct items of their t+1 context (the same context every baseline gets, most recent first, up to fanout[0])
  at depth 1, linked by a `purchase` edge when a context event on the item converted and `click` otherwise, aged
  from the user's last context event; below each known item, its neighbourhood in graph(t) sampled with the
  remaining fanouts at cutoff end(t) (edges aged from the user's last context event too). The fanouts are those of
  the view `entity_embeddings` embedded warm entities with (the checkpoint's trained teacher view), so a cold user's
  tree has the shape of a warm user's, the context standing in for the history. When the encoder reads structural
  encodings (hir_model.graph.structure), graph(t)'s tokens carry theirs, and the user's own token the normalised
  stage-weighted sum of its known context items' encodings: where one more hop of the encoding would place a node
  with those edges (items new in t+1 have none). Nothing of graph(t) is later than end(t), and the context is part of
  the protocol, so nothing else of t+1 enters.
  `cold_users="mean"` uses the normalised weighted mean of the context items' rows instead (a cheaper reference).
  When the encoder reads structural encodings, a cold user's score blends the encoder's vector with the structural
  readout (`cold_structure_weight`): the cosine between the user's place in graph(t) (the stage-weighted unit mean of
  their context items' encodings) and each item's encoding. The encoder loses part of what the encodings hold around a
  new user's first items (README, Evaluation: the readout alone beat the encoder's vector for cold users).
- Items first seen in t+1: the encoder's single-token path (the entity_embeddings asset's cold-start path): id
  code, type `product`, and the item's content vector when the item space carries one of the encoder's width
  (the `content_embeddings` vectors of t+1, the only t+1 side information the protocol allows).
Known items without a published row (none when the asset is complete) take the same single-token path.

The item prior. log p(item | user) = PMI(user, item) + log p(item): an in-batch softmax learns the first term (its
candidates are drawn by popularity; with the logQ correction it is asked for both), but unit-norm rows centred per
type cannot carry the second, a per-item offset (README, Evaluation). So the ranking adds it explicitly, as matrix
factorisation's item bias does: score = u.v + prior_weight * temp * log prior(item), i.e. in the training's logit
units (u.v / temp) plus prior_weight times the log prior. temp is the checkpoint's engagement temperature; prior(item)
the item's decayed engagement in graph(t) at end(t) (`Graph.strength`, the quantity the strength token reads), the
causal forecast of how often window t+1 engages it. Items with none (unengaged by end(t), first seen in t+1) share
one floor, half the smallest prior of an engaged item. A checkpoint without a recorded training config, or artefacts
without graph(t), get no prior. The weight is fitted on window t's own last `calibrate_days` (readout.fit_prior_weight:
held-out Recall@20 of a few candidate weights); `prior_weight` where too few users are held out, or with
`calibrate_days=None`. With the structural readout, cold users take the new users' prior instead (`cold_prior_days`;
readout.new_user_engagement): cold_prior_weight x temp x log of each item's engagements made in their users' first
days, with the same floor rule. Beside the encoder's vector alone it lost (README, Evaluation), so it comes with the
readout only.

The context's event types are not part of `Queries` (only whether an event converted), hence the two edge types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from hir_model.graph.build import GraphConfig
from hir_model.graph.hashing import hash_codes
from hir_model.graph.sampler import ViewConfig, sample
from hir_model.graph.types import SELF_EDGE, SampledBatch
from hir_model.eval.artefacts import WindowArtefacts
from hir_model.eval.cold_tokens import CLICK_EDGE, ITEM_TYPE, PURCHASE_EDGE, ContentLookup, Tokens
from hir_model.eval.readout import PriorCalibration, fit_prior_weight, new_user_engagement, recent_items, warm_scores
from hir_model.eval.split import Interactions, ItemSpace, Queries
from hir_model.nn import collate

US = 1_000_000
GRAPH_WEIGHTS = GraphConfig()  # the stage weights a cold user's context would carry in the graph


@dataclass(frozen=True)
class HIRMethodConfig:
    view: ViewConfig | None = None  # a cold user's tree: fanout[0] context items, graph(t) fanouts below; None: the view
    # warm entities were embedded with (the checkpoint's trained teacher view, as `entity_embeddings` uses)
    compile_bias: bool = False  # compile the dense attention bias (eval batches are few: ~6 s of compiling per process buys little)
    cold_users: str = "encoder"  # "encoder": the frozen encoder on the sequence above; "mean": mean of context rows
    deep_weight: float = 2.0  # "mean" and the recent-items readout: a converted context event weighs this much
    batch_size: int = 32  # sequences per encoder forward
    seed: int = 0  # of the neighbourhood sampler
    prior_weight: float = 1.0  # the item prior's weight in the training's logit units (module docstring); 0: the plain dot
    # product. With calibrate_days, only where the calibration has too few users
    calibrate_days: float | None = 7.0  # fit the prior's weight on window t's last days (hir_model.eval.readout); None: off
    recent_weight: float = 0.7  # a warm user's query: (1 - w) * published row + w * recent items (readout); 0: the row
    recent_half_life_days: float = 2.0  # recency of the recent-items readout, counted back from the user's last event
    kernel_weight: float = 0.7  # a warm user's score: (1 - k) * query.v + k * interest kernel over recent items (readout); 0: off
    kernel_temp: float = 0.1  # the kernel's temperature on cosines (-> 0: the best single recent item; large: their mean)
    cold_structure_weight: float = 0.85  # a cold user's score: (1 - s) * encoder vector.v + s * structural readout; 0: off
    cold_prior_days: float | None = 7.0  # with the structural readout, a cold user's item prior: the new users' (engagements
    # in their first days, readout.new_user_engagement) at cold_prior_weight; None: the prior warm users get
    cold_prior_weight: float = 0.7  # in the training's logit units, like prior_weight
    cold_prior_half_life_days: float = 30.0  # the new users' prior counts engagements decayed from end(t) at this half-life

    def __post_init__(self) -> None:
        if self.cold_users not in ("encoder", "mean"):
            raise ValueError(f"cold_users must be 'encoder' or 'mean', got {self.cold_users!r}")
        shares = {"recent_weight": self.recent_weight, "kernel_weight": self.kernel_weight,
                  "cold_structure_weight": self.cold_structure_weight}
        if not all(0.0 <= v <= 1.0 for v in shares.values()):
            raise ValueError(f"{', '.join(shares)} must be in [0, 1], got {shares}")
        days = self.cold_prior_days
        if self.cold_prior_weight < 0 or self.cold_prior_half_life_days <= 0 or (days is not None and days <= 0):
            raise ValueError(f"cold_prior_weight must be >= 0, cold_prior_half_life_days and cold_prior_days > 0, got "
                             f"{self.cold_prior_weight}, {self.cold_prior_half_life_days}, {self.cold_prior_days}")
        if self.kernel_temp <= 0:
            raise ValueError(f"kernel_temp must be > 0, got {self.kernel_temp}")
        if self.recent_half_life_days <= 0 or (self.calibrate_days is not None and self.calibrate_days <= 0):
            raise ValueError(f"recent_half_life_days and calibrate_days must be > 0, got {self.recent_half_life_days}, "
                             f"{self.calibrate_days}")


class HIR:
    """Window t's HIR artefacts as a ranked method (see the module docstring)."""

    def __init__(self, artefacts: WindowArtefacts, config: HIRMethodConfig = HIRMethodConfig(), name: str = "hir"):
        self.artefacts, self.config, self.name = artefacts, config, name
        encoder = artefacts.model.encoder
        if encoder.cfg.compile_dense_bias != config.compile_bias:  # a runtime knob of the frozen encoder, not a weight
            encoder.cfg = replace(encoder.cfg, compile_dense_bias=config.compile_bias)
        cfg = encoder.cfg
        self.view = config.view or artefacts.view
        self.k, self.buckets, self.content_dim, self.width = cfg.hash_codes, cfg.hash_buckets, cfg.content_dim, cfg.width
        emb = artefacts.embeddings
        self._row = pd.Index(emb.entity_id)
        self._content = ContentLookup(artefacts.graph, artefacts.content, cfg.content_dim)
        self.user_rows: np.ndarray | None = None  # (U,) row of each train user in the embeddings, -1 for none
        self.items: np.ndarray | None = None  # (N, W) item vectors of the last scored item space
        self.prior: np.ndarray | None = None  # (N,) weight x temp x log prior of the same items (None: no prior)
        self._items_key: np.ndarray | None = None  # the ids array `items` was computed for
        self._nodes: tuple[np.ndarray, np.ndarray] | None = None  # (ids array, (N,) graph(t) node of each item) last looked up
        self.cold_encoded = 0  # cold users embedded by the encoder so far (a count for the report)
        self.single_token_items = 0  # items embedded by the single-token path in the last item space
        self._warm_scored: list[np.ndarray] = []  # ids of the warm users scored since the last fit
        self.calibration: PriorCalibration | None = None  # the prior's weight fitted on window t's last days (fit)
        self.cold_prior: np.ndarray | None = None  # (N,) cold users' prior over the last scored item space (None: self.prior)
        self._new_user: np.ndarray | None = None  # (n_items,) train items' engagements by new users (fit; with the readout)

    def fit(self, train: Interactions, items: ItemSpace) -> None:
        a = self.artefacts
        if train.window != a.window or train.end_us != a.end_us:
            raise ValueError(f"{self.name}: artefacts of window {a.window} cannot be evaluated on the split of {train.window}")
        self.user_rows = self._row.get_indexer(train.user_ids).astype(np.int64)
        self.items, self._items_key, self._warm_scored, self.calibration = None, None, [], None
        c = self.config
        self._new_user = (new_user_engagement(train, c.cold_prior_days, c.cold_prior_half_life_days, c.deep_weight)
                          if c.cold_prior_days is not None and self.structural_readout else None)
        if c.calibrate_days is not None and c.prior_weight and self.artefacts.prior_scale and a.graph is not None:
            vectors = self.item_vectors(items)
            self.calibration = fit_prior_weight(train, vectors, lambda cut: self._unit_log_prior(items, cut), c.calibrate_days,
                                                c.recent_half_life_days, c.deep_weight, kernel_weight=c.kernel_weight,
                                                kernel_temp=c.kernel_temp)
            self.items, self._items_key = None, None  # the prior is recomputed with the fitted weight

    def warm_users(self) -> np.ndarray:
        """The distinct warm users scored since the last fit (e.g. for BoM vs exact retrieval on the same users)."""
        return np.unique(np.concatenate(self._warm_scored)) if self._warm_scored else np.zeros(0, object)

    # items -------------------------------------------------------------------------------------------------------
    def item_vectors(self, items: ItemSpace) -> np.ndarray:
        """(N, W): published rows for known items, the single-token path for the rest (cached per item space)."""
        if self._items_key is items.ids and self.items is not None:  # the same item space (run.py scores it in batches)
            return self.items
        emb = self.artefacts.embeddings
        rows = self._row.get_indexer(items.ids)
        rows[items.n_known:] = -1  # first seen in t+1: never a row of t (and no id reuse across windows)
        out = np.zeros((len(items), self.width), np.float32)
        out[rows >= 0] = emb.vectors[rows[rows >= 0]]
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            content, has = self._item_content(items, missing)
            out[missing] = self._single_tokens(items.ids[missing], content, has)
        self.items, self._items_key, self.single_token_items = out, items.ids, len(missing)
        self.prior, self.cold_prior = self._log_prior(items), self._cold_log_prior(items)
        return out

    @property
    def prior_scale(self) -> float:
        """What multiplies log prior(item) in the scores: the prior's weight (fitted on window t's last days, else
        prior_weight) x the checkpoint's temperature (0: no prior)."""
        return self.prior_weight * self.artefacts.prior_scale

    @property
    def prior_weight(self) -> float:
        return self.calibration.weight if self.calibration is not None else self.config.prior_weight

    def item_nodes(self, items: ItemSpace) -> np.ndarray:
        """(N,) graph(t) node of each item of the item space, -1 for none (items first seen in t+1 have none; all when
        there is no graph); looked up once per item space."""
        if self._nodes is not None and self._nodes[0] is items.ids:
            return self._nodes[1]
        node = np.full(len(items), -1, np.int64)
        if self.artefacts.graph is not None and items.n_known:
            node[:items.n_known] = self.artefacts.graph.nodes.index_of(pa.array(list(items.ids[:items.n_known]), pa.string()))
        self._nodes = (items.ids, node)
        return node

    def _log_prior(self, items: ItemSpace) -> np.ndarray | None:
        """(N,) prior_weight x temp x log of each item's decayed engagement in graph(t), or None when the scores take none
        (module docstring)."""
        if self.prior_scale == 0 or self.artefacts.graph is None:
            return None
        unit = self._unit_log_prior(items, self.artefacts.end_us)
        return None if unit is None else (self.prior_weight * unit).astype(np.float32)

    @property
    def structural_readout(self) -> bool:
        """Whether cold users are scored partly on the structural encodings, and so take the new users' prior (module
        docstring): the encoder reads encodings of graph(t) and `cold_structure_weight` > 0."""
        a = self.artefacts
        return bool(self.config.cold_structure_weight and a.model.encoder.cfg.structure_dim and a.graph is not None)

    def _cold_log_prior(self, items: ItemSpace) -> np.ndarray | None:
        """(N,) cold_prior_weight x temp x log of each item's engagements by new users (items with none, and items first
        seen in t+1, at half the smallest), or None when cold users take `self.prior` (no structural readout, no new-user
        prior configured, no prior at all, or no engagement by a new user)."""
        if self._new_user is None or self.prior_scale == 0:
            return None
        counts = np.zeros(len(items))
        counts[:len(self._new_user)] = self._new_user
        unit = self._floored_log(counts)
        return None if unit is None else (self.config.cold_prior_weight * unit).astype(np.float32)

    def _unit_log_prior(self, items: ItemSpace, cutoff_us: int) -> np.ndarray | None:
        """(N,) temp x log of each item's decayed engagement in graph(t) as of `cutoff_us` (<= end(t)), unengaged items at
        the floor; None when no item is engaged."""
        return self._floored_log(self.artefacts.graph.strength_at(self.item_nodes(items), cutoff_us).astype(np.float64))

    def _floored_log(self, engagement: np.ndarray) -> np.ndarray | None:
        """temp x log of each item's engagement, items with none at half the smallest positive one (the module docstring's
        floor); None when no item has any."""
        engaged = engagement > 0
        if not engaged.any():
            return None
        return self.artefacts.prior_scale * np.log(np.where(engaged, engagement, engagement[engaged].min() / 2))

    def _item_content(self, items: ItemSpace, rows: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        if self.content_dim == 0 or items.content is None or items.content.shape[1] != self.content_dim:
            return None, np.zeros(len(rows), bool)
        return items.content[rows], items.has_content[rows]

    def _single_tokens(self, ids: np.ndarray, content: np.ndarray | None, has: np.ndarray) -> np.ndarray:
        b = len(ids)
        batch = SampledBatch(offsets=np.arange(b + 1, dtype=np.int64), seeds=np.full(b, -1, np.int64), node=np.full(b, -1, np.int64),
                             hash_codes=hash_codes(list(ids), self.k, self.buckets), node_type=np.full(b, ITEM_TYPE, np.int64),
                             depth=np.zeros(b, np.int64), ancestors=np.zeros((b, 1), np.int64),
                             edge_type=np.full(b, SELF_EDGE, np.int64), edge_age=np.zeros(b, np.float32),
                             cutoff_us=self.artefacts.end_us, content=content if self.content_dim else None,
                             has_content=has if self.content_dim else None)
        return self._encode(batch)

    # users -------------------------------------------------------------------------------------------------------
    def score(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        if self.user_rows is None:
            raise RuntimeError(f"{self.name}: fit before score")
        item_vectors = self.item_vectors(items)
        users = np.zeros((len(queries), self.width), np.float32)
        rows = np.where(queries.user_index >= 0, self.user_rows[np.maximum(queries.user_index, 0)], -1)
        warm = np.flatnonzero(rows >= 0)
        self._warm_scored.append(queries.user_ids[warm])
        inductive = np.flatnonzero(rows < 0)  # cold users (and a warm user without a row: from their history)
        if len(inductive):
            sub = queries.take(inductive)
            users[inductive] = (recent_items(sub, item_vectors, None, self.config.deep_weight) if self.config.cold_users == "mean"
                                else self.embed_cold(sub, items))
        scores = users @ item_vectors.T
        c = self.config
        structure = self._structure(self.item_nodes(items)) if len(inductive) and self.structural_readout else None
        if structure is not None:  # cold users: the encoder's vector blended with the structural readout (module docstring)
            placed = recent_items(sub, structure, None, c.deep_weight)
            scores[inductive] = (1 - c.cold_structure_weight) * scores[inductive] + c.cold_structure_weight * (placed @ structure.T)
        if len(warm):
            scores[warm] = warm_scores(queries.take(warm), item_vectors, self.artefacts.embeddings.vectors[rows[warm]], c.recent_weight,
                                       c.recent_half_life_days, c.deep_weight, c.kernel_weight, c.kernel_temp)
        if self.prior is not None:
            scores[warm] += self.prior[None, :]
        cold_prior = self.cold_prior if self.cold_prior is not None else self.prior
        if cold_prior is not None:
            scores[inductive] += cold_prior[None, :]
        return scores.astype(np.float32)

    def embed_cold(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        """(Q, W) users embedded by the frozen encoder from their context (see the module docstring)."""
        vectors = [self._encode(self.cold_batch(queries.take(np.arange(lo, min(lo + self.config.batch_size, len(queries)))), items))
                   for lo in range(0, len(queries), self.config.batch_size)]
        self.cold_encoded += len(queries)
        return np.concatenate(vectors) if vectors else np.zeros((0, self.width), np.float32)

    def cold_batch(self, queries: Queries, items: ItemSpace) -> SampledBatch:
        """One sequence per query: user token, its distinct context items, their graph(t) neighbourhoods (BFS order)."""
        a, view = self.artefacts, self.view
        ctx = queries.context
        frame = pd.DataFrame({"q": ctx.row_of, "item": ctx.idx, "ts": queries.context_ts, "deep": queries.context_deep})
        cutoff = frame.groupby("q").ts.max().reindex(np.arange(len(queries))).fillna(a.end_us).to_numpy(np.int64)
        picked = frame.groupby(["q", "item"], sort=False).agg(ts=("ts", "max"), deep=("deep", "any")).reset_index()
        picked = picked.sort_values(["q", "ts", "item"], ascending=[True, False, True], kind="stable")
        picked = picked[picked.groupby("q").cumcount() < view.fanout[0]]
        item = picked["item"].to_numpy(np.int64)
        node = self.item_nodes(items)[item]
        sub = None
        rooted = np.flatnonzero(node >= 0)
        if len(rooted) and len(view.fanout) > 1:
            below = ViewConfig(f"{view.name}_below_context", view.fanout[1:], view.max_age_days, view.edge_drop, view.scan_degree,
                               view.draws_per_slot)
            sub = sample(a.graph, node[rooted], a.end_us, below, np.random.default_rng([self.config.seed, a.end_us, len(queries)]))
        sub_of = np.full(len(item), -1, np.int64)
        sub_of[rooted] = np.arange(len(rooted))
        new_content, new_has = self._item_content(items, item)
        width = len(view.fanout) + 1  # ancestors per token: depths 0 .. len(fanout)

        parts, offsets = [], [0]
        by_query = np.split(np.arange(len(item)), np.cumsum(np.bincount(picked["q"].to_numpy(), minlength=len(queries)))[:-1])
        user_codes = hash_codes(list(queries.user_ids), self.k, self.buckets)
        ts, deep = picked["ts"].to_numpy(np.int64), picked["deep"].to_numpy(bool)
        for q, entries in enumerate(by_query):
            shift = (cutoff[q] - a.end_us) / US  # seconds from end(t) to the user's last context event
            toks = [Tokens.seed(user_codes[q], width, self.content_dim)]
            base = 1
            for e in entries:
                if sub_of[e] >= 0:
                    s = sub_of[e]
                    lo, hi = sub.offsets[s], sub.offsets[s + 1]
                    content, has = self._content.of_nodes(sub.node[lo:hi])
                    t = Tokens.grafted(sub, lo, hi, base, width, content, has, shift)
                else:  # an item first seen in t+1 (or unknown to graph(t)): a leaf
                    codes = hash_codes([items.ids[item[e]]], self.k, self.buckets)
                    c = new_content[e:e + 1] if new_content is not None else np.zeros((1, self.content_dim), np.float32)
                    t = Tokens.leaf(codes, base, width, c, new_has[e:e + 1])
                t.edge_type[0] = PURCHASE_EDGE if deep[e] else CLICK_EDGE
                t.edge_age[0] = (cutoff[q] - ts[e]) / US
                toks.append(t)
                base += len(t.depth)
            parts.append(Tokens.concat(toks).bfs())
            offsets.append(offsets[-1] + base)
        seq = Tokens.concat(parts)
        strength = a.graph.strength_at(seq.node, a.end_us) if a.graph is not None else np.zeros(len(seq.node), np.float32)
        # the user's own token: the engagement weight of its context, as the graph would hold it (stage weights, undecayed)
        stage = np.where(queries.context_deep, GRAPH_WEIGHTS.purchase, GRAPH_WEIGHTS.click)
        strength[np.asarray(offsets[:-1], np.int64)] = np.bincount(ctx.row_of, weights=stage, minlength=len(queries))
        return SampledBatch(offsets=np.asarray(offsets, np.int64), seeds=np.full(len(queries), -1, np.int64), node=seq.node,
                            hash_codes=seq.codes, node_type=seq.node_type, depth=seq.depth, ancestors=seq.ancestors,
                            edge_type=seq.edge_type, edge_age=seq.edge_age.astype(np.float32), cutoff_us=a.end_us,
                            content=seq.content if self.content_dim else None, has_content=seq.has if self.content_dim else None,
                            strength=strength, structure=self._cold_structure(seq.node, offsets, queries, items))

    def _cold_structure(self, node: np.ndarray, offsets: list[int], queries: Queries, items: ItemSpace) -> np.ndarray | None:
        """`_structure` of a cold batch's tokens, the users' own tokens placed in graph(t) the way the encoding places any
        node: the normalised sum of its neighbours' encodings (its context items known to graph(t), stage-weighted)."""
        out = self._structure(node)
        if out is None or self.artefacts.graph is None:
            return out
        ctx = queries.context
        item_node = self.item_nodes(items)[ctx.idx]
        stage = np.where(queries.context_deep, GRAPH_WEIGHTS.purchase, GRAPH_WEIGHTS.click)
        user = np.zeros((len(queries), out.shape[1]))
        np.add.at(user, ctx.row_of, stage[:, None] * self._structure(item_node))
        norm = np.linalg.norm(user, axis=1, keepdims=True)
        out[np.asarray(offsets[:-1], np.int64)] = np.divide(user, norm, out=np.zeros_like(user), where=norm > 0)
        return out

    def _structure(self, node: np.ndarray) -> np.ndarray | None:
        """(T, S) structural encodings of graph(t) nodes (-1, the cold user's own token and items new in t+1: zeros), when
        the encoder reads them; None otherwise."""
        dim, graph = self.artefacts.model.encoder.cfg.structure_dim, self.artefacts.graph
        if not dim:
            return None
        if graph is None:
            return np.zeros((len(node), dim), np.float32)
        return graph.structure_at(node, self.artefacts.end_us, dim)

    @torch.inference_mode()
    def _encode(self, batch: SampledBatch) -> np.ndarray:
        """(B, W) unit vectors of the batch's seed tokens, in slices of `batch_size` sequences."""
        model, step = self.artefacts.model, max(self.config.batch_size, 1)
        out = []
        for lo in range(0, batch.num_sequences, step):
            hi = min(lo + step, batch.num_sequences)
            a, b = batch.offsets[lo], batch.offsets[hi]
            part = SampledBatch(batch.offsets[lo:hi + 1] - a, batch.seeds[lo:hi], batch.node[a:b], batch.hash_codes[a:b],
                                batch.node_type[a:b], batch.depth[a:b], batch.ancestors[a:b], batch.edge_type[a:b],
                                batch.edge_age[a:b], batch.cutoff_us, None if batch.content is None else batch.content[a:b],
                                None if batch.has_content is None else batch.has_content[a:b],
                                None if batch.strength is None else batch.strength[a:b],
                                None if batch.structure is None else batch.structure[a:b])
            out.append(model.encoder(collate(part), model.global_tokens).float().cpu().numpy())  # (b, W)
        return np.concatenate(out) if out else np.zeros((0, self.width), np.float32)
