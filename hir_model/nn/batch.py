"""The encoder's input: a `SampledBatch` (numpy, concatenated sequences) padded into torch tensors [B, N].

Padding to the longest sequence is what the dense backend needs ([B, H, N, N] bias) and what the flex backend
skips block by block (its block mask drops every block past a sequence's length), so both backends read the
same per-token tensors. Padding positions hold harmless values (type 0, depth 0, no ancestors) and are
excluded by `valid`, never by the values themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from hir_model.graph.types import SampledBatch


@dataclass(frozen=True)
class EncoderBatch:
    hash_codes: Tensor  # (B, N, K) int64 deep-hash codes
    node_type: Tensor  # (B, N) int64 index into NODE_TYPES; 0 at padding
    depth: Tensor  # (B, N) int64 BFS depth, 0 for the seed and at padding
    ancestors: Tensor  # (B, N, D+1) int64 local index of the ancestor at each depth; -1 beyond depth and at padding
    edge_type: Tensor  # (B, N) int64 index into EDGE_TYPES of the edge to the parent
    edge_age: Tensor  # (B, N) float32 seconds from the edge's last timestamp to the cutoff
    has_content: Tensor  # (B, N) bool
    lengths: Tensor  # (B,) int64 tokens per sequence (>= 1: the seed)
    content: Tensor | None = None  # (B, N, C) float32; rows where has_content is False are zeros
    strength: Tensor | None = None  # (B, N) float32 decayed engagement of each token's node; 0 at padding (None: all 0)
    structure: Tensor | None = None  # (B, N, S) float32 structural encoding of each token's node; 0 at padding (None: all 0)
    node: Tensor | None = None  # (B, N) int64 node index of each token, -1 at padding: kept on request (`collate(keep_node=True)`)
    # for batches whose per-node columns are filled in on the device (hir_model.train.loader.NodeTables)

    @property
    def num_sequences(self) -> int:
        return self.node_type.shape[0]

    @property
    def max_len(self) -> int:
        return self.node_type.shape[1]

    @property
    def valid(self) -> Tensor:  # (B, N) bool: real tokens
        return torch.arange(self.max_len, device=self.lengths.device) < self.lengths[:, None]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> EncoderBatch:
        return self._map(lambda x: x.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> EncoderBatch:
        """The batch in page-locked memory (torch's DataLoader calls this), so copies to a GPU can overlap compute."""
        return self._map(lambda x: x.pin_memory())

    def _map(self, fn) -> EncoderBatch:
        return EncoderBatch(**{f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name)) for f in fields(self)})


def collate(batch: SampledBatch, keep_node: bool = False) -> EncoderBatch:
    """Pad the concatenated sequences of `batch` into [B, Nmax] tensors (Nmax = the longest sequence); with `keep_node`,
    the tokens' node indices too (`EncoderBatch.node`)."""
    lengths = batch.lengths
    if len(lengths) == 0 or (lengths < 1).any():
        raise ValueError("every sequence needs at least its seed token (lengths >= 1, B >= 1)")
    if (batch.depth[batch.offsets[:-1]] != 0).any():
        raise ValueError("the first token of each sequence must be its seed (depth 0)")
    B, N, T = len(lengths), int(lengths.max()), int(batch.offsets[-1])
    row = np.repeat(np.arange(B), lengths)  # (T,) sequence of each token
    col = np.arange(T) - np.repeat(batch.offsets[:-1], lengths)  # (T,) position within its sequence

    def pad(values: np.ndarray, fill, dtype) -> Tensor:
        out = np.full((B, N) + values.shape[1:], fill, dtype=dtype)
        out[row, col] = values
        return torch.from_numpy(out)

    has_content = batch.has_content if batch.has_content is not None else np.zeros(T, dtype=bool)
    content = None
    if batch.content is not None:
        content = pad(np.where(has_content[:, None], batch.content, 0.0), 0.0, np.float32)
    node = pad(batch.node, -1, np.int64) if keep_node or batch.hash_codes is None else None
    if batch.hash_codes is None:  # one gather from the graph's per-node table straight into the padded layout
        codes = batch.code_table.take(node.numpy().clip(0), axis=0)  # (B, N, K)
        codes[node.numpy() < 0] = 0
        hash_codes = torch.from_numpy(codes)
    else:
        hash_codes = pad(batch.hash_codes, 0, np.int64)
    return EncoderBatch(
        hash_codes=hash_codes,
        node_type=pad(batch.node_type, 0, np.int64),
        depth=pad(batch.depth, 0, np.int64),
        ancestors=pad(batch.ancestors, -1, np.int64),
        edge_type=pad(batch.edge_type, 0, np.int64),
        edge_age=pad(batch.edge_age, 0.0, np.float32),
        has_content=pad(has_content, False, bool),
        lengths=torch.from_numpy(lengths.astype(np.int64)),
        content=content,
        strength=None if batch.strength is None else pad(batch.strength, 0.0, np.float32),
        structure=None if batch.structure is None else pad(batch.structure, 0.0, np.float32),
        node=node if keep_node else None,
    )
