"""Arrivals stage: catalog_increment, one day's new items placed in the last closed window's space and published as a
small checked increment that `hir serve` appends without a restart (hir_model.rank.increment).

Partitioned by day, each day mapped onto the window closed before it starts (daily partitions, so an operator sees and
backfills increments per day like any partition); the arrival sensor (dagster_project.arrival_sensor) runs a day when
it begins, when a catalogue file touching it lands, and once more after it closes.
"""

from datetime import timedelta

import dagster as dg

from hir_assets.content_resources import ContentModels
from hir_assets.partitions import window_of
from hir_assets.publication import STEP_RETRY, audit, partitioned, publishes
from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.content import CLIP_ASSET, CONTENT_ASSET, CONTENT_FILE
from hir_model.data.windows import KEY_FORMAT, Window, WindowSpec, floor_to_window
from hir_model.embed import EMBEDDINGS_ASSET
from hir_model.graph.window import GRAPH_ASSET
from hir_model.protocol.split import to_us
from hir_model.rank.increment import (INCREMENT_ASSET, ITEMS_FILE, NEW_IDS_CHECK, UNIT_CHECK, WITHIN_DAY_CHECK, Increment,
                                      build_increment, increment_checks, manifests, read_increment, write_increment)
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET
from hir_model.train.checkpoint import ENCODER_ASSET

GROUP = "arrivals"
CONTENT_VERSION_CHECK = "increment_content_version"
WINDOW_ASSETS = (HEAD_ASSET, BOM_ASSET, EMBEDDINGS_ASSET, ENCODER_ASSET, CONTENT_ASSET, CLIP_ASSET,
                 GRAPH_ASSET)  # what a day reads of window t (the graph: the frozen encoder's artefacts load it)


def increment_partitions(spec: WindowSpec) -> dg.TimeWindowPartitionsDefinition:
    """One partition per day from the second window's start (the first has no closed window before it) to one window
    past the last (the days after the newest window, while it is the one served)."""
    return dg.TimeWindowPartitionsDefinition(start=spec.first_start + spec.length, end=spec.last_end + spec.length,
                                             cron_schedule="0 0 * * *", fmt=KEY_FORMAT, timezone="UTC")


def onto_window(spec: WindowSpec) -> dg.TimeWindowPartitionMapping:
    """Day d -> the window closed before d starts (Dagster shifts by days, the downstream's unit, then takes the window)."""
    days = spec.length // timedelta(days=1)
    return dg.TimeWindowPartitionMapping(start_offset=-days, end_offset=-days)


def window_before(spec: WindowSpec, day: Window) -> Window:
    """The window whose space day `day`'s items are placed in: the last one that ends by the day's start."""
    return spec.window((floor_to_window(day.start, spec.kind) - spec.length).strftime(KEY_FORMAT))


def increment_results(inc: Increment, window_items, width: int, others: dict, content_version: str | None
                      ) -> list[dg.AssetCheckResult]:
    """The increment's checks on what was staged: the blocking three (hir_model.rank.increment) and whether its content
    came from the encoders window t's content table did (warn: another version places items off the map's inputs)."""
    out = [dg.AssetCheckResult(asset_key=INCREMENT_ASSET, check_name=n, passed=bool(ok), description=d, metadata=m)
           for n, ok, d, m in increment_checks(inc, window_items, width, others)]
    same = not len(inc) or content_version is None or inc.content_version in ("", content_version)
    out.append(dg.AssetCheckResult(asset_key=INCREMENT_ASSET, check_name=CONTENT_VERSION_CHECK, passed=same,
                                   severity=dg.AssetCheckSeverity.WARN,
                                   description=f"increment content {inc.content_version or 'none'}; window {inc.window}'s "
                                               f"content table {content_version or 'none'}"))
    return out


def other_days(store, inc: Increment, window: Window) -> dict:
    """day -> item ids of window t's other published increments (what this day's ids must be new to)."""
    out = {}
    for day in manifests(store, inc.window, to_us(window.end)):
        if day != inc.day:
            out[day] = store.read(INCREMENT_ASSET, day, ITEMS_FILE, columns=["entity_id"])["entity_id"].to_pylist()
    return out


def build_increment_assets(spec: WindowSpec) -> list[dg.AssetsDefinition]:
    days = increment_partitions(spec)
    mapping = onto_window(spec)
    specs = [dg.AssetCheckSpec(name, asset=INCREMENT_ASSET, blocking=True, description=text) for name, text in (
        (UNIT_CHECK, "every vector is finite, unit norm and of the window's width"),
        (NEW_IDS_CHECK, "no id is an item of the window, an item of another day's increment of the window, or repeated"),
        (WITHIN_DAY_CHECK, "every item was first seen inside the day: nothing dated at or after the increment's end"))]
    specs.append(dg.AssetCheckSpec(CONTENT_VERSION_CHECK, asset=INCREMENT_ASSET, blocking=False,
                                   description="the items' content came from the encoders of the window's content table"))

    @dg.asset(name=INCREMENT_ASSET, partitions_def=days, group_name=GROUP, kinds={"parquet", "pytorch"},
              deps=[dg.AssetDep(a, partition_mapping=mapping) for a in WINDOW_ASSETS],
              check_specs=partitioned(specs, days), backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    @publishes
    def catalog_increment(context: dg.AssetExecutionContext, storage: PartitionStorage, source: SourceResource,
                          content: ContentModels) -> dg.MaterializeResult:
        """The items first seen on this day, embedded and placed in the last closed window's space: served at once."""
        day, store = window_of(context), storage.store()
        window = window_before(spec, day)
        build = build_increment(store, source.get(), window, day, content.content_config())
        inc = build.increment
        version = None
        if len(inc) and store.exists(CONTENT_ASSET, window.key, CONTENT_FILE):
            table = store.read(CONTENT_ASSET, window.key, CONTENT_FILE, columns=["encoder_version"])
            version = table["encoder_version"][0].as_py() if table.num_rows else None
        others = other_days(store, inc, window)
        with store.writing() as staging:  # judged on what was staged; committed only if the blocking checks pass
            folder = staging.path(INCREMENT_ASSET, day.key)
            write_increment(folder, inc)
            checks = audit(context, increment_results(read_increment(folder), build.window_items, build.width, others,
                                                      version))
        if build.known_skipped:
            context.log.warning(f"{len(build.known_skipped)} arrivals of {day.key} are items window {window.key} already "
                                f"ranks (not published again): {build.known_skipped[:5]}")
        context.log.info(f"{INCREMENT_ASSET} {day.key}: {len(inc)} items placed in window {window.key}'s space "
                         f"({inc.single_token} by the encoder's single token) in {build.seconds:.1f}s")
        return dg.MaterializeResult(check_results=checks, metadata={
            "dagster/row_count": len(inc), "window": window.key, "items": list(map(str, inc.item_ids[:20])),
            "with_content": int(inc.has_content.sum()), "single_token": inc.single_token, "arrivals": build.arrivals,
            "known_skipped": len(build.known_skipped), "catalog_rows": build.catalog_rows,
            "catalog_rejected": build.rejected_rows, "seconds": round(build.seconds, 2), "digest": inc.digest,
            "path": dg.MetadataValue.path(store.uri(INCREMENT_ASSET, day.key))})

    return [catalog_increment]
