"""BoM tokens, the inverted index's order and cap, faiss round trip, reranking and recall, on tiny crafted data."""

from __future__ import annotations

import faiss
import numpy as np
import pyarrow as pa
import pytest

from hir_model.embed import EntityEmbeddings, embed_entities
from hir_model.hierarchy import build_hierarchy
from hir_model.retrieval import (FAISS_FILE, IndexConfig, Retriever, bom_tokens, build_faiss, build_postings, recall_at_k,
                                 sample_users, write_index)
from tests.hir_model.graph.graphs import AS_OF
from tests.hir_model.retrieval.fixtures import tiny_model, tiny_world


def tokens_table(rows) -> pa.Table:
    e, lv, r, p, w = zip(*rows)
    return bom_tokens(pa.table({"entity_id": list(e), "level": pa.array(lv, pa.int32()), "rank": pa.array(r, pa.int32()),
                                "primitive": pa.array(p, pa.int64()), "weight": pa.array(w, pa.float32())}))


def test_tokens_and_postings_sorted_by_weight_and_capped():
    tok = tokens_table([("a", 0, 0, 7, 0.2), ("b", 0, 0, 7, 0.9), ("c", 0, 0, 7, 0.5), ("u", 0, 0, 7, 1.0), ("a", 1, 0, 3, 1.0)])
    assert tok["token"].to_pylist() == ["L0:7", "L0:7", "L0:7", "L0:7", "L1:3"]
    post, stats = build_postings(tok, ["a", "b", "c"], max_share=1.0)  # "u" is not an item
    assert post.to_pylist()[:3] == [{"token": "L0:7", "entity_id": e, "weight": pytest.approx(w)} for e, w in
                                    (("b", 0.9), ("c", 0.5), ("a", 0.2))]
    assert stats.tokens == 2 and stats.truncated == 0
    capped, stats = build_postings(tok, ["a", "b", "c"], max_share=0.5)  # cap = floor(1.5) = 1
    assert capped.filter(pa.compute.equal(capped["token"], "L0:7"))["entity_id"].to_pylist() == ["b"]
    assert stats.cap == 1 and stats.truncated == 1 and stats.longest == 1


def crafted_retriever(tmp_path, vectors: dict[str, list[float]], types: dict[str, str], token_rows) -> Retriever:
    ids = list(vectors)
    v = np.array([vectors[e] for e in ids], np.float32)
    emb = EntityEmbeddings(np.array(ids, object), np.array([types[e] for e in ids], object), v / np.linalg.norm(v, axis=1, keepdims=True),
                           np.zeros(len(ids), bool), np.arange(len(ids)))
    tok = tokens_table(token_rows)
    post, _ = build_postings(tok, [e for e in ids if types[e] != "user"], max_share=1.0)
    write_index(tmp_path, emb, tok, post)
    return Retriever.load(tmp_path, emb)


def test_retrieve_reranks_postings_by_dot_product(tmp_path):
    r = crafted_retriever(tmp_path, {"u": [1, 0], "p1": [0, 1], "p2": [1, 0.1], "p3": [1, 0.2], "p4": [1, 0]},
                          {"u": "user", "p1": "product", "p2": "product", "p3": "advertiser", "p4": "product"},
                          [("u", 0, 0, 1, 1.0), ("p1", 0, 0, 1, 0.9), ("p2", 0, 0, 1, 0.1), ("p3", 0, 0, 1, 0.5), ("p4", 0, 0, 2, 1.0)])
    hits = r.retrieve("u", 2)
    assert [h.entity_id for h in hits] == ["p2", "p3"]  # p4 is closer but shares no token; p1 has the heaviest posting
    assert hits[0].score == pytest.approx(1 / np.sqrt(1.01), rel=1e-5)
    assert [h.entity_id for h in r.retrieve("u", 2, exact=True)] == ["p4", "p2"]
    assert [h.entity_id for h in r.similar("p2", 3)] == ["p3", "p1"]  # its own token's postings, itself excluded
    assert "p2" not in [h.entity_id for h in r.similar("p2", 3, exact=True)]
    report = recall_at_k(r, ["u"], k=2)
    assert report.recall == pytest.approx(0.5) and report.candidates_per_query == 3 and report.items == 4
    with pytest.raises(KeyError, match="no embedding"):
        r.retrieve("nobody")


def test_faiss_round_trip_exact_and_hnsw(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for cfg, kind in ((IndexConfig(), faiss.IndexFlatIP), (IndexConfig(exact_max=100), faiss.IndexHNSWFlat)):
        faiss.write_index(build_faiss(x, cfg), str(tmp_path / FAISS_FILE))
        back = faiss.read_index(str(tmp_path / FAISS_FILE))
        assert isinstance(back, kind) and back.ntotal == 300
        _, top = back.search(x[:5], 1)
        assert top[:, 0].tolist() == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(back.reconstruct_n(0, 300), x, atol=1e-6)


def test_end_to_end_tiny_world(tmp_path):
    """Random encoder weights: wiring, every entity tokenised at every level, cold-start item retrievable."""
    graph, content, _ = tiny_world()
    model = tiny_model()
    emb = embed_entities(model, graph, AS_OF, content)
    h = build_hierarchy(emb, [p.numpy() for p in model.prototypes], graph, AS_OF, {})
    tok = bom_tokens(h.tables["assignments"])
    levels = {lv: set(tok.filter(pa.compute.equal(tok["level"], lv))["entity_id"].to_pylist()) for lv in (0, 1)}
    assert all(s == set(emb.entity_id) for s in levels.values())
    items = emb.entity_id[np.isin(emb.entity_type, ("product", "advertiser"))]
    post, _ = build_postings(tok, items, max_share=1.0)
    write_index(tmp_path, emb, tok, post)
    r = Retriever.load(tmp_path, emb)
    report = recall_at_k(r, sample_users(emb, 5), k=10)
    assert report.queries == 5 and 0 <= report.recall <= 1
    assert r.similar("n31", 3)  # the cold-start product has tokens, so it has neighbours
