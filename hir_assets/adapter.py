"""Objective adapters: per (window, objective), a small adapter on the frozen encoder's embeddings, and its gain.

`objective_adapter` is partitioned by window x objective, so it cannot share a job with the window-partitioned
assets: it runs in its own job (dagster_project.jobs), after `entity_embeddings` of the window. Its lineage names the
window's own `entity_embeddings` and `raw_events`; it also reads `raw_events` of the earlier windows (training
history up to the window end, like the graph) and of window t+1 (the gain only, never training). Those two reads
are not declared as dependencies: the earlier windows are already upstream of the window's embeddings through the
cumulative graph, and declaring t+1 would mark every adapter stale when the next window's events arrive, and the
last window would wait for a window that does not exist.
"""

from typing import Optional

import dagster as dg

from hir_assets.overrides import Overrides
from hir_assets.publication import STEP_RETRY, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.adapter.fit import OBJECTIVES, AdapterConfig
from hir_model.adapter.objective_adapter import ADAPTER_ASSET, adapt_window, write_adapter
from hir_model.data.tables import EVENTS_ASSET
from hir_model.data.windows import Window, utc
from hir_model.embed import EMBEDDINGS_ASSET

GROUP = "training"
LOSS_DECREASED_CHECK = "adapter_loss_decreased"
SAME_WINDOW = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="window")


class ObjectiveAdapterRun(Overrides):
    """Overrides of AdapterConfig (hir_model.adapter.fit)."""

    rank: Optional[int] = None  # rank of each side's low-rank residual map
    steps: Optional[int] = None  # optimizer steps
    batch_size: Optional[int] = None  # pairs per step (the batch's other items are the negatives)
    lr: Optional[float] = None
    seed: Optional[int] = None

    def adapter_config(self, base: AdapterConfig = AdapterConfig()) -> AdapterConfig:
        return self.apply(base)


def adapter_partitions(window_partitions: dg.TimeWindowPartitionsDefinition) -> dg.MultiPartitionsDefinition:
    return dg.MultiPartitionsDefinition({"window": window_partitions, "objective": dg.StaticPartitionsDefinition(list(OBJECTIVES))})


def _window(partitions: dg.TimeWindowPartitionsDefinition, key: str | None) -> Window | None:
    if key is None:
        return None
    tw = partitions.time_window_for_partition_key(key)
    return Window(key, utc(tw.start), utc(tw.end))


def build_adapter_assets(window_partitions: dg.TimeWindowPartitionsDefinition) -> list[dg.AssetsDefinition]:
    partitions = adapter_partitions(window_partitions)

    @dg.asset(name=ADAPTER_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"pytorch"}, backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY,
              pool="gpu", deps=[dg.AssetDep(EMBEDDINGS_ASSET, partition_mapping=SAME_WINDOW), dg.AssetDep(EVENTS_ASSET, partition_mapping=SAME_WINDOW)],
              check_specs=partitioned([dg.AssetCheckSpec(LOSS_DECREASED_CHECK, asset=ADAPTER_ASSET, blocking=False,
                                                         description="the adapter's loss is finite and its last steps average "
                                                                     "below its first")], partitions))
    @publishes
    def objective_adapter(context: dg.AssetExecutionContext, config: ObjectiveAdapterRun,
                          storage: PartitionStorage) -> dg.MaterializeResult:
        """A low-rank adapter on the frozen encoder's embeddings for one objective; its Recall@20 gain on window t+1."""
        keys = context.partition_key.keys_by_dimension
        window, objective, store = _window(window_partitions, keys["window"]), keys["objective"], storage.store()
        next_window = _window(window_partitions, window_partitions.get_next_partition_key(window.key))
        run = adapt_window(store, window, next_window, objective, config.adapter_config())
        with store.writing() as staging:
            part = write_adapter(staging, run)
        m = run.metrics()
        metadata = {"status": m["status"], "objective_events": run.objective_events, "events_used": run.events_used,
                    "seconds": round(run.seconds, 3), "path": dg.MetadataValue.path(store.uri(ADAPTER_ASSET, part))}
        if run.skipped:
            context.log.info(f"{ADAPTER_ASSET} {window.key} x {objective}: skipped, {run.skipped}")
            check = dg.AssetCheckResult(check_name=LOSS_DECREASED_CHECK, passed=True, description=f"nothing trained: {run.skipped}",
                                        metadata={"skipped": True})
            return dg.MaterializeResult(metadata=metadata | {"skipped": run.skipped}, check_results=[check])
        metadata |= {"steps": m["steps"], "pairs": m["pairs"], "first_loss": m["first_loss"], "final_loss": m["final_loss"],
                     "fit_seconds": m["fit_seconds"], "gain_note": run.gain_note or "none"}
        gain = run.gain
        if gain is not None and gain.users:
            metadata |= {f"recall@{gain.k}_base": gain.recall_base, f"recall@{gain.k}_adapted": gain.recall_adapted,
                         f"recall@{gain.k}_popularity": gain.recall_popularity, "gain_ratio": gain.ratio,
                         f"ndcg@{gain.k}_base": gain.ndcg_base, f"ndcg@{gain.k}_adapted": gain.ndcg_adapted,
                         "eval_users": gain.users, "eval_targets": gain.targets, "eval_window": run.successor}
        ok, first, last = run.fit.loss_decreased()
        check = dg.AssetCheckResult(check_name=LOSS_DECREASED_CHECK, passed=ok, severity=dg.AssetCheckSeverity.WARN,
                                    description=f"mean loss {first:.4f} over the first steps, {last:.4f} over the last",
                                    metadata={"first_loss": dg.MetadataValue.float(float(first)),
                                              "last_loss": dg.MetadataValue.float(float(last)),
                                              "loss_change": dg.MetadataValue.float(float(last - first))})
        context.log.info(f"{ADAPTER_ASSET} {window.key} x {objective}: {run.fit.pairs} pairs, loss {first:.3f} -> {last:.3f}; "
                         + (run.gain_note or f"recall@{gain.k} {gain.recall_base:.4f} -> {gain.recall_adapted:.4f}"))
        return dg.MaterializeResult(metadata=metadata, check_results=[check])

    return [objective_adapter]
