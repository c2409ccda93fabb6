"""Audience stage: `audiences`, every advertiser's and campaign's top users and primitives per window, the table ad systems
ingest (hir_model.rank.audience_export), published only when its blocking checks pass."""

from typing import Optional

import dagster as dg

from hir_assets.overrides import Overrides
from hir_assets.partitions import window_of
from hir_assets.publication import STEP_RETRY, Gate, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.config import load_config
from hir_model.data.tables import CATALOG_ASSET
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.rank.audience import Audiences, audience_config
from hir_model.rank.audience_export import AUDIENCES_ASSET, export_audiences, export_checks, write_export
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET

GROUP = "audiences"
CHECKS = (("audience_per_active_advertiser", "every advertiser with a served item has an audience, or a recorded refusal "
                                             "below the floor"),
          ("audience_scores_finite", "every exported user's score is finite"),
          ("audience_sizes_recorded", "every exported segment records its size, at least its exported users"),
          ("audience_min_size", "no exported segment is smaller than the floor (min_audience, default 100 users): an "
                                "audience never singles out a person"))


class AudiencesRun(Overrides):
    """The export's knobs; AudienceConfig fields (hir_model.rank.audience) over hir.toml's [audience]."""

    k: int = 1000  # users exported per entity
    products: bool = False  # every product and service too, not only advertisers and campaigns
    min_audience: Optional[int] = None  # the floor; unset: hir.toml's [audience], else the library's default


def export_results(export) -> list[dg.AssetCheckResult]:
    return [dg.AssetCheckResult(asset_key=AUDIENCES_ASSET, check_name=n, passed=bool(ok), description=d, metadata=m)
            for n, ok, d, m in export_checks(export)]


def build_audience_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    specs = [dg.AssetCheckSpec(name, asset=AUDIENCES_ASSET, blocking=True, description=text) for name, text in CHECKS]

    @dg.asset(name=AUDIENCES_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"},
              check_specs=partitioned(specs, partitions), backfill_policy=dg.BackfillPolicy.multi_run(1),
              retry_policy=STEP_RETRY, deps=[HEAD_ASSET, BOM_ASSET, HIERARCHY_ASSET, CATALOG_ASSET])
    @publishes
    def audiences(context: dg.AssetExecutionContext, config: AudiencesRun, storage: PartitionStorage) -> dg.MaterializeResult:
        """Every advertiser's and campaign's users most likely to convert, and its primitives, for ad systems to ingest."""
        window, store = window_of(context), storage.store()
        settings = config.apply(audience_config(load_config().audience))
        built = Audiences.load(store, window.key, config=settings, increments=False)
        export = export_audiences(built, config.k, config.products)
        gate = Gate(context, export_results)
        with store.writing() as staging:
            write_export(staging, export)
            gate(export)
        seg = export.segments
        return dg.MaterializeResult(check_results=gate.results, metadata={
            "dagster/row_count": export.members.num_rows, "segments": seg.num_rows,
            "refused": seg.num_rows - int(sum(1 for x in seg.column("exported").to_pylist() if x)),
            "active_advertisers": len(export.active), "floor": export.floor, "k": config.k, "seconds": round(export.seconds, 2),
            "users": len(built.user_ids), "path": dg.MetadataValue.path(store.uri(AUDIENCES_ASSET, window.key))})

    return [audiences]
