"""Typed values passed between the graph, the sampler and the encoder (the contract between them).

Vocabularies are fixed tuples: the encoder sizes its bias tables from them, so adding a type is a model
change (bump the encoder version), never a silent reindexing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from data_contracts.vocab import ENTITY_TYPES, EVENT_TYPES

NODE_TYPES: tuple[str, ...] = ENTITY_TYPES  # user, advertiser, product, service, campaign, kg_entity

# Edge types. Engagement edges exist in both directions (user -> entity: the event type; entity -> user:
# the same with `_rev`), so a BFS from any node reaches its neighbours and the type says which way it went.
EDGE_TYPES: tuple[str, ...] = (
    ("self",)  # the seed token: it has no parent edge
    + EVENT_TYPES
    + tuple(f"{t}_rev" for t in EVENT_TYPES)
    + ("parent", "child")  # entity -> its parent (product -> advertiser, campaign -> advertiser), and back
    + ("relation", "relation_rev")  # typed structural / KG relations (the relation name stays in the graph's edge table)
)
SELF_EDGE = 0


@dataclass(frozen=True)
class SampledBatch:
    """Variable-length token sequences, one per seed, concatenated: no padding in memory.

    T = total tokens, B = seeds, K = hash codes per node, D = max depth of the sampling.
    Sequence b holds tokens offsets[b]:offsets[b+1]; its first token is the seed itself (depth 0).
    """

    offsets: np.ndarray  # int64 [B+1], offsets[0] = 0, offsets[-1] = T
    seeds: np.ndarray  # int64 [B], node index (row of the graph's node table) of each seed
    node: np.ndarray  # int64 [T], node index of each token
    # int64 [T, K], deep-hash codes of each token's node id (hir_model.graph.hashing); None when `code_table` is set
    hash_codes: np.ndarray | None
    # Integer columns may be any integer dtype (the sampler writes the narrowest; collate widens them to int64):
    node_type: np.ndarray  # int [T], index into NODE_TYPES
    depth: np.ndarray  # int [T], BFS-tree depth, 0 for the seed
    ancestors: np.ndarray  # int [T, D+1], local index (within the sequence) of the ancestor at each depth d <= depth[t]; ancestors[t, depth[t]] is t's own local index; -1 beyond depth[t]
    edge_type: np.ndarray  # int [T], index into EDGE_TYPES of the edge to the parent (SELF_EDGE for the seed)
    edge_age: np.ndarray  # float32 [T], seconds from that edge's last timestamp to the cutoff (0 for the seed)
    cutoff_us: int  # the cutoff, UTC microseconds: no sampled edge is later than it
    content: np.ndarray | None = None  # float32 [T, C], the token's content vector where it has one
    has_content: np.ndarray | None = None  # bool [T]; False rows of `content` are meaningless (not zeros that look like data)
    strength: np.ndarray | None = None  # float32 [T], the token's node's decayed engagement (hir_model.graph.csr.Graph.strength); None: 0
    structure: np.ndarray | None = None  # float32 [T, S], the token's node's structural encoding (hir_model.graph.structure); None: 0
    # int64 [V, K], the graph's per-node codes (shared, never copied): token t's codes are code_table[node[t]], gathered
    # once where they are used (collate pads them straight from it) instead of per token here
    code_table: np.ndarray | None = None

    def __post_init__(self) -> None:
        if (self.hash_codes is None) == (self.code_table is None):
            raise ValueError("a SampledBatch needs exactly one of hash_codes (per token) and code_table (per node)")

    @property
    def token_codes(self) -> np.ndarray:
        """int64 [T, K]: each token's hash codes, gathered from `code_table` when the batch carries node indices only."""
        return self.hash_codes if self.hash_codes is not None else self.code_table.take(self.node, axis=0)

    def take_tokens(self, idx: np.ndarray, **changes) -> SampledBatch:
        """The batch with its per-token columns (those that exist) taken at `idx`, and `changes` applied."""
        cut = {f: None if getattr(self, f) is None else getattr(self, f)[idx] for f in TOKEN_FIELDS}
        return replace(self, **{**cut, **changes})

    @property
    def num_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


TOKEN_FIELDS = ("node", "hash_codes", "node_type", "depth", "ancestors", "edge_type", "edge_age", "content", "has_content",
                "strength", "structure")  # SampledBatch's columns with one row per token
