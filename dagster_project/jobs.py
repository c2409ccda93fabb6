"""Every job of the project: the window job (every per-window asset of one window, what the schedule runs) and the
three assets that run apart from it, each in a job of its own."""

from __future__ import annotations

import dagster as dg

from hir_assets.evaluation import judged_partitions
from hir_assets.publication import STEP_RETRY
from hir_assets.report import REPORT_ASSET
from hir_model.adapter.objective_adapter import ADAPTER_ASSET
from hir_model.eval.publish import EVALUATION_ASSET
from hir_model.rank.increment import INCREMENT_ASSET

WINDOW_JOB, EVALUATION_JOB = "hir_window", "window_evaluation_job"
ADAPTER_JOB, REPORT_JOB = "objective_adapters", "evaluation_report_job"
INCREMENT_JOB = "catalog_increment_job"

# Not in the window job: window_evaluation (window t is judged on t+1's events, which arrive with the next run),
# objective_adapter (partitioned by window x objective), evaluation_report (one page over all windows, not
# partitioned) and catalog_increment (partitioned by day); each has a job of its own.
SEPARATE_ASSETS = (EVALUATION_ASSET, ADAPTER_ASSET, REPORT_ASSET, INCREMENT_ASSET)


def build_window_job(partitions: dg.PartitionsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """Every per-window HIR asset for one window, in dependency order; transient failures (an S3 blip) are retried."""
    return dg.define_asset_job(
        WINDOW_JOB, selection=dg.AssetSelection.all() - dg.AssetSelection.assets(*SEPARATE_ASSETS), partitions_def=partitions,
        op_retry_policy=STEP_RETRY,
        description="All HIR assets for one window, in dependency order.")


def build_evaluation_job(partitions: dg.TimeWindowPartitionsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """window_evaluation alone, one partition per run: what a second pass over the windows runs (window t's run
    cannot evaluate t, since t+1's events come later)."""
    return dg.define_asset_job(EVALUATION_JOB, selection=[EVALUATION_ASSET], partitions_def=judged_partitions(partitions),
                               description="evaluate window t on window t+1's events (after t+1 is ingested)")


def build_increment_job(days: dg.PartitionsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """catalog_increment alone, one day per run: what the arrival sensor launches (and a backfill of days). One step,
    run in the run's own process: a second process importing the definitions would double a landing's latency."""
    return dg.define_asset_job(INCREMENT_JOB, selection=[INCREMENT_ASSET], partitions_def=days, executor_def=dg.in_process_executor,
                               description="One day's new items placed in the last closed window's space and published "
                                           "as an increment that hir serve appends without a restart.")


def adapter_job() -> dg.UnresolvedAssetJobDefinition:
    """objective_adapter alone: its window x objective partitions keep it out of the window-partitioned jobs."""
    return dg.define_asset_job(ADAPTER_JOB, selection=dg.AssetSelection.assets(ADAPTER_ASSET),
                               description="One objective's adapter on one window's embeddings (after entity_embeddings).")


def report_job() -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(REPORT_JOB, selection=[REPORT_ASSET],
                               description="Write the source's evaluation report over every evaluated window.")
