"""Token embedding: deep-hash id embedding (+ an optional hashed id table) + content projection (or a learned "no content" vector) + node type +
the node's strength bucket + a projection of its structural encoding (hir_model.graph.structure; when configured).

Strength (Graphormer's centrality encoding, on the time-decayed graph): the decayed engagement on a node's edges as of
the cutoff (hir_model.graph.csr.Graph.strength), in log2 buckets. The sampler caps every fanout, so a sampled
neighbourhood alone does not tell a film rated by 300 users from one rated by 8; popularity is most of what MovieLens
users rate next (decayed popularity alone: Recall@20 0.21).

Deep-hash embedding (DHE, Kang et al. 2021): a node id arrives as K hash codes (hir_model.graph.hashing);
each code is reduced modulo a constant number of buckets and scaled to [-1, 1], and an MLP maps the K floats
to a vector. Nothing is sized by the vocabulary, so 1 thousand or 100 million ids cost the same parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hir_model.nn.batch import EncoderBatch
from hir_model.nn.config import EncoderConfig


class DeepHashEmbedding(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.hash_codes, self.buckets = cfg.hash_codes, cfg.hash_buckets
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hash_codes, cfg.hash_hidden), nn.SiLU(),
            nn.Linear(cfg.hash_hidden, cfg.hash_hidden), nn.SiLU(),
            nn.Linear(cfg.hash_hidden, cfg.width),
        )

    def encode(self, codes: Tensor) -> Tensor:
        """(..., K) int64 codes -> (..., K) float32 in [-1, 1] (uniform for uniform hashes)."""
        reduced = torch.remainder(codes, self.buckets)  # non-negative even for negative int64 hashes
        return reduced.to(torch.float32) * (2.0 / (self.buckets - 1)) - 1.0

    def forward(self, codes: Tensor) -> Tensor:  # (..., K) int64 -> (..., width)
        if codes.shape[-1] != self.hash_codes:
            raise ValueError(f"got {codes.shape[-1]} hash codes per node, the config expects {self.hash_codes}")
        return self.mlp(self.encode(codes))

    def reset_parameters(self) -> None:
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                m.reset_parameters()


class HashedIdTable(nn.Module):
    """A fixed-size table of id rows: a node's vector is the sum of the rows its first `hashes` codes pick (modulo the
    rows), zero at start. Beside the deep-hash MLP: a row moves with each gradient it gets, so ids learn within a
    window's budget; memory is rows x width whatever the vocabulary (two ids share both rows rarely)."""

    def __init__(self, rows: int, hashes: int, width: int):
        super().__init__()
        self.hashes = hashes
        self.rows = nn.Embedding(rows, width)
        self.reset_parameters()

    def forward(self, codes: Tensor) -> Tensor:  # (..., K) int64 -> (..., width)
        idx = torch.remainder(codes[..., : self.hashes], self.rows.num_embeddings)  # (..., h)
        return self.rows(idx).sum(-2)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.rows.weight)


STRENGTH_FLOOR_LOG2 = -8  # bucket 1 holds strengths below 2^-7 (a click decayed over ~5 tau); bucket 0: none at all


def strength_bucket(strength: Tensor, buckets: int) -> Tensor:
    """(...) float decayed engagement -> (...) int64 bucket: 0 for <= 0, else floor(log2) shifted to start at 1, clamped."""
    b = torch.floor(torch.log2(strength.clamp_min(2.0 ** STRENGTH_FLOOR_LOG2))).long() - STRENGTH_FLOOR_LOG2 + 1
    return torch.where(strength > 0, b.clamp(1, buckets - 1), torch.zeros_like(b))


class TokenEmbedding(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.ids = DeepHashEmbedding(cfg)
        self.id_table = HashedIdTable(cfg.id_table_rows, cfg.id_table_hashes, cfg.width) if cfg.id_table_rows else None
        self.types = nn.Embedding(cfg.node_types, cfg.width)
        # no bias: a shared offset would only add a direction common to every node (the type embedding has one per type)
        self.content = nn.Linear(cfg.content_dim, cfg.width, bias=False) if cfg.content_dim else None
        # subtracted from every content vector before the projection: text embeddings of one catalogue share a large
        # common direction (MovieLens films: mean pairwise cosine ~0.7), which made every film (and every user reading
        # films) look alike. Set from the training data on a fresh start; saved and loaded with the weights.
        self.register_buffer("content_mean", torch.zeros(cfg.content_dim))
        self.no_content = nn.Parameter(torch.empty(cfg.width))  # stands in where a node has no content vector
        self.strength = nn.Embedding(cfg.strength_buckets, cfg.width) if cfg.strength_buckets else None
        # no bias: a node without an encoding (zeros) gets nothing added, not a shared offset
        self.structure = nn.Linear(cfg.structure_dim, cfg.width, bias=False) if cfg.structure_dim else None
        self.reset_parameters()

    def forward(self, batch: EncoderBatch) -> Tensor:  # -> (B, N, width)
        x = self.ids(batch.hash_codes) + self.types(batch.node_type)  # (B, N, W)
        if self.id_table is not None:  # rows only for nodes with engagement: a new id would read others' rows
            engaged = batch.strength > 0 if batch.strength is not None else torch.ones_like(batch.node_type, dtype=torch.bool)
            x = x + self.id_table(batch.hash_codes) * engaged[..., None]
        if self.strength is not None:
            x = x + self.strength(strength_bucket(batch.strength if batch.strength is not None
                                                  else torch.zeros_like(batch.node_type, dtype=torch.float32), self.strength.num_embeddings))
        if self.structure is not None and batch.structure is not None:
            if batch.structure.shape[-1] != self.structure.in_features:
                raise ValueError(f"structural encodings have {batch.structure.shape[-1]} dims, the config expects "
                                 f"{self.structure.in_features}")
            x = x + self.structure(batch.structure)
        if self.content is None or batch.content is None:
            return x + self.no_content
        if batch.content.shape[-1] != self.content.in_features:
            raise ValueError(f"content vectors have {batch.content.shape[-1]} dims, the config expects {self.content.in_features}")
        content = self.content(batch.content - self.content_mean)  # (B, N, W)
        return x + torch.where(batch.has_content[..., None], content, self.no_content)

    def reset_parameters(self) -> None:
        self.ids.reset_parameters()
        if self.id_table is not None:
            self.id_table.reset_parameters()
        nn.init.normal_(self.types.weight, std=0.02)
        nn.init.normal_(self.no_content, std=0.02)
        if self.content is not None:
            self.content.reset_parameters()
        if self.strength is not None:
            nn.init.normal_(self.strength.weight, std=0.02)
        if self.structure is not None:
            self.structure.reset_parameters()
