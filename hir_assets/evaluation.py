"""Evaluation stage: window_evaluation (window t's artefacts judged on window t+1's events, beside the baselines).

Window t is evaluated once window t+1's `raw_events` are published. Until then the asset is skipped: the run
succeeds, the partition stays unmaterialised, and an observation on the asset (and a warning in the run log) says
why. So window t's own run skips it; the evaluation job (window_evaluation alone, dagster_project.jobs) evaluates t
once t+1 is in, e.g. right after t+1's run, or as a second pass over the windows.
"""


import base64
import math
from dataclasses import replace
from datetime import datetime, timezone
from typing import Optional

import dagster as dg
import pyarrow.parquet as pq

from hir_assets.overrides import Overrides
from hir_assets.partitions import window_of
from hir_assets.publication import STEP_RETRY, audit, partitioned, publishes
from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.content import CONTENT_ASSET
from hir_model.data.tables import CATALOG_ASSET, EVENTS_ASSET
from hir_model.data.windows import CRON, WindowSpec
from hir_model.embed import EMBEDDINGS_ASSET
from hir_model.config import load_config
from hir_model.eval.agreement import agreement_markdown
from hir_model.eval.audience import AudienceEvalConfig
from hir_model.eval.publish import EVALUATION_ASSET, collect, write_evaluation
from hir_model.eval.pages import comparison_table, report_path, user_band
from hir_model.eval.report import lift_table, markdown_table, plot_cold_vs_warm, plot_per_window, timing_table
from hir_model.eval.window_evaluation import WindowEvalConfig, WindowOutcome, evaluate_published_window, future_reads
from hir_model.graph.window import GRAPH_ASSET
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.rank.audience import audience_config
from hir_model.rank.increment import INCREMENT_ASSET
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET
from hir_model.train.checkpoint import ENCODER_ASSET

GROUP = "evaluation"
CAUSAL_READS_CHECK = "reads_only_t_and_next_events"
HIR_EVALUATED_CHECK = "hir_evaluated"
THIS_AND_NEXT = dg.TimeWindowPartitionMapping(start_offset=0, end_offset=1, allow_nonexistent_upstream_partitions=True)
PREVIOUS = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)
NEXT_DAYS = dg.TimeWindowPartitionMapping(start_offset=1, end_offset=1, allow_nonexistent_upstream_partitions=True)  # t+1's days
USER_SLICES = (("warm", "known"), ("cold", "known"))  # the per-window plot in the metadata: warm and cold users
DESCRIPTION = ("Window t's artefacts on window t+1's events: HIR as served (BoM + ranking head), the head over every item "
               "and the published embeddings alone, beside the baselines; warm and cold users apart; skipped until t+1's "
               "events exist.")


class WindowEvaluationRun(Overrides):
    """Overrides of WindowEvalConfig (hir_model.eval.window_evaluation)."""

    warm_start: Optional[bool] = None  # LightGCN and ALS start from the latest earlier window's saved state
    increments: Optional[bool] = None  # the served row answers new items from window t's published increments
    arrival_cadence: Optional[str] = None  # when an increment's item became servable: "arrival" or "day_end"
    arrival_lag_s: Optional[float] = None  # seconds from a catalogue file landing to the item served

    def eval_config(self, base: WindowEvalConfig = WindowEvalConfig()) -> WindowEvalConfig:
        return self.apply(base)


def served_audiences(config: WindowEvalConfig) -> WindowEvalConfig:
    """`config` with the audience slice scored as `hir serve` and the `audiences` asset score (hir.toml's [audience])."""
    audience = AudienceEvalConfig(audience=audience_config(load_config().audience))
    return replace(config, eval=replace(config.eval, audience=audience))


def spec_of(partitions: dg.TimeWindowPartitionsDefinition) -> WindowSpec:
    """The window spec behind the partitions (the windows the source covers today)."""
    kind = {cron: k for k, cron in CRON.items()}[partitions.cron_schedule]
    utc = lambda ts: datetime.fromtimestamp(ts.timestamp(), timezone.utc)  # noqa: E731
    return WindowSpec(kind, utc(partitions.start), utc(partitions.end))


