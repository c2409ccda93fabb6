"""The served path (hir_model.rank.recommender) on the tiny store: a context answered as the evaluation scores that cold
user, engaged items left out, the head state's files and contract; and the budget tuning on a crafted index."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hir_model.embed import EntityEmbeddings
from hir_model.eval.hir import HeadMethod
from hir_model.eval.run import TableReader, load_split
from hir_model.eval.scoring import EvalConfig
from hir_model.graph.window import to_us
from hir_model.protocol.split import Interactions, to_us as split_us
from hir_model.rank.artefacts import load_artefacts
from hir_model.rank.context import parse_context, read_context_file
from hir_model.rank.head import HeadConfig
from hir_model.rank.inductive import InductiveEncoder
from hir_model.rank.recommender import Batch, ContextEvent, Recommender, UnknownUser, user_rows
from hir_model.rank.state import HEAD_ASSET, HeadState, read_head, write_head
from hir_model.rank.tune import served_recall, tune_probe_factor
from hir_model.retrieval import Retriever, bom_tokens, build_postings, write_index
from tests.hir_model.eval.hir_store import KEYS, SPEC, hir_store

torch.set_num_threads(1)
W0 = SPEC.window(KEYS[0])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hir_store(tmp_path_factory.mktemp("rank") / "store", temp=0.1)


def _recommender(store) -> Recommender:
    state = read_head(store.partition_dir(HEAD_ASSET, KEYS[0]))
    inductive = InductiveEncoder(load_artefacts(store, KEYS[0], to_us(W0.end)))
    rows, has = user_rows(inductive.artefacts.embeddings, state.history.user_ids)
    return Recommender(state, rows, has, None, inductive)


def test_a_context_is_served_as_the_evaluation_scores_that_cold_user(store):
    split, _ = load_split(TableReader(store), SPEC, W0, SPEC.next(W0), EvalConfig())
    rec = _recommender(store)
    method = HeadMethod(rec, rec.inductive, "hir_exact")
    method.fit(split.train, split.items.known())
    cold = split.cold.queries
    assert len(cold) == 1 and cold.user_ids[0] == "u3"
    scores = method.score(cold, split.items)[0, :split.items.n_known]
    context = [ContextEvent(str(split.items.ids[i]), int(t), bool(d))
               for i, t, d in zip(cold.context.row(0), cold.context_ts, cold.context_deep)]
    scores[cold.context.row(0)] = -np.inf  # the evaluation ranks context items last
    expected = np.lexsort((np.arange(len(scores)), -scores))[:3]
    hits = rec.recommend("u3", context=context, k=3, exact=True)
    assert [h.entity_id for h in hits] == list(split.items.ids[expected])
    np.testing.assert_allclose([h.score for h in hits], scores[expected], rtol=1e-5, atol=1e-6)
    assert not {e.entity_id for e in context} & {h.entity_id for h in hits}
    again = rec.recommend("u3", context=context + [ContextEvent("not-an-item")], k=3, exact=True)
    assert again == hits and rec.unknown_items(context + [ContextEvent("not-an-item")]) == ["not-an-item"]
    with pytest.raises(UnknownUser, match=f"no history in window {KEYS[0]}"):
        rec.recommend("u3")


def test_known_users_never_get_an_engaged_item_unless_asked(store):
    rec = _recommender(store)
    for user in rec.state.history.user_ids:
        engaged = set(rec.state.item_ids[rec.state.history.item[rec.state.history.user == rec.user_index[user]]])
        served = {h.entity_id for h in rec.recommend(user, k=10)}
        assert engaged and not engaged & served and len(served) == rec.state.n_items - len(engaged)
        assert engaged <= {h.entity_id for h in rec.recommend(user, k=10, include_seen=True)}


def test_the_head_state_round_trips_and_a_broken_file_is_refused(store, tmp_path):
    state = read_head(store.partition_dir(HEAD_ASSET, KEYS[0]))
    assert state.log_prior is not None and state.temp == pytest.approx(0.1) and state.history.end_us == to_us(W0.end)
    write_head(tmp_path, state)
    back = read_head(tmp_path)
    for a in ("item_ids", "vectors", "log_prior"):
        np.testing.assert_array_equal(getattr(back, a), getattr(state, a))
    for a in ("user", "item", "ts", "deep"):
        np.testing.assert_array_equal(getattr(back.history, a), getattr(state.history, a))
    assert back.prior_weight == state.prior_weight and back.config == state.config and back.prior_floor == state.prior_floor
    items = pq.read_table(tmp_path / "items.parquet")
    pq.write_table(items.set_column(3, "log_prior", items["log_prior"].cast(pa.float64())), tmp_path / "items.parquet")
    with pytest.raises(ValueError, match="breaks the ranking head's contract"):
        read_head(tmp_path)
    (tmp_path / "history.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="history.parquet missing"):
        read_head(tmp_path)


def test_contexts_parse_from_the_command_line_and_files(tmp_path):
    assert parse_context("p1, p2:purchase") == [ContextEvent("p1", None, False), ContextEvent("p2", None, True)]
    with pytest.raises(ValueError, match="event_type 'buy'"):
        parse_context("p1:buy")
    (tmp_path / "c.jsonl").write_text('{"entity_id": "p1", "ts": "2024-01-08T00:00:00Z"}\n{"entity_id": "p2", "event_type": "purchase"}\n')
    events = read_context_file(tmp_path / "c.jsonl")
    assert events[0].ts_us == split_us("2024-01-08T00:00:00Z") and events[1] == ContextEvent("p2", None, True)
    (tmp_path / "c.csv").write_text("item,ts\np1,1\n")
    with pytest.raises(ValueError, match="needs an entity_id column"):
        read_context_file(tmp_path / "c.csv")
    (tmp_path / "bad.jsonl").write_text('{"entity_id": "p1"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        read_context_file(tmp_path / "bad.jsonl")


def _crafted(tmp_path, n_items: int = 400, n_users: int = 60, seed: int = 0) -> Recommender:
    """Items in 20 clusters, one primitive per cluster; users with a few items of one cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, 8))
    cluster = rng.integers(0, 20, n_items)
    vectors = centres[cluster] + 0.3 * rng.normal(size=(n_items, 8))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ids = np.array([f"i{k:04d}" for k in range(n_items)], object)
    users, hu, hi = [], [], []
    for u in range(n_users):
        pool = np.flatnonzero(cluster == rng.integers(0, 20))
        for item in rng.choice(pool, min(4, len(pool)), replace=False):
            hu.append(u)
            hi.append(item)
        users.append(f"u{u:03d}")
    history = Interactions("w", 10, np.array(users, object), np.array(hu), np.array(hi), np.arange(len(hu)), np.zeros(len(hu), bool),
                           n_items)
    state = HeadState("w", 10, HeadConfig(kernel_weight=0.0), ids, np.full(n_items, "product", object), vectors,
                      (0.05 * np.log(rng.pareto(1.5, n_items) + 1e-3)).astype(np.float32), None, None, 1.0, 0.05, history)
    rows = np.stack([vectors[np.array(hi)[np.array(hu) == u]].mean(0) for u in range(n_users)]).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    assignments = pa.table({"entity_id": list(ids) + users, "level": pa.array([0] * (n_items + n_users), pa.int32()),
                            "rank": pa.array([0] * (n_items + n_users), pa.int32()),
                            "primitive": pa.array(list(cluster) + [int(cluster[np.array(hi)[np.array(hu) == u][0]])
                                                                   for u in range(n_users)], pa.int64()),
                            "weight": pa.array([1.0] * (n_items + n_users), pa.float32())})
    c = (centres / np.linalg.norm(centres, axis=1, keepdims=True)).astype(np.float32)
    primitives = pa.table({"level": pa.array([0] * 20, pa.int32()), "primitive": pa.array(range(20), pa.int64()),
                           "centroid": pa.FixedSizeListArray.from_arrays(pa.array(c.reshape(-1)), 8)})
    tokens = bom_tokens(assignments)
    postings, _ = build_postings(tokens, ids, 1.0)
    write_index(tmp_path, ids, state.item_types, vectors, tokens, postings, primitives=primitives)
    emb = EntityEmbeddings(np.concatenate([ids, users]), np.array(["product"] * n_items + ["user"] * n_users, object),
                           np.vstack([vectors, rows]), np.zeros(n_items + n_users, bool), np.full(n_items + n_users, -1))
    return Recommender(state, rows, np.ones(n_users, bool), Retriever.load(tmp_path, emb), budget_k=20)


