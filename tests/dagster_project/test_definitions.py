"""The Definitions load from the project's config, and the Dagster CLI materialises one partition reproducibly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_default_definitions_load_with_movielens_windows():
    from dagster_project.definitions import defs

    dg.Definitions.validate_loadable(defs)
    job = defs.resolve_job_def("hir_window")
    keys = job.partitions_def.get_partition_keys()
    assert (keys[0], keys[-1], len(keys)) == ("1997-09-14", "1998-04-19", 32)  # no empty tail up to today
    assets = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"raw_events", "rejected_events", "entity_catalog"} <= assets


def test_hir_model_never_imports_dagster():
    code = ("import importlib, pkgutil, sys, hir_model, data_contracts\n"
            "for m in pkgutil.walk_packages(hir_model.__path__, 'hir_model.'): importlib.import_module(m.name)\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'dagster'], 'dagster imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.slow
def test_dg_launch_materialises_one_partition_and_reruns_identically(byo, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "HIR_SOURCE": "parquet", "HIR_PARQUET_PATH": str(byo),
           "HIR_STORAGE_URI": str(tmp_path / "store"), "HIR_WINDOW": "weekly"}
    dg_cli = Path(sys.executable).with_name("dg")

    def launch(asset: str) -> None:
        proc = subprocess.run([str(dg_cli), "launch", "--assets", asset, "--partition", "2024-01-07"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    launch("entity_catalog")
    launch("raw_events")
    folder = tmp_path / "store" / "raw_events" / "2024-01-07"
    first = {p.name: p.read_bytes() for p in folder.iterdir()}
    launch("raw_events")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == first and "events.parquet" in first
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 3 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert {r.tags.get("dagster/partition") for r in runs} == {"2024-01-07"}


def test_schedule_targets_the_window_that_just_closed(byo, tmp_path):
    from dagster_project.definitions import build_definitions
    from hir_model.config import HIRConfig

    defs = build_definitions(HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path)))
    schedule = defs.resolve_schedule_def("hir_newest_window")
    assert schedule.cron_schedule == "0 0 * * 0" and schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    from datetime import datetime, timezone

    context = dg.build_schedule_context(scheduled_execution_time=datetime(2024, 1, 21, tzinfo=timezone.utc))
    requests = list(schedule.evaluate_tick(context).run_requests)
    assert [r.partition_key for r in requests] == ["2024-01-14"]  # the window [01-14, 01-21) closed at the tick


def test_the_local_instance_runs_one_training_step_at_a_time_and_retries_dead_runs(byo, tmp_path):
    import shutil

    from dagster_project.definitions import GPU_ASSETS, OWNER, build_definitions
    from hir_model.config import HIRConfig

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.local.yaml", home / "dagster.yaml")  # what the Makefile installs
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert (instance.run_retries_enabled, instance.run_retries_max_retries) == (True, 1)
        assert not instance.run_retries_retry_on_asset_or_op_failure  # step failures are the step retry policy's
    defs = build_definitions(HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "s")))
    graph = defs.resolve_asset_graph()
    pools = {k.to_user_string(): graph.get(k).pools for k in graph.get_all_asset_keys()}
    assert {a for a, p in pools.items() if p == {"gpu"}} == set(GPU_ASSETS)
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert OWNER in node.owners and node.tags["hir/source"] == "parquet" and node.tags["hir/stage"] == node.group_name
    retry = defs.resolve_job_def("hir_window").op_retry_policy
    assert retry is not None and retry.max_retries == 2


def test_every_asset_step_retries_transient_faults_whatever_launched_it(byo, tmp_path):
    """The asset page and a backfill launch the implicit asset job, not hir_window: its steps carry the same retry policy."""
    from dagster._core.definitions.dependency import NodeHandle  # not re-exported by dagster

    from dagster_project.definitions import build_definitions
    from dagster_project.jobs import WINDOW_JOB
    from hir_assets.publication import STEP_RETRY
    from hir_model.config import HIRConfig

    defs = build_definitions(HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store")))
    window_job = defs.resolve_job_def(WINDOW_JOB)
    for asset in defs.assets:
        if not asset.partitions_def:  # the report: one page over every window, rebuilt at the demo's end
            continue
        job = defs.resolve_implicit_job_def_def_for_assets([next(iter(asset.keys))])
        assert job.get_retry_policy_for_handle(NodeHandle(asset.node_def.name, None)) == STEP_RETRY, asset.node_def.name
        if job is not window_job and asset.node_def.name in window_job.graph.node_dict:
            assert window_job.get_retry_policy_for_handle(NodeHandle(asset.node_def.name, None)) == STEP_RETRY
