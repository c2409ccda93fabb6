"""The engagement_graph asset, materialised with Dagster on the bring-your-own fixture, window after window."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from hir_assets.events import build_ingest_assets
from hir_assets.graph import (NO_FUTURE_EDGES_CHECK, NODE_COUNT_CHECK, NODES_TYPED_CHECK, WEIGHTS_CHECK, build_graph_assets,
                              check_results)
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_model.config import HIRConfig
from hir_model.graph.audit import audit_graph
from hir_model.graph.storage import load_graph
from hir_model.graph.types import EDGE_TYPES
from hir_model.graph.window import GRAPH_ASSET, to_us
from hir_model.storage import PartitionStore
from tests.conftest import W1

KEYS = ["2024-01-07", "2024-01-14"]


def job(byo: Path, tmp_path: Path) -> dg.JobDefinition:
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store"),
                       data_dir=tmp_path / "data")
    partitions = window_partitions(config.window_spec())
    defs = dg.Definitions(assets=build_ingest_assets(partitions) + build_graph_assets(partitions),
                          resources={"storage": LocalPartitionStorage(root=config.storage_uri),
                                     "source": SourceResource.from_config(config)})
    return defs.resolve_implicit_global_asset_job_def()


def run(job_def: dg.JobDefinition, key: str, instance: dg.DagsterInstance, selection=None) -> dg.ExecuteInProcessResult:
    return job_def.execute_in_process(partition_key=key, instance=instance, raise_on_error=False,
                                      asset_selection=[dg.AssetKey(a) for a in selection] if selection else None)


def graph_metadata(result: dg.ExecuteInProcessResult) -> dict:
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
              if e.asset_key.to_user_string() == GRAPH_ASSET]
    return {k: v.value for k, v in mat.metadata.items()}


def test_both_windows_materialise_in_order_and_pass_checks(byo, tmp_path):
    instance, job_def = dg.DagsterInstance.ephemeral(), job(byo, tmp_path)
    results = [run(job_def, key, instance) for key in KEYS]
    assert all(r.success for r in results)
    for r in results:
        evaluations = {e.check_name: e for e in r.get_asset_check_evaluations() if e.asset_key.to_user_string() == GRAPH_ASSET}
        assert set(evaluations) == {NO_FUTURE_EDGES_CHECK, WEIGHTS_CHECK, NODES_TYPED_CHECK, NODE_COUNT_CHECK}
        assert all(e.passed for e in evaluations.values()), {k: e.description for k, e in evaluations.items() if not e.passed}
    first, second = (graph_metadata(r) for r in results)
    # window 1: u1, u2 x p1, p2 x (impression, click, purchase), both directions; p1, p2, c1 -> a1 and back; c1 promotes p1 and back
    assert first["nodes_by_type"] == {"user": 2, "advertiser": 1, "product": 2, "campaign": 1}
    assert first["edges_by_type"] == {t: 4 for t in ("impression", "click", "purchase", "impression_rev", "click_rev", "purchase_rev")} | {
        "parent": 3, "child": 3, "relation": 1, "relation_rev": 1}
    assert first["previous_partition"].startswith("none") and second["previous_partition"] == KEYS[0]
    assert second["nodes"] == 8 and second["new_nodes"] == 2 and second["excluded"] == 0  # u3, p3 arrive in window 2
    assert second["edges_by_type"]["click"] == 4 and second["edges_by_type"]["parent"] == 4  # same pairs again: weights add
    assert {"density", "degree", "build_seconds", "excluded_by_reason"} <= set(second)
    store = PartitionStore(tmp_path / "store")
    g0, g1 = (load_graph(store.partition_dir(GRAPH_ASSET, k)) for k in KEYS)
    assert g1.nodes.entity_id.slice(0, len(g0.nodes)).equals(g0.nodes.entity_id)  # stable node indices
    assert g1.as_of_us == to_us(W1 + timedelta(weeks=1))  # window 2 ends 2024-01-21
    click = EDGE_TYPES.index("click")
    assert np.all(g1.weight[g1.edge_type == click] > g0.weight[g0.edge_type == click] * np.exp(-7 / 30) * 0.999)


def test_second_window_without_the_first_fails_and_names_it(byo, tmp_path):
    instance, job_def = dg.DagsterInstance.ephemeral(), job(byo, tmp_path)
    assert run(job_def, KEYS[1], instance, ["entity_catalog", "raw_events"]).success
    result = run(job_def, KEYS[1], instance, [GRAPH_ASSET])
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert f"materialise {GRAPH_ASSET} for {KEYS[0]} first" in str(failure.event_specific_data.error)


def test_rerun_replaces_the_partition(byo, tmp_path):
    instance, job_def = dg.DagsterInstance.ephemeral(), job(byo, tmp_path)
    assert run(job_def, KEYS[0], instance).success
    folder = PartitionStore(tmp_path / "store").partition_dir(GRAPH_ASSET, KEYS[0])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert run(job_def, KEYS[0], instance, [GRAPH_ASSET]).success
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.fixture
def built_graph(byo, tmp_path):
    instance, job_def = dg.DagsterInstance.ephemeral(), job(byo, tmp_path)
    assert run(job_def, KEYS[0], instance).success
    return load_graph(PartitionStore(tmp_path / "store").partition_dir(GRAPH_ASSET, KEYS[0]), mmap=False)


def test_leak_guard_fails_on_a_future_edge(built_graph):
    end = built_graph.as_of_us
    assert all(r.passed for r in check_results(audit_graph(built_graph, end), KEYS[0]))
    built_graph.last_ts[3] = end  # an event at the window end belongs to the next window
    results = {r.check_name: r for r in check_results(audit_graph(built_graph, end), KEYS[0])}
    leak = results[NO_FUTURE_EDGES_CHECK]
    assert not leak.passed and leak.severity == dg.AssetCheckSeverity.ERROR and leak.metadata["future_edges"].value == 1
    assert results[WEIGHTS_CHECK].passed


def test_bad_weights_and_types_fail_their_checks(built_graph):
    built_graph.weight[0], built_graph.weight[1] = np.nan, 0.0
    built_graph.nodes.node_type[0] = 99
    results = {r.check_name: r for r in check_results(audit_graph(built_graph, built_graph.as_of_us), KEYS[0])}
    assert not results[WEIGHTS_CHECK].passed and results[WEIGHTS_CHECK].metadata["bad_weights"].value == 2
    assert not results[NODES_TYPED_CHECK].passed


def test_leaked_input_rows_fail_the_blocking_leak_guard(byo, tmp_path):
    """A published events file with a row after its window (a broken upstream writer) blocks the graph."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    instance = dg.DagsterInstance.ephemeral()
    job_def = job(byo, tmp_path)
    assert run(job_def, KEYS[0], instance, ["entity_catalog", "raw_events"]).success
    path = tmp_path / "store" / "raw_events" / KEYS[0] / "events.parquet"
    events = pq.read_table(path)
    late = events.slice(0, 1).set_column(5, events.schema.field(5), pa.array([W1 + timedelta(days=1)], events.schema.field(5).type))
    pq.write_table(pa.concat_tables([events, late.set_column(0, events.schema.field(0), pa.array(["leak"]))]), path)
    result = run(job_def, KEYS[0], instance, [GRAPH_ASSET])
    leak = next(e for e in result.get_asset_check_evaluations() if e.check_name == NO_FUTURE_EDGES_CHECK)
    assert not leak.passed and leak.metadata["input_rows_after_end"].value == 1