def test_more_candidates_reach_more_of_the_exact_ranking_and_tuning_takes_the_smallest_enough(tmp_path):
    rec = _crafted(tmp_path)
    users = list(rec.state.history.user_ids)
    recalls = [served_recall(rec, users, 20, f) for f in (0.5, 1.0, 2.0, 4.0)]
    assert all(a.recall <= b.recall + 1e-9 for a, b in zip(recalls, recalls[1:]))
    assert recalls[-1].recall > recalls[0].recall and recalls[0].candidate_fraction < recalls[-1].candidate_fraction
    factor, reached = tune_probe_factor(rec, users, 20, 0.9, 1.0)
    assert reached >= 0.9 and served_recall(rec, users, 20, factor).recall == pytest.approx(reached)
    smaller = [f for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0) if f < factor]
    assert all(served_recall(rec, users, 20, f).recall < 0.9 for f in smaller)
    capped, _ = tune_probe_factor(rec, users, 20, 1.01, 0.05)  # unreachable target within 5% of the items: the cap holds
    assert served_recall(rec, users, 20, capped).candidate_fraction <= 0.05 or capped == 0.5


def test_absent_is_the_complement_of_membership_in_the_sorted_skip_list():
    from hir_model.protocol.metrics import in_sorted

    rng = np.random.default_rng(3)
    for n_skip in (0, 1, 7, 300):
        skip = np.unique(rng.integers(0, 500, n_skip))
        rows = rng.integers(0, 520, 200)
        assert (~in_sorted(skip, rows)).tolist() == (~np.isin(rows, skip)).tolist()


def test_a_cold_user_is_served_its_exact_ranking_whatever_the_candidate_budget(tmp_path):
    """A cold user's score carries the new users' prior, which no probe of the index follows: served equals exact."""
    rec = _crafted(tmp_path)
    rng = np.random.default_rng(1)
    rec.items = dataclasses.replace(rec.items, cold_prior=(2.0 * rng.normal(size=rec.n_items)).astype(np.float32))
    warm = rec.user_batch(list(rec.state.history.user_ids[:12]))
    cold = Batch(warm.queries, np.zeros(12, bool), np.zeros_like(warm.rows), warm.rows)
    exact = rec.top(cold, 20, exact=True)
    served = rec.top(cold, 20, probe_factor=0.5)
    for (er, es), (sr, ss) in zip(exact, served):
        np.testing.assert_array_equal(sr, er)
        np.testing.assert_allclose(ss, es, rtol=1e-6)
    # the same queries read as warm users are served from the index's candidates, which miss part of their exact top
    as_warm = Batch(warm.queries, np.ones(12, bool), warm.rows, None)
    assert sum(len(c) for c in rec.candidates(as_warm, 20, 0.5)) < sum(len(c) for c in rec.candidates(cold, 20, 0.5))
