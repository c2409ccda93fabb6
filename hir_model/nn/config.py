"""The encoder's hyper-parameters: one frozen dataclass, sized from the graph contract's vocabularies."""

from __future__ import annotations

from dataclasses import dataclass

from hir_model.graph.hashing import HashConfig
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES

BACKENDS = ("auto", "dense", "flex")


@dataclass(frozen=True)
class EncoderConfig:
    layers: int = 2  # pre-norm transformer layers
    heads: int = 4
    width: int = 128  # model width; head dim = width // heads
    mlp_ratio: int = 4  # MLP hidden = mlp_ratio * width
    dropout: float = 0.0
    # deep-hash embedding (DHE): no per-id table, so parameters do not grow with the vocabulary
    hash_codes: int = HashConfig.k  # K: hash codes per node; must equal the graph's HashConfig.k
    hash_buckets: int = HashConfig.buckets  # codes (in [0, buckets)) are scaled to [-1, 1]; a constant, not a vocabulary size
    hash_hidden: int = 256  # width of the DHE MLP's hidden layers
    id_table_rows: int = 0  # rows of a hashed id table beside the deep-hash MLP (0: none): a node's id vector adds the rows
    # its first id_table_hashes codes pick (modulo the rows; zero at start), for nodes with engagement only. A row learns
    # from one step's gradient, where the MLP needs many; its size is fixed, not the vocabulary's
    id_table_hashes: int = 2  # rows per node, summed (two hashes: two ids rarely share both rows)
    content_dim: int = 0  # C: content vector size (0: the batches carry none)
    strength_buckets: int = 0  # log2 buckets of a token's decayed engagement (Graphormer's centrality encoding): bucket 0
    # for none, 1 .. for 2^-8 and up; 0: no strength embedding. hir.toml turns it on (24) for MovieLens, where popularity
    # is most of the signal; on the synthetic source it cost cold-start items (README, Training)
    structure_dim: int = 0  # S: size of each token's structural encoding (FastRP of the engagement graph,
    # hir_model.graph.structure), projected and added to the token; 0: none. hir.toml turns it on for MovieLens
    # structural bias tables (per head)
    node_types: int = len(NODE_TYPES)  # real node types; the bias tables add one more for global tokens
    edge_types: int = len(EDGE_TYPES)
    max_depth: int = 3  # deepest BFS level the sampler produces (the broad view's 3 hops); distances span 0 .. 2 * max_depth
    age_buckets: int = 16  # log2 buckets of an edge's age: bucket b holds ages in [2^b - 1, 2^(b+1) - 1) units
    age_unit_s: float = 3600.0  # the age unit: bucket 0 is "under an hour"
    # attention backend: "auto" picks by device, grad mode and sequence length (hir_model.nn.backends)
    backend: str = "auto"
    dense_bias_budget_mb: float = 1024.0  # "auto": a dense [B, H, N, N] bias above this goes to flex where flex runs
    compile_dense_bias: bool = True  # build the dense [B, H, N, N] bias with one compiled kernel (eager on failure)

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: expected one of {BACKENDS}")
        if self.structure_dim < 0:
            raise ValueError(f"structure_dim must be >= 0, got {self.structure_dim}")
        if self.id_table_rows < 0 or (self.id_table_rows and not 1 <= self.id_table_hashes <= self.hash_codes):
            raise ValueError(f"id_table_rows must be >= 0 and id_table_hashes in [1, hash_codes={self.hash_codes}], got "
                             f"{self.id_table_rows}, {self.id_table_hashes}")
        if self.max_depth < 0 or self.age_buckets < 1 or self.hash_codes < 1 or self.hash_buckets < 2:
            raise ValueError("max_depth >= 0, age_buckets >= 1, hash_codes >= 1 and hash_buckets >= 2 are required")

    @classmethod
    def from_dict(cls, d: dict) -> EncoderConfig:
        """A saved config; one written before the strength token, the structural encoding or the id table had none (0)."""
        return cls(**{"strength_buckets": 0, "structure_dim": 0, "id_table_rows": 0, **d})

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def global_type(self) -> int:
        """The node type of global tokens in the bias tables (one past the real types)."""
        return self.node_types
