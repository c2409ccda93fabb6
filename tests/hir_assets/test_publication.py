"""Write, audit, publish, for every asset with a blocking check: a planted failure leaves the partition's files byte
for byte, fails the run and the partition in Dagster, records each evaluation on its window (also in a run launched
over a one-window range, as backfills launch them), and raises one alert naming asset, check, window and run URL; a
running `hir serve` keeps the window it had until a window passes its checks.

The pipeline is the real one (every asset of `build_definitions` on the bring-your-own fixture, two windows, an
on-disk instance); each plant corrupts what one asset stages (a NaN vector, an unassigned entity, a perturbed
checkpoint, a leaked row, a read of the future) or sets the check's own threshold out of reach.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import dagster as dg
import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.jobs import EVALUATION_JOB, INCREMENT_JOB, WINDOW_JOB
from dagster_project.notify import AlertLogNotifier
from dagster_project.sensors import CHECK_FAILED
from hir_assets import audiences, enrichment, evaluation, events, hierarchy, increments, index, training
from hir_model.config import HIRConfig
from hir_model.data.tables import ENTITIES_FILE, EVENTS_FILE
from hir_model.storage import Staging
from tests.conftest import W1, write_byo
from tests.dagster_project.instances import write_home
from tests.hir_model.rank.test_serve import server

KEYS = ["2024-01-07", "2024-01-14"]
DAY = "2024-01-16"  # a day of W1 whose increment is placed in W0's space: p3 ("Green hat") arrives on it
RANGE = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
RUN_CONFIG = {"ops": {"hir_encoder": {"config": {"launch": "in_process", "steps": 4}},
                      "bom_index": {"config": {"max_posting_share": 1.0}}}}  # 3 items: a 5% cap would keep 1 per token

pytestmark = pytest.mark.slow  # two real windows (~25 s), then one single-asset run per case


@dataclasses.dataclass
class Pipeline:
    root: Path
    byo: Path
    store: Path
    home: Path
    defs: dg.Definitions
    instance: dg.DagsterInstance


def definitions(byo: Path, store: Path) -> dg.Definitions:
    return build_definitions(HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(store),
                                       data_dir=store.parent / "data"))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("publication")
    byo, store = write_byo(root / "byo"), root / "store"
    home = write_home(root / "home", "run_sharded_sqlite")
    defs = definitions(byo, store)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        window_job = defs.resolve_job_def(WINDOW_JOB)
        for key in KEYS:
            assert window_job.execute_in_process(partition_key=key, instance=instance, run_config=RUN_CONFIG).success
        assert defs.resolve_job_def(EVALUATION_JOB).execute_in_process(partition_key=KEYS[0], instance=instance).success
        assert defs.resolve_job_def(INCREMENT_JOB).execute_in_process(partition_key=DAY, instance=instance).success
        yield Pipeline(root, byo, store, home, defs, instance)


def digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` and its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def nan_first_row(values: np.ndarray) -> np.ndarray:
    out = np.array(values, dtype=np.float32, copy=True)
    out[0] = np.nan
    return out


def wrap(monkeypatch, module, name: str, after):
    """Replace module.name by a call of the real function whose result goes through `after(result, *args)`."""
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: after(real(*args, **kwargs), *args))


# Each plant is a context manager: it corrupts what one asset stages (or reaches for its threshold), yields the run
# config the run needs, and undoes what it changed outside the run.

def duplicate_first_row(path: Path) -> None:
    """A writer bug: the table's first row twice (its unique-id contract check fails)."""
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), path)


def duplicate_staged_row(monkeypatch, builder: str, asset: str, file: str) -> None:
    """`events.<builder>` duplicates the first row of what it staged as `asset`'s `file`."""
    def after(built, source, window, *rest):
        staging = next(a for a in rest if isinstance(a, Staging))
        duplicate_first_row(staging.file(asset, window.key, file))
        return built
    wrap(monkeypatch, events, builder, after)


@contextmanager
def duplicate_staged_catalog_row(monkeypatch, p):
    duplicate_staged_row(monkeypatch, "build_catalog", events.CATALOG_ASSET, ENTITIES_FILE)
    yield {}


@contextmanager
def duplicate_staged_event(monkeypatch, p):
    duplicate_staged_row(monkeypatch, "build_events", events.EVENTS_ASSET, EVENTS_FILE)
    yield {}


@contextmanager
def leaked_event_row(monkeypatch, p):
    """A published events file with a row after its window (a broken upstream writer): the graph's leak guard."""
    path = p.store / "raw_events" / KEYS[1] / "events.parquet"
    original = path.read_bytes()
    table = pq.read_table(path)
    ts = table.schema.get_field_index("ts")
    late = table.slice(0, 1).set_column(ts, table.schema.field(ts), pa.array([W1 + timedelta(weeks=1)], table.schema.field(ts).type))
    pq.write_table(pa.concat_tables([table, late.set_column(0, table.schema.field(0), pa.array(["leak"]))]), path)
    try:
        yield {}
    finally:
        path.write_bytes(original)


