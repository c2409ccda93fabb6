"""Increments (hir_model.rank.increment) on the tiny store: a day's arrivals read through the catalogue contract, placed
and tokenised in window t's space, written and read back, judged by their checks; served by `Recommender.with_increments`
(the window's own answers unchanged, the base snapshot untouched, the faiss index and postings extended in place); and
`hir serve` picking one up without a restart, `/health` naming it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from hir_model.content import ContentConfig
from hir_model.data.parquet_source import ParquetSource
from hir_model.rank.increment import (INCREMENT_ASSET, NEW_IDS_CHECK, UNIT_CHECK, WITHIN_DAY_CHECK, Increment,
                                      build_increment, day_of, increment_checks, load_increments, read_increment,
                                      write_increment)
from hir_model.rank.recommender import ContextEvent, Recommender
from hir_model.rank.serve import ServeConfig, WindowSwitcher
from hir_model.storage import PartitionStore
from tests.hir_model.eval.tiny import KEYS, SPEC, W3, catalog
from tests.hir_model.rank.test_serve import full_store  # noqa: F401  (the fixture: W0 and W1 with bom_index)

torch.set_num_threads(1)
W0 = SPEC.window(KEYS[0])
DAY = day_of("2024-01-14")  # p6 ("white running shoe") is first seen at W1 + 3 h: the first day after W0


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> ParquetSource:
    """The tiny world's catalogue as a bring-your-own folder (every entity, each read as of the day asked)."""
    root = tmp_path_factory.mktemp("byo")
    (root / "catalog").mkdir()
    (root / "events" / KEYS[0]).mkdir(parents=True)
    pq.write_table(catalog(W3), root / "catalog" / "entities.parquet")
    return ParquetSource(root)


@pytest.fixture(scope="module")
def built(full_store, source):  # noqa: F811
    store = PartitionStore(full_store)
    build = build_increment(store, source, W0, DAY, ContentConfig())
    with store.writing() as staging:
        write_increment(staging.path(INCREMENT_ASSET, DAY.key), build.increment)
    return store, build


def test_a_days_arrivals_are_placed_in_the_windows_space(built):
    store, build = built
    inc = build.increment
    assert (inc.day, inc.window) == (DAY.key, KEYS[0]) and list(inc.item_ids) == ["p6"] and list(inc.item_types) == ["product"]
    assert inc.start_us <= inc.first_seen_us[0] < inc.end_us  # first seen inside the day
    rec = Recommender.load(store, KEYS[0])
    assert inc.vectors.shape == (1, rec.items.vectors.shape[1])
    np.testing.assert_allclose(np.linalg.norm(inc.vectors, axis=1), 1, atol=1e-5)
    assert inc.has_content.all() and inc.single_token == 1  # text embedded; the test encoder reads no content
    levels = sorted(set(inc.tokens["level"].to_pylist()))
    assert levels == sorted(int(b.tokens[0].split(":")[0][1:]) for b in rec.retriever.codebooks)  # a token per level
    assert set(inc.tokens["entity_id"].to_pylist()) == {"p6"}
    assert build.known_skipped == [] and build.arrivals == 1
    again = read_increment(store.partition_dir(INCREMENT_ASSET, DAY.key))  # written and read back: the same increment
    assert again.digest == inc.digest and list(again.item_ids) == ["p6"] and again.tokens.equals(inc.tokens)
    np.testing.assert_array_equal(again.content, inc.content)
    assert [i.day for i in load_increments(store, KEYS[0], inc.start_us)] == [DAY.key]
    assert load_increments(store, KEYS[1], inc.start_us + 7 * 86_400_000_000) == []  # placed in W0's space, not W1's


def test_a_day_without_arrivals_is_an_empty_increment(full_store, source):  # noqa: F811
    inc = build_increment(PartitionStore(full_store), source, W0, day_of("2024-01-15"), ContentConfig()).increment
    assert len(inc) == 0 and inc.vectors.shape[0] == 0
    assert all(ok for _, ok, _, _ in increment_checks(inc, np.array(["p1"], object), 16))


