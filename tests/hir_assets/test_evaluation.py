"""window_evaluation materialised with Dagster on the tiny store (tests/hir_model/eval/tiny.py) with HIR's artefacts
(a random-weight checkpoint: this tests the wiring, the files, the checks and the skip, not the quality)."""

from __future__ import annotations

import dagster as dg
import pytest
import torch

from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_assets.evaluation import CAUSAL_READS_CHECK, HIR_EVALUATED_CHECK, build_evaluation_assets
from hir_model.eval.publish import EVALUATION_ASSET, METRICS_FILE, STATE_FILE, read_evaluation
from hir_model.eval.pages import print_last_window, write_html_report
from hir_model.rank.head import HeadConfig
from tests.hir_model.eval.hir_store import KEYS, SPEC, hir_store, publish_head

torch.set_num_threads(1)


def run(store, key: str, **config):
    (asset,) = build_evaluation_assets(window_partitions(SPEC))
    source = SourceResource(source="parquet", window="weekly", data_dir=str(store.root), parquet_path=str(store.root))
    run_config = {"ops": {asset.op.name: {"config": config}}} if config else None
    return dg.materialize([asset], partition_key=key, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
                          resources={"storage": LocalPartitionStorage(root=str(store.root)), "source": source}, run_config=run_config)


def materialisation(result) -> dict | None:
    mats = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    return {k: v.value for k, v in mats[0].metadata.items()} if mats else None


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    store = hir_store(tmp_path_factory.mktemp("eval") / "store")
    return store, [run(store, key) for key in KEYS[:-1]]


def test_windows_with_a_successor_materialise_with_hir_beside_the_baselines(evaluated):
    store, (first, second) = evaluated
    for result in (first, second):
        assert result.success
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert checks[CAUSAL_READS_CHECK].passed and checks[HIR_EVALUATED_CHECK].passed
    meta = materialisation(first)
    assert "| deep_funnel | warm | known | hir_exact |" in meta["metrics"] and "| cold | known | lightgcn |" in meta["metrics"]
    assert meta["recall20_per_window"].startswith("![") and "data:image/png;base64," in meta["cold_vs_warm"]
    assert meta["warm_users"] == 2 and meta["cold_users"] == 1 and meta["hir"]["evaluated"]
    assert "hir_exact_score" in meta["downstream_lift"]
    assert "95% CI" in meta["comparisons"] and isinstance(meta["hir_exact_warm_deep_recall20"], float)
    assert str(meta["report"]).endswith("_reports/evaluation.html")
    ev, extras = read_evaluation(store, KEYS[0])
    assert ev.methods == ("hir_exact", "hir_embeddings", "ranker_base", "popularity", "item2item_recent", "content", "mf_als", "lightgcn") \
        and extras["hir"]["cold_users_encoded"] >= 1
    assert {p.name for p in store.files(EVALUATION_ASSET, KEYS[0])} == {f"{METRICS_FILE}.parquet", "summary.parquet", "users.parquet", STATE_FILE}
    # the audience slice is published beside the ranking slices, hir's row read back with its per-entity values
    audience = {(r.method, r.items, r.target): r for r in ev.results if r.users == "audience"}
    hir = audience[("hir", "known", "product")]
    assert hir.metrics.n_users == len(hir.user_ids) > 0 and set(hir.metrics.per_user) == {"recall@1pct", "auc"}
    assert {m for m, _, _ in audience} >= {"hir", "popularity", "item2item_recent", "content", "mf_als", "lightgcn"}
    # W1 warm-starts the stateful baselines from W0's saved state (strictly earlier), W0 from nothing
    assert materialisation(first)["warm_started_from"] == {}
    assert materialisation(second)["warm_started_from"] == {"mf_als": KEYS[0], "lightgcn": KEYS[0]}


def test_the_last_window_is_not_a_partition_to_judge(evaluated):
    """The newest window has no t+1: it is no partition of the evaluation (the UI never counts it missing), and the
    library still skips it with a message if asked."""
    from hir_model.eval.window_evaluation import evaluate_published_window

    store, _ = evaluated
    (asset,) = build_evaluation_assets(window_partitions(SPEC))
    assert asset.partitions_def.get_partition_keys() == KEYS[:-1] == window_partitions(SPEC).get_partition_keys()[:-1]
    with pytest.raises(dg.DagsterUnknownPartitionError, match=KEYS[-1]):
        run(store, KEYS[-1])
    skipped = evaluate_published_window(store, SPEC, KEYS[-1])
    assert "has no successor" in skipped.reason and not store.exists(EVALUATION_ASSET, KEYS[-1])


