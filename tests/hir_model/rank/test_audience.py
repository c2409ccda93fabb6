"""Audiences (hir_model.rank.audience) on the tiny store with its hierarchy and index (test_serve's `full_store`): the
head transposed (each user's score is the served ranking's value of the pair), advertisers through their products,
converted users left out, the hierarchy restriction and its sizes, the floor, and an arrival served from content."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.rank.audience import (Audience, AudienceConfig, Audiences, AudienceTooSmall, UnknownEntity, aggregate,
                                     user_propensity)
from hir_model.rank.recommender import Recommender
from hir_model.storage import PartitionStore
from tests.hir_model.eval.hir_store import KEYS
from tests.hir_model.rank.test_increment import built, source  # noqa: F401  (fixtures: W0 plus p6's increment)
from tests.hir_model.rank.test_serve import full_store  # noqa: F401  (the fixture: W0 and W1 with bom_index)

torch.set_num_threads(1)
OLD, NEW = KEYS[0], KEYS[1]
ONE = AudienceConfig(min_audience=1)


def served_column(rec: Recommender, users: list[str], item: str) -> np.ndarray:
    """What the served ranking computes for (user, item): the head over every item, the pair's column."""
    return rec.scores(rec.user_batch(users), include_seen=True)[:, rec.item_row[item]]


def test_a_products_audience_orders_users_by_the_served_rankings_value_of_the_pair(full_store):  # noqa: F811
    store = PartitionStore(full_store)
    audiences = Audiences.load(store, NEW, config=ONE)
    rec = audiences.rec
    assert rec.ranker is None  # the tiny store trains none: the served score of every pair is the head's
    users = list(audiences.user_ids)
    assert users == ["u1", "u2", "u3", "u4"]
    a = audiences.audience("p4", k=10, include_converted=True)
    expected = served_column(rec, users, "p4")
    assert isinstance(a, Audience) and a.entity_type == "product" and a.items == ("p4",) and a.source == "history"
    assert a.size == 4 and list(a.user_ids) == [users[i] for i in np.lexsort((np.arange(4), -expected))]
    np.testing.assert_allclose(a.scores, np.sort(expected)[::-1], rtol=1e-5)
    # batched over users: the same values whatever the batch size
    small = Audiences(rec, audiences.linker, audiences.membership, AudienceConfig(min_audience=1, batch_users=1))
    np.testing.assert_array_equal(small.audience("p4", k=10, include_converted=True).scores, a.scores)


def test_an_advertiser_is_scored_over_its_products_and_converted_users_are_left_out(full_store):  # noqa: F811
    audiences = Audiences.load(PartitionStore(full_store), OLD, config=ONE)
    rec = audiences.rec
    a = audiences.audience("a1", k=10, include_converted=True)
    assert a.entity_type == "advertiser" and a.items == ("p1", "p2")  # c1 (its campaign) is not an item
    both = np.stack([served_column(rec, ["u1", "u2"], p) for p in ("p1", "p2")], 1)
    np.testing.assert_allclose(dict(zip(a.user_ids, a.scores))["u2"], both[1].mean(), rtol=1e-5)  # the decided aggregate
    assert AudienceConfig().aggregate == "mean"
    # u1 purchased p1 in W0: it already converted with p1 and with a1, not with a2
    for entity in ("p1", "a1"):
        kept = audiences.audience(entity, k=10)
        assert "u1" not in kept.user_ids and kept.excluded == 1 and kept.size == 1
    assert audiences.audience("a2", k=10).excluded == 0
    with pytest.raises(UnknownEntity, match="'nobody'"):
        audiences.audience("nobody")


def test_a_level_keeps_the_users_assigned_to_the_entitys_primitive_and_reports_each_levels_size(full_store):  # noqa: F811
    audiences = Audiences.load(PartitionStore(full_store), NEW, config=ONE)
    a = audiences.audience("p3", k=10, include_converted=True)
    assert [lv["level"] for lv in a.levels] == audiences.membership.levels == [0, 1]
    for lv in a.levels:
        members = audiences.membership.members(lv["level"], lv["primitive"])
        assert lv["size"] == len(members & set(audiences.user_ids))
        if lv["size"]:
            restricted = audiences.audience("p3", k=10, level=lv["level"], include_converted=True)
            assert restricted.size == lv["size"] and set(restricted.user_ids) <= members
            assert restricted.primitive == lv["primitive"]
    with pytest.raises(ValueError, match="levels"):
        audiences.audience("p3", level=7)


