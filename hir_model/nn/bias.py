"""The structural attention bias, defined once as `bias(b, h, q_idx, kv_idx)`.

Four small learned tables per head: (query type, key type), tree distance, the key's edge type to its parent
and the key's edge-age bucket. Per batch they become `BiasTensors`: one fused (type-pair x distance) table and
a per-key (edge + age) vector, plus per-token integer codes. The bias of a pair is then

    pair[h, q_code[b, q] + k_code[b, k] - 2 * shared(b, q, k)] + key_bias[b, h, k]

with q_code = type_q * TK * NDIST + depth_q and k_code = type_k * NDIST + depth_k, so the index is
(type_q * TK + type_k) * NDIST + distance; `shared` counts the ancestors at depths 1..D that q and k have in
common, i.e. depth(lca), and the tree distance depth_q + depth_k - 2 * depth(lca) falls out of per-token
O(N * D) arrays, never an N x N matrix.

`generate_structural_bias(t)` returns that function. FlexAttention calls it on scalars (as a score_mod, fused,
nothing materialised); `dense_bias(t)` calls it on broadcast index grids to get [B, H, N, N + G] for SDPA.
Same code, so the two backends cannot drift.

Key slots past the tokens hold the global tokens (own type, no distance / edge / age term); padding keys carry
the PAD type whose table entries are -inf, so the dense bias masks padding by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hir_model.nn.batch import EncoderBatch
from hir_model.nn.config import EncoderConfig

Bias = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # bias(b, h, q_idx, kv_idx)


@dataclass(frozen=True)
class BiasTensors:
    """Everything the bias function reads, built once per batch. N = padded length, Nk = N + G."""

    pair: Tensor  # (H, TQ * TK * NDIST) float32: type-pair + tree-distance table, -inf for padding keys
    key_bias: Tensor  # (B, H, Nk) float32: key's edge-type + age-bucket terms; 0 for global and padding keys
    q_code: Tensor  # (B, N) int32: type * TK * NDIST + depth
    k_code: Tensor  # (B, Nk) int32: type * NDIST + depth (GLOBAL / PAD types past the tokens)
    q_anc: Tensor  # (D, B, N) int32: local index of the ancestor at depths 1..D, -1 beyond depth
    k_anc: Tensor  # (D, B, Nk) int32: the same, -2 beyond depth, at padding and for globals (never equals -1)
    key_valid: Tensor  # (B, Nk) bool: real token or global token
    lengths: Tensor  # (B,) int64 real tokens per sequence (0 for padding sequences)
    n_dist: int  # NDIST = 2 * max_depth + 1 distance buckets

    @property
    def n_global(self) -> int:
        return self.k_code.shape[1] - self.q_code.shape[1]


def make_bias(pair: Tensor, key_bias: Tensor, q_code: Tensor, k_code: Tensor, q_anc: Tensor, k_anc: Tensor) -> Bias:
    """The bias function over these tensors; works on scalars (score_mod) and on broadcast grids (dense)."""
    depths = q_anc.shape[0]

    def bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        i = q_code[b, q_idx] + k_code[b, kv_idx]  # int32 throughout: half the vector width of int64
        for d in range(depths):  # each ancestor shared below the seed shortens the tree path by 2
            i = i - 2 * (q_anc[d, b, q_idx] == k_anc[d, b, kv_idx]).to(torch.int32)
        return pair[h, i] + key_bias[b, h, kv_idx]

    return bias


def generate_structural_bias(t: BiasTensors) -> Bias:
    return make_bias(t.pair, t.key_bias, t.q_code, t.k_code, t.q_anc, t.k_anc)


def generate_structural_score_mod(t: BiasTensors):
    """FlexAttention score_mod: score + bias(b, h, q_idx, kv_idx)."""
    bias = generate_structural_bias(t)

    def structural_score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + bias(b, h, q_idx, kv_idx)

    return structural_score_mod


def generate_key_padding_mask(t: BiasTensors):
    """FlexAttention mask_mod: a query sees its own sequence's real tokens and every global token."""
    key_valid = t.key_valid

    def key_padding_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return key_valid[b, kv_idx]

    return key_padding_mask


