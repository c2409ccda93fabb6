"""BoM tokens, the inverted index's order and cap, faiss round trip, probing and similarity, on tiny crafted data (the
served path over it, tuned against the ranking head, is tested in tests/hir_model/rank)."""

from __future__ import annotations

import faiss
import numpy as np
import pyarrow as pa
import pytest

from hir_model.embed import EntityEmbeddings, embed_entities
from hir_model.hierarchy import build_hierarchy
from hir_model.retrieval import (FAISS_FILE, IndexConfig, Retriever, bom_tokens, build_faiss, build_postings, posting_cap,
                                 write_index)
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


def crafted_retriever(tmp_path, vectors: dict[str, list[float]], types: dict[str, str], token_rows,
                      centroids: dict[tuple[int, int], list[float]] | None = None, config: IndexConfig = IndexConfig()) -> Retriever:
    ids = list(vectors)
    v = np.array([vectors[e] for e in ids], np.float32)
    emb = EntityEmbeddings(np.array(ids, object), np.array([types[e] for e in ids], object), v / np.linalg.norm(v, axis=1, keepdims=True),
                           np.zeros(len(ids), bool), np.arange(len(ids)))
    tok = tokens_table(token_rows)
    post, _ = build_postings(tok, [e for e in ids if types[e] != "user"], max_share=1.0)
    primitives = None
    if centroids:
        (lv, p), c = zip(*centroids), np.array(list(centroids.values()), np.float32)
        primitives = pa.table({"level": pa.array(lv, pa.int32()), "primitive": pa.array(p, pa.int64()),
                               "centroid": pa.FixedSizeListArray.from_arrays(pa.array(c.reshape(-1)), c.shape[1])})
    items = emb.entity_type != "user"
    write_index(tmp_path, emb.entity_id[items], emb.entity_type[items], emb.vectors[items], tok, post, config, primitives)
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
    np.testing.assert_array_equal(r.probe_vector(r.vector("u"), 3)[0], r.probe_order("u", 3))  # by id or by vector
    with pytest.raises(KeyError, match="no embedding"):
        r.retrieve("nobody")


def test_probing_takes_the_nearest_fine_primitives_up_to_the_budget(tmp_path):
    """The user's own fine token is L1:1; probing adds L1:2's heaviest items (its centroid is next nearest), never L1:3."""
    vectors = {"u": [1, 0.1], "a1": [1, 0], "a2": [1, 0.2], "b1": [0.7, 0.7], "b2": [0.8, 0.6], "b3": [0.6, 0.8], "c1": [-1, 0]}
    types = {e: "user" if e == "u" else "product" for e in vectors}
    rows = [("u", 1, 0, 1, 1.0), ("a1", 1, 0, 1, 1.0), ("a2", 1, 0, 1, 0.9), ("b1", 1, 0, 2, 0.5), ("b2", 1, 0, 2, 0.9),
            ("b3", 1, 0, 2, 0.7), ("c1", 1, 0, 3, 1.0)] + [(e, 0, 0, 0, 1.0) for e in vectors]  # one coarse token for all
    centroids = {(0, 0): [1, 0], (1, 1): [1, 0.1], (1, 2): [0.7, 0.7], (1, 3): [-1, 0]}
    r = crafted_retriever(tmp_path, vectors, types, rows, {k: list(np.array(c) / np.linalg.norm(c)) for k, c in centroids.items()})
    got = lambda f, k: sorted(r.item_ids[r.with_probe_factor(f).candidates("u", k)].tolist())  # noqa: E731
    assert got(1.0, 2) == ["a1", "a2"]  # the budget is met by the nearest primitive alone
    assert got(1.0, 3) == ["a1", "a2", "b2"]  # then the next one's heaviest entry
    assert got(2.5, 2) == ["a1", "a2", "b1", "b2", "b3"]  # 5 = ceil(2.5 x 2): L1:3 is never needed
    assert got(0, 2) == sorted(r.item_ids.tolist())  # no probing: its stored tokens (the coarse one holds everything)
    assert len(r.with_probe_factor(10.0).candidates("u", 2)) == 6  # fine level exhausted: the coarse level follows
    assert [h.entity_id for h in r.with_probe_factor(1.0).retrieve("u", 3)] == ["a2", "a1", "b2"]  # reranked by dot product
    assert r.budget(3) == 9  # the default probe_factor (3.0)
    # exact top-4: a2 a1 b2 b1; probe order: a1 a2 (L1:1 by weight), b2 b3 b1 (L1:2 by weight)
    assert r.item_ids[r.probe_order("u", 10)].tolist() == ["a1", "a2", "b2", "b3", "b1", "c1"]


