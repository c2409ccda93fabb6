"""hir_encoder materialised with Dagster (through Pipes, and in process) on the bring-your-own fixture."""

from __future__ import annotations


import dagster as dg
import pytest
import torch

from hir_assets.events import build_ingest_assets
from hir_assets.graph import build_graph_assets
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_assets.training import COLLAPSE_CHECK, LOSS_CHECK, REPRODUCE_CHECK, build_training_assets, check_results
from hir_model.config import HIRConfig
from hir_model.train.checkpoint import CHECKPOINT_FILE, ENCODER_ASSET, load_trained_model

KEYS = ["2024-01-07", "2024-01-14"]


def training_job(byo, store):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(store),
                       data_dir=store.parent / "data")
    partitions = window_partitions(config.window_spec())
    defs = dg.Definitions(assets=build_ingest_assets(partitions) + build_graph_assets(partitions) + build_training_assets(partitions),
                          resources={"storage": LocalPartitionStorage(root=config.storage_uri),
                                     "source": SourceResource.from_config(config),
                                     "pipes_subprocess_client": dg.PipesSubprocessClient()})
    return defs.resolve_implicit_global_asset_job_def()


def test_two_windows_train_through_pipes_and_warm_start(byo, tmp_path):
    job = training_job(byo, tmp_path / "store")
    instance = dg.DagsterInstance.ephemeral()
    run_config = {"ops": {ENCODER_ASSET: {"config": {"steps": 4, "threads": 1, "levels": "2,4"}}}}
    for key in KEYS:
        # 8 nodes and 4 steps are too few for the loss / collapse checks to be meaningful: they run, they need not pass
        result = job.execute_in_process(partition_key=key, instance=instance, run_config=run_config, raise_on_error=False)
        checks = {e.check_name: e for e in result.get_asset_check_evaluations() if e.asset_key.to_user_string() == ENCODER_ASSET}
        assert checks[REPRODUCE_CHECK].passed and {LOSS_CHECK, COLLAPSE_CHECK} <= set(checks)
        (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
                  if e.asset_key.to_user_string() == ENCODER_ASSET]
        meta = {k: v.value for k, v in mat.metadata.items()}
        assert meta["steps"] == 4 and meta["attention_backend"] == "dense" and "loss_curve" in meta and "final_loss" in meta
    assert meta["warm_started_from"] == KEYS[0] and meta["total_steps"] == 8
    model = load_trained_model(tmp_path / "store" / ENCODER_ASSET / KEYS[1] / CHECKPOINT_FILE)
    assert model.window == KEYS[1] and model.step == 8


def test_checks_fail_on_rising_loss_collapse_and_drift():
    bad = check_results({"losses": [1.0, 2.0], "usage_entropy": [0.9, 0.01]}, probe_error=1.0)
    assert not any(r.passed for r in bad)
    good = check_results({"losses": [2.0, 1.0], "usage_entropy": [0.9, 0.8]}, probe_error=0.0)
    assert all(r.passed for r in good)


def test_loss_check_uses_held_out_batches_and_lets_a_warm_plateau_pass():
    def loss_passed(**metrics):
        return next(r for r in check_results({"losses": [6.0, 6.1], "usage_entropy": [0.9], **metrics}, 0.0)
                    if r.check_name == LOSS_CHECK).passed

    # the step losses rose, but the held-out loss fell: the held-out measurement decides
    assert loss_passed(held_out_start=6.0, held_out_final=5.8)
    assert not loss_passed(held_out_start=5.888, held_out_final=5.933)  # a fresh model must improve
    assert loss_passed(held_out_start=5.888, held_out_final=5.933, warm_started=True)  # +0.8%: a plateau
    assert not loss_passed(held_out_start=5.0, held_out_final=5.5, warm_started=True)  # +10%: worse
    assert not loss_passed(held_out_start=5.0, held_out_final=float("nan"), losses=[6.0, float("nan")], warm_started=True)


def test_in_process_launch_trains_the_same_weights_as_pipes(byo, tmp_path):
    """launch="in_process" calls the same entry point in the step's process: the same checkpoint bit for bit."""
    states, metadata = {}, {}
    for launch in ("pipes", "in_process"):
        job = training_job(byo, tmp_path / launch)
        run_config = {"ops": {ENCODER_ASSET: {"config": {"steps": 3, "levels": "2,4", "launch": launch,
                                                          "threads": torch.get_num_threads()}}}}
        result = job.execute_in_process(partition_key=KEYS[0], instance=dg.DagsterInstance.ephemeral(), run_config=run_config,
                                        raise_on_error=False)
        (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
                  if e.asset_key.to_user_string() == ENCODER_ASSET]
        metadata[launch] = {k: v.value for k, v in mat.metadata.items()}
        model = load_trained_model(tmp_path / launch / ENCODER_ASSET / KEYS[0] / CHECKPOINT_FILE)
        states[launch] = model.encoder.state_dict() | {f"prototypes.{i}": p for i, p in enumerate(model.prototypes)}
    assert metadata["in_process"]["launch"] == "in_process" and metadata["pipes"]["launch"] == "pipes"
    assert metadata["in_process"]["version"] == metadata["pipes"]["version"]
    assert set(metadata["pipes"]) == set(metadata["in_process"])  # the same metadata keys, Pipes' included
    assert states["pipes"].keys() == states["in_process"].keys()
    assert all(torch.equal(states["pipes"][k], states["in_process"][k]) for k in states["pipes"])


@pytest.mark.parametrize("launch, nproc", [("subprocess", 1), ("in_process", 2)])
def test_a_launch_that_cannot_run_is_refused_before_training(byo, tmp_path, launch, nproc):
    job = training_job(byo, tmp_path / "store")
    run_config = {"ops": {ENCODER_ASSET: {"config": {"steps": 1, "launch": launch, "nproc_per_node": nproc}}}}
    result = job.execute_in_process(partition_key=KEYS[0], instance=dg.DagsterInstance.ephemeral(), run_config=run_config,
                                    raise_on_error=False)
    (failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.event_specific_data.error.message
    assert f"launch={launch!r}" in message and "launch is one of ('pipes', 'in_process')" in message
    assert not (tmp_path / "store" / ENCODER_ASSET / KEYS[0]).exists()