def test_an_item_the_window_knows_is_not_an_arrival_and_the_window_must_have_closed(full_store, tmp_path):  # noqa: F811
    """p1, ranked by W0, listed again as first seen on the day (in a file read first): skipped, never placed again."""
    import pyarrow as pa

    (tmp_path / "catalog").mkdir()
    table = catalog(W3)
    again = table.filter(pa.array([e == "p1" for e in table["entity_id"].to_pylist()]))
    again = again.set_column(3, "first_seen_ts", pa.array([DAY.start.replace(hour=9)], table.schema.field("first_seen_ts").type))
    pq.write_table(again, tmp_path / "catalog" / "a.parquet")
    pq.write_table(table, tmp_path / "catalog" / "b.parquet")
    store = PartitionStore(full_store)
    build = build_increment(store, ParquetSource(tmp_path), W0, DAY, ContentConfig())
    assert build.known_skipped == ["p1"] and list(build.increment.item_ids) == ["p6"] and build.arrivals == 2
    with pytest.raises(ValueError, match="starts before window 2024-01-07 ends"):
        build_increment(store, ParquetSource(tmp_path), W0, day_of("2024-01-08"), ContentConfig())
    with pytest.raises(FileNotFoundError, match="ranking_head for 2024-01-21 is not materialised"):
        build_increment(store, ParquetSource(tmp_path), SPEC.window(KEYS[2]), day_of("2024-01-28"), ContentConfig())


def test_the_checks_name_the_rows_that_break_them(built):
    _, build = built
    inc = build.increment
    ok = dict((n, (p, d)) for n, p, d, _ in increment_checks(inc, build.window_items, build.width, {}))
    assert all(p for p, _ in ok.values())
    future = dataclasses.replace(inc, first_seen_us=np.array([inc.end_us + 3_600_000_000]))  # an hour past the day's end
    got = {n: (p, d) for n, p, d, _ in increment_checks(future, build.window_items, build.width, {})}
    assert not got[WITHIN_DAY_CHECK][0] and "1 dated at or after the increment's end" in got[WITHIN_DAY_CHECK][1]
    assert "p6 (row 0, first seen 2024-01-15T01:00:00+00:00)" in got[WITHIN_DAY_CHECK][1]
    known = dataclasses.replace(inc, item_ids=np.array(["p1"], object))
    got = {n: (p, d) for n, p, d, _ in increment_checks(known, build.window_items, build.width, {"2024-01-16": ["p9"]})}
    assert not got[NEW_IDS_CHECK][0] and "['p1']" in got[NEW_IDS_CHECK][1]
    got = {n: p for n, p, _, _ in increment_checks(inc, build.window_items, build.width, {"2024-01-16": ["p6"]})}
    assert not got[NEW_IDS_CHECK]  # the same id in another day's increment of the window
    nan = dataclasses.replace(inc, vectors=np.full_like(inc.vectors, np.nan))
    got = {n: (p, d) for n, p, d, _ in increment_checks(nan, build.window_items, build.width, {})}
    assert not got[UNIT_CHECK][0] and "p6 (row 0)" in got[UNIT_CHECK][1]
    got = {n: p for n, p, _, _ in increment_checks(inc, build.window_items, build.width + 1, {})}
    assert not got[UNIT_CHECK]  # another width than the window's


