"""A graph round-trips through .npy + Parquet, loads memory-mapped, and never pickles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hir_model.graph.storage import ARRAYS, load_graph, write_graph
from tests.hir_model.graph.graphs import random_graph


def test_csr_round_trip_through_mmap(tmp_path):
    graph = random_graph(np.random.default_rng(0))
    write_graph(graph, tmp_path / "g")
    loaded = load_graph(tmp_path / "g")
    for name in ARRAYS:
        stored = getattr(loaded, name)
        assert isinstance(stored, np.memmap) and not stored.flags.writeable, name
        assert stored.dtype == getattr(graph, name).dtype and np.array_equal(stored, getattr(graph, name)), name
    assert loaded.indptr.dtype == np.int64 and loaded.neighbours.dtype == np.int32 and loaded.edge_type.dtype == np.int8
    assert loaded.weight.dtype == np.float32 and loaded.last_ts.dtype == np.int64
    assert (loaded.as_of_us, loaded.tau_s, loaded.relation_names) == (graph.as_of_us, graph.tau_s, graph.relation_names)
    assert loaded.nodes.entity_id.equals(graph.nodes.entity_id)
    for f in ("node_type", "first_seen_us", "hash_codes"):
        assert np.array_equal(getattr(loaded.nodes, f), getattr(graph.nodes, f)), f
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == sorted([f"{a}.npy" for a in ARRAYS] + ["graph.json", "nodes.parquet"])
    for name in ARRAYS:  # plain arrays: loadable without pickle
        np.load(tmp_path / "g" / f"{name}.npy", allow_pickle=False)


def test_inconsistent_or_missing_graphs_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="graph.json"):
        load_graph(tmp_path / "nothing")
    graph = random_graph(np.random.default_rng(1))
    write_graph(graph, tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "graph.json").read_text())
    (tmp_path / "g" / "graph.json").write_text(json.dumps(meta | {"num_edges": meta["num_edges"] + 1}))
    with pytest.raises(ValueError, match="inconsistent"):
        load_graph(tmp_path / "g")
