"""The tiny store (tiny.py) with HIR's artefacts for W0 and W1: graph, a random-weight checkpoint, entity embeddings.

The checkpoint is an untrained Encoder (training is tested elsewhere): these tests check the wiring, the causality and
the shapes of HIR's evaluation, not the quality of its embeddings.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hir_model.embed import EMBEDDINGS_ASSET, EMBEDDINGS_FILE, EmbedConfig, embeddings_table
from hir_model.embed.entity_embeddings import embed_window
from hir_model.graph.window import build_window_graph, to_us
from hir_model.nn import Encoder, EncoderConfig
from hir_model.rank.head import HeadConfig
from hir_model.rank.ranking_head import build_head_state
from hir_model.rank.state import HEAD_ASSET, write_head
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import checkpoint_path, save_checkpoint
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

WIDTH = 16


def fake_checkpoint(store: PartitionStore, key: str, seed: int = 0, structure_dim: int = 0, temp: float | None = None) -> None:
    """`temp`: record a training config with that engagement temperature (else none is recorded)."""
    torch.manual_seed(seed)
    enc = Encoder(EncoderConfig(layers=1, heads=2, width=WIDTH, hash_hidden=16, compile_dense_bias=False, structure_dim=structure_dim))
    for p in enc.embed.ids.mlp[-1].parameters():  # the id MLP's output starts at zero: give ids a voice
        torch.nn.init.normal_(p, std=0.5)
    protos = [torch.nn.functional.normalize(torch.randn(k, WIDTH), dim=-1) for k in (2, 3)]
    path = checkpoint_path(store, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = None if temp is None else {"train_config": {"engagement_temp": temp}}
    save_checkpoint(path, enc, protos, step=0, window=key, extra=extra)


def publish_head(store: PartitionStore, key: str, config: HeadConfig = HeadConfig()) -> None:
    """ranking_head of `key` with `config`, as the asset writes it."""
    state = build_head_state(store, SPEC, key, config)
    with store.writing() as staging:
        write_head(staging.path(HEAD_ASSET, key), state)


def hir_store(root: Path, plant_future: bool = False, corrupt_w2: bool = False, windows: int = 2,
              structure_dim: int = 0, temp: float | None = None) -> PartitionStore:
    """tiny_store (with its options) plus engagement_graph, hir_encoder (reading structural encodings of `structure_dim`,
    its training config recording engagement temperature `temp` when given), entity_embeddings and ranking_head (the
    default HeadConfig) of the first `windows`."""
    store = tiny_store(root, plant_future=plant_future, corrupt_w2=corrupt_w2)
    previous = None
    for window in SPEC.windows()[:windows]:
        with store.writing() as staging:
            build_window_graph(store, window, previous, staging)
        fake_checkpoint(store, window.key, structure_dim=structure_dim, temp=temp)
        build = embed_window(store, window.key, to_us(window.end), EmbedConfig(batch_size=8))
        with store.writing() as staging:
            staging.write_table(EMBEDDINGS_ASSET, window.key, EMBEDDINGS_FILE, embeddings_table(build.embeddings))
        publish_head(store, window.key)
        previous = window.key
    return store


__all__ = ["KEYS", "SPEC", "hir_store", "publish_head"]