def test_adaptive_budgets_take_what_lies_within_the_margin(tmp_path):
    """Per-query budgets: the items whose priority is within the margin of the query's best, k at least, the probe
    factor x k at most; the margin is tuned to the smallest that reaches the target and stored in probe.json."""
    vectors = {"u": [1, 0.1], "v": [0.75, 0.65], "a1": [1, 0], "a2": [1, 0.2], "b1": [0.7, 0.7], "b2": [0.8, 0.6],
               "b3": [0.6, 0.8], "c1": [-1, 0]}
    types = {e: "user" if e in ("u", "v") else "product" for e in vectors}
    rows = [("u", 1, 0, 1, 1.0), ("v", 1, 0, 2, 1.0), ("a1", 1, 0, 1, 1.0), ("a2", 1, 0, 1, 0.9), ("b1", 1, 0, 2, 0.5),
            ("b2", 1, 0, 2, 0.9), ("b3", 1, 0, 2, 0.7), ("c1", 1, 0, 3, 1.0)]
    centroids = {(1, 1): [1, 0.1], (1, 2): [0.7, 0.7], (1, 3): [-1, 0]}
    r = crafted_retriever(tmp_path, vectors, types, rows, {k: list(np.array(c) / np.linalg.norm(c)) for k, c in centroids.items()})
    r = r.with_probe_margin(0.05, 3.0)  # weight prior 0: a list's entries share its centroid's similarity
    got = lambda q, k: sorted(r.item_ids[r.candidates(q, k)].tolist())  # noqa: E731
    assert got("u", 1) == ["a1", "a2"]  # L1:1 (cos 1) alone: L1:2 (cos 0.77) is outside the margin
    assert got("v", 1) == ["b1", "b2", "b3"]  # v's nearest list holds three
    assert got("u", 3) == ["a1", "a2", "b2"]  # the floor k = 3 reaches into the next list, heaviest first
    assert len(r.with_probe_margin(0.5, 3.0).candidates("u", 1)) == 3  # wide margin: capped at 3 x k
    assert len(r.with_probe_margin(0.5, 3.0).candidates("u", 2)) == 5  # 6 allowed, the margin (cos > 0.5) stops at 5
    assert len(r.with_probe_margin(0.0, 3.0).candidates("u", 2)) == 2  # margin 0: the nearest list's equal priorities


def test_weight_prior_lets_a_firmly_held_item_of_the_next_primitive_go_first(tmp_path):
    """a1 is held loosely (0.05) by the nearest primitive L1:1, b2 firmly (0.9) by the next, L1:2: with weight_prior 0
    probing reads L1:1 whole first; with a prior, b2 (cos 0.77 + 0.1 x log 0.9) passes a1 (cos 0.995 + 0.1 x log 0.05)."""
    vectors = {"u": [1, 0.1], "a1": [1, 0], "a2": [1, 0.2], "b1": [0.7, 0.7], "b2": [0.8, 0.6], "c1": [-1, 0]}
    types = {e: "user" if e == "u" else "product" for e in vectors}
    rows = [("u", 1, 0, 1, 1.0), ("a1", 1, 0, 1, 0.05), ("a2", 1, 0, 1, 0.9), ("b1", 1, 0, 2, 0.5), ("b2", 1, 0, 2, 0.9),
            ("c1", 1, 0, 3, 1.0)]
    centroids = {(1, 1): [1, 0.1], (1, 2): [0.7, 0.7], (1, 3): [-1, 0]}
    r = crafted_retriever(tmp_path, vectors, types, rows, {k: list(np.array(c) / np.linalg.norm(c)) for k, c in centroids.items()})
    order = lambda prior: r.item_ids[Retriever.load(tmp_path, r.emb, weight_prior=prior).probe_order("u", 5)].tolist()  # noqa: E731
    assert order(0.0) == ["a2", "a1", "b2", "b1", "c1"]
    assert order(0.1) == ["a2", "b2", "b1", "a1", "c1"]


