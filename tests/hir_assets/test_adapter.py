"""objective_adapter materialised with Dagster on a tiny store: entity_embeddings and raw_events are written directly
(the upstream assets are tested elsewhere), so these tests cover the wiring, the skip paths and the files."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from dagster_project.jobs import ADAPTER_JOB, adapter_job
from hir_assets.adapter import LOSS_DECREASED_CHECK, build_adapter_assets
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage
from hir_model.adapter.fit import CONFIG_FILE, WEIGHTS_FILE, load_adapter
from hir_model.adapter.objective_adapter import ADAPTER_ASSET, METRICS_FILE, adapter_partition
from hir_model.data.tables import EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.embed import EMBEDDINGS_ASSET, EMBEDDINGS_FILE, embeddings_schema
from hir_model.storage import PartitionStore
from tests.conftest import W0, W1, events_table

KEYS = ["2024-01-07", "2024-01-14"]
USERS, PRODUCTS = [f"u{i}" for i in range(6)], [f"p{i}" for i in range(8)]
PARTITIONS = window_partitions(WindowSpec("weekly", W0, W1 + timedelta(weeks=1)))
RUN_CONFIG = {"ops": {ADAPTER_ASSET: {"config": {"steps": 20, "batch_size": 8}}}}


def embeddings(seed: int, cold: tuple[str, ...] = ()) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = USERS + PRODUCTS + ["a1"]
    types = ["user"] * len(USERS) + ["product"] * len(PRODUCTS) + ["advertiser"]
    x = rng.standard_normal((len(ids), 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return pa.table([pa.array(ids), pa.array(types), pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8),
                     pa.array([i in cold for i in ids])], schema=embeddings_schema(8))


@pytest.fixture
def store(tmp_path: Path) -> PartitionStore:
    """Window 1: u0-u5 click and purchase p0-p3; window 2: they purchase p4-p7 (new to them: the gain's targets)."""
    store = PartitionStore(tmp_path / "store")
    with store.writing() as staging:
        staging.write_table(EVENTS_ASSET, KEYS[0], EVENTS_FILE, events_table(W0, "a", USERS, PRODUCTS[:4]))
        staging.write_table(EVENTS_ASSET, KEYS[1], EVENTS_FILE, events_table(W1, "b", USERS, PRODUCTS[4:]))
        for i, key in enumerate(KEYS):
            staging.write_table(EMBEDDINGS_ASSET, key, EMBEDDINGS_FILE, embeddings(i))
    return store


def materialise(store: PartitionStore, window: str, objective: str) -> dg.ExecuteInProcessResult:
    return dg.materialize(build_adapter_assets(PARTITIONS), partition_key=dg.MultiPartitionKey({"window": window, "objective": objective}),
                          resources={"storage": LocalPartitionStorage(root=str(store.root))}, run_config=RUN_CONFIG,
                          instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def metadata(result: dg.ExecuteInProcessResult) -> dict:
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    return {k: v.value for k, v in mat.metadata.items()}


def test_adapter_materialises_with_its_gain_on_the_next_window(store):
    result = materialise(store, KEYS[0], "purchase")
    assert result.success
    md = metadata(result)
    assert md["status"] == "trained" and md["steps"] == 20 and md["pairs"] == 24 and md["events_used"] == 24
    assert md["eval_window"] == KEYS[1] and md["eval_users"] == len(USERS) and md["eval_targets"] == 24
    assert {"recall@20_base", "recall@20_adapted", "gain_ratio", "final_loss", "seconds"} <= set(md)
    assert md["recall@20_base"] == 1.0  # 8 products, K = 20: every target is in the top 20 (a wiring test, not quality)
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == LOSS_DECREASED_CHECK and "first_loss" in check.metadata
    part = adapter_partition(KEYS[0], "purchase")
    assert {p.name for p in store.files(ADAPTER_ASSET, part)} == {WEIGHTS_FILE, CONFIG_FILE, METRICS_FILE}
    assert load_adapter(store.partition_dir(ADAPTER_ASSET, part)).width == 8
    first = (store.partition_dir(ADAPTER_ASSET, part) / WEIGHTS_FILE).read_bytes()
    assert materialise(store, KEYS[0], "purchase").success  # a re-run replaces the partition with the same weights
    assert (store.partition_dir(ADAPTER_ASSET, part) / WEIGHTS_FILE).read_bytes() == first


def test_an_objective_without_events_is_a_clear_skip(store):
    result = materialise(store, KEYS[0], "add_to_cart")
    assert result.success
    md = metadata(result)
    assert md["status"] == "skipped" and md["skipped"].startswith("no add_to_cart events up to 2024-01-14")
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and "nothing trained" in check.description
    assert [p.name for p in store.files(ADAPTER_ASSET, adapter_partition(KEYS[0], "add_to_cart"))] == [METRICS_FILE]


def test_the_last_window_has_no_successor_and_training_reads_only_up_to_its_end(store):
    result = materialise(store, KEYS[1], "click")
    assert result.success
    md = metadata(result)
    assert md["gain_note"] == "no successor window" and "recall@20_base" not in md
    assert md["events_used"] == 48  # both windows' clicks: the history up to the window end


def test_missing_embeddings_fail_naming_the_asset(tmp_path):
    store = PartitionStore(tmp_path / "empty")
    result = materialise(store, KEYS[0], "click")
    assert not result.success
    assert "entity_embeddings for window 2024-01-07 was never materialised" in str(result.get_step_failure_events()[0].event_specific_data.error)


def test_adapter_job_sits_beside_a_window_job():
    """The window x objective partitions cannot share a job with window-partitioned assets: the window job leaves it out."""
    @dg.asset(name=EMBEDDINGS_ASSET, partitions_def=PARTITIONS)
    def entity_embeddings() -> None: ...

    window_job = dg.define_asset_job("hir_window", selection=dg.AssetSelection.all() - dg.AssetSelection.assets(ADAPTER_ASSET),
                                     partitions_def=PARTITIONS)
    defs = dg.Definitions(assets=[entity_embeddings, *build_adapter_assets(PARTITIONS)], jobs=[window_job, adapter_job()],
                          resources={"storage": LocalPartitionStorage(root="unused")})
    dg.Definitions.validate_loadable(defs)
    keys = defs.resolve_job_def(ADAPTER_JOB).partitions_def.get_partition_keys()
    assert len(keys) == 2 * 3 and dg.MultiPartitionKey({"window": KEYS[1], "objective": "purchase"}) in keys
