"""End to end on real data: the MovieLens graph, both sampled views, encoded (no training yet)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from hir_model.data.movielens import MovieLensSource
from hir_model.data.windows import WindowSpec
from hir_model.graph.build import build_graph
from hir_model.graph.sampler import sample_views
from hir_model.graph.window import to_us
from hir_model.nn.batch import collate
from hir_model.nn.config import EncoderConfig
from hir_model.nn.encoder import Encoder

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_encode_sampled_movielens_neighbourhoods():
    source = MovieLensSource(Path(os.environ.get("HIR_DATA_DIR", REPO / "data")))
    source.prepare()
    windows = WindowSpec.covering("weekly", *source.span()).windows()[:4]
    end = windows[-1].end
    catalog = pa.concat_tables([b.table for b in source.catalog(end)])
    relations = pa.concat_tables([b.table for b in source.relations(end)])
    events = [b.table for w in windows for b in source.events(w)]
    graph, _ = build_graph(None, catalog, relations, events, to_us(end))
    rng = np.random.default_rng(0)
    seeds = rng.choice(np.flatnonzero(graph.nodes.node_type == 0), 8, replace=False)
    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig())  # defaults match the graph's hashing and the broad view's depth
    global_tokens = torch.randn(4, encoder.cfg.width)
    for sampled in sample_views(graph, seeds, graph.as_of_us, rng):  # narrow (~40 tokens) and broad (~550, depth 3)
        batch = collate(sampled)
        with torch.no_grad():
            out = encoder(batch, global_tokens)
        assert out.shape == (8, encoder.cfg.width) and torch.isfinite(out).all()
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(8))
        assert batch.max_len > 1 and encoder.last_choice.backend == "dense"  # CPU inference at this size
    assert torch.unique(out, dim=0).shape[0] == 8  # different neighbourhoods, different embeddings