def test_probing_reads_only_the_lists_it_needs_and_matches_a_full_scan(tmp_path):
    """Random postings over 40 primitives: the first `limit` rows of the probe order equal the top `limit` of a scan of
    every posting of the level by priority (best per item), for several limits and priors."""
    rng = np.random.default_rng(3)
    n, k, dim = 300, 40, 8
    vectors = {f"i{j}": list(rng.normal(size=dim)) for j in range(n)} | {"u": list(rng.normal(size=dim))}
    types = {e: "user" if e == "u" else "product" for e in vectors}
    rows = [("u", 1, 0, 0, 1.0)]
    for j in range(n):
        prims = rng.choice(k, 3, replace=False)
        w = rng.dirichlet(np.ones(3))
        rows += [(f"i{j}", 1, rank, int(p), float(x)) for rank, (p, x) in enumerate(zip(prims, w))]
    cents = rng.normal(size=(k, dim))
    r = crafted_retriever(tmp_path, vectors, types, rows, {(1, p): list(c / np.linalg.norm(c)) for p, c in enumerate(cents)})
    book = r.codebooks[0]
    sims = book.centroids @ r.vector("u")
    for prior in (0.0, 0.05, 0.3):
        best = np.full(n, -np.inf)
        for p, tok in enumerate(book.tokens):
            items, weights = r.postings.get(tok, (np.zeros(0, np.int64), np.zeros(0)))
            best[items] = np.maximum(best[items], sims[p] + prior * np.log(weights))
        for limit in (10, 60, 250):
            got = Retriever.load(tmp_path, r.emb, weight_prior=prior).probe_order("u", limit)
            assert len(got) == limit and len(set(got.tolist())) == limit
            assert np.allclose(np.sort(best[got])[::-1], np.sort(best)[::-1][:limit])


def test_token_and_posting_invariants(tmp_path):
    """On the tiny world: a token per level for every entity (cold start too), weights summing to one per level, lists
    sorted by weight and within the cap, every posting an item's own token."""
    graph, content, _ = tiny_world()
    emb = embed_entities(tiny_model(), graph, AS_OF, content)
    h = build_hierarchy(emb, [p.numpy() for p in tiny_model().prototypes], graph, AS_OF, {})
    tok = bom_tokens(h.tables["assignments"]).to_pandas()
    per_level = tok.groupby(["entity_id", "level"]).weight.agg(["size", "sum"])
    assert len(per_level) == len(emb) * len(h.levels)  # every (entity, level) pair has tokens
    np.testing.assert_allclose(per_level["sum"], 1.0, rtol=1e-5)
    assert tok.token.str.fullmatch(r"L\d+:\d+").all() and (tok.weight > 0).all()
    assert set(tok[tok.entity_id == "n31"].level) == {0, 1}  # the cold-start product is tokenised at every level
    items = emb.entity_id[np.isin(emb.entity_type, ("product", "advertiser"))]
    post, stats = build_postings(bom_tokens(h.tables["assignments"]), items, max_share=0.2)
    p = post.to_pandas()
    cap = posting_cap(len(items), 0.2)
    assert p.groupby("token").size().max() <= cap == stats.cap and set(p.entity_id) <= set(items)
    assert all((np.diff(g.weight.to_numpy()) <= 0).all() for _, g in p.groupby("token"))
    pairs = set(zip(tok.token, tok.entity_id))
    assert all(pair in pairs for pair in zip(p.token, p.entity_id))
    uncapped, _ = build_postings(bom_tokens(h.tables["assignments"]), items, max_share=1.0)
    assert "n31" in set(uncapped["entity_id"].to_pylist())  # the cold-start product is reachable through the index