def test_a_missing_next_window_is_skipped_until_its_events_exist(tmp_path):
    store = hir_store(tmp_path / "store")
    import shutil

    shutil.rmtree(store.partition_dir("raw_events", KEYS[1]))
    result = run(store, KEYS[0])
    assert result.success and materialisation(result) is None
    (obs,) = [e.event_specific_data.asset_observation for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert f"raw_events of the next window {KEYS[1]} is not materialised" in obs.metadata["skipped"].value


def test_html_report_and_last_window_table(evaluated, tmp_path, capsys):
    store, _ = evaluated
    path = write_html_report(store, KEYS, tmp_path / "report.html")
    page = path.read_text()
    assert page.count("data:image/png;base64,") >= 3 and "hir" in page and KEYS[2] in page  # the skipped window is listed
    assert "Audiences: window t's audiences judged on t+1's conversions" in page
    last = print_last_window(store, KEYS, html=path)
    out = capsys.readouterr().out
    assert last == KEYS[1] and f"window {KEYS[1]}" in out and "| deep_funnel | warm | known | hir_exact |" in out and str(path) in out
    # the audience slice on one screen: a row per entity group, kind and metric, hir against each method with its CI
    audience = [line for line in out.splitlines() if line.startswith("| known ")]
    assert audience and all(line.count(" lead") + line.count(" tie") + line.count(" behind") + line.count(" n/a") >= 1
                            for line in audience), out
    assert len(out.splitlines()) < 150


def test_the_evaluation_job_runs_the_asset_alone_after_the_next_window_is_in(tmp_path):
    from dagster_project.jobs import EVALUATION_JOB, build_evaluation_job

    store = hir_store(tmp_path / "store")
    partitions = window_partitions(SPEC)
    source = SourceResource(source="parquet", window="weekly", data_dir=str(store.root), parquet_path=str(store.root))
    defs = dg.Definitions(assets=build_evaluation_assets(partitions), jobs=[build_evaluation_job(partitions)],
                          resources={"storage": LocalPartitionStorage(root=str(store.root)), "source": source})
    job = defs.resolve_job_def(EVALUATION_JOB)
    result = job.execute_in_process(partition_key=KEYS[0], instance=dg.DagsterInstance.ephemeral())
    assert result.success and read_evaluation(store, KEYS[0]) is not None


def test_the_leak_guard_fails_on_any_read_after_t_but_the_next_windows_events(evaluated):
    from dataclasses import replace

    from hir_assets.evaluation import check_results
    from hir_model.eval.window_evaluation import evaluate_published_window

    store, _ = evaluated
    outcome = evaluate_published_window(store, SPEC, KEYS[0])
    assert all(r.passed for r in check_results(outcome, KEYS[0]))
    leaked = replace(outcome, opened=outcome.opened + [("entity_embeddings", KEYS[1]), ("raw_events", KEYS[2])])
    guard = check_results(leaked, KEYS[0])[0]
    assert guard.check_name == CAUSAL_READS_CHECK and not guard.passed
    assert guard.metadata["future_reads"].value == [["entity_embeddings", KEYS[1]], ["raw_events", KEYS[2]]]


def test_hirs_metadata_reports_the_published_ranking_head(tmp_path):
    store = hir_store(tmp_path / "store", temp=0.1)
    on = run(store, KEYS[0])
    publish_head(store, KEYS[0], HeadConfig(prior_weight=0.0, recent_weight=0.0, kernel_weight=0.0))
    off = run(store, KEYS[0])
    assert on.success and off.success
    hir_on, hir_off = materialisation(on)["hir"], materialisation(off)["hir"]
    assert hir_on["prior_scale"] == pytest.approx(0.1) and hir_off["prior_scale"] == 0.0
    assert hir_on["head"]["config"]["recent_weight"] == 0.7 and hir_off["head"]["config"]["recent_weight"] == 0.0
    assert hir_on["rows"] == ["hir_exact", "hir_embeddings", "ranker_base"]  # no bom_index in this store: no served row
    assert "bom_index" in hir_on["served"]
    # this store's encoder reads no structural encodings: no structural readout, so no new users' prior either
    assert hir_on["head"]["structural_readout"] is False and hir_on["head"]["cold_prior"] is False