def _fake(inc: Increment, ids: list[str], vectors: np.ndarray, day: str = "2024-01-16") -> Increment:
    """Another day's increment of the same window with these items (tokens: the built item's, renamed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tok = pa.concat_tables([inc.tokens.set_column(0, "entity_id", pa.array([e] * inc.tokens.num_rows, pa.string()))
                            for e in ids])
    assert pc.all(pc.is_in(tok["entity_id"], pa.array(ids))).as_py()
    n = len(ids)
    return dataclasses.replace(inc, day=day, item_ids=np.array(ids, object), item_types=np.array(["product"] * n, object),
                               first_seen_us=np.full(n, day_of(day).start.timestamp() * 1e6, np.int64),
                               vectors=vectors.astype(np.float32), content=np.zeros((n, inc.content.shape[1]), np.float32),
                               has_content=np.zeros(n, bool), tokens=tok)


def test_served_with_increments_the_window_answers_as_before_and_the_base_is_untouched(built):
    store, build = built
    base = Recommender.load(store, KEYS[0])
    before = {u: [(h.entity_id, h.score) for h in base.recommend(u, k=5)] for u in ("u1", "u2")}
    ntotal = base.retriever.index.ntotal
    rec = base.with_increments([build.increment])
    assert (rec.n_window, rec.n_items, rec.arrived_items) == (base.n_items, base.n_items + 1, 1)
    assert rec.retriever.index is base.retriever.index and base.retriever.index.ntotal == ntotal + 1  # extended in place
    for u in ("u1", "u2"):
        assert [(h.entity_id, h.score) for h in base.recommend(u, k=5)] == before[u]  # the old snapshot: as it was
        assert [(h.entity_id, h.score) for h in rec.recommend(u, k=5, scope="window")] == before[u]
        new = rec.recommend(u, k=5, scope="new")
        assert [h.entity_id for h in new] == ["p6"]
        exact = rec.recommend(u, k=5, scope="new", exact=True)
        assert [(h.entity_id, h.score) for h in exact] == [(h.entity_id, h.score) for h in new]
        assert "p6" in [h.entity_id for h in rec.recommend(u, k=rec.n_items)]
    assert base.retriever.similar("p1", k=10, exact=True) and "p6" not in [h.entity_id for h in base.retriever.similar("p1", k=10, exact=True)]
    assert "p6" in [h.entity_id for h in rec.retriever.similar("p1", k=10, exact=True)]  # the faiss search reaches it
    assert any(r == base.n_items for t, _ in rec.retriever.tokens["p6"] for r in rec.retriever.postings[t][0])
    assert all(base.n_items not in base.retriever.postings.get(t, ([],))[0] for t, _ in rec.retriever.tokens["p6"])
    # a cold user whose context holds the new item: the encoder reads it (a leaf from its content), not dropped
    context = [ContextEvent("p1"), ContextEvent("p6", deep=True)]
    assert rec.unknown_items(context) == [] and base.unknown_items(context) == ["p6"]
    assert [h.entity_id for h in rec.recommend(context=context, k=3)] and "p6" not in [h.entity_id for h in rec.recommend(context=context, k=10)]


def test_increments_stack_and_upto_serves_what_was_published_then(built):
    store, build = built
    base = Recommender.load(store, KEYS[0])
    one = base.with_increments([build.increment])
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2, build.width))
    two = one.with_increments([_fake(build.increment, ["p8", "p9"], vectors / np.linalg.norm(vectors, axis=1, keepdims=True))])
    assert list(two.item_ids[two.n_window:]) == ["p6", "p8", "p9"] and two.retriever.size == one.retriever.size + 2
    batch = two.user_batch(["u1"])
    rows, _ = two.top(batch, 10, scope="new", upto=two.n_window + 1)[0]
    assert [two.item_ids[r] for r in rows] == ["p6"]  # only what was published by then
    rows, _ = two.top(batch, 10, scope="new")[0]
    assert sorted(two.item_ids[r] for r in rows) == ["p6", "p8", "p9"]
    contexts = [[ContextEvent("p1"), ContextEvent("p8", deep=True)]] * 2
    bounds = (two.n_window + 1, two.n_items)  # before p8 was published, and after
    both = two.context_batch(contexts, ["c1", "c2"], upto=np.array(bounds))
    assert two.item_row["p8"] not in both.queries.context.row(0) and two.item_row["p8"] in both.queries.context.row(1)
    for q, bound in enumerate(bounds):  # one batch with a bound per context = each context alone
        alone = two.context_batch(contexts[:1], [f"c{q + 1}"], upto=bound)
        assert list(both.queries.context.row(q)) == list(alone.queries.context.row(0))
        np.testing.assert_allclose(both.cold_vectors[q], alone.cold_vectors[0], atol=1e-5)
    with pytest.raises(ValueError, match="serves these ids already"):
        two.with_increments([_fake(build.increment, ["p8"], vectors[:1])])
    branch = one.with_increments([_fake(build.increment, ["q1"], vectors[:1] / np.linalg.norm(vectors[0]))])
    assert list(branch.item_ids[branch.n_window:]) == ["p6", "q1"]  # a second branch from `one`: on a copy of the index
    assert branch.retriever.index is not one.retriever.index and branch.retriever.index.ntotal == branch.n_items
    assert [h.entity_id for h in two.recommend("u1", k=10, scope="new", exact=True)] == \
        [h.entity_id for h in two.recommend("u1", k=10, scope="new")]  # few arrivals: every one is a candidate


def test_hir_serve_appends_a_published_increment_and_health_names_it(full_store, source, tmp_path):  # noqa: F811
    """The switcher on a copy of the store: W0 pinned, no increment; one is published; the next poll serves it."""
    import shutil

    root = tmp_path / "store"
    shutil.copytree(full_store, root, ignore=shutil.ignore_patterns(INCREMENT_ASSET))
    store = PartitionStore(root)
    switcher = WindowSwitcher(store, ServeConfig(window=KEYS[0]))
    first = switcher.served
    assert switcher.health()["increments"] == [] and switcher.health()["arrived_items"] == 0
    assert not switcher.poll()
    build = build_increment(store, source, W0, DAY, ContentConfig())
    with store.writing() as staging:
        write_increment(staging.path(INCREMENT_ASSET, DAY.key), build.increment)
    assert switcher.poll()
    health = switcher.health()
    assert health["increments"] == [{"day": DAY.key, "items": 1, "digest": build.increment.digest}]
    assert health["arrived_items"] == 1 and health["items"] == health["window_items"] + 1 and health["increment_updates"] == 1
    assert switcher.served.rec.retriever.index is first.rec.retriever.index  # extended, not reloaded
    assert [h.entity_id for h in switcher.served.rec.recommend("u1", k=3, scope="new")] == ["p6"]
    assert first.rec.n_items == health["window_items"]  # a request holding the old snapshot never sees it
    assert not switcher.poll()  # nothing new
    # the day published again with one more item: only that item is appended
    more = _fake(build.increment, ["p6", "p8"], np.vstack([build.increment.vectors, build.increment.vectors]), DAY.key)
    more = dataclasses.replace(more, first_seen_us=np.array([build.increment.first_seen_us[0]] * 2))
    with store.writing() as staging:
        write_increment(staging.path(INCREMENT_ASSET, DAY.key), more)
    assert switcher.poll()
    assert list(switcher.served.rec.item_ids[switcher.served.rec.n_window:]) == ["p6", "p8"]
    assert switcher.health()["increments"] == [{"day": DAY.key, "items": 2, "digest": more.digest}]


def test_hir_retrieve_and_the_http_query_take_a_scope(built, monkeypatch, capsys):
    from hir_model.cli import main
    from hir_model.rank.serve import BadRequest, query_from_json, query_from_params

    store, build = built
    monkeypatch.setenv("HIR_STORAGE_URI", str(store.root))
    assert main(["retrieve", "--window", KEYS[0], "--user", "u1", "--scope", "new", "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert f"+ increments {DAY.key}..{DAY.key} (1 items)" in out and "new items only" in out and " p6 " in out
    assert main(["retrieve", "--window", KEYS[0], "--entity", "p6", "--k", "3"]) == 0  # an arrival's neighbours
    assert "similar to p6" in capsys.readouterr().out
    assert query_from_params({"user": "u1", "scope": "new"}).scope == "new" and query_from_json({"user": "u1"}).scope == "all"
    with pytest.raises(BadRequest, match="scope must be one of"):
        query_from_params({"user": "u1", "scope": "fresh"})


def test_arrivals_are_scored_with_the_heads_content_term(built):
    """A head carrying its items' content: the arrivals' content joins the item side, and the served score of p6 is the
    head's score with the content term, as hir_exact scores an item first seen after end(t)."""
    from hir_model.rank.head import head_scores
    from hir_model.rank.state import HEAD_ASSET, read_head

    store, build = built
    inc = build.increment
    state = read_head(store.partition_dir(HEAD_ASSET, KEYS[0]))
    rng = np.random.default_rng(1)
    state = dataclasses.replace(state, content=rng.normal(size=(state.n_items, inc.content.shape[1])).astype(np.float32))
    base = Recommender.load(store, KEYS[0])
    rec = Recommender(state, base.user_rows, base.has_row, base.retriever, probe_factor=base.probe_factor).with_increments([inc])
    assert rec.items.fresh.tolist() == [False] * state.n_items + [True] and rec.items.content_weight == state.config.content_weight
    side = state.items(state.config, inc.vectors, new_content=inc.content)
    batch = rec.user_batch(["u1"])
    expected = head_scores(batch.queries, side, state.config, batch.rows, batch.warm, batch.cold_vectors)[0, -1]
    without = head_scores(batch.queries, state.items(state.config, inc.vectors), state.config, batch.rows, batch.warm,
                          batch.cold_vectors)[0, -1]
    (hit,) = rec.recommend("u1", k=1, scope="new")
    assert hit.entity_id == "p6" and hit.score == pytest.approx(float(expected), rel=1e-5) and expected != without