def test_an_audience_below_the_floor_is_refused_with_a_clear_message(full_store):  # noqa: F811
    audiences = Audiences.load(PartitionStore(full_store), NEW, config=AudienceConfig(min_audience=5))
    with pytest.raises(AudienceTooSmall, match="has 4 users, below the minimum of 5"):
        audiences.audience("p4", k=10, include_converted=True)
    with pytest.raises(AudienceTooSmall, match="k=3 is below the minimum audience of 5"):
        audiences.audience("p4", k=3)
    assert issubclass(AudienceTooSmall, ValueError)
    assert AudienceConfig().min_audience == 100  # the default floor


def test_an_arrival_is_served_from_its_content(built):  # noqa: F811
    store, _ = built
    audiences = Audiences.load(store, OLD, config=ONE)
    a = audiences.audience("p6", k=10)  # first seen after W0's end: only its increment carries it
    assert a.source == "content" and a.items == ("p6",) and set(a.user_ids) == {"u1", "u2"}
    np.testing.assert_allclose(a.scores, np.sort(served_column(audiences.rec, list(a.user_ids), "p6"))[::-1], rtol=1e-5)
    assert "p6" in audiences.audience("a1", k=10, include_converted=True).items  # its advertiser reaches it too
    assert not Audiences.load(store, OLD, config=ONE, increments=False).linker.items_of("p6", {})


def test_many_audiences_at_once_are_each_audience_alone(full_store):  # noqa: F811
    audiences = Audiences.load(PartitionStore(full_store), NEW, config=AudienceConfig(min_audience=2, batch_users=3))
    together = audiences.many(["a1", "a2", "p4", "nobody"], k=10)
    for entity, got in zip(("a1", "a2", "p4"), together):
        try:
            alone = audiences.audience(entity, k=10)
        except AudienceTooSmall:
            assert isinstance(got, AudienceTooSmall)
            continue
        assert list(got.user_ids) == list(alone.user_ids) and got.size == alone.size and got.levels == alone.levels
        np.testing.assert_allclose(got.scores, alone.scores, rtol=1e-6)
    assert isinstance(together[3], UnknownEntity)
    apart = Audiences(audiences.rec, audiences.linker, audiences.membership,
                      AudienceConfig(min_audience=2, batch_users=3, max_columns=1)).many(["a1", "a2", "p4"], k=10)
    for a, b in zip(together, apart):  # one entity per pass over the users: the same audiences
        assert type(a) is type(b) and (isinstance(a, Exception) or list(a.user_ids) == list(b.user_ids))


def test_the_content_term_is_added_on_the_windows_items_and_left_to_the_head_on_arrivals(built):  # noqa: F811
    from hir_model.rank.audience import pair_scores
    from hir_model.rank.head import head_scores, recent_items

    store, _ = built
    rec = Audiences.load(store, OLD, config=ONE).rec  # p6 appended: the head gives it its own content term
    batch = rec.user_batch(["u1", "u2"])
    rng = np.random.default_rng(0)
    content = rng.normal(size=(rec.n_items, 4)).astype(np.float32)
    content /= np.linalg.norm(content, axis=1, keepdims=True)
    columns = np.arange(rec.n_items)
    args = (batch.queries, rec.items, rec.config, batch.rows, batch.warm, batch.cold_vectors, columns)
    head = head_scores(*args)
    got = pair_scores(*args, AudienceConfig(content_weight=2.0), content)
    profile = recent_items(batch.queries, content, None, rec.config.deep_weight)
    fresh = rec.items.fresh if rec.items.fresh is not None else np.zeros(rec.n_items, bool)
    np.testing.assert_allclose(got[:, ~fresh], head[:, ~fresh] + 2.0 * profile @ content[~fresh].T, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[:, fresh], head[:, fresh])
    np.testing.assert_array_equal(pair_scores(*args, AudienceConfig(content_weight=0.0), content), head)
    assert AudienceConfig().content_weight == 1.0


