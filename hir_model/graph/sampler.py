"""Causal neighbourhood sampling: for each seed, a time-respecting BFS tree, flattened into a token sequence.

Semantics (one `sample` call, one cutoff):
- Only edges with last_ts <= cutoff exist. An edge's weight at the cutoff is its stored weight decayed from
  the graph's `as_of` to the cutoff (engagement edges only; structural weights do not decay). Edges with
  last_ts <= cutoff got no event after it, so this is exact.
- A view may also hide engagement edges older than `max_age_days` at the cutoff (structural facts stay
  visible) and drop each edge independently with probability `edge_drop` for the whole call.
- From each token at depth d, up to fanout[d] *distinct neighbour nodes* are drawn without replacement,
  each with probability proportional to its summed visible weight from that token (successive sampling);
  the token's edge type is one of the edges to that neighbour, drawn proportionally to its weight, and its
  age is that edge's.
- Tree semantics: a node may appear in several branches (two paths to it are two tokens), but never twice
  on one root-to-token path (no walking back to the parent, no cycles).

How (every step is one numpy pass over all tokens of a depth level of the whole batch; no per-seed Python):
- Per (graph, cutoff, max_age) a table of the visible edges is built once and kept (hir_model.graph.visible; about 48
  bytes per visible edge): their CSR, their log weight decayed to the cutoff and a Walker alias table per node, packed
  so that a weighted draw is one aligned 32-byte read (O(1), no search) and a token's edge type and age one 8-byte read.
- Neighbours are picked per level (hir_model.graph.pick). A frontier token whose node has more than `scan_degree`
  visible edges draws `draws_per_slot` x fanout edges with replacement; dropped edges and nodes on its path are
  rejected, and the first distinct neighbours in draw order are kept (the first distinct values of an i.i.d. weighted
  sequence are a successive sample). All the uniforms are drawn at once, but a token's draws are looked at only until
  it is full: the first k - found for every token, the rest for those still short.
- A token that ends short of its fanout while its node has more distinct neighbours, and every token of a
  smaller node, continues exactly: a Gumbel-top-k scan of all its node's visible edges, without the neighbours
  it already has. Given the draws so far, the next distinct neighbours of an i.i.d. sequence are a successive
  sample of the rest, so the result is exact successive sampling either way (no truncation).
Tokens are laid out per sequence in BFS order: seed, depth 1, depth 2; within a parent in draw order. Each level is
written straight to its places in the batch; a pick travels as one int64, edge << 32 | neighbour. The batch's integer
columns are as narrow as their values allow and its hash codes stay in the graph's node table (`code_table`): writing
the batch's bytes was a third of a broad batch's time, and collate gathers the codes straight into its padded layout.

The same seeds and generator give the same batch, value for value, as the sampler the demo ran with (9d8e473): every
speed-up here keeps the order and number of the generator's draws (tests/hir_model/graph/test_sampler_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir_model.graph.csr import Graph
from hir_model.graph.pick import Call, pick
from hir_model.graph.types import SampledBatch
from hir_model.graph.visible import NEIGHBOUR_MASK, VisibleEdges, neighbour_of, visible_edges


@dataclass(frozen=True)
class ViewConfig:
    name: str
    fanout: tuple[int, ...]  # distinct neighbours drawn per token at depth 0, 1, ...: max depth D = len(fanout)
    max_age_days: float | None = None  # engagement edges older than this at the cutoff are hidden (None: full history)
    edge_drop: float = 0.0  # probability that an edge is hidden for the whole call
    scan_degree: int = 16  # nodes with at most this many visible edges are scanned at once (speed only: both ways are exact)
    draws_per_slot: int = 2  # larger ones: weighted draws with replacement, this many per fanout slot, before a scan of the rest

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanout", tuple(int(f) for f in self.fanout))
        if not self.fanout or min(self.fanout) < 1 or not 0 <= self.edge_drop < 1 or self.draws_per_slot < 1:
            raise ValueError(f"ViewConfig {self.name!r}: fanout must be positive ints, 0 <= edge_drop < 1, draws_per_slot >= 1")


NARROW = ViewConfig("narrow", fanout=(8, 4), max_age_days=14.0, edge_drop=0.2)  # the student's view: small, recent, noisy
BROAD = ViewConfig("broad", fanout=(16, 8, 4))  # the teacher's view: larger, deeper, full history


def sample(graph: Graph, seeds: np.ndarray, cutoff_us: int, view: ViewConfig, rng: np.random.Generator) -> SampledBatch:
    """One time-respecting BFS tree per seed (node indices of `graph`), as a variable-length token batch."""
    seeds, cutoff_us = np.asarray(seeds, np.int64).reshape(-1), int(cutoff_us)
    if len(seeds) and (seeds.min() < 0 or seeds.max() >= graph.num_nodes):
        raise IndexError(f"seeds must be node indices in [0, {graph.num_nodes}); got {seeds.min()}..{seeds.max()}")
    table = visible_edges(graph, cutoff_us, view.max_age_days)
    call = Call(table, rng, np.uint64(rng.integers(0, 2**63)), view.edge_drop, view.scan_degree, view.draws_per_slot)
    # per level: each token as edge << 32 | node (a seed's edge: the tables' last entry, self), and for the levels below
    # the seeds, the children of each token of the level above and the index of each token's parent there
    tokens, count, owner = [np.int64(len(table.type_age) - 1) << 32 | seeds], [], []
    path = [seeds.astype(table.neighbours.dtype)]  # per depth 0..d, [F]: the nodes from the root to each frontier token
    for d, k in enumerate(view.fanout, 1):
        c, packed = pick(call, path, k)
        o = np.repeat(np.arange(len(c)), c)
        tokens.append(packed), count.append(c), owner.append(o)
        if d < len(view.fanout):
            path = [col.take(o) for col in path] + [neighbour_of(packed, path[0].dtype)]
    return _assemble(graph, table, seeds, cutoff_us, tokens, count, owner)


def _assemble(graph: Graph, table: VisibleEdges, seeds: np.ndarray, cutoff_us: int, tokens: list, count: list,
              owner: list) -> SampledBatch:
    """Per-level tokens (each grouped by sequence) -> one sequence per seed in BFS order, with local ancestor indices.
    A level's tokens keep their order, so a token's place is its sequence's offset, the tokens of its sequence at the
    levels above, and its rank among its sequence's tokens at its own level: each level is written straight to its
    places, no sort and no permutation pass."""
    b, levels = len(seeds), len(tokens)
    per_seq = np.ones((levels, b), np.int64)  # (L, B) tokens per sequence and level
    for d, c in enumerate(count, 1):  # a sequence's tokens at level d: the children of its tokens at level d - 1
        below = np.zeros(len(c) + 1, np.int64)
        np.cumsum(c, out=below[1:])
        end = np.cumsum(per_seq[d - 1])
        per_seq[d] = below.take(end) - below.take(end - per_seq[d - 1])
    offsets = np.zeros(b + 1, np.int64)
    np.cumsum(per_seq.sum(0), out=offsets[1:])
    t = int(offsets[-1])
    # (L, B): place of a sequence's first token at a level, minus that token's index within the level
    shift = offsets[:-1] + np.cumsum(per_seq, axis=0) - per_seq - (np.cumsum(per_seq, axis=1) - per_seq)
    packed = np.empty(t, np.int64)
    ancestors = np.empty((t, levels), np.int32)  # local indices: a sequence has far fewer than 2**31 tokens
    rows = ancestors.view(np.dtype((np.void, 4 * levels))).reshape(-1)  # one item per token: np.put moves whole rows
    block = np.full((b, levels), -1, np.int32)  # (n, L) the level's ancestors, in level order
    for d in range(levels):
        at = np.arange(len(tokens[d])) + np.repeat(shift[d], per_seq[d])  # place in the batch
        if d:  # the parent's ancestors (-1 from depth d on), then its own local index
            block = block.take(owner[d - 1], axis=0)
        block[:, d] = at - np.repeat(offsets[:-1], per_seq[d])
        np.put(packed, at, tokens[d])
        np.put(rows, at, block.view(rows.dtype).reshape(-1))
    nodes = packed & NEIGHBOUR_MASK
    type_age = table.type_age.take(packed >> 32)
    # narrow integer columns and the codes left in the graph's node table: the batch's bytes are what limits this pass
    return SampledBatch(
        offsets=offsets, seeds=seeds, node=nodes, hash_codes=None, code_table=np.asarray(graph.nodes.hash_codes),
        node_type=np.take(graph.nodes.node_type, nodes), depth=np.repeat(np.tile(np.arange(levels, dtype=np.int8), b), per_seq.T.reshape(-1)),
        ancestors=ancestors, edge_type=(type_age >> 32).astype(np.int8), edge_age=type_age.astype(np.uint32).view(np.float32),
        cutoff_us=cutoff_us, strength=graph.strength_until(cutoff_us).take(nodes))


def sample_views(graph: Graph, seeds: np.ndarray, cutoff_us: int, rng: np.random.Generator,
                 narrow: ViewConfig = NARROW, broad: ViewConfig = BROAD) -> tuple[SampledBatch, SampledBatch]:
    """The student's (narrow) and the teacher's (broad) view of the same seeds at the same cutoff."""
    return sample(graph, seeds, cutoff_us, narrow, rng), sample(graph, seeds, cutoff_us, broad, rng)
