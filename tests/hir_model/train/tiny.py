"""A tiny planted graph for the training tests: G groups, users engage with their group's products."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from hir_model.graph.csr import NodeTable, aggregate, both_directions, node_bits, to_graph
from hir_model.graph.hashing import HashConfig, hash_codes
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES
from hir_model.nn import EncoderConfig
from hir_model.train.config import TrainConfig, set_fields
from hir_model.train.data import TrainData, active_nodes

US = 1_000_000
DAY = 86_400 * US
AS_OF = 1_700_000_000 * US


def tiny_data(groups: int = 4, users: int = 6, products: int = 6, seed: int = 0) -> tuple[TrainData, np.ndarray]:
    """-> (data, group of each node). Nodes: per group `users` users, `products` products, 1 advertiser."""
    rng = np.random.default_rng(seed)
    per = users + products + 1
    n = groups * per
    group = np.repeat(np.arange(groups), per)
    kind = np.tile(np.array(["user"] * users + ["product"] * products + ["advertiser"]), groups)
    src, dst, et, ts = [], [], [], []
    for g in range(groups):
        u0, p0, a = g * per, g * per + users, g * per + users + products
        for u in range(u0, u0 + users):
            for p in rng.choice(np.arange(p0, p0 + products), 3, replace=False):
                src.append(u), dst.append(p), et.append(rng.choice(["click", "purchase"])), ts.append(AS_OF - rng.integers(1, 20) * DAY)
        for p in range(p0, p0 + products):
            src.append(p), dst.append(a), et.append("parent"), ts.append(AS_OF - 30 * DAY)
    types = np.array([EDGE_TYPES.index(t) for t in et], np.int8)
    bits = node_bits(n)
    edges = aggregate(both_directions(np.array(src), np.array(dst), types, np.ones(len(src)), np.array(ts, np.int64),
                                      np.full(len(src), -1, np.int32), bits))
    ids = [f"n{i}" for i in range(n)]
    cfg = HashConfig()
    nodes = NodeTable(pa.array(ids), np.array([NODE_TYPES.index(k) for k in kind], np.int8), np.zeros(n, np.int64),
                      hash_codes(ids, cfg.k, cfg.buckets))
    graph = to_graph(edges, nodes, bits, AS_OF, 30 * 86_400.0, ())
    eng = np.array([t in ("click", "purchase") for t in et])
    pu, pe = np.array(src)[eng], np.array(dst)[eng]
    data = TrainData(graph, AS_OF, active_nodes(graph, AS_OF), pu, pe, np.ones(len(pu), np.int64),
                     np.full(len(pu), 1 / len(pu)))
    return data, group


def tiny_config(**kw) -> TrainConfig:
    enc = EncoderConfig(width=32, heads=2, layers=1, hash_hidden=32, compile_dense_bias=False)
    base = set_fields(TrainConfig(), levels=(2, 4), steps=4, batch_size=16, warmup_steps=1, checkpoint_every=2, probe_size=4,
                       metric_nodes=64, encoder=enc)
    return set_fields(base, **kw)