def png_markdown(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def planted_truth(source: SourceResource):
    """The synthetic source's planted interests (entities.parquet beside its data), None for other sources."""
    if source.source != "synthetic":
        return None
    path = source.get().data_dir / "ground_truth" / "entities.parquet"
    return pq.read_table(path) if path.is_file() else None


def metadata(outcome: WindowOutcome, history: list, store, key: str, rows: int) -> dict:
    ev = outcome.evaluation
    c = ev.counts
    meta = {
        "next_window": ev.next_window,
        "metrics": dg.MetadataValue.md(markdown_table([ev])),
        "recall20_per_window": dg.MetadataValue.md(png_markdown(plot_per_window(history, slices=USER_SLICES, dpi=72,
                                                                                band=user_band),
                                                                "deep-funnel Recall@20 per window")),
        "comparisons": dg.MetadataValue.md(comparison_table(history)),
        "report": dg.MetadataValue.path(str(report_path(store.root))),
        "cold_vs_warm": dg.MetadataValue.md(png_markdown(plot_cold_vs_warm([ev]), "cold vs warm")),
        "downstream_lift": dg.MetadataValue.md(lift_table([ev])),
        "cost": dg.MetadataValue.md(timing_table([ev])),
        "warm_users": c.warm_users, "cold_users": c.cold_users, "cold_users_too_few": c.cold_users_too_few,
        "known_items": c.known_items, "new_items": c.new_items, "train_events": c.train_events,
        "next_engagements": c.next_engagements, "content_source": ev.content_source,
        "hir": dg.MetadataValue.json(outcome.hir.as_dict()),
        **{f"{m}_warm_deep_recall20": float(v) for m in ("hir", "hir_exact", "hir_embeddings", "ranker_base")
           if not math.isnan(v := ev.value(m, "warm", "known", "deep_funnel", "recall@20"))},
        "warm_started_from": dg.MetadataValue.json(outcome.warm_started_from),
        "dagster/row_count": rows,
        "path": dg.MetadataValue.path(store.uri(EVALUATION_ASSET, key)),
    }
    if outcome.agreement:
        meta["planted_agreement"] = dg.MetadataValue.md(agreement_markdown(outcome.agreement))
    if ev.lift is not None and ev.lift.extended is not None:
        meta["downstream_auc_lift"] = round(ev.lift.auc_lift, 4)
    return meta


def check_results(outcome: WindowOutcome, key: str, next_end: str | None = None) -> list[dg.AssetCheckResult]:
    """The leak guard (what was opened after window t; `next_end`: the key of the window after t+1, up to which t's
    increments may be read) and whether HIR made it into the table."""
    ev, hir = outcome.evaluation, outcome.hir
    leaks = future_reads(outcome.opened, key, ev.next_window, next_end)
    return [
        dg.AssetCheckResult(check_name=CAUSAL_READS_CHECK, passed=not leaks,
                            description=f"{len(outcome.opened)} partitions read; after {key}: "
                                        f"{sorted({p for _, p in outcome.opened if p > key}) or 'none'}",
                            metadata={"future_reads": dg.MetadataValue.json([list(x) for x in leaks]),
                                      "future_read_count": len(leaks), "partitions_read": len(outcome.opened)}),
        dg.AssetCheckResult(check_name=HIR_EVALUATED_CHECK, passed=hir.evaluated, severity=dg.AssetCheckSeverity.WARN,
                            description=hir.reason or f"HIR scored {ev.counts.warm_users} warm and {ev.counts.cold_users} cold users"),
    ]


def judged_partitions(partitions: dg.TimeWindowPartitionsDefinition) -> dg.TimeWindowPartitionsDefinition:
    """The windows that can be judged: every window but the last, which has no t+1 yet (so the UI never counts it as
    missing); all of them while there is only one."""
    keys = partitions.get_partition_keys()
    if len(keys) < 2:
        return partitions
    return dg.TimeWindowPartitionsDefinition(start=partitions.start, end=partitions.time_window_for_partition_key(keys[-1]).start,
                                             cron_schedule=partitions.cron_schedule, fmt=partitions.fmt,
                                             timezone=partitions.timezone)


def build_evaluation_assets(partitions: dg.TimeWindowPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """`partitions`: the windows (the asset's own are the judged ones, `judged_partitions`)."""
    spec_at_load = spec_of(partitions)
    partitions = judged_partitions(partitions)

    spec = dg.AssetSpec(
        EVALUATION_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"}, description=DESCRIPTION,
        deps=[dg.AssetDep(EVENTS_ASSET, partition_mapping=THIS_AND_NEXT), dg.AssetDep(CATALOG_ASSET, partition_mapping=THIS_AND_NEXT),
              dg.AssetDep(CONTENT_ASSET, partition_mapping=THIS_AND_NEXT), ENCODER_ASSET, EMBEDDINGS_ASSET, GRAPH_ASSET,
              HIERARCHY_ASSET, HEAD_ASSET, BOM_ASSET, dg.AssetDep(EVALUATION_ASSET, partition_mapping=PREVIOUS),
              dg.AssetDep(INCREMENT_ASSET, partition_mapping=NEXT_DAYS)])
    checks = partitioned([
        dg.AssetCheckSpec(CAUSAL_READS_CHECK, asset=EVALUATION_ASSET, blocking=True,
                          description="leak guard: nothing after window t was opened but window t+1's events, catalogue "
                                      "and content rows (the protocol's test events and cold-start item side data)"),
        dg.AssetCheckSpec(HIR_EVALUATED_CHECK, asset=EVALUATION_ASSET,
                          description="HIR's artefacts of window t were there and HIR is in the table")], partitions)

    # a multi_asset that can subset: its output and checks are optional, so a window without a successor yields nothing
    @dg.multi_asset(name=EVALUATION_ASSET, specs=[spec], check_specs=checks, partitions_def=partitions, can_subset=True,
                    backfill_policy=dg.BackfillPolicy.multi_run(1),  # in order: window t warm-starts baselines from t-1
                    retry_policy=STEP_RETRY)
    @publishes
    def window_evaluation(context: dg.AssetExecutionContext, config: WindowEvaluationRun, storage: PartitionStorage,
                          source: SourceResource):
        """Evaluate window t on window t+1's events, or skip (with an observation saying why) until they exist."""
        window, store = window_of(context), storage.store()
        outcome = evaluate_published_window(store, spec_at_load, window.key, served_audiences(config.eval_config()),
                                            planted_truth(source))
        if not isinstance(outcome, WindowOutcome):
            context.log.warning(outcome.reason)
            yield dg.AssetObservation(asset_key=EVALUATION_ASSET, partition=window.key, metadata={"skipped": outcome.reason})
            return
        ev = outcome.evaluation
        with store.writing() as staging:  # a window that read the future is never published
            table = write_evaluation(staging, window.key, ev, outcome.extras, outcome.methods)
            next_end = spec_at_load.window(ev.next_window).end.strftime("%Y-%m-%d")
            checks = audit(context, check_results(outcome, window.key, next_end))
        earlier = [k for k in store.partitions(EVALUATION_ASSET) if k <= window.key]
        history = collect(store, earlier)
        context.log.info(f"evaluated {window.key} on {ev.next_window}: {ev.counts.warm_users} warm, {ev.counts.cold_users} cold users; "
                         + ", ".join(f"{t.method} {t.fit_s + t.score_s:.1f}s" for t in ev.timings))
        yield dg.MaterializeResult(metadata=metadata(outcome, history, store, window.key, table.num_rows),
                                   check_results=checks)

    return [window_evaluation]
