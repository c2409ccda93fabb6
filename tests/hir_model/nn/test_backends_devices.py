"""Flex against the dense reference on every device: one attention call's output and, where flex has a backward (not
on CPU), the gradients of q, k, v and of the bias tables; and the encoder under bf16 autocast on CUDA.

The CPU case compiles flex (tens of seconds) and is marked slow; the CUDA cases are skipped without a GPU
(benchmarks/gpu_session.sh runs them on one).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.nn import backends
from hir_model.nn.batch import collate
from hir_model.nn.bias import StructuralBias
from hir_model.nn.config import EncoderConfig
from hir_model.nn.encoder import Encoder
from tests.hir_model.nn.random_batches import random_batch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=CUDA)]
LENGTHS, G, HEADS, HEAD_DIM = [5, 40, 130], 3, 4, 16  # flex pads to (4, 256): full, partial and empty key blocks


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def attention_case(device: torch.device, training: bool):
    """Bias tables (random, so the bias matters), a collated batch and q, k, v (B, H, N [+ G], Dh) on `device`."""
    torch.manual_seed(0)
    sbias = StructuralBias(EncoderConfig(heads=HEADS, width=HEADS * HEAD_DIM)).to(device)
    for table in sbias.parameters():
        torch.nn.init.normal_(table)
    batch = collate(random_batch(np.random.default_rng(0), LENGTHS)[0]).to(device)
    B, N = batch.node_type.shape
    q = torch.randn(B, HEADS, N, HEAD_DIM, device=device, requires_grad=training)
    k, v = (torch.randn(B, HEADS, N + G, HEAD_DIM, device=device, requires_grad=training) for _ in range(2))
    return sbias, batch, (q, k, v)


def run_backend(backend: str, sbias: StructuralBias, batch, qkv, training: bool):
    """(output at real tokens, {name: grad}) of one attention call through `StructuredAttention`."""
    (B, N), grads = batch.node_type.shape, {}
    rows, length = backends.flex_shape(B, N) if backend == "flex" else (B, N)
    with torch.set_grad_enabled(training):
        attend = backends.StructuredAttention(backend, sbias.tensors(batch, length, G, rows), (B, N),
                                              lambda: sbias.tensors(batch, N, G), compile_dense_bias=False)
        out = attend(*qkv)  # (B, H, N, Dh)
        assert attend.backend == backend  # no silent fallback
        out = out * batch.valid[:, None, :, None]  # padded queries are free to differ
        if training:
            for p in (*qkv, *sbias.parameters()):
                p.grad = None
            out.square().sum().backward()
            grads = {"q": qkv[0], "k": qkv[1], "v": qkv[2], **dict(sbias.named_parameters())}
            grads = {name: None if t.grad is None else t.grad.detach().clone() for name, t in grads.items()}
    return out.detach(), grads


@pytest.mark.parametrize("device", DEVICES)
def test_flex_matches_dense_forward_and_backward(device):
    device = torch.device(device)
    training = device.type != "cpu"  # no flex backward on CPU
    backends.reset_compiled()
    sbias, batch, qkv = attention_case(device, training)
    dense, dense_grads = run_backend("dense", sbias, batch, qkv, training)
    flex, flex_grads = run_backend("flex", sbias, batch, qkv, training)
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-5)
    missing = sorted(name for name in dense_grads if flex_grads[name] is None or dense_grads[name] is None)
    assert not missing, f"no gradient for {missing}"
    errors = {name: relative_error(flex_grads[name], dense_grads[name]) for name in dense_grads}
    assert all(e < 1e-4 for e in errors.values()), errors


@CUDA
@pytest.mark.parametrize("backend", ["dense", "flex"])
def test_encoder_under_bf16_autocast_tracks_float32(backend):
    """The trainer's bf16 path (Encoder.autocast_dtype): finite float32 readouts close to the float32 encoder's, and a
    backward that reaches every parameter."""
    device = torch.device("cuda")
    backends.reset_compiled()
    torch.manual_seed(0)
    enc = Encoder(EncoderConfig(content_dim=8, backend=backend, compile_dense_bias=False)).to(device)
    batch = collate(random_batch(np.random.default_rng(1), [5, 40, 130, 9], content_dim=8)[0]).to(device)
    glob = torch.randn(G, enc.cfg.width, device=device)
    reference = enc(batch, glob)
    reference.square().sum().backward()
    expected = {n for n, p in enc.named_parameters() if p.grad is not None}
    enc.zero_grad(set_to_none=True)
    enc.autocast_dtype = torch.bfloat16
    out = enc(batch, glob)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    cosine = torch.nn.functional.cosine_similarity(out.detach(), reference.detach(), dim=-1)
    assert cosine.min() > 0.99, cosine
    out.square().sum().backward()
    got = {n for n, p in enc.named_parameters() if p.grad is not None and torch.isfinite(p.grad).all()}
    assert got == expected, expected ^ got
