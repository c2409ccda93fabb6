"""Co-engagement in the ranking head: the term by hand, its weight from the track record, its file, its candidates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hir_model.baselines.sequence import Item2ItemConfig, Item2ItemRecent
from hir_model.protocol.method import US_PER_DAY as DAY_US
from hir_model.protocol.split import Interactions, ItemSpace, warm_queries
from hir_model.rank.coengagement import COENGAGEMENT_WEIGHTS, coengagement_similarity, context_matrix, top_of_row
from hir_model.rank.head import HeadConfig, head_scores, head_scores_at
from hir_model.rank.state import fit_head, read_head, write_head
from hir_model.rank.track import CO_MODE, TrackRecord, coengagement_mode, pooled_choice, track_record

END = 100 * DAY_US
N_ITEMS = 20
CONFIG = HeadConfig(kernel_weight=0.0)


def _world(buy: str):
    """Every item its own direction (no two items near in the space). Forty earlier users clicked item 2k, then 2k + 1
    (k = u % 10); forty later users clicked 2k only. In s+1 the later users buy 2k + 1 (`sequence`: what co-engagement
    predicts) or item 0 (`popular`, after its earlier clicks)."""
    vectors = np.eye(N_ITEMS, dtype=np.float32)
    events = []
    for u in range(40):
        events += [(u, 2 * (u % 10), 50.0 + u / 10), (u, 2 * (u % 10) + 1, 51.0 + u / 10)]
    for u in range(40, 80):
        events += [(u, 2 * (u % 10), 60.0 + u / 10)]
    events += [(u, 0, 40.0) for u in range(80, 140)]  # item 0: the popular one
    u, i, d = (np.asarray(x) for x in zip(*sorted(events, key=lambda e: (e[0], e[2]))))
    users = np.array([f"u{k:03d}" for k in range(140)], object)
    history = Interactions("s", END, users, u.astype(np.int64), i.astype(np.int64), (d * DAY_US).astype(np.int64),
                           np.zeros(len(u), bool), N_ITEMS)
    counts = np.bincount(history.item, minlength=N_ITEMS).astype(float)
    log_prior = np.log(np.where(counts > 0, counts, 0.5)).astype(np.float32)
    rows = np.zeros((140, N_ITEMS), np.float32)
    rows[u, i] = 1.0
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    later = pd.DataFrame([(users[v], 2 * (v % 10) + 1 if buy == "sequence" else 0, True) for v in range(40, 80)],
                         columns=["user_id", "item", "deep"])
    return history, vectors, log_prior, rows, later


def test_the_term_is_the_weighted_co_engagement_of_the_history_by_hand():
    history, vectors, log_prior, rows, _ = _world("sequence")
    state = fit_head(history, np.array([f"i{k:02d}" for k in range(N_ITEMS)], object), np.full(N_ITEMS, "product", object),
                     vectors, lambda cut: np.exp(log_prior), 0.1, None, replace(CONFIG, coengagement_weight=2.0))
    s = state.coengagement.toarray()
    assert s.shape == (N_ITEMS, N_ITEMS) and s[0, 1] > 0 and s[2, 3] > 0 and s[0, 2] == 0 and np.all(np.diag(s) == 0)
    # the evaluation's item2item_recent reads the same similarity (its own deep weight and history)
    base = Item2ItemRecent(Item2ItemConfig(deep_weight=CONFIG.deep_weight))
    base.fit(history, ItemSpace(state.item_ids, N_ITEMS, np.full(N_ITEMS, -1), np.zeros(0, object)))
    np.testing.assert_allclose(base.similarity.toarray(), s)
    queries = warm_queries(history, np.arange(40, 60))
    warm = np.ones(len(queries), bool)
    with_co = head_scores(queries, state.items(), CONFIG, rows[40:60], warm, None)
    without = head_scores(queries, replace(state, coengagement_weight=0.0).items(), CONFIG, rows[40:60], warm, None)
    ctx = context_matrix(queries, N_ITEMS, CONFIG.coengagement_half_life_days, CONFIG.deep_weight).toarray()
    np.testing.assert_allclose(with_co - without, 2.0 * ctx @ s, rtol=1e-5, atol=1e-6)
    q, c = np.repeat(np.arange(20), 3), np.tile([1, 3, 5], 20)
    np.testing.assert_allclose(head_scores_at(queries, state.items(), CONFIG, rows[40:60], warm, None, q, c), with_co[q, c],
                               rtol=1e-6)
    # what the learned representation carries has none of it
    assert state.items(CONFIG.embeddings_only()).coengagement is None
    assert fit_head(history, state.item_ids, state.item_types, vectors, lambda cut: np.exp(log_prior), 0.1, None,
                    replace(CONFIG, coengagement=False)).coengagement is None


def test_the_track_record_gives_co_engagement_the_weight_the_next_window_rewards():
    history, vectors, log_prior, rows, later = _world("sequence")
    has = np.ones(len(rows), bool)
    s = coengagement_similarity(history, CONFIG.deep_weight)
    seq = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1, similarity=s)
    assert set(seq.recall) == {"exact", "embeddings"} | {coengagement_mode(w) for w in COENGAGEMENT_WEIGHTS}
    assert max(seq.recall["exact"].values()) <= 0.1  # nothing near 2k + 1 in the space, not popular: ties' order only
    assert seq.recall[coengagement_mode(2.0)][0.0] == 1.0
    co, prior = pooled_choice([seq], 10)
    assert co > 0 and seq.recall[coengagement_mode(co)][prior] == 1.0
    assert pooled_choice([seq], 10, with_coengagement=False)[0] == 0.0
    history, vectors, log_prior, rows, later = _world("popular")
    pop = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1, similarity=s)
    co, prior = pooled_choice([pop], 10)
    assert co == 0.0 and pop.recall["exact"][prior] == 1.0  # co-engagement adds nothing the prior needs: a tie keeps 0
    without = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1)
    assert set(without.recall) == {"exact", "embeddings"}


def test_pooled_choice_weighs_records_by_users_and_reads_only_modes_every_record_holds():
    def rec(users, best_mode):
        modes = ("exact", coengagement_mode(2.0), coengagement_mode(4.0))
        return TrackRecord("a", "b", users, {m: {w: (1.0 if (m, w) == best_mode else 0.5) for w in (0.0, 1.0, 4.0)}
                                              for m in modes})
    assert pooled_choice([rec(30, (coengagement_mode(4.0), 1.0)), rec(10, ("exact", 4.0))], 40) == (4.0, 1.0)
    assert pooled_choice([rec(10, (coengagement_mode(4.0), 1.0)), rec(30, ("exact", 4.0))], 40) == (0.0, 4.0)
    old = TrackRecord("z", "a", 100, {"exact": {w: 0.1 for w in (0.0, 1.0, 4.0)}})  # a head before co-engagement
    assert pooled_choice([old, rec(30, (coengagement_mode(4.0), 1.0))], 40)[0] == 0.0
    assert pooled_choice([rec(30, ("exact", 4.0))], 40) is None
    assert all(coengagement_mode(w).startswith(CO_MODE) for w in COENGAGEMENT_WEIGHTS)


def test_the_head_takes_the_tracks_co_engagement_weight_and_its_file_round_trips(tmp_path):
    history, vectors, log_prior, rows, later = _world("sequence")
    ids, types = np.array([f"i{k:02d}" for k in range(N_ITEMS)], object), np.full(N_ITEMS, "product", object)
    s = coengagement_similarity(history, CONFIG.deep_weight)
    record = track_record(history, vectors, log_prior, rows, np.ones(len(rows), bool), CONFIG, later, "s", k=1, similarity=s)
    state = fit_head(history, ids, types, vectors, lambda cut: np.exp(log_prior), 0.1, None, replace(CONFIG, track_min_users=10),
                     (record,))
    assert state.prior_source == "track" and state.coengagement_weight > 0
    write_head(tmp_path, state)
    back = read_head(tmp_path)
    assert back.coengagement_weight == state.coengagement_weight and back.summary()["coengagement"]
    np.testing.assert_array_equal(back.coengagement.toarray(), state.coengagement.toarray())
    np.testing.assert_array_equal(top_of_row(back.coengagement, 0, 3), [1])
    table = pq.read_table(tmp_path / "coengagement.parquet")
    pq.write_table(table.set_column(2, "similarity", table["similarity"].cast(pa.float64())), tmp_path / "coengagement.parquet")
    with pytest.raises(ValueError, match="coengagement.parquet breaks the ranking head's contract"):
        read_head(tmp_path)
    (tmp_path / "coengagement.parquet").unlink()  # a head written before co-engagement: none, weight as recorded
    assert read_head(tmp_path).coengagement is None and read_head(tmp_path).items().coengagement is None


def test_served_candidates_reach_the_co_engaged_items_the_exact_ranking_puts_first(tmp_path):
    from tests.hir_model.rank.test_recommender import _crafted

    rec = _crafted(tmp_path)
    state = rec.state
    h = state.history
    far = np.argsort(state.vectors @ state.vectors[h.item[h.user == 0]].mean(0))[:5]  # far from user 0's interests
    sim = np.zeros((state.n_items, state.n_items), np.float32)
    sim[h.item[h.user == 0][:, None], far[None, :]] = 1.0
    import scipy.sparse as sp

    co_state = replace(state, coengagement=sp.csr_matrix(sim), coengagement_weight=8.0)
    co = type(rec)(co_state, rec.user_rows, rec.has_row, rec.retriever, budget_k=20, probe_factor=0.5)
    exact = co.top(co.user_batch(["u000"]), 10, exact=True)[0][0]
    assert set(far) <= set(exact[:5])  # the co-engaged items lead the exact ranking...
    served = co.top(co.user_batch(["u000"]), 10)[0][0]
    np.testing.assert_array_equal(served[:5], exact[:5])  # ...and the served path finds them (a small budget)
    plain = type(rec)(state, rec.user_rows, rec.has_row, rec.retriever, budget_k=20, probe_factor=0.5)
    assert not set(far) & set(plain.top(plain.user_batch(["u000"]), 10)[0][0])