def grid_bias(pair: Tensor, key_bias: Tensor, q_code: Tensor, k_code: Tensor, q_anc: Tensor, k_anc: Tensor) -> Tensor:
    (B, N), Nk, H = q_code.shape, k_code.shape[1], pair.shape[0]
    dev = pair.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1, 1)
    q = torch.arange(N, device=dev).view(1, 1, N, 1)
    k = torch.arange(Nk, device=dev).view(1, 1, 1, Nk)
    return make_bias(pair, key_bias, q_code, k_code, q_anc, k_anc)(b, h, q, k)  # (B, H, N, Nk)


def grid_bias_into(out: Tensor, pair: Tensor, key_bias: Tensor, q_code: Tensor, k_code: Tensor, q_anc: Tensor,
                   k_anc: Tensor) -> None:
    """`grid_bias`'s values written into a reusable buffer `out` (B, H, N, Nk), for passes without a gradient to the
    tables: the fused index on plain broadcast views and one index_select over it, 2-4x faster on CPU than advanced
    indexing on index grids (whose backward training keeps). tests/hir_model/nn pins it equal to `bias`."""
    (B, N), Nk, H = q_code.shape, k_code.shape[1], pair.shape[0]
    i = q_code[:, :, None] + k_code[:, None, :]  # (B, N, Nk) int32, as in `bias`
    for d in range(q_anc.shape[0]):
        i = i - 2 * (q_anc[d][:, :, None] == k_anc[d][:, None, :]).to(torch.int32)
    gathered = torch.index_select(pair, 1, i.view(-1)).view(H, B, N, Nk).permute(1, 0, 2, 3)
    torch.add(gathered, key_bias[:, :, None, :], out=out)


def dense_bias(t: BiasTensors, kernel: Callable[..., Tensor] | None = None) -> Tensor:
    """The bias evaluated on broadcast index grids: (B, H, N, Nk). `kernel`: a compiled `grid_bias`."""
    return (kernel or grid_bias)(t.pair, t.key_bias, t.q_code, t.k_code, t.q_anc, t.k_anc)


def tree_distance(t: BiasTensors) -> Tensor:
    """(B, N, Nk) the tree distance each pair's bias uses (read back from the fused index; tests, debugging)."""
    pair = torch.arange(t.pair.shape[1], device=t.pair.device).remainder(t.n_dist).expand_as(t.pair)
    return dense_bias(BiasTensors(pair, torch.zeros_like(t.key_bias), t.q_code, t.k_code, t.q_anc, t.k_anc,
                                  t.key_valid, t.lengths, t.n_dist))[:, 0].long()


def age_bucket(age_s: Tensor, unit_s: float, buckets: int) -> Tensor:
    """log2 buckets: floor(log2(1 + age / unit)), clamped to [0, buckets - 1]."""
    return torch.log2(1.0 + age_s.clamp(min=0) / unit_s).floor().long().clamp(max=buckets - 1)


