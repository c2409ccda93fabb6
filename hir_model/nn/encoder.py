"""Topology-aware graph transformer: token embedding, pre-norm layers with the structural bias, seed output.

Each sequence is a seed's sampled neighbourhood; the output is the seed token's embedding, L2-normalised, in
the shared metric space. Optional global tokens [G, width] (e.g. coarse interest prototypes) are extra keys
and values for every sequence in every layer, with a node type of their own in the bias tables.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.nn.backends import BiasWorkspace, StructuredAttention, choose_backend, dense_budget_bytes, flex_shape
from hir_model.nn.batch import EncoderBatch
from hir_model.nn.bias import StructuralBias
from hir_model.nn.config import EncoderConfig
from hir_model.nn.embedding import TokenEmbedding

log = logging.getLogger("hir")


class Attention(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.heads, self.width = cfg.heads, cfg.width
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: Tensor, global_tokens: Tensor | None, attend: StructuredAttention) -> Tensor:
        (B, N, W), H = x.shape, self.heads
        q, k, v = self.qkv(x).view(B, N, 3, H, W // H).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, Dh)
        if global_tokens is not None:  # the same key/value projections, shared by every sequence
            G = global_tokens.shape[0]
            gk, gv = F.linear(global_tokens, self.qkv.weight[W:], self.qkv.bias[W:]).view(G, 2, H, W // H).permute(1, 2, 0, 3)
            k = torch.cat([k, gk.expand(B, H, G, W // H)], dim=2)  # (B, H, N + G, Dh)
            v = torch.cat([v, gv.expand(B, H, G, W // H)], dim=2)
        y = attend(q, k, v)  # (B, H, N, Dh)
        return self.proj(y.transpose(1, 2).reshape(B, N, W))


class Block(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, cfg.mlp_ratio * cfg.width), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.width, cfg.width))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, global_tokens: Tensor | None, attend: StructuredAttention) -> Tensor:
        g = None if global_tokens is None else self.ln1(global_tokens)  # (G, W), normed like the tokens
        x = x + self.drop(self.attn(self.ln1(x), g, attend))
        return x + self.drop(self.mlp(self.ln2(x)))

    def reset_parameters(self) -> None:
        self.ln1.reset_parameters()
        self.ln2.reset_parameters()
        # nanoGPT's std 0.02 is ~1/sqrt(768) for GPT-2's width; at width 64 it leaves attention near-uniform and the
        # values near zero, so a seed barely reads its neighbourhood and contrastive training collapses (InfoNCE stays
        # at chance; docs/decisions.md). Scale by 1/sqrt(width) instead, residual projections down by sqrt(2 * layers).
        std = self.cfg.width ** -0.5
        for lin in (self.attn.qkv, self.attn.proj, self.mlp[0], self.mlp[2]):
            residual = lin is self.attn.proj or lin is self.mlp[2]
            nn.init.normal_(lin.weight, std=std / math.sqrt(2 * self.cfg.layers) if residual else std)
            nn.init.zeros_(lin.bias)


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg)
        self.bias = StructuralBias(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.last_choice = None  # the backend choice of the latest forward (hir_model.nn.backends.Choice)
        self.workspace = BiasWorkspace()  # the dense bias buffer reused across no-grad batches (not state)
        self.autocast_dtype: torch.dtype | None = None  # e.g. torch.bfloat16: embedding and layers under autocast, the
        # readout in float32 (set by the trainer, TrainConfig.runtime.precision; not state, not saved); None: float32 throughout
        # (node types, W): the mean readout of each seed type, subtracted before the unit norm. A fresh encoder maps
        # every node near one direction (shared type vectors, the MLPs' GELU offsets, anonymous KG neighbours), so no
        # prototype could tell nodes apart; training sets it from the data on a fresh start (a data-dependent
        # initialisation) and keeps it current; it travels with the weights. Per type, not one shared mean: with one,
        # users and products kept apart along a type direction and the balanced coarse level split by type instead of
        # by interest (docs/decisions.md).
        self.register_buffer("out_mean", torch.zeros(cfg.node_types, cfg.width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.embed.reset_parameters()
        self.bias.reset_parameters()
        for block in self.blocks:
            block.reset_parameters()
        self.ln_f.reset_parameters()

    def attention(self, batch: EncoderBatch, n_global: int = 0) -> StructuredAttention:
        """Choose the backend for this batch (logged) and build its bias tensors once for all layers."""
        (B, N), cfg = batch.node_type.shape, self.cfg
        training = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        device = self.bias.type_pair.device
        choice = choose_backend(cfg.backend, device, training, N, 4 * B * cfg.heads * N * (N + n_global),
                                dense_budget_bytes(cfg.dense_bias_budget_mb, device))
        if choice.backend != getattr(self.last_choice, "backend", None):
            log.info("attention backend: %s (%s)", choice.backend, choice.reason)
        else:
            log.debug("attention backend: %s (%s)", choice.backend, choice.reason)
        self.last_choice = choice
        rows, length = flex_shape(B, N) if choice.backend == "flex" else (B, N)
        tensors = self.bias.tensors(batch, length, n_global, rows)
        return StructuredAttention(choice.backend, tensors, (B, N), lambda: self.bias.tensors(batch, N, n_global),
                                   cfg.compile_dense_bias, self.workspace)

    def forward(self, batch: EncoderBatch, global_tokens: Tensor | None = None) -> Tensor:  # -> (B, width) unit rows
        return F.normalize(self.readout(batch, global_tokens), dim=-1)

    def readout(self, batch: EncoderBatch, global_tokens: Tensor | None = None) -> Tensor:  # -> (B, width)
        if global_tokens is not None and (global_tokens.dim() != 2 or global_tokens.shape[1] != self.cfg.width):
            raise ValueError(f"global tokens must be [G, {self.cfg.width}], got {tuple(global_tokens.shape)}")
        attend = self.attention(batch, 0 if global_tokens is None else global_tokens.shape[0])
        dtype = self.autocast_dtype
        with nullcontext() if dtype is None else torch.autocast(self.out_mean.device.type, dtype=dtype):
            x = self.embed(batch)  # (B, N, W)
            for block in self.blocks:
                x = block(x, global_tokens, attend)
        seed = x[:, 0].float()  # the seed token (position 0); a no-op in float32
        return self.ln_f(seed) - self.out_mean[batch.node_type[:, 0]]  # before the unit norm

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "out_mean"  # checkpoints from before the per-type centre hold one (W,) mean for every type
        if key in state_dict and state_dict[key].dim() == 1:
            state_dict[key] = state_dict[key].expand_as(self.out_mean).clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        c = self.cfg
        n = sum(p.numel() for p in self.parameters())
        return f"layers={c.layers}, heads={c.heads}, width={c.width}, backend={c.backend!r}, params={n:,}"
