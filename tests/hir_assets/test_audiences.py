"""The `audiences` asset materialised with Dagster over the tiny store with its head, hierarchy and index (test_serve's
`full_store`): every advertiser and campaign exported with its primitives, the served audience's users and scores, the
floor refusing segments (recorded, never exported), and a broken export failing its blocking checks."""

from __future__ import annotations

import dataclasses

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest
import torch

from hir_assets.audiences import build_audience_assets
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage
from hir_model.rank.audience import AudienceConfig, Audiences
from hir_model.rank.audience_export import (AUDIENCES_ASSET, MEMBERS_FILE, PRIMITIVES_FILE, SEGMENTS_FILE,
                                            export_audiences, export_checks)
from hir_model.storage import PartitionStore
from tests.hir_model.eval.hir_store import KEYS, SPEC
from tests.hir_model.rank.test_serve import full_store  # noqa: F401  (the fixture: W0 and W1 with bom_index)

torch.set_num_threads(1)
NEW = KEYS[1]


def _materialise(root, floor: int, tmp_path, monkeypatch):
    (tmp_path / "hir.toml").write_text("[audience]\nmin_audience = 1000\n")  # the run config's floor wins over it
    monkeypatch.setenv("HIR_CONFIG", str(tmp_path / "hir.toml"))
    (asset,) = build_audience_assets(window_partitions(SPEC))
    return dg.materialize([asset], partition_key=NEW, resources={"storage": LocalPartitionStorage(root=str(root))},
                          run_config={"ops": {AUDIENCES_ASSET: {"config": {"min_audience": floor, "k": 10}}}},
                          instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def test_every_advertiser_and_campaign_is_exported_as_the_served_audience(full_store, tmp_path, monkeypatch):  # noqa: F811
    result = _materialise(full_store, 2, tmp_path, monkeypatch)
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 4 and all(c.passed for c in checks)
    store = PartitionStore(full_store)
    segments = store.read(AUDIENCES_ASSET, NEW, SEGMENTS_FILE).to_pylist()
    assert {s["entity_id"]: s["entity_type"] for s in segments} == {"a1": "advertiser", "a2": "advertiser"}
    members = store.read(AUDIENCES_ASSET, NEW, MEMBERS_FILE).to_pandas()
    expected = Audiences.load(store, NEW, config=AudienceConfig(min_audience=2), increments=False)
    for s in segments:
        a = expected.audience(s["entity_id"], k=10)
        mine = members[members.entity_id == s["entity_id"]].sort_values("rank")
        assert list(mine.user_id) == list(a.user_ids) and s["size"] == a.size >= 2 and s["refused"] is None
        np.testing.assert_allclose(mine.score, a.scores, rtol=1e-6)
    primitives = store.read(AUDIENCES_ASSET, NEW, PRIMITIVES_FILE).to_pylist()
    assert {(p["entity_id"], p["level"]) for p in primitives} == {(e, lv) for e in ("a1", "a2") for lv in (0, 1)}


def test_below_the_floor_a_segment_is_recorded_with_its_reason_and_never_exported(full_store, tmp_path, monkeypatch):  # noqa: F811
    # in W1 u1 and u3 converted with both advertisers' products: 2 users qualify for each, below a floor of 3
    result = _materialise(full_store, 3, tmp_path, monkeypatch)
    assert result.success and all(c.passed for c in result.get_asset_check_evaluations())
    store = PartitionStore(full_store)
    segments = store.read(AUDIENCES_ASSET, NEW, SEGMENTS_FILE).to_pylist()
    assert all(s["exported"] == 0 and "below the minimum of 3" in s["refused"] for s in segments)
    assert store.read(AUDIENCES_ASSET, NEW, MEMBERS_FILE).num_rows == 0


def test_a_segment_below_the_floor_or_a_missing_advertiser_fails_the_checks(full_store):  # noqa: F811
    export = export_audiences(Audiences.load(PartitionStore(full_store), NEW, config=AudienceConfig(min_audience=2),
                                             increments=False), k=10)
    assert all(ok for _, ok, _, _ in export_checks(export))
    small = dataclasses.replace(export, floor=5)  # the same segments judged against a higher floor
    failed = {name for name, ok, _, _ in export_checks(small) if not ok}
    assert failed == {"audience_min_size"}
    seg = export.segments
    dropped = dataclasses.replace(export, segments=seg.filter(pa.array([e != "a1" for e in seg["entity_id"].to_pylist()])))
    assert {name for name, ok, _, _ in export_checks(dropped) if not ok} == {"audience_per_active_advertiser"}
    nan = dataclasses.replace(export, members=export.members.set_column(
        5, "score", pa.array(np.full(export.members.num_rows, np.nan, np.float32))))
    assert {name for name, ok, _, _ in export_checks(nan) if not ok} == {"audience_scores_finite"}


@pytest.mark.parametrize("floor", [0])
def test_the_floor_is_at_least_one(floor):
    with pytest.raises(ValueError):
        AudienceConfig(min_audience=floor)
