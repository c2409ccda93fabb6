"""Backend choice, the flex block mask, and the fallbacks when compilation fails."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hir_model.nn import backends
from hir_model.nn.backends import BLOCK, BiasWorkspace, choose_backend, flex_shape, key_block_mask
from hir_model.nn.batch import collate
from hir_model.nn.bias import StructuralBias
from hir_model.nn.config import EncoderConfig
from hir_model.nn.encoder import Encoder
from tests.hir_model.nn.random_batches import random_batch

CPU = torch.device("cpu")
MB = 2**20


@pytest.fixture
def fresh_compile_state():
    backends.reset_compiled()
    yield
    backends.reset_compiled()


@pytest.mark.parametrize(("requested", "device", "training", "bias_mb", "expected", "why"), [
    ("auto", "cpu", True, 4096, "dense", "no CPU backward"),  # whatever the size: flex cannot train on CPU
    ("auto", "cpu", False, 16, "dense", "faster at every measured length"),
    ("auto", "cpu", False, 4096, "flex", "budget"),  # too big for the dense bias: the memory path
    ("auto", "cuda", False, 16, "dense", "faster at every measured length"),
    ("auto", "cuda", True, 16, "dense", "faster at every measured length"),
    ("auto", "cuda", True, 4096, "flex", "budget"),
    ("auto", "meta", False, 16, "dense", "no flex on meta"),
    ("flex", "cpu", True, 16, "dense", "no CPU backward (config asked for flex)"),
    ("flex", "cpu", False, 16, "flex", "set in config"),
    ("dense", "cuda", False, 4096, "dense", "set in config"),
])
def test_auto_choice(requested, device, training, bias_mb, expected, why):
    choice = choose_backend(requested, torch.device(device), training, 1024, bias_mb * MB, 1024 * MB)
    assert choice.backend == expected and why in choice.reason


def test_auto_choice_follows_the_crossover_table(monkeypatch):
    monkeypatch.setitem(backends.FLEX_FROM_TOKENS, ("cpu", False), 512)
    assert choose_backend("auto", CPU, False, 511, MB, 1024 * MB).backend == "dense"
    assert choose_backend("auto", CPU, False, 512, MB, 1024 * MB).backend == "flex"


def test_cuda_takes_dense_at_every_length_within_the_memory_budget():
    cuda = torch.device("cuda")  # a device object only: choose_backend never touches the device
    for training in (False, True):
        assert choose_backend("auto", cuda, training, 16384, MB, 1024 * MB).backend == "dense"
        assert choose_backend("auto", cuda, training, 16384, 2048 * MB, 1024 * MB).backend == "flex"


def test_dense_budget_is_the_config_on_cpu():
    assert backends.dense_budget_bytes(1024, CPU) == 1024 * MB


def test_flex_shapes_are_powers_of_two():
    assert flex_shape(1, 1) == (1, BLOCK) and flex_shape(3, 129) == (4, 256) and flex_shape(16, 4096) == (16, 4096)


def test_block_mask_keeps_exactly_the_blocks_with_real_keys():
    lengths = [1, 130, 256, 300, 0]
    sampled, _ = random_batch(np.random.default_rng(0), lengths[:-1], max_depth=2)
    t = StructuralBias(EncoderConfig()).tensors(collate(sampled), length=512, n_global=5, rows=5)
    dense = key_block_mask(t).to_dense()[:, 0].bool().numpy()  # (B, nq, nk) blocks visited
    nq, nk = 512 // BLOCK, -(-(512 + 5) // BLOCK)
    for b, n in enumerate(lengths):
        for i in range(nq):
            live = i * BLOCK < n  # a query block holding real tokens
            expected = [live and (j * BLOCK < n or j >= nq) for j in range(nk)]
            assert dense[b, i].tolist() == expected, (b, i)


def test_workspace_reuses_one_buffer():
    ws, like = BiasWorkspace(), torch.zeros(())
    a = ws.take((2, 4, 8, 8), like)
    b = ws.take((1, 4, 8, 8), like)
    assert b.data_ptr() == a.data_ptr() and b.shape == (1, 4, 8, 8)
    assert ws.take((4, 4, 8, 8), like).numel() == 1024 and ws.buffer.numel() == 1024


def test_compile_failure_falls_back_to_dense_with_a_warning(fresh_compile_state, monkeypatch, caplog):
    torch.manual_seed(0)
    reference = Encoder(EncoderConfig(backend="dense", compile_dense_bias=False))
    flex = Encoder(EncoderConfig(backend="flex"))
    flex.load_state_dict(reference.state_dict())
    batch = collate(random_batch(np.random.default_rng(1), [4, 9, 2])[0])

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", broken_compile)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hir"):
        out = flex(batch)
        expected = reference(batch)
    torch.testing.assert_close(out, expected)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("flex attention failed" in w and "no C++ compiler here" in w for w in warnings), warnings
    assert any("dense bias kernel failed" in w and "no C++ compiler here" in w for w in warnings), warnings
    choice = choose_backend("auto", CPU, False, 4096, 10**12, 1024 * MB)  # would be flex, but flex failed
    assert choice.backend == "dense" and "flex failed" in choice.reason
