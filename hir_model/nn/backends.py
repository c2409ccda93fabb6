"""Two attention backends for the one structural bias, and the automatic choice between them.

- dense: `scaled_dot_product_attention` with the bias materialised once per batch as [B, H, N, N + G] (shared
  by every layer), built by one compiled kernel (eager if compilation fails). Works everywhere, forward and
  backward; costs O(B * H * N^2) memory.
- flex: `flex_attention` (compiled) with the bias as its score_mod and a block mask that skips padding, so no
  N x N tensor exists. No backward on CPU in this torch.

Layout: both backends use the padded [B, N] layout of `EncoderBatch` (one bias definition, one set of index
tensors) rather than one packed row of tokens: the dense bias needs [B, N, N] anyway, and flex skips padding
block by block. Flex pads further, B and N to powers of two (N >= 128, `flex_shape`), and compiles with static
shapes: with symbolic sizes the CPU flex template's C++ fails to compile (torch 2.14.1: `cur_qSplitSize` not
declared; always for a symbolic sequence length, for a symbolic batch size depending on how the captured tensors
are reached), so each (B, N) bucket compiles once. The padding costs flex next to nothing: the block mask holds no
block past a sequence's end, so padded query blocks and padded sequences are skipped entirely.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from hir_model.nn.bias import (BiasTensors, dense_bias, generate_key_padding_mask, generate_structural_score_mod, grid_bias,
                                grid_bias_into)

log = logging.getLogger("hir")

BLOCK = 128  # flex block size (its default)

# Padded tokens per sequence at and above which "auto" takes flex for speed, per (device type, training); None = never
# for speed (flex only for memory: `dense_budget_bytes`). From `benchmarks/attention.py`, dense timed with its per-batch
# bias build (figures in docs/history.md):
# - CPU: flex is 1.7x to 4x slower at every N (inference), and has no backward.
# - CUDA (H200, torch 2.11, N = 256 to 16,384): dense is faster at every N for inference (1.2x-2.5x); for training
#   flex wins by 4% at 4096 only, ties at 8192 and is 2.4x slower at 16,384, so dense is within 10% everywhere.
FLEX_FROM_TOKENS: dict[tuple[str, bool], int | None] = {
    ("cpu", False): None,
    ("cpu", True): None,
    ("cuda", False): None,
    ("cuda", True): None,
}
CUDA_DENSE_SHARE = 1 / 16  # on CUDA the dense bias may also take this share of the device's memory (8.7 GB on an H200)


def dense_budget_bytes(budget_mb: float, device: torch.device) -> float:
    """The most a dense bias may take where flex could run instead: `budget_mb`, or on CUDA the larger of it and
    CUDA_DENSE_SHARE of the device's memory (dense is the faster path there, flex the memory path)."""
    budget = budget_mb * 2**20
    if device.type == "cuda" and torch.cuda.is_available():
        budget = max(budget, CUDA_DENSE_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return budget


FLEX_DEVICES = ("cpu", "cuda")  # where flex runs at all (forward); CPU has no flex backward

_flex_failure: str | None = None  # why flex is off for this process (compile failure), once it failed
_compiled: dict[str, object] = {}  # "flex" / "dense_bias": compiled callables shared by every encoder


@dataclass(frozen=True)
class Choice:
    backend: str  # "dense" | "flex"
    reason: str


def choose_backend(requested: str, device: torch.device, training: bool, tokens: int, dense_bias_bytes: int,
                   dense_budget_bytes: float = float("inf")) -> Choice:
    """Pick the backend for one batch: `tokens` = padded sequence length, `dense_bias_bytes` = the size of its
    dense bias, `dense_budget_bytes` = the most the dense bias may take where flex can run instead."""
    if requested == "dense":
        return Choice("dense", "set in config")
    if training and device.type == "cpu":
        return Choice("dense", "flex has no CPU backward" + (" (config asked for flex)" if requested == "flex" else ""))
    if _flex_failure is not None:
        return Choice("dense", f"flex failed earlier in this process ({_flex_failure})")
    if requested == "flex":
        return Choice("flex", "set in config")
    if device.type not in FLEX_DEVICES:
        return Choice("dense", f"no flex on {device.type}")
    if dense_bias_bytes > dense_budget_bytes:
        return Choice("flex", f"the dense bias would take {dense_bias_bytes / 2**20:.0f} MiB "
                              f"> budget {dense_budget_bytes / 2**20:.0f} MiB")
    threshold = FLEX_FROM_TOKENS.get((device.type, training))
    if threshold is None:
        return Choice("dense", f"dense is faster at every measured length ({device.type}, training={training})")
    if tokens >= threshold:
        return Choice("flex", f"{tokens} tokens >= crossover {threshold} ({device.type}, training={training})")
    return Choice("dense", f"{tokens} tokens < crossover {threshold} ({device.type}, training={training})")


def flex_shape(batch: int, tokens: int) -> tuple[int, int]:
    """The flex path's padded (sequences, tokens): powers of two, tokens at least one block."""
    return 1 << (batch - 1).bit_length(), max(BLOCK, 1 << (tokens - 1).bit_length())


def key_block_mask(t: BiasTensors) -> BlockMask:
    """Block mask of `generate_key_padding_mask` from the lengths alone (no N x N evaluation). N % BLOCK == 0."""
    n, G = t.q_code.shape[1], t.n_global
    nq, nk = n // BLOCK, -(-(n + G) // BLOCK)
    lo = torch.arange(nk, device=t.lengths.device) * BLOCK
    length = t.lengths[:, None]  # (B, 1)
    tokens = lo < n  # (nk,) key blocks of tokens; the rest hold the global tokens
    full = tokens & (lo + BLOCK <= length)  # (B, nk) every key real
    partial = (tokens & (lo < length) & (lo + BLOCK > length)) | ~tokens  # a sequence's last block; global blocks
    live_q = (torch.arange(nq, device=lo.device) * BLOCK < length)[:, None, :, None]  # (B, 1, nq, 1)

    def blocks(m: Tensor) -> tuple[Tensor, Tensor]:
        m = m[:, None, None, :] & live_q  # (B, 1, nq, nk): padded query blocks attend nothing
        return m.sum(-1, dtype=torch.int32), torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)

    (pn, pi), (fn, fi) = blocks(partial), blocks(full)
    return BlockMask.from_kv_blocks(pn, pi, fn, fi, BLOCK_SIZE=BLOCK, mask_mod=generate_key_padding_mask(t),
                                    seq_lengths=(n, n + G))