@contextmanager
def nan_content_vector(monkeypatch, p):
    def after(build, *args):
        table = build.table
        i = table.schema.get_field_index("embedding")
        column = table.column(i).combine_chunks()
        rows = column.to_pylist()
        first = next(j for j, v in enumerate(rows) if v is not None)
        rows[first] = [float("nan")] * len(rows[first])
        return dataclasses.replace(build, table=table.set_column(i, table.schema.field(i), pa.array(rows, column.type)))
    wrap(monkeypatch, enrichment, "embed_window", after)
    yield {}


@contextmanager
def perturbed_checkpoint(monkeypatch, p):
    import torch

    real = training.reproduces_probe

    def perturb_then_probe(checkpoint, *args):  # the saved weights no longer give the logged probe embeddings
        payload = torch.load(checkpoint, weights_only=True)
        payload["model"] = {k: v + 1.0 if v.is_floating_point() else v for k, v in payload["model"].items()}
        torch.save(payload, checkpoint)
        return real(checkpoint, *args)
    monkeypatch.setattr(training, "reproduces_probe", perturb_then_probe)
    yield {"ops": {"hir_encoder": RUN_CONFIG["ops"]["hir_encoder"]}}


@contextmanager
def nan_entity_vector(monkeypatch, p):
    def after(build, *args):
        emb = dataclasses.replace(build.embeddings, vectors=nan_first_row(build.embeddings.vectors))
        return dataclasses.replace(build, embeddings=emb)
    wrap(monkeypatch, hierarchy, "embed_window", after)
    yield {}


@contextmanager
def unassigned_entity(monkeypatch, p):
    def after(h, *args):
        h.levels[0].weight[0, :] = 0.0  # the first entity has no primitive at level 0
        return h
    wrap(monkeypatch, hierarchy, "hierarchy_window", after)
    yield {}


@contextmanager
def nan_item_prior(monkeypatch, p):
    def after(state, *args):
        return dataclasses.replace(state, log_prior=nan_first_row(state.log_prior))
    wrap(monkeypatch, index, "build_head_state", after)
    yield {}


RECALL_OUT_OF_REACH = {"ops": {"bom_index": {"config": {"max_posting_share": 1.0, "recall_threshold": 1.01}}}}


@contextmanager
def recall_out_of_reach(monkeypatch, p):
    yield RECALL_OUT_OF_REACH


@contextmanager
def read_of_the_future(monkeypatch, p):
    def after(outcome, store, spec, key, *args):
        if isinstance(outcome, evaluation.WindowOutcome):
            outcome.opened.append((training.ENCODER_ASSET, outcome.evaluation.next_window))  # t+1's encoder: a leak
        return outcome
    wrap(monkeypatch, evaluation, "evaluate_published_window", after)
    yield {}


@contextmanager
def item_after_the_day(monkeypatch, p):
    """A writer bug: the staged increment gains a row first seen an hour after the day's end."""
    real = increments.write_increment

    def write(folder, inc):
        real(folder, inc)
        items = pq.read_table(Path(folder) / "items.parquet")
        ts = items.schema.get_field_index("first_seen_ts")
        late = items.slice(0, 1).set_column(ts, items.schema.field(ts), pa.array([W1 + timedelta(days=3, hours=1)],
                                                                                 items.schema.field(ts).type))
        late = late.set_column(0, items.schema.field(0), pa.array(["late"], pa.string()))
        pq.write_table(pa.concat_tables([items, late]), Path(folder) / "items.parquet")
    monkeypatch.setattr(increments, "write_increment", write)
    yield {}


@contextmanager
def nan_audience_score(monkeypatch, p):
    """A scoring bug: the first exported user's score is NaN (products exported, down to one user: there is one)."""
    def after(export, *args):
        scores = export.members.column("score").to_numpy().copy()
        scores[0] = np.nan
        i = export.members.schema.get_field_index("score")
        return dataclasses.replace(export, members=export.members.set_column(i, "score", pa.array(scores, pa.float32())))
    wrap(monkeypatch, audiences, "export_audiences", after)
    yield {"ops": {"audiences": {"config": {"min_audience": 1, "k": 10, "products": True}}}}


CASES = [  # asset, the check the plant fails, the window (or day) re-run, the plant
    ("entity_catalog", "unique_entity_id", KEYS[1], duplicate_staged_catalog_row),
    ("raw_events", "unique_event_id", KEYS[1], duplicate_staged_event),
    ("engagement_graph", "no_future_edges", KEYS[1], leaked_event_row),
    ("content_embeddings", "finite", KEYS[1], nan_content_vector),
    ("hir_encoder", "checkpoint_reproduces_probe", KEYS[1], perturbed_checkpoint),
    ("entity_embeddings", "embeddings_finite_unit_norm", KEYS[1], nan_entity_vector),
    ("interest_hierarchy", "every_entity_assigned", KEYS[1], unassigned_entity),
    ("ranking_head", "head_finite", KEYS[1], nan_item_prior),
    ("bom_index", "bom_recall_at_100", KEYS[1], recall_out_of_reach),
    ("window_evaluation", "reads_only_t_and_next_events", KEYS[0], read_of_the_future),
    ("catalog_increment", "increment_within_day", DAY, item_after_the_day),
    ("audiences", "audience_scores_finite", KEYS[1], nan_audience_score),
]
JOBS = {"window_evaluation": EVALUATION_JOB, "catalog_increment": INCREMENT_JOB}  # assets outside the window job