def test_faiss_round_trip_exact_and_ivf(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for cfg, kind in ((IndexConfig(), faiss.IndexFlatIP), (IndexConfig(exact_max=100), faiss.IndexIVFFlat)):
        faiss.write_index(build_faiss(x, cfg), str(tmp_path / FAISS_FILE))
        back = faiss.read_index(str(tmp_path / FAISS_FILE))
        assert isinstance(back, kind) and back.ntotal == 300
        _, top = back.search(x[:5], 1)
        assert top[:, 0].tolist() == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(back.reconstruct_n(0, 300), x, atol=1e-6)  # the IVF index keeps its direct map
    assert faiss.extract_index_ivf(back).nlist == round(np.sqrt(300))


def one_list_catalogue(tmp_path, n: int = 3000, dim: int = 16, config: IndexConfig = IndexConfig(exact_max=1000)) -> Retriever:
    """n items around 60 interests, all in one fine primitive with random weights (a catalogue that outgrew its
    codebook), and a user near one of the interests."""
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(60, dim))
    x = centres[rng.integers(0, 60, n + 1)] + 0.3 * rng.normal(size=(n + 1, dim))
    vectors = {f"i{j}": list(x[j]) for j in range(n)} | {"u": list(x[n])}
    types = {e: "user" if e == "u" else "product" for e in vectors}
    rows = [("u", 1, 0, 0, 1.0)] + [(f"i{j}", 1, 0, 0, float(w)) for j, w in enumerate(rng.random(n))]
    return crafted_retriever(tmp_path, vectors, types, rows, {(1, 0): [1.0] + [0.0] * (dim - 1)}, config)


def test_above_exact_max_probing_takes_the_nearest_items_from_the_ivf_lists(tmp_path):
    """One list of 3,000 items: the postings can only give its heaviest, whatever the query; the IVF probe gives the
    query's nearest by dot product (nearly all of the true top 50 with the default scan, all of them reading every list)."""
    r = one_list_catalogue(tmp_path)
    assert r.ivf is not None and r.ivf.nlist == round(np.sqrt(3000))
    q = r.vector("u")
    truth = np.argsort(-(r.item_vectors @ q), kind="stable")[:50]
    rows, prio = r.probe_vector(q, 50)
    assert len(rows) == 50 and len(set(rows.tolist())) == 50 and (np.diff(prio) <= 0).all()
    np.testing.assert_allclose(prio, r.item_vectors[rows] @ q, rtol=1e-5)  # the priority is the dot product
    assert np.isin(truth, rows).mean() >= 0.9
    flat = Retriever.load(tmp_path, r.emb)
    flat.ivf = None  # the same index probed through its postings: the list's heaviest 50, far from the query's nearest
    assert np.isin(truth, flat.probe_vector(q, 50)[0]).mean() < 0.2
    r.ivf_scan = float(r.ivf.nlist) * 3000 / 50  # nprobe = nlist: every list read, the exact top 50
    np.testing.assert_array_equal(np.sort(r.probe_vector(q, 50)[0]), np.sort(truth))
    assert {h.entity_id for h in r.retrieve("u", 10, exact=True)} == {f"i{j}" for j in truth[:10]}  # exact reads every list


def test_ivf_probe_margin_floor_and_budget_past_the_lists(tmp_path):
    r = one_list_catalogue(tmp_path)
    q = r.vector("u")
    rows, prio = r.probe_vector(q, 400, margin=0.05, floor=30)
    assert 30 <= len(rows) < 400 and (prio >= prio[0] - 0.05 - 1e-9).all()
    assert len(r.probe_vector(q, 400, margin=0.0, floor=30)[0]) == 30
    r.ivf_scan = 0.01  # one list at first: nprobe doubles until the lists hold the budget
    assert len(r.probe_vector(q, 2500)[0]) == 2500
    assert len(r.probe_vector(q, 10_000)[0]) == 3000


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
    rows = np.isin(emb.entity_id, items)
    write_index(tmp_path, emb.entity_id[rows], emb.entity_type[rows], emb.vectors[rows], tok, post)
    r = Retriever.load(tmp_path, emb)
    assert {h.entity_id for h in r.similar("n31", 10, exact=True)} <= set(items)
    assert r.similar("n31", 3)  # the cold-start product has tokens, so it has neighbours
