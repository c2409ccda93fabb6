"""SyntheticSource: contracts, causality, determinism, funnel shape, planted structure, streaming."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA
from data_contracts.vocab import EVENT_TYPES, FUNNEL_STAGES
from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
from hir_model.data.windows import WindowSpec

SMALL = SyntheticConfig(n_windows=3, events_per_window=30_000, n_advertisers=20, n_products=300, n_users=400,
                        new_advertisers_per_window=3, new_products_per_window=30, new_users_per_window=25,
                        batch_rows=8_192, image_size=16)


def every(mask) -> bool:
    return pc.all(mask, min_count=0).as_py()


def table(batches, schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([b.table for b in batches] + [schema.empty_table()])


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> SyntheticSource:
    return SyntheticSource(SMALL, tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="module")
def windows(source):
    return WindowSpec.covering("weekly", *source.span()).windows()


@pytest.fixture(scope="module")
def events(source, windows) -> list[pa.Table]:
    return [table(source.events(w), EVENTS_SCHEMA) for w in windows]


@pytest.fixture(scope="module")
def final(source, windows):
    end = windows[-1].end
    return table(source.catalog(end), CATALOG_SCHEMA), table(source.relations(end), RELATIONS_SCHEMA)


def test_span_gives_the_configured_windows(source, windows):
    first, last = source.span()
    assert first == SMALL.start and last == SMALL.start + timedelta(weeks=3, microseconds=-1)
    assert [w.key for w in windows] == ["2024-01-07", "2024-01-14", "2024-01-21"]


def test_tables_match_the_contracts_exactly(source, windows):
    for batch in source.events(windows[0]):
        assert batch.table.schema == EVENTS_SCHEMA
        assert batch.origin.startswith("synthetic:seed=7/events/2024-01-07#")
    for batch in source.catalog(windows[0].end):
        assert batch.table.schema == CATALOG_SCHEMA
    for batch in source.relations(windows[0].end):
        assert batch.table.schema == RELATIONS_SCHEMA


def test_same_seed_same_data_other_seed_other_data(source, windows, events, final, tmp_path):
    twin = SyntheticSource(SMALL, source.data_dir)  # same folder: image uris match too
    assert table(twin.events(windows[1]), EVENTS_SCHEMA).equals(events[1])
    assert table(twin.catalog(windows[-1].end), CATALOG_SCHEMA).equals(final[0])
    assert table(twin.relations(windows[-1].end), RELATIONS_SCHEMA).equals(final[1])
    assert twin.ground_truth.entities.equals(source.ground_truth.entities)
    other = SyntheticSource(replace(SMALL, seed=8), source.data_dir)
    assert not table(other.events(windows[1]), EVENTS_SCHEMA).equals(events[1])
    assert not other.ground_truth.hierarchy["name"].equals(source.ground_truth.hierarchy["name"])
    assert not table(other.catalog(windows[0].end), CATALOG_SCHEMA)["title"].equals(table(source.catalog(windows[0].end), CATALOG_SCHEMA)["title"])


def test_a_shorter_run_is_a_prefix_of_a_longer_one(source, windows, events):
    short = SyntheticSource(replace(SMALL, n_windows=2), source.data_dir)
    assert table(short.events(windows[1]), EVENTS_SCHEMA).equals(events[1])
    assert table(short.catalog(windows[1].end), CATALOG_SCHEMA).equals(table(source.catalog(windows[1].end), CATALOG_SCHEMA))
    assert list(short.events(windows[2])) == []


def test_events_lie_in_their_window_with_unique_ids(windows, events):
    for w, ev in zip(windows, events):
        assert ev.num_rows == SMALL.events_per_window
        assert pc.min(ev["ts"]).as_py() >= w.start and pc.max(ev["ts"]).as_py() < w.end
        assert set(ev["event_type"].to_pylist()) <= set(EVENT_TYPES)
    ids = pa.concat_arrays([ev["event_id"].combine_chunks() for ev in events])
    assert len(pc.unique(ids)) == len(ids)


def test_events_only_reference_entities_known_at_window_end(source, windows, events):
    for w, ev in zip(windows, events):
        cat = table(source.catalog(w.end), CATALOG_SCHEMA)
        users = cat.filter(pc.equal(cat["entity_type"], "user"))
        assert every(pc.is_in(ev["user_id"], users["entity_id"]))
        joined = ev.join(cat.select(["entity_id", "entity_type", "first_seen_ts"]).rename_columns(["entity_id", "cat_type", "fs"]), "entity_id")
        assert joined.num_rows == ev.num_rows  # every entity is in the catalog
        assert every(pc.equal(joined["entity_type"], joined["cat_type"]))
        assert every(pc.greater_equal(joined["ts"], joined["fs"]))  # nothing engaged before it exists


def test_catalog_and_relations_are_causal_and_closed(source, windows):
    for end in [windows[0].start, windows[0].start + timedelta(days=3)] + [w.end for w in windows]:
        cat, rel = table(source.catalog(end), CATALOG_SCHEMA), table(source.relations(end), RELATIONS_SCHEMA)
        assert cat.num_rows == 0 or pc.max(cat["first_seen_ts"]).as_py() < end
        assert rel.num_rows == 0 or pc.max(rel["first_seen_ts"]).as_py() < end
        known = cat["entity_id"]
        for col in (rel["src_id"], rel["dst_id"], pc.drop_null(cat["parent_id"])):
            assert every(pc.is_in(col, known))
    cat, rel = table(source.catalog(windows[-1].end), CATALOG_SCHEMA), table(source.relations(windows[-1].end), RELATIONS_SCHEMA)
    assert set(rel["relation"].to_pylist()) == {"sold_by", "run_by", "promotes"}
    assert len(pc.unique(cat["entity_id"])) == cat.num_rows


def test_new_products_advertisers_and_users_arrive_every_window(windows, final):
    cat = final[0]
    for w in windows:
        fs = cat["first_seen_ts"]
        new = cat.filter(pc.and_(pc.greater_equal(fs, w.start), pc.less(fs, w.end)))
        kinds = new["entity_type"].to_pylist()
        assert {"product", "advertiser", "user", "campaign"} <= set(kinds)
        if w is not windows[0]:
            assert kinds.count("product") == SMALL.new_products_per_window


def test_funnel_rates_fall_steeply(events):
    ev = pa.concat_tables(events)
    counts = {t: pc.sum(pc.equal(ev["event_type"], t)).as_py() for t in EVENT_TYPES}
    stages = [counts[t] for t in FUNNEL_STAGES]
    assert all(a > b for a, b in zip(stages, stages[1:])), counts
    assert counts["purchase"] <= 0.01 * counts["impression"]
    assert 0.01 < counts["click"] / counts["impression"] < 0.15
    assert counts["interested"] > 0 and counts["not_interested"] > 0


def test_deeper_stages_follow_shallower_ones(events):
    for ev in events:
        first = ev.group_by(["user_id", "entity_id", "event_type"]).aggregate([("ts", "min")])
        for shallow, deep in zip(FUNNEL_STAGES, FUNNEL_STAGES[1:]):
            a = first.filter(pc.equal(first["event_type"], shallow)).drop_columns("event_type").rename_columns(["user_id", "entity_id", "t_a"])
            b = first.filter(pc.equal(first["event_type"], deep)).drop_columns("event_type").rename_columns(["user_id", "entity_id", "t_b"])
            j = b.join(a, ["user_id", "entity_id"], join_type="left outer")
            assert j.num_rows == b.num_rows and j["t_a"].null_count == 0  # the shallower stage happened...
            assert every(pc.less_equal(j["t_a"], j["t_b"]))  # ...and first


def test_product_popularity_is_heavy_tailed(events):
    ev = pa.concat_tables(events)
    imp = ev.filter(pc.and_(pc.equal(ev["event_type"], "impression"), pc.equal(ev["entity_type"], "product")))
    per = np.sort(imp.group_by("entity_id").aggregate([("event_id", "count")])["event_id_count"].to_numpy())[::-1]
    top = per[: max(1, len(per) // 10)].sum() / per.sum()
    assert top > 0.4, top


def test_engagement_concentrates_on_planted_interests(source, events):
    truth = source.ground_truth.entities.select(["entity_id", "interest_l2"])
    n_fine = int(np.prod(SMALL.branching))
    for w, ev in enumerate(events):
        clicks = ev.filter(pc.and_(pc.equal(ev["event_type"], "click"), pc.equal(ev["entity_type"], "product")))
        clicks = clicks.join(truth, "entity_id").select(["user_id", "interest_l2"])
        mixture = source.user_mixture(w)
        planted = mixture.select(["user_id", "interest_l2"]).append_column("planted", pa.repeat(True, mixture.num_rows))
        on_interest = clicks.join(planted, ["user_id", "interest_l2"])["planted"].is_valid().to_numpy(zero_copy_only=False).mean()
        chance = mixture.num_rows / len(pc.unique(mixture["user_id"])) / n_fine  # mean interests per user / n_fine
        assert on_interest > 0.5 and on_interest > 5 * chance, (on_interest, chance)


def test_images_are_png_deterministic_and_written_once(source, windows, final, tmp_path):
    cat = final[0]
    products = cat.filter(pc.equal(cat["entity_type"], "product"))
    uris = products["image_uri"].to_pylist()
    paths = [source.data_dir / "images" / u.rsplit("/", 1)[1] for u in uris]
    assert all(u.startswith("file:///") and u == p.as_uri() for u, p in zip(uris, paths))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    before = paths[0].stat().st_mtime_ns
    list(source.catalog(windows[-1].end))
    assert paths[0].stat().st_mtime_ns == before  # idempotent: not rewritten
    fresh = SyntheticSource(SMALL, tmp_path)
    list(fresh.catalog(windows[0].end))
    assert (tmp_path / "images" / paths[0].name).read_bytes() == paths[0].read_bytes()
    assert paths[0].read_bytes() != paths[1].read_bytes()
    assert not (tmp_path / "images" / paths[-1].name).exists()  # only what the catalog up to then needs


def test_ground_truth_is_written_beside_the_data(source, final, tmp_path):
    src = SyntheticSource(replace(SMALL, n_products=20, n_users=30, new_products_per_window=2, new_users_per_window=2), tmp_path)
    src.prepare()
    entities = pq.read_table(tmp_path / "ground_truth" / "entities.parquet")
    hierarchy = pq.read_table(tmp_path / "ground_truth" / "hierarchy.parquet")
    assert entities.column_names == ["entity_id", "entity_type", "interest_l0", "interest_l1", "interest_l2"]
    assert entities.equals(src.ground_truth.entities) and hierarchy.equals(src.ground_truth.hierarchy)
    b0, b1, b2 = SMALL.branching
    assert hierarchy.num_rows == b0 + b0 * b1 + b0 * b1 * b2
    assert len(list((tmp_path / "images").glob("*.png"))) == 20 + 2 * SMALL.n_windows
    # the truth covers the whole catalogue and is consistent with the tree
    assert set(source.ground_truth.entities["entity_id"].to_pylist()) == set(final[0]["entity_id"].to_pylist())
    gt = source.ground_truth.entities
    assert np.array_equal(gt["interest_l1"].to_numpy() // b1, gt["interest_l0"].to_numpy())
    assert np.array_equal(gt["interest_l2"].to_numpy() // b2, gt["interest_l1"].to_numpy())


def test_daily_windows_slice_the_same_events(source, windows, events):
    days = WindowSpec.covering("daily", windows[0].start, windows[0].end - timedelta(microseconds=1)).windows()
    parts = [table(source.events(d), EVENTS_SCHEMA) for d in days]
    for d, ev in zip(days, parts):
        assert ev.num_rows == 0 or (pc.min(ev["ts"]).as_py() >= d.start and pc.max(ev["ts"]).as_py() < d.end)
    assert sorted(pa.concat_tables(parts)["event_id"].to_pylist()) == sorted(events[0]["event_id"].to_pylist())
    per_day = np.array([ev.num_rows for ev in parts])
    assert per_day.min() > 0.7 * per_day.mean() and per_day.max() < 1.3 * per_day.mean()  # late arrivals do not pile up
    assert list(source.events(WindowSpec.covering("weekly", windows[-1].end, windows[-1].end).windows()[0])) == []


def test_a_large_window_streams_in_bounded_batches(tmp_path):
    cfg = replace(SMALL, n_windows=1, events_per_window=1_000_000, batch_rows=50_000)
    src = SyntheticSource(cfg, tmp_path)
    window = WindowSpec.covering("weekly", *src.span()).windows()[0]
    baseline, peak, rows, sizes = pa.total_allocated_bytes(), 0, 0, []
    for batch in src.events(window):
        sizes.append(batch.table.num_rows)
        rows += batch.table.num_rows
        peak = max(peak, pa.total_allocated_bytes() - baseline)
        del batch
    assert rows == 1_000_000 and max(sizes) <= 50_000 and len(sizes) == 20
    assert peak < 32 * 2**20, peak  # one batch's worth of Arrow memory, not the window's
