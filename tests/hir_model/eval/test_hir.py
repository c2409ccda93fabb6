"""HIR's rows in the evaluation on the tiny store (tiny.py) with a random-weight checkpoint: the cold users' sequences, the
single-token path for new items, the ranking head's scores by hand, causality, and the whole window through
`evaluate_published_window`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from hir_model.embed.entities import single_token_batch
from hir_model.rank.artefacts import load_artefacts, trained_prior_scale
from hir_model.eval.hir import HeadMethod
from hir_model.eval.publish import EVALUATION_ASSET, STATE_FILE, read_evaluation, save_states, summary_table
from hir_model.rank.fit import new_user_engagement
from hir_model.rank.head import HeadConfig
from hir_model.rank.inductive import InductiveEncoder
from hir_model.rank.recommender import Recommender, user_rows
from hir_model.rank.state import HEAD_ASSET, read_head
from hir_model.eval.run import TableReader, load_split
from hir_model.eval.scoring import EvalConfig
from hir_model.eval.window_evaluation import WindowEvalConfig, WindowOutcome, evaluate_published_window, future_reads
from hir_model.graph.build import GraphConfig
from hir_model.graph.hashing import hash_codes
from hir_model.graph.types import EDGE_TYPES, NODE_TYPES
from hir_model.graph.window import to_us
from hir_model.nn import collate
from tests.hir_model.eval.hir_store import KEYS, SPEC, hir_store, publish_head

torch.set_num_threads(1)
W0 = SPEC.window(KEYS[0])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hir_store(tmp_path_factory.mktemp("hir") / "store")


def _split(store):
    split, _ = load_split(TableReader(store), SPEC, W0, SPEC.next(W0), EvalConfig())
    return split


def _inductive(store, key: str = KEYS[0]) -> InductiveEncoder:
    return InductiveEncoder(load_artefacts(store, key, to_us(SPEC.window(key).end)))


def _hir(store, name: str = "hir_exact", key: str = KEYS[0], **kw) -> HeadMethod:
    """HIR's `name` row from window `key`'s ranking head, published with HeadConfig(**kw) (as the asset would)."""
    publish_head(store, key, HeadConfig(**kw))
    inductive = _inductive(store, key)
    state = read_head(store.partition_dir(HEAD_ASSET, key))
    rows, has = user_rows(inductive.artefacts.embeddings, state.history.user_ids)
    return HeadMethod(Recommender(state, rows, has, None, inductive), inductive, name)


def test_a_cold_users_sequence_is_their_context_over_graph_t(store):
    split, hir = _split(store), _inductive(store)
    batch = hir.cold_batch(split.cold.queries, split.items)  # u3, context p2 (clicked 1h into W1)
    graph = hir.artefacts.graph
    assert batch.num_sequences == 1 and batch.depth[0] == 0 and NODE_TYPES[batch.node_type[0]] == "user"
    np.testing.assert_array_equal(batch.hash_codes[0], hash_codes(["u3"], hir.k, hir.buckets)[0])
    p2 = graph.nodes.index_of(pa.array(["p2"]))[0]
    assert batch.node[1] == p2 and batch.depth[1] == 1 and EDGE_TYPES[batch.edge_type[1]] == "click" and batch.edge_age[1] == 0
    below = batch.depth >= 2
    assert below.any() and (batch.depth <= len(hir.view.fanout)).all()
    np.testing.assert_array_equal(batch.hash_codes[below], graph.nodes.hash_codes[batch.node[below]])
    # graph(t) edges are aged from u3's last context event, an hour after end(W0): nothing is younger than that
    assert (batch.edge_age[below] >= 3600).all() and (batch.edge_age >= 0).all()
    # ancestors: every token hangs under the user (0) and, below depth 1, under the context item (1); BFS order
    assert (batch.ancestors[:, 0] == 0).all() and (batch.ancestors[below, 1] == 1).all()
    own = batch.ancestors[np.arange(len(batch.depth)), batch.depth]  # a token's ancestor at its own depth is itself
    assert (np.diff(batch.depth) >= 0).all() and (own == np.arange(len(batch.depth))).all()
    # strength: the graph's own for graph(t) tokens; the user's from its context (one click: the click stage weight)
    np.testing.assert_allclose(batch.strength[1:], graph.strength_at(batch.node[1:], hir.artefacts.end_us))
    assert batch.strength[1] > 0 and batch.strength[0] == GraphConfig().click
    collate(batch)  # a valid encoder batch


def test_new_items_take_the_single_token_path_of_the_embeddings_asset(store):
    split, hir = _split(store), _inductive(store)
    graph, model = hir.artefacts.graph, hir.artefacts.model
    p1 = graph.nodes.index_of(pa.array(["p1"]))
    with torch.inference_mode():
        expected = model.encoder(collate(single_token_batch(graph, p1, hir.artefacts.end_us)), model.global_tokens).numpy()
    np.testing.assert_allclose(hir._single_tokens(np.array(["p1"], object), None, np.zeros(1, bool)), expected, atol=1e-6)
    vectors = hir.item_vectors(split.items)
    assert split.items.ids[5] == "p6" and hir.single_token_items == 1 and np.isclose(np.linalg.norm(vectors[5]), 1, atol=1e-5)


def test_scores_are_dot_products_warm_users_looked_up_and_cold_ones_inductive(store):
    split = _split(store)
    row_only = _hir(store, recent_weight=0.0, kernel_weight=0.0, coengagement=False)
    no_kernel = _hir(store, kernel_weight=0.0, coengagement=False)
    hir, embeddings = _hir(store, coengagement=False), _hir(store, "hir_embeddings")
    with_co = _hir(store)  # the default: co-engagement at its configured weight (no track record in window 0)
    for m in (hir, row_only, no_kernel, embeddings, with_co):
        m.fit(split.train, split.items.known())
    emb = hir.inductive.artefacts.embeddings
    u1, items = emb.vectors[list(emb.entity_id).index("u1")], hir.inductive.item_vectors(split.items)
    np.testing.assert_allclose(row_only.score(split.warm.queries, split.items)[0], items @ u1, rtol=1e-5, atol=1e-6)
    # hir_embeddings is the published row alone, whatever the head's shares
    np.testing.assert_allclose(embeddings.score(split.warm.queries, split.items)[0], items @ u1, rtol=1e-5, atol=1e-6)
    # the query adds u1's recent items: p1 clicked 2 h and bought 1 h before u1's last event, p2 clicked then
    w_p1, w_p2 = 2 ** (-2 / 48) + 2 * 2 ** (-1 / 48), 1.0
    recent = w_p1 * items[0] + w_p2 * items[1]
    query = 0.3 * u1 + 0.7 * recent / np.linalg.norm(recent)
    np.testing.assert_allclose(no_kernel.score(split.warm.queries, split.items)[0], items @ query, rtol=1e-5, atol=1e-6)
    # the default score blends that with the interest kernel over p1 and p2 (weights normalised, temperature 0.1)
    kernel = 0.1 * np.log((w_p1 * np.exp(items @ items[0] / 0.1) + w_p2 * np.exp(items @ items[1] / 0.1)) / (w_p1 + w_p2))
    np.testing.assert_allclose(hir.score(split.warm.queries, split.items)[0], 0.3 * (items @ query) + 0.7 * kernel, rtol=1e-5,
                               atol=1e-5)
    # co-engagement adds 16 x the history's co-engagement with each item (half-life 7 days; items new in t+1: none)
    state = with_co.rec.state
    assert state.coengagement_weight == 16.0 and state.coengagement is not None
    sim = state.coengagement.toarray()
    c_p1, c_p2 = 2 ** (-2 / 168) + 2 * 2 ** (-1 / 168), 1.0
    co = np.zeros(len(split.items))
    co[:state.n_items] = (c_p1 * sim[0] + c_p2 * sim[1]) / (c_p1 + c_p2)
    assert co.any()
    np.testing.assert_allclose(with_co.score(split.warm.queries, split.items)[0],
                               hir.score(split.warm.queries, split.items)[0] + 16.0 * co, rtol=1e-5, atol=1e-5)
    cold = hir.score(split.cold.queries, split.items)
    np.testing.assert_array_equal(cold, hir.score(split.cold.queries, split.items))  # seeded: the same every time
    other = _hir(store, key=KEYS[1])
    with pytest.raises(ValueError, match="cannot be evaluated on the split of"):
        other.fit(split.train, split.items.known())


def test_score_pairs_are_the_scores_at_those_cells_bit_for_bit(store):
    """The lift reads HIR's scores at a few cells a user through score_pairs: exactly score()'s values there, for warm
    users (the kernel's soft maximum only at those cells) and cold ones, with the kernel, without it and served."""
    split = _split(store)
    for m in (_hir(store), _hir(store, kernel_weight=0.0), _hir(store, "hir_embeddings"), _hir(store, "hir")):
        m.fit(split.train, split.items.known())
        for queries in (split.warm.queries, split.cold.queries):
            full = m.score(queries, split.items)
            rng = np.random.default_rng(0)
            q = rng.integers(0, len(queries), 40)
            c = rng.integers(0, len(split.items), 40)
            np.testing.assert_array_equal(m.score_pairs(queries, split.items, q, c), full[q, c])


def test_the_served_row_is_the_recommenders_top_k_and_never_an_engaged_item(store):
    split = _split(store)
    served, exact = _hir(store, "hir"), _hir(store)
    for m in (served, exact):
        m.fit(split.train, split.items.known())
    scores, full = served.score(split.warm.queries, split.items), exact.score(split.warm.queries, split.items)
    rec = served.rec
    for q, user in enumerate(split.warm.queries.user_ids):
        hits = rec.recommend(user, k=50)
        listed = np.flatnonzero(np.isfinite(scores[q]))
        assert sorted(split.items.ids[listed]) == sorted(h.entity_id for h in hits)  # what is served is what is measured
        np.testing.assert_allclose(scores[q, listed], full[q, listed], rtol=1e-5, atol=1e-6)  # the head's scores
        engaged = set(split.items.ids[split.warm.queries.context.row(q)])
        assert engaged and not engaged & {h.entity_id for h in hits}
        assert engaged <= {h.entity_id for h in rec.recommend(user, k=50, include_seen=True)}
    assert not np.isfinite(scores[:, split.items.n_known:]).any()  # items first seen in t+1 are never served
    with pytest.raises(LookupError, match="no history in window"):
        rec.recommend("nobody")


def test_a_planted_future_event_changes_nothing_and_t_plus_2_is_never_opened(tmp_path):
    clean = evaluate_published_window(hir_store(tmp_path / "clean"), SPEC, KEYS[0])
    planted = evaluate_published_window(hir_store(tmp_path / "planted", plant_future=True, corrupt_w2=True), SPEC, KEYS[0])
    assert isinstance(clean, WindowOutcome) and isinstance(planted, WindowOutcome)
    assert planted.evaluation.to_table().equals(clean.evaluation.to_table())
    assert {p for _, p in planted.opened} <= {KEYS[0], KEYS[1]} and not future_reads(planted.opened, KEYS[0], KEYS[1])
    assert future_reads([("hir_encoder", KEYS[1]), ("raw_events", KEYS[2])], KEYS[0], KEYS[1]) == \
        [("hir_encoder", KEYS[1]), ("raw_events", KEYS[2])]


def _publish(store, key, outcome):
    with store.writing() as staging:  # as the asset does
        staging.write_table(EVALUATION_ASSET, key, "metrics", outcome.evaluation.to_table())
        staging.write_table(EVALUATION_ASSET, key, "summary", summary_table(outcome.evaluation, outcome.extras))
        save_states(staging.path(EVALUATION_ASSET, key) / STATE_FILE, outcome.methods)


def test_the_last_window_is_skipped_and_stateful_baselines_warm_start_from_earlier_only(store):
    assert "has no successor" in evaluate_published_window(store, SPEC, KEYS[2]).reason
    first = evaluate_published_window(store, SPEC, KEYS[0], WindowEvalConfig())
    assert first.extras["warm_started_from"] == {} and first.extras["hir"]["evaluated"]
    _publish(store, KEYS[0], first)
    ev, extras = read_evaluation(store, KEYS[0])
    assert ev.to_table().equals(first.evaluation.to_table()) and extras["hir"] == first.extras["hir"]
    assert ev.lift.extra_names == first.evaluation.lift.extra_names and ev.counts == first.evaluation.counts
    second = evaluate_published_window(store, SPEC, KEYS[1], WindowEvalConfig())
    assert second.extras["warm_started_from"] == {"mf_als": KEYS[0], "lightgcn": KEYS[0]}
    in_process = evaluate_published_window(store, SPEC, KEYS[1], WindowEvalConfig(), previous=first)  # the saved state is exact
    assert in_process.evaluation.to_table().equals(second.evaluation.to_table())
    _publish(store, KEYS[1], second)
    again = evaluate_published_window(store, SPEC, KEYS[0], WindowEvalConfig())  # W1's state is later: never used for W0
    assert again.extras["warm_started_from"] == {} and again.evaluation.to_table().equals(first.evaluation.to_table())


def test_hierarchy_and_bom_index_add_lift_features_agreement_and_the_served_row(tmp_path):
    from hir_model.retrieval.index import BOM_ASSET
    from hir_model.hierarchy.build import HIERARCHY_ASSET
    from hir_model.retrieval import IndexConfig
    from hir_model.hierarchy.interest_hierarchy import hierarchy_window
    from hir_model.rank.bom_index import build_window_index

    store = hir_store(tmp_path / "store")
    without = evaluate_published_window(store, SPEC, KEYS[0], WindowEvalConfig())
    assert without.evaluation.methods[:2] == ("hir_exact", "hir_embeddings") and "not materialised" in without.extras["hir"]["served"]
    h = hierarchy_window(store, KEYS[0], None, to_us(W0.end))
    with store.writing() as staging:  # as the interest_hierarchy asset writes them
        for name, table in h.tables.items():
            staging.write_table(HIERARCHY_ASSET, KEYS[0], name, table)
    with store.writing() as staging:
        build = build_window_index(store, KEYS[0], staging.path(BOM_ASSET, KEYS[0]), IndexConfig(max_posting_share=1.0))
    assert build.recall.recall == 1.0 and build.recall.queries == 2  # u1, u2: 5 items, every token's posting kept
    truth = pa.table({"entity_id": ["p1", "p2", "p3", "p4", "p5"], "entity_type": ["product"] * 5,
                      "interest_l0": pa.array([0, 0, 1, 1, 1], pa.int32())})
    out = evaluate_published_window(store, SPEC, KEYS[0], WindowEvalConfig(), truth)
    assert out.evaluation.methods[:3] == ("hir", "hir_exact", "hir_embeddings")
    assert out.evaluation.lift.extra_names == ("hir_exact_score", "hir_exact_scored", "bom_affinity_L0", "bom_affinity_L1")
    assert [(a.level, a.planted_level, a.entities) for a in out.agreement] == [(0, 0, 5), (1, 0, 5)]
    served = out.evaluation.value("hir", "warm", "known", "engagement", "recall@20")
    assert served == out.evaluation.value("hir_exact", "warm", "known", "engagement", "recall@20")  # 5 items: all candidates
    assert (HIERARCHY_ASSET, KEYS[0]) in out.opened and (BOM_ASSET, KEYS[0]) in out.opened


def test_with_structural_encodings_a_cold_user_is_placed_by_its_context(tmp_path):
    store = hir_store(tmp_path / "store", structure_dim=8)
    split, inductive = _split(store), _inductive(store)
    batch = inductive.cold_batch(split.cold.queries, split.items)  # u3, context p2
    graph = inductive.artefacts.graph
    np.testing.assert_array_equal(batch.structure[1:], graph.structure_at(batch.node[1:], inductive.artefacts.end_us, 8))
    assert batch.node[1] == graph.nodes.index_of(pa.array(["p2"]))[0] and batch.structure[1].any()
    np.testing.assert_allclose(batch.structure[0], batch.structure[1], atol=1e-6)  # one context film: its place, unit norm
    from dataclasses import replace
    blind = inductive._encode(replace(batch, structure=np.zeros_like(batch.structure)))
    assert not np.allclose(inductive._encode(batch), blind, atol=1e-4)  # the encoder reads them
    hir = _hir(store)
    hir.fit(split.train, split.items.known())
    scores = hir.score(split.cold.queries, split.items)
    assert np.isfinite(scores).all() and scores.shape == (1, len(split.items))
    # the score blends the encoder's vector (0.15) with the structural readout (0.85): u3's place in graph(t), here p2's
    # encoding, against each item's; p6, first seen in W1, has no encoding and gets the encoder's share alone
    encoder = _hir(store, cold_structure_weight=0.0)
    encoder.fit(split.train, split.items.known())
    items = graph.structure_at(inductive.item_nodes(split.items), inductive.artefacts.end_us, 8)
    p2 = list(split.items.ids).index("p2")
    assert not items[split.items.n_known:].any() and items[p2].any()
    np.testing.assert_allclose(scores[0], 0.15 * encoder.score(split.cold.queries, split.items)[0] + 0.85 * (items @ items[p2]),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(scores, encoder.score(split.cold.queries, split.items), atol=1e-3)
    with pytest.raises(ValueError, match="cold_structure_weight"):
        HeadConfig(cold_structure_weight=1.5)


def test_with_the_structural_readout_cold_users_take_the_new_users_prior(tmp_path):
    store = hir_store(tmp_path / "store", structure_dim=8, temp=0.1)
    split = _split(store)
    items = split.items
    fitted = {name: _hir(store, **kw) for name, kw in
              {"default": {}, "general": {"cold_prior_days": None}, "plain": {"prior_weight": 0.0}}.items()}
    for m in fitted.values():
        m.fit(split.train, items.known())
    gap = {name: {who: fitted[name].score(q, items) - fitted["plain"].score(q, items)
                  for who, q in (("warm", split.warm.queries), ("cold", split.cold.queries))} for name in ("default", "general")}
    counts = np.zeros(len(items))
    counts[:items.n_known] = new_user_engagement(split.train, 7.0, 30.0, 2.0)
    assert (counts > 0).any() and (counts == 0).any()  # u3's items are new-user items, p6 (first seen in W1) is not
    expected = 0.7 * 0.1 * np.log(np.maximum(counts, counts[counts > 0].min() / 2))
    np.testing.assert_allclose(gap["default"]["cold"][0], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gap["default"]["warm"], gap["general"]["warm"], rtol=1e-5, atol=1e-6)  # warm users: graph(t)'s
    np.testing.assert_allclose(gap["general"]["cold"][0], gap["general"]["warm"][0], rtol=1e-4, atol=1e-5)  # off: the same prior
    assert not np.allclose(gap["default"]["cold"][0], gap["general"]["cold"][0], atol=1e-3)
    without = hir_store(tmp_path / "plain", temp=0.1)  # no structural encodings: cold users keep graph(t)'s prior
    one, none = _hir(without), _hir(without, prior_weight=0.0)
    for m in (one, none):
        m.fit(split.train, items.known())
    cold_gap, warm_gap = (one.score(q, items) - none.score(q, items) for q in (split.cold.queries, split.warm.queries))
    np.testing.assert_allclose(cold_gap[0], warm_gap[0], rtol=1e-4, atol=1e-5)


def test_scores_add_the_item_prior_in_the_trainings_logit_units(tmp_path):
    store = hir_store(tmp_path / "store", temp=0.1)
    split, plain = _split(store), _hir(store, prior_weight=0.0)
    hir = _hir(store)
    assert hir.inductive.artefacts.prior_scale == pytest.approx(0.1)
    for m in (hir, plain):
        m.fit(split.train, split.items.known())
    graph, items = hir.inductive.artefacts.graph, split.items
    prior = graph.strength_at(graph.nodes.index_of(pa.array(list(items.ids[:items.n_known]))), hir.inductive.artefacts.end_us)
    assert (prior > 0).any() and items.n_known < len(items)  # engaged items, and p6 first seen in W1
    floor = prior[prior > 0].min() / 2
    expected = 0.1 * np.log(np.concatenate([np.where(prior > 0, prior, floor), np.full(len(items) - items.n_known, floor)]))
    gap = hir.score(split.warm.queries, items) - plain.score(split.warm.queries, items)
    np.testing.assert_allclose(gap, np.broadcast_to(expected, gap.shape), rtol=1e-4, atol=1e-5)
    twice = _hir(store, prior_weight=2.0)
    twice.fit(split.train, items.known())
    np.testing.assert_allclose(twice.score(split.warm.queries, items) - plain.score(split.warm.queries, items),
                               np.broadcast_to(2 * expected, (len(split.warm.queries), len(items))), rtol=1e-4, atol=1e-5)
    publish_head(store, KEYS[0])
    outcome = evaluate_published_window(store, SPEC, KEYS[0])
    assert outcome.extras["hir"]["prior_scale"] == pytest.approx(0.1)
    from hir_model.eval.report import extras_table

    rows = extras_table({KEYS[0]: outcome.extras, KEYS[1]: {"hir": {"evaluated": True, "prior_scale": 0.0}}}).splitlines()
    assert "item prior" in rows[0] and "| 0.1 (weight 1) |" in rows[2] and "| none |" in rows[3]
    assert hir.rec.state.calibration is None and outcome.extras["hir"]["prior_calibration"] is None  # 2 warm users: too few


def test_without_a_recorded_training_config_the_scores_stay_the_dot_product(store):
    assert trained_prior_scale({}) == 0.0
    assert trained_prior_scale({"train_config": {"engagement_temp": 0.05, "logq_correction": False}}) == 0.05
    split, hir = _split(store), _hir(store, prior_weight=3.0, recent_weight=0.0, kernel_weight=0.0, coengagement=False)
    hir.fit(split.train, split.items.known())
    assert hir.inductive.artefacts.prior_scale == 0.0 and hir.rec.state.calibration is None
    scores, items = hir.score(split.warm.queries, split.items), hir.inductive.item_vectors(split.items)
    emb = hir.inductive.artefacts.embeddings
    np.testing.assert_allclose(scores[0], items @ emb.vectors[list(emb.entity_id).index("u1")], rtol=1e-5, atol=1e-6)
    publish_head(store, KEYS[0])