def test_hir_toml_audience_table_and_its_source_sub_table(tmp_path):
    from hir_model.config import load_config
    from hir_model.rank.audience import audience_config

    path = tmp_path / "hir.toml"
    path.write_text("[audience]\nmin_audience = 50\n[audience.movielens]\npropensity_weight = 0.3\n"
                    "[audience.synthetic]\nmin_audience = 70\n")
    ml = audience_config(load_config(path, env={"HIR_SOURCE": "movielens"}).audience)
    syn = audience_config(load_config(path, env={"HIR_SOURCE": "synthetic"}).audience)
    assert (ml.min_audience, ml.propensity_weight) == (50, 0.3) and (syn.min_audience, syn.propensity_weight) == (70, 0.0)
    path.write_text("[audience]\nminimum = 5\n")
    with pytest.raises(ValueError, match="unknown keys \\['minimum'\\]"):
        audience_config(load_config(path, env={}).audience)


def test_aggregates_and_propensity():
    s = np.array([[0.0, 1.0], [0.5, 0.5]], np.float32)
    np.testing.assert_allclose(aggregate(s, "max", 0.1), [1.0, 0.5])
    np.testing.assert_allclose(aggregate(s, "mean", 0.1), [0.5, 0.5])
    lse = aggregate(s, "lse", 0.1)
    assert 0.5 < lse[0] < 1.0 and lse[1] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        AudienceConfig(aggregate="sum")
    from hir_model.protocol.split import Interactions
    day = 86_400_000_000
    h = Interactions("w", 10 * day, np.array(["a", "b"], object), np.array([0, 0, 1]), np.zeros(3, np.int64),
                     np.array([10 * day - 1, 10 * day - 1, 0]), np.array([True, False, False]), 1)
    p = user_propensity(h, 14.0, 2.0)
    assert p[0] == pytest.approx(np.log1p(3.0), rel=1e-4) and 0 < p[1] < np.log1p(1.0)  # recent and converting first


def _config(tmp_path, floor: int):
    path = tmp_path / "hir.toml"
    path.write_text(f"[audience]\nmin_audience = {floor}\n")
    return path


def test_hir_audience_answers_and_exits_2_on_what_it_cannot_serve(built, tmp_path, monkeypatch, capsys):  # noqa: F811
    import json

    from hir_model.cli import main

    store, _ = built
    monkeypatch.setenv("HIR_STORAGE_URI", str(store.root))
    monkeypatch.setenv("HIR_CONFIG", str(_config(tmp_path, 2)))
    expected = Audiences.load(store, OLD, config=AudienceConfig(min_audience=2))
    for entity in ("a2", "p4", "p6"):  # a known advertiser, a product, an arrival served from its content
        assert main(["audience", "--window", OLD, "--entity", entity, "--k", "5", "--json"]) == 0
        body = json.loads(capsys.readouterr().out)
        want = expected.audience(entity, k=5)
        assert [u["user_id"] for u in body["users"]] == list(want.user_ids) and body["size"] == want.size == 2
        assert body["source"] == ("content" if entity == "p6" else "history")
    assert main(["audience", "--window", OLD, "--entity", "a2", "--k", "5", "--level", "0"]) == 0
    assert "level 0 primitive" in capsys.readouterr().out
    for args, message in ((["--entity", "a1"], "has 1 users, below the minimum of 2"),  # u1 converted with p1
                          (["--entity", "a2", "--k", "1"], "k=1 is below the minimum audience of 2"),
                          (["--entity", "nobody"], "has no item for 'nobody'"),
                          (["--entity", "a2", "--level", "9"], "levels [0, 1], not 9")):
        assert main(["audience", "--window", OLD, *args]) == 2
        assert message in capsys.readouterr().err
    assert main(["audience", "--window", "1999-01-03", "--entity", "a2"]) == 2
    assert "was never materialised" in capsys.readouterr().err