def test_every_blocking_check_is_planted(tmp_path):
    """The cases cover every asset that has a blocking check (a new one must get a case)."""
    defs = definitions(write_byo(tmp_path / "byo"), tmp_path / "store")
    blocking = {spec.asset_key.to_user_string() for a in defs.assets for spec in a.check_specs if spec.blocking}
    assert blocking == {asset for asset, *_ in CASES}


def tick(p: Pipeline, cursor: str | None, log: Path) -> str:
    sensor = p.defs.resolve_sensor_def("hir_alerts")
    context = dg.build_sensor_context(instance=p.instance, cursor=cursor, resources={"notifier": AlertLogNotifier(path=str(log))})
    sensor(context)
    return context.cursor


@pytest.mark.parametrize("asset,check,key,plant", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("launch", ["partition", "range"])
def test_a_failed_blocking_check_publishes_nothing(pipeline, monkeypatch, tmp_path, asset, check, key, plant, launch):
    p = pipeline
    log = tmp_path / "alerts.jsonl"
    cursor = tick(p, None, log)  # alerting starts now
    before, folder = digest(p.store / asset / key), p.store / asset
    with plant(monkeypatch, p) as run_config:
        job = p.defs.resolve_job_def(JOBS.get(asset, WINDOW_JOB))
        job = job.get_subset(asset_selection={dg.AssetKey(asset)})
        where = {"partition_key": key} if launch == "partition" else {"tags": dict.fromkeys(RANGE, key)}
        result = job.execute_in_process(instance=p.instance, raise_on_error=False, run_config=run_config, **where)
    # nothing under the partition changed, nothing staged is left behind
    assert digest(p.store / asset / key) == before and before
    assert not [x.name for x in folder.iterdir() if x.name.startswith((".staging", ".trash"))]
    # the run failed, because its blocking check withheld the window (not retried)
    assert not result.success
    failures = [e for e in result.all_events if e.is_step_failure]
    assert [e.event_specific_data.error.cls_name for e in failures] == ["PublicationBlocked"]
    assert "PublicationBlocked" in CHECK_FAILED
    assert not result.get_asset_materialization_events()
    # every evaluation belongs to the window; the planted one failed
    evaluations = result.get_asset_check_evaluations()
    assert evaluations and {e.partition for e in evaluations} == {key}
    assert [e.check_name for e in evaluations if not e.passed] == [check]
    # Dagster shows the partition failed, and the check failed on that window
    graph = p.defs.resolve_asset_graph()
    partitions_def = graph.get(dg.AssetKey(asset)).partitions_def
    status = p.instance.get_status_by_partition(dg.AssetKey(asset), [key], partitions_def)
    assert status[key] == dg.AssetPartitionStatus.FAILED
    record = p.instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey(asset), check), limit=1)[0]
    assert record.run_id == result.run_id and record.partition == key and record.status.value == "FAILED"
    # one alert, naming asset, check, window and run
    tick(p, cursor, log)
    alerts = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(alerts) == 1, alerts
    alert = alerts[0]
    assert (alert["asset"], alert["check"], alert["partition"], alert["run_id"]) == (asset, check, key, result.run_id)
    assert alert["run_url"].endswith(f"/runs/{result.run_id}") and f"checkDetail={check}" in alert["check_url"]
    assert key in alert["title"]


def test_hir_serve_keeps_its_window_until_one_passes(pipeline, tmp_path):
    """W1's bom_index fails its recall check: no W1 index appears and `hir serve` stays on W0; the same window passing
    its checks is then switched to."""
    store = tmp_path / "store"
    shutil.copytree(pipeline.store, store)
    shutil.rmtree(store / "bom_index" / KEYS[1])  # W1 has everything but its index: W0 is the newest servable window
    defs = definitions(pipeline.byo, store)
    job = defs.resolve_job_def(WINDOW_JOB).get_subset(asset_selection={dg.AssetKey("bom_index")})
    with dg.DagsterInstance.ephemeral() as instance, server(store, tmp_path / "serve.log", "--poll-seconds", "0.2") as (_, url):
        assert httpx.get(f"{url}/health").json()["window"] == KEYS[0]
        failed = job.execute_in_process(partition_key=KEYS[1], instance=instance, raise_on_error=False,
                                        run_config=RECALL_OUT_OF_REACH)
        assert not failed.success and not (store / "bom_index" / KEYS[1]).exists()
        time.sleep(1.5)  # several polls
        assert httpx.get(f"{url}/health").json()["window"] == KEYS[0]
        passing = {"ops": {"bom_index": RUN_CONFIG["ops"]["bom_index"]}}
        assert job.execute_in_process(partition_key=KEYS[1], instance=instance, run_config=passing).success
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{url}/health").json())["window"] != KEYS[1]:
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
    assert health["switches"] == 1
