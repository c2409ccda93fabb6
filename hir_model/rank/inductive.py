"""What window t's frozen encoder says about what it never embedded: cold users from their context, and items without a
published row (first seen after end(t)), inductively, with no retraining.

- Cold users: one token sequence per user, built like the teacher's broad view: the user's own token (deep-hash id code
  + type, no content) at depth 0; the distinct items of their context (most recent first, up to fanout[0]) at depth 1,
  linked by a `purchase` edge when a context event on the item converted and `click` otherwise, aged from the user's
  last context event; below each item known to graph(t), its neighbourhood sampled with the remaining fanouts at
  cutoff end(t). The fanouts are those of the view `entity_embeddings` embedded warm entities with, so a cold user's
  tree has the shape of a warm user's, the context standing in for the history. When the encoder reads structural
  encodings, graph(t)'s tokens carry theirs and the user's own token the normalised stage-weighted sum of its known
  context items' encodings. Nothing of graph(t) is later than end(t).
- Items without a row: placed by their content among window t's warm products (hir_model.embed.content_map), as
  `entity_embeddings` places its cold-start products; items without content (or with `new_items = "encoder"`) take
  the single-token path (id code, type `product`, content vector when the item space carries one of the encoder's width).
The context's event types are not part of `Queries` (only whether an event converted), hence the two edge types.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from hir_model.embed.content_map import RIDGE, check_path, fit_placer
from hir_model.graph.build import GraphConfig
from hir_model.graph.hashing import hash_codes
from hir_model.graph.sampler import ViewConfig, sample
from hir_model.graph.types import SELF_EDGE, SampledBatch
from hir_model.nn import collate
from hir_model.protocol.split import ItemSpace, Queries
from hir_model.rank.artefacts import WindowArtefacts
from hir_model.rank.cold_tokens import CLICK_EDGE, ITEM_TYPE, PURCHASE_EDGE, ContentLookup, Tokens

US = 1_000_000
GRAPH_WEIGHTS = GraphConfig()  # the stage weights a cold user's context would carry in the graph


@dataclass(frozen=True)
class InductiveConfig:
    view: ViewConfig | None = None  # a cold user's tree; None: the view warm entities were embedded with (the checkpoint's)
    compile_bias: bool = False  # compile the dense attention bias (few batches: compiling buys little)
    batch_size: int = 32  # sequences per encoder forward
    seed: int = 0  # of the neighbourhood sampler
    new_items: str = "neighbours"  # items without a row, with content: "neighbours" or "content_map" (placed from window
    # t's warm products, hir_model.embed.content_map) or "encoder" (the single token, as items without content)
    content_map_ridge: float = RIDGE

    def __post_init__(self) -> None:
        check_path(self.new_items, "InductiveConfig")


class InductiveEncoder:
    """Window t's frozen encoder over graph(t), for cold users and items without a published row (module docstring)."""

    def __init__(self, artefacts: WindowArtefacts, config: InductiveConfig = InductiveConfig()):
        self.artefacts, self.config = artefacts, config
        encoder = artefacts.model.encoder
        if encoder.cfg.compile_dense_bias != config.compile_bias:  # a runtime knob of the frozen encoder, not a weight
            encoder.cfg = replace(encoder.cfg, compile_dense_bias=config.compile_bias)
        cfg = encoder.cfg
        self.view = config.view or artefacts.view
        self.k, self.buckets, self.content_dim, self.width = cfg.hash_codes, cfg.hash_buckets, cfg.content_dim, cfg.width
        self._row = pd.Index(artefacts.embeddings.entity_id)
        self._content = ContentLookup(artefacts.graph, artefacts.content, cfg.content_dim)
        self._nodes: tuple[np.ndarray, np.ndarray] | None = None  # (ids array, (N,) graph(t) node of each item) last looked up
        self.cold_encoded = 0  # cold users embedded so far (a count for the report)
        self.single_token_items = 0  # items embedded by the single-token path in the last item_vectors call

    @property
    def reads_structure(self) -> bool:
        """Whether the encoder reads structural encodings of graph(t) (the cold users' structural readout needs them)."""
        return bool(self.artefacts.model.encoder.cfg.structure_dim and self.artefacts.graph is not None)

    def item_vectors(self, items: ItemSpace) -> np.ndarray:
        """(N, W): published rows for items known by end(t), the single-token path for the rest."""
        rows = self._row.get_indexer(items.ids)
        rows[items.n_known:] = -1  # first seen after t: never a row of t (and no id reuse across windows)
        out = np.zeros((len(items), self.width), np.float32)
        out[rows >= 0] = self.artefacts.embeddings.vectors[rows[rows >= 0]]
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            content, has = self._item_content(items, missing)
            out[missing] = self._single_tokens(items.ids[missing], content, has)
            placer = self.placer if content is not None else None
            if placer is not None and has.any():
                out[missing[has]] = placer(content[has])
        self.single_token_items = len(missing)
        return out

    @functools.cached_property
    def placer(self):
        """`fit_placer` of the configured path over window t's published rows and content table, fitted once; None:
        no fit (the single token)."""
        table = self.artefacts.content
        if table is None or self.content_dim == 0:
            return None
        return fit_placer(self.config.new_items, self.artefacts.embeddings, table, self.config.content_map_ridge)

    def item_nodes(self, items: ItemSpace) -> np.ndarray:
        """(N,) graph(t) node of each item, -1 for none (items first seen after t; all without a graph)."""
        if self._nodes is not None and self._nodes[0] is items.ids:
            return self._nodes[1]
        node = np.full(len(items), -1, np.int64)
        if self.artefacts.graph is not None and items.n_known:
            node[:items.n_known] = self.artefacts.graph.nodes.index_of(pa.array(list(items.ids[:items.n_known]), pa.string()))
        self._nodes = (items.ids, node)
        return node

    def item_structure(self, items: ItemSpace) -> np.ndarray | None:
        """(N, S) the items' structural encodings in graph(t) (zeros for items outside it); None when not read."""
        return self._structure(self.item_nodes(items)) if self.reads_structure else None

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

    def embed_cold(self, queries: Queries, items: ItemSpace) -> np.ndarray:
        """(Q, W) users embedded by the frozen encoder from their context (see the module docstring)."""
        step = self.config.batch_size
        vectors = [self._encode(self.cold_batch(queries.take(np.arange(lo, min(lo + step, len(queries)))), items))
                   for lo in range(0, len(queries), step)]
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
        below = None
        if len(view.fanout) > 1:
            below = ViewConfig(f"{view.name}_below_context", view.fanout[1:], view.max_age_days, view.edge_drop, view.scan_degree,
                               view.draws_per_slot)
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
            rooted = entries[node[entries] >= 0] if below is not None else entries[:0]
            sub = None
            if len(rooted):  # sampled per user, so a user's tree does not depend on who shares its batch
                rng = np.random.default_rng([self.config.seed, a.end_us, zlib.crc32(str(queries.user_ids[q]).encode())])
                sub = sample(a.graph, node[rooted], a.end_us, below, rng)
            sub_of = dict(zip(rooted.tolist(), range(len(rooted))))
            for e in entries:
                if e in sub_of:
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
            part = batch.take_tokens(slice(a, b), offsets=batch.offsets[lo:hi + 1] - a, seeds=batch.seeds[lo:hi])
            out.append(model.encoder(collate(part), model.global_tokens).float().cpu().numpy())  # (b, W)
        return np.concatenate(out) if out else np.zeros((0, self.width), np.float32)