class BiasWorkspace:
    """A reusable flat buffer for the dense bias when no gradient is needed. A fresh B * H * N^2 allocation is
    faulted in page by page on every batch, about half of the bias build at N >= 1024 on CPU; reusing one
    buffer skips that. It holds the largest bias seen until `release()` (or until its owner is dropped)."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    def take(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        n = math.prod(shape)
        buf = self.buffer
        if buf is None or buf.numel() < n or buf.device != like.device or buf.dtype != like.dtype:
            self.buffer = buf = None  # free the old one first
            self.buffer = torch.empty(n, device=like.device, dtype=like.dtype)
        return self.buffer[:n].view(shape)

    def release(self) -> None:
        self.buffer = None


def build_dense_bias(t: BiasTensors, compiled: bool = True, workspace: BiasWorkspace | None = None) -> Tensor:
    """(B, H, N, N + G): one compiled kernel, a single pass writing the bias (eager if compiling fails);
    into `workspace` when given and no gradient flows to the bias tables."""
    needs_grad = torch.is_grad_enabled() and (t.pair.requires_grad or t.key_bias.requires_grad)
    out = None
    if workspace is not None and not needs_grad:
        (B, N), Nk, H = t.q_code.shape, t.k_code.shape[1], t.pair.shape[0]
        out = workspace.take((B, H, N, Nk), t.pair)
    inputs = (t.pair, t.key_bias, t.q_code, t.k_code, t.q_anc, t.k_anc)
    if compiled and "dense_bias_failed" not in _compiled:
        try:
            if out is None:
                return _compile("dense_bias", grid_bias)(*inputs)
            _compile("dense_bias_into", grid_bias_into)(out, *inputs)
            return out
        except Exception as exc:  # noqa: BLE001 - any compiler failure: say so, then build it eagerly
            _compiled["dense_bias_failed"] = _cause(exc)
            log.warning("compiling the dense bias kernel failed (%s); building it eagerly from now on", _cause(exc))
    if out is None:
        return dense_bias(t)
    grid_bias_into(out, *inputs)
    return out


def _compile(name: str, fn):
    if name not in _compiled:
        _compiled[name] = torch.compile(fn, dynamic=True)  # B and N vary per batch: one compile for all
    return _compiled[name]


class DenseAttention:
    def __init__(self, t: BiasTensors, compiled: bool = True, workspace: BiasWorkspace | None = None):
        self.bias = build_dense_bias(t, compiled, workspace)  # (B, H, N, N + G), -inf at padding keys

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.bias.dtype != q.dtype:  # under autocast (bf16 q, k, v): the float32 bias once in their dtype, for every layer
            self.bias = self.bias.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


class FlexAttention:
    def __init__(self, t: BiasTensors):
        self.score_mod = generate_structural_score_mod(t)
        self.block_mask = key_block_mask(t)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if "flex" not in _compiled:
            _compiled["flex"] = torch.compile(flex_attention, dynamic=False)  # static shapes: see the module docstring
        if q.dtype != torch.float32:  # under autocast: flex in float32 (its float32 bias tensors), the result cast back
            with torch.autocast(q.device.type, enabled=False):
                return self(q.float(), k.float(), v.float()).to(q.dtype)
        with torch._dynamo.config.patch(recompile_limit=64):  # one compile per (B, N) bucket
            return _compiled["flex"](q, k, v, score_mod=self.score_mod, block_mask=self.block_mask)


class StructuredAttention:
    """Per batch: attention with the structural bias on one backend. Layers pass q (B, H, N, Dh) and k, v
    (B, H, N + G, Dh) at the batch's own shape; this pads them to the backend's layout and back.
    `dense_tensors` builds the batch's own-shape tensors if flex fails and the dense backend takes over."""

    def __init__(self, backend: str, t: BiasTensors, shape: tuple[int, int], dense_tensors: Callable[[], BiasTensors],
                 compile_dense_bias: bool = True, workspace: BiasWorkspace | None = None):
        self.backend, self.tensors, self.shape = backend, t, shape
        self.dense_tensors, self.compile_dense_bias, self.workspace = dense_tensors, compile_dense_bias, workspace
        self.impl = FlexAttention(t) if backend == "flex" else DenseAttention(t, compile_dense_bias, workspace)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # -> (B, H, N, Dh)
        (B, N), (R, L) = self.shape, self.tensors.q_code.shape
        if (R, L) != (B, N):
            q = F.pad(q, (0, 0, 0, L - N, 0, 0, 0, R - B))
            k, v = (torch.cat([F.pad(x[:, :, :N], (0, 0, 0, L - N)), x[:, :, N:]], 2) for x in (k, v))
            k, v = (F.pad(x, (0, 0, 0, 0, 0, 0, 0, R - B)) for x in (k, v))
        try:
            out = self.impl(q, k, v)
        except Exception as exc:  # noqa: BLE001 - flex compilation failed: fall back, loudly
            if self.backend != "flex":
                raise
            global _flex_failure
            _flex_failure = _cause(exc)
            log.warning("flex attention failed (%s); falling back to the dense backend", _flex_failure)
            self.backend, self.tensors = "dense", self.dense_tensors()
            self.impl = DenseAttention(self.tensors, self.compile_dense_bias, self.workspace)
            return self.impl(q[:B, :, :N], *(torch.cat([x[:B, :, :N], x[:B, :, L:]], 2) for x in (k, v)))
        return out[:B, :, :N]


def _cause(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


def reset_compiled() -> None:
    """Forget compiled kernels and earlier compile failures (tests; after fixing the environment)."""
    global _flex_failure
    _flex_failure = None
    _compiled.clear()
