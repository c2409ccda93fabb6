"""The encoder end to end on random batches: flex against the dense reference, edge cases, init, repr, logging.

Flex compiles once per padded (B, N) bucket (tens of seconds on CPU): the encoders are built once per module
and the flex cases reuse three buckets, (4, 128), (1, 128) and (4, 256), all with 3 global tokens.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hir_model.nn.batch import collate
from hir_model.nn.config import EncoderConfig
from hir_model.nn.encoder import Encoder
from tests.hir_model.nn.random_batches import concat, random_batch

G = 3


@pytest.fixture(scope="module")
def encoders() -> dict[str, Encoder]:
    """Three encoders with the same random weights (bias tables too, so the bias matters) and backends."""
    torch.manual_seed(0)
    base = EncoderConfig(content_dim=8)
    reference = Encoder(EncoderConfig(**{**base.__dict__, "backend": "dense", "compile_dense_bias": False}))
    for table in reference.bias.parameters():
        torch.nn.init.normal_(table)
    out = {"reference": reference,
           "dense": Encoder(EncoderConfig(**{**base.__dict__, "backend": "dense"})),
           "flex": Encoder(EncoderConfig(**{**base.__dict__, "backend": "flex"}))}
    for enc in out.values():
        enc.load_state_dict(reference.state_dict())
        enc.eval()
    return out


@pytest.fixture(scope="module")
def global_tokens() -> torch.Tensor:
    return torch.randn(G, 128, generator=torch.Generator().manual_seed(1))


def encode(encoder: Encoder, lengths: list[int], seed: int, globals_: torch.Tensor | None) -> torch.Tensor:
    batch = collate(random_batch(np.random.default_rng(seed), lengths, content_dim=8)[0])
    with torch.no_grad():
        return encoder(batch, globals_)


CASES = {
    "variable lengths, padding": [5, 1, 40, 17],
    "single-token sequence": [1, 3, 2, 6],
    "batch of one": [7],
    "several blocks": [200, 130, 5],  # full and partial key blocks, padded query blocks
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_flex_and_dense_agree(encoders, global_tokens, case):
    lengths = CASES[case]
    expected = encode(encoders["reference"], lengths, 0, global_tokens)
    for backend in ("dense", "flex"):
        out = encode(encoders[backend], lengths, 0, global_tokens)
        assert encoders[backend].last_choice.backend == backend  # no silent fallback
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("lengths", [[7], [1], [1, 1], [3, 1, 12]])
def test_output_is_one_unit_vector_per_seed(encoders, global_tokens, lengths):
    for globals_ in (None, global_tokens):  # the eager reference: size-1 shapes would each compile the dense kernel
        out = encode(encoders["reference"], lengths, 2, globals_)
        assert out.shape == (len(lengths), 128) and torch.isfinite(out).all()
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(len(lengths)))


def test_global_tokens_change_the_output(encoders, global_tokens):
    reference = encoders["reference"]
    assert not torch.allclose(encode(reference, [5, 9], 3, None), encode(reference, [5, 9], 3, global_tokens))
    with pytest.raises(ValueError, match="global tokens"):
        encode(reference, [5], 3, torch.zeros(2, 64))


def test_padding_and_batch_mates_do_not_change_a_sequence(encoders, global_tokens):
    short, _ = random_batch(np.random.default_rng(4), [6], content_dim=8)
    long, _ = random_batch(np.random.default_rng(5), [30, 2], content_dim=8)
    with torch.no_grad():
        alone = encoders["reference"](collate(short), global_tokens)
        together = encoders["reference"](collate(concat(short, long)), global_tokens)
    torch.testing.assert_close(together[:1], alone)


def test_training_on_cpu_uses_dense_and_logs_the_choice(caplog):
    encoder = Encoder(EncoderConfig(compile_dense_bias=False))
    batch = collate(random_batch(np.random.default_rng(6), [4, 8])[0])
    with caplog.at_level(logging.INFO, logger="hir"):
        encoder(batch).sum().backward()
    assert encoder.last_choice.backend == "dense" and "no CPU backward" in encoder.last_choice.reason
    assert any("attention backend: dense" in r.getMessage() for r in caplog.records)


def test_reset_parameters_and_repr():
    encoder = Encoder(EncoderConfig(layers=3, heads=2, width=64))
    with torch.no_grad():
        for p in encoder.parameters():
            p.fill_(1.0)
    encoder.reset_parameters()
    assert all(t.abs().sum() == 0 for t in encoder.bias.parameters())  # tables start neutral
    assert encoder.blocks[0].attn.qkv.weight.std().item() == pytest.approx(64 ** -0.5, rel=0.1)  # 1 / sqrt(width)
    assert encoder.blocks[0].attn.proj.weight.std().item() == pytest.approx(64 ** -0.5 / 6 ** 0.5, rel=0.1)  # / sqrt(2 layers)
    assert encoder.ln_f.weight.eq(1).all() and encoder.blocks[2].mlp[2].bias.eq(0).all()
    text = repr(encoder)
    assert "layers=3, heads=2, width=64" in text and "StructuralBias(heads=2" in text and "params=" in text


def test_config_is_validated():
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(width=100, heads=3)
    with pytest.raises(ValueError, match="backend"):
        EncoderConfig(backend="fast")