class StructuralBias(nn.Module):
    """The learned tables (per head) and their expansion into per-batch `BiasTensors`."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        H, T = cfg.heads, cfg.node_types
        self.type_pair = nn.Parameter(torch.empty(H, T, T + 1))  # (query type, key type incl. global)
        self.distance = nn.Parameter(torch.empty(H, 2 * cfg.max_depth + 1))  # tree distance 0 .. 2D
        self.edge = nn.Parameter(torch.empty(H, cfg.edge_types))  # key's edge type to its parent
        self.age = nn.Parameter(torch.empty(H, cfg.age_buckets))  # key's edge-age bucket
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in (self.type_pair, self.distance, self.edge, self.age):
            nn.init.zeros_(table)  # start as plain attention; the tables learn the structure

    def pair_table(self) -> Tensor:  # (H, TQ * TK * NDIST) with TQ = T query types, TK = T + 2 key types
        H, T, NDIST = self.cfg.heads, self.cfg.node_types, self.distance.shape[1]
        real = self.type_pair[:, :, :T, None] + self.distance[:, None, None, :]  # (H, T, T, NDIST)
        glob = self.type_pair[:, :, T:, None].expand(H, T, 1, NDIST)  # no tree distance to a global token
        pad = torch.full((H, T, 1, NDIST), float("-inf"), device=real.device, dtype=real.dtype)
        return torch.cat([real, glob, pad], dim=2).reshape(H, -1)

    def tensors(self, batch: EncoderBatch, length: int | None = None, n_global: int = 0,
                rows: int | None = None) -> BiasTensors:
        """Per-batch bias tensors: sequences padded to `length` tokens (default: the longest) plus G global keys,
        and the batch padded to `rows` sequences (default: B) with empty ones (length 0: no key, no block)."""
        cfg = self.cfg
        (B, N0), N, R, D = batch.node_type.shape, length or batch.max_len, rows or batch.num_sequences, cfg.max_depth
        if N < N0 or R < B:
            raise ValueError(f"cannot pad a batch of {B} x {N0} tokens to {R} x {N}")
        if B and int(batch.depth.max()) > D:
            raise ValueError(f"a token at depth {int(batch.depth.max())} exceeds the config's max_depth {D}")
        T, NDIST = cfg.node_types, 2 * D + 1
        GLOBAL, PAD, TK = T, T + 1, T + 2
        valid = batch.valid  # (B, N0)
        dev, i32 = valid.device, torch.int32

        def tokens(x: Tensor, pad_value, global_value=None, dim: int = 0) -> Tensor:  # (.., B, .., N0) -> (.., R, .., N [+ G])
            x = torch.cat([x, x.new_full(x.shape[:-1] + (N - N0,), pad_value)], dim=-1)
            x = torch.cat([x, x.new_full(x.shape[:dim] + (R - B,) + x.shape[dim + 1:], pad_value)], dim=dim)
            if global_value is None:
                return x
            return torch.cat([x, x.new_full(x.shape[:-1] + (n_global,), global_value)], dim=-1)

        q_code = tokens(batch.node_type * (TK * NDIST) + batch.depth, 0).to(i32)
        k_code = torch.where(valid, batch.node_type * NDIST + batch.depth, PAD * NDIST)
        k_code = tokens(k_code, PAD * NDIST, GLOBAL * NDIST).to(i32)
        anc = batch.ancestors[:, :, 1:D + 1]  # (B, N0, <=D): depth 0 is the seed, shared by every token
        anc = torch.cat([anc, anc.new_full((B, N0, D - anc.shape[-1]), -1)], -1).permute(2, 0, 1)  # (D, B, N0)
        q_anc = tokens(torch.where(anc >= 0, anc, -1), -1, dim=1).to(i32)
        k_anc = tokens(torch.where((anc >= 0) & valid, anc, -2), -2, -2, dim=1).to(i32)
        ages = age_bucket(batch.edge_age, cfg.age_unit_s, cfg.age_buckets)  # (B, N0)
        key_bias = (self.edge[:, batch.edge_type] + self.age[:, ages]).permute(1, 0, 2)  # (B, H, N0)
        key_bias = tokens(key_bias.masked_fill(~valid[:, None], 0.0), 0.0, 0.0)  # (R, H, Nk)
        key_valid = tokens(valid, False, True)
        lengths = torch.cat([batch.lengths.to(dev), batch.lengths.new_zeros(R - B, device=dev)])
        return BiasTensors(self.pair_table(), key_bias, q_code, k_code, q_anc, k_anc, key_valid, lengths, NDIST)

    def extra_repr(self) -> str:
        return (f"heads={self.cfg.heads}, type_pair={tuple(self.type_pair.shape[1:])}, distances={self.distance.shape[1]}, "
                f"edge_types={self.edge.shape[1]}, age_buckets={self.age.shape[1]}")
