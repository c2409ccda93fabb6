"""A tiny engaged world for the hierarchy and retrieval tests: users, products, advertisers, one cold-start product,
embedded with a randomly initialised encoder (it tests wiring and invariants, not quality)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from hir_model.graph.types import NODE_TYPES
from hir_model.nn import Encoder, EncoderConfig
from hir_model.train.checkpoint import TrainedModel
from tests.hir_model.graph.graphs import AS_OF, DAY_US, make_graph

CONTENT_DIM = 8
WIDTH = 16
LEVELS = (2, 4)


def tiny_model(seed: int = 0, content_dim: int = CONTENT_DIM) -> TrainedModel:
    torch.manual_seed(seed)
    enc = Encoder(EncoderConfig(layers=1, heads=2, width=WIDTH, hash_codes=2, hash_buckets=1000, hash_hidden=16,
                                content_dim=content_dim, backend="dense", compile_dense_bias=False)).eval()
    protos = tuple(torch.nn.functional.normalize(torch.randn(k, WIDTH), dim=-1) for k in LEVELS)
    return TrainedModel(enc, protos, 0, "test", "w")


def tiny_world(n_users: int = 12, n_products: int = 20, n_adv: int = 3, seed: int = 0):
    """(graph, content table): the last product has no edge at all (cold start)."""
    rng = np.random.default_rng(seed)
    types = ["user"] * n_users + ["product"] * n_products + ["advertiser"] * n_adv
    n = len(types)
    users, products = np.arange(n_users), n_users + np.arange(n_products - 1)
    src, dst, et, w, ts = [], [], [], [], []
    for u in users:
        for p in rng.choice(products, 4, replace=False):
            src.append(u), dst.append(p), et.append("click"), w.append(1.0), ts.append(AS_OF - DAY_US)
    for i, p in enumerate(n_users + np.arange(n_products - 1)):  # the last product: no edge at all
        src.append(p), dst.append(n_users + n_products + i % n_adv), et.append("parent"), w.append(1.0), ts.append(AS_OF - 2 * DAY_US)
    g = make_graph(n, src, dst, et, w, ts, node_type=[NODE_TYPES.index(t) for t in types])
    vecs = rng.normal(size=(n, CONTENT_DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [f"n{i}" for i in range(n)]
    content = pa.table({"entity_id": pa.array(ids), "entity_type": pa.array(types),  # the content_embeddings columns read
                        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), CONTENT_DIM)})
    return g, content, types