@pytest.mark.slow  # a server process importing torch: 4-8 s
def test_get_audience_over_http_answers_as_the_library_and_refuses_bad_input(built, tmp_path, monkeypatch):  # noqa: F811
    import httpx

    from tests.hir_model.rank.test_serve import server

    store, _ = built
    monkeypatch.setenv("HIR_CONFIG", str(_config(tmp_path, 2)))
    expected = Audiences.load(store, OLD, config=AudienceConfig(min_audience=2))
    with server(store.root, tmp_path / "serve.log", "--window", OLD) as (proc, url), \
            httpx.Client(base_url=url, timeout=30) as client:
        for entity in ("a2", "p4", "p6"):  # a known advertiser, a product, a new entity (its increment: content only)
            r = client.get("/audience", params={"entity": entity, "k": "5"})
            assert r.status_code == 200, r.text
            body, want = r.json(), expected.audience(entity, k=5)
            assert body["window"] == OLD and body["entity"] == entity and body["size"] == want.size
            assert [u["user_id"] for u in body["users"]] == list(want.user_ids)
            assert [u["score"] for u in body["users"]] == pytest.approx([float(s) for s in want.scores], rel=1e-6)
        assert client.get("/audience", params={"entity": "p6", "k": "5"}).json()["source"] == "content"
        r = client.get("/audience", params={"entity": "a2", "k": "5", "level": "1"})
        assert r.status_code == 200 and r.json()["level"] == 1
        small = client.get("/audience", params={"entity": "a1", "k": "5"})  # u1 converted with p1: one user is left
        assert small.status_code == 422 and "below the minimum of 2" in small.json()["error"]
        assert client.get("/audience", params={"entity": "a1", "k": "5", "include_converted": "1"}).status_code == 200
        assert client.get("/audience", params={"entity": "nobody"}).status_code == 404
        bad = [client.get("/audience", params=p) for p in ({"entity": "a2", "k": "abc"}, {"entity": "a2", "k": "0"},
                                                          {"entity": "a2", "level": "x"}, {"entity": "a2", "level": "9"},
                                                          {"entity": "a2", "primitive": "1"}, {"k": "5"},
                                                          {"entity": "a2", "kk": "5"},
                                                          {"entity": "a2", "include_converted": "maybe"})]
        assert [r.status_code for r in bad] == [400] * len(bad), [r.text for r in bad]
        assert "'abc'" in bad[0].json()["error"] and "kk" in bad[6].json()["error"]
        assert client.get("/health").json()["window"] == OLD  # still serving
    assert proc.returncode == 0


def test_the_users_terms_made_once_score_any_columns_as_the_head_does(full_store):  # noqa: F811
    """Audiences keep each user batch's terms (UserTerms) and score every entity from them: the values head_scores gives
    those columns, the co-engagement term taken over the columns alone included."""
    from hir_model.rank.head import head_scores, scores, user_terms

    audiences = Audiences.load(PartitionStore(full_store), NEW, config=ONE)
    rec = audiences.rec
    assert rec.items.coengagement is not None and rec.items.coengagement.nnz  # the term whose columns are sliced first
    batch = rec.user_batch(list(audiences.user_ids))
    warm = batch.warm.copy()
    warm[0] = False  # scored as a cold user: its encoder vector (here its row) and the structural readout
    args = (batch.queries, rec.items, rec.config, batch.rows, warm, batch.rows)
    full = head_scores(*args)
    terms = user_terms(*args)
    np.testing.assert_array_equal(scores(terms, rec.items, rec.config), full)
    for columns in (np.array([3, 0]), np.arange(rec.n_items)[::-1].copy()):  # a few (the flat kernel), all reversed
        got = scores(terms, rec.items, rec.config, columns)
        np.testing.assert_array_equal(got, head_scores(*args, columns))
        np.testing.assert_allclose(got, full[:, columns], rtol=1e-5, atol=1e-6)
    # the audience's cached blocks give what scoring the users afresh gives
    fresh = Audiences(rec, audiences.linker, audiences.membership, ONE)
    a = audiences.audience("p4", k=10, include_converted=True)
    audiences.audience("a1", k=10, include_converted=True)  # blocks reused across entities
    np.testing.assert_array_equal(audiences.audience("p4", k=10, include_converted=True).scores, a.scores)
    np.testing.assert_array_equal(fresh.audience("p4", k=10, include_converted=True).scores, a.scores)
