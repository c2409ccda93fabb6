"""Hierarchy stage: entity_embeddings (every entity in one metric space) and interest_hierarchy (primitives,
assignments with stable ids, super-graph, labels)."""

from dataclasses import replace
from typing import Optional

import dagster as dg
import numpy as np

from hir_assets.overrides import Overrides
from hir_assets.partitions import window_of
from hir_assets.publication import Gate, STEP_RETRY, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.content import CONTENT_ASSET
from hir_model.data.tables import CATALOG_ASSET
from hir_model.embed import EMBEDDINGS_ASSET, EMBEDDINGS_FILE, EmbedConfig, embed_defaults, embeddings_table
from hir_model.data.windows import Window
from hir_model.embed.entity_embeddings import EmbeddingsBuild, embed_window, unit_norm_error
from hir_model.graph.window import GRAPH_ASSET, to_us
from hir_model.hierarchy import ASSIGNMENTS_FILE, HIERARCHY_ASSET, PRIMITIVES_FILE, SUPER_GRAPH_FILE, Hierarchy, HierarchyConfig
from hir_model.hierarchy.interest_hierarchy import hierarchy_window
from hir_model.train.checkpoint import ENCODER_ASSET

GROUP = "hierarchy"
FINITE_UNIT_CHECK = "embeddings_finite_unit_norm"
COLD_START_CHECK = "cold_start_present"
ASSIGNED_CHECK = "every_entity_assigned"
NORM_TOLERANCE = 1e-3
PREVIOUS = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


class EntityEmbeddingsRun(Overrides):
    """Overrides of EmbedConfig (hir_model.embed)."""

    batch_size: Optional[int] = None  # seeds per forward pass (in the checkpoint's teacher view)
    users: Optional[str] = None  # warm users' view: "broad" (the teacher's) or "narrow" (the student's); hir.toml [embed]
    new_items: Optional[str] = None  # cold-start products: "content_map" (their content's place) or "encoder" (single token)

    def embed_config(self, base: EmbedConfig = EmbedConfig()) -> EmbedConfig:
        """`base` (hir.toml's [embed] over EmbedConfig's defaults) with the fields this run sets."""
        return self.apply(base)


class InterestHierarchyRun(Overrides):
    """Overrides of HierarchyConfig and its AssignConfig (hir_model.hierarchy)."""

    temperature: Optional[float] = None  # softmax temperature over the cosine similarity to each primitive (its centroid)
    top_k: Optional[int] = None  # primitives kept per entity per level
    min_similarity: Optional[float] = None  # a prototype keeps its predecessor's id only when at least this similar
    centroid_steps: Optional[int] = None  # k-means steps from each primitive's prototype to its members' centroid (0: none)
    reseed_dead: Optional[bool] = None  # a primitive nearest to nobody is re-seeded among the worst-fitted entities

    def hierarchy_config(self, base: HierarchyConfig = HierarchyConfig()) -> HierarchyConfig:
        return replace(self.apply(base), assign=self.apply(base.assign))


def _result(asset: str, name: str, passed: bool, description: str, **metadata) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(asset_key=asset, check_name=name, passed=bool(passed), description=description, metadata=metadata)


def previous_hierarchy(store, key: str) -> str | None:
    """The latest partition before `key` holding an interest_hierarchy (t-1 unless t-1 was never run)."""
    earlier = [p for p in store.partitions(HIERARCHY_ASSET) if p < key and store.exists(HIERARCHY_ASSET, p, PRIMITIVES_FILE)]
    return earlier[-1] if earlier else None


def publish_embeddings(store, window: Window, config: EmbedConfig, gate=None) -> EmbeddingsBuild:
    """Window `window`'s entity_embeddings, computed and published; `gate(build)` judges it before the commit and raises
    to discard it."""
    build = embed_window(store, window.key, to_us(window.end), config)
    with store.writing() as staging:
        staging.write_table(EMBEDDINGS_ASSET, window.key, EMBEDDINGS_FILE, embeddings_table(build.embeddings))
        if gate:
            gate(build)
    return build


def publish_hierarchy(store, window: Window, config: HierarchyConfig, gate=None) -> tuple[Hierarchy, str | None]:
    """Window `window`'s interest_hierarchy, its ids matched to the previous one's, computed and published (`gate(h)`
    judges it before the commit); and the previous partition (None: fresh ids)."""
    prev_key = previous_hierarchy(store, window.key)
    h = hierarchy_window(store, window.key, prev_key, to_us(window.end), config)
    with store.writing() as staging:
        for name, file in (("assignments", ASSIGNMENTS_FILE), ("primitives", PRIMITIVES_FILE), ("super_graph", SUPER_GRAPH_FILE)):
            staging.write_table(HIERARCHY_ASSET, window.key, file, h.tables[name])
        if gate:
            gate(h)
    return h, prev_key


def embeddings_checks(build: EmbeddingsBuild) -> list[dg.AssetCheckResult]:
    emb = build.embeddings
    bad, norm_err = unit_norm_error(emb)
    return [
        _result(EMBEDDINGS_ASSET, FINITE_UNIT_CHECK, bad == 0 and norm_err <= NORM_TOLERANCE,
                f"{bad} non-finite rows; max |norm - 1| = {norm_err:.2e}", nonfinite=int(bad),
                max_norm_error=dg.MetadataValue.float(float(norm_err))),
        _result(EMBEDDINGS_ASSET, COLD_START_CHECK, not build.missing,
                f"{int(emb.cold_start.sum())} cold-start rows; {len(build.missing)} of {build.expected} catalogue entities "
                f"without a row: {build.missing or 'none'}", cold_start=int(emb.cold_start.sum()), expected=build.expected,
                missing=len(build.missing), rows=len(emb)),
    ]


def hierarchy_checks(h: Hierarchy, config: HierarchyConfig) -> list[dg.AssetCheckResult]:
    n = len(h.levels[0].primitive) if h.levels else 0
    complete = all(len(a.primitive) == n and (a.weight > 0).all() for a in h.levels)
    assigned = min((float((a.weight > 0).all(axis=-1).mean()) if len(a.primitive) == n and n else 0.0 for a in h.levels),
                   default=0.0)  # the worst level's share of entities with all top-k weights > 0
    return [_result(HIERARCHY_ASSET, ASSIGNED_CHECK, complete and n > 0,
                    f"{n} entities x {len(h.levels)} levels, top-{config.assign.top_k} each", entities=n, levels=len(h.levels),
                    assigned_share=dg.MetadataValue.float(assigned),
                    **{f"primitives_used_L{i}": int((a.sizes() > 0).sum()) for i, a in enumerate(h.levels)})]


def build_hierarchy_assets(partitions: dg.PartitionsDefinition, embed_overrides: dict | None = None) -> list[dg.AssetsDefinition]:
    """`embed_overrides`: EmbedConfig fields from hir.toml's [embed] (and [embed.<source>]); the run config's win."""
    embed_base = embed_defaults(embed_overrides)  # a bad field fails when the definitions load, naming it

    @dg.asset(name=EMBEDDINGS_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"pytorch", "parquet"},
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY, deps=[ENCODER_ASSET, GRAPH_ASSET, CONTENT_ASSET, CATALOG_ASSET], check_specs=partitioned([
                  dg.AssetCheckSpec(FINITE_UNIT_CHECK, asset=EMBEDDINGS_ASSET, blocking=True,
                                    description="every embedding is finite with unit L2 norm"),
                  dg.AssetCheckSpec(COLD_START_CHECK, asset=EMBEDDINGS_ASSET, blocking=True,
                                    description="every user, product, advertiser and campaign of the catalogue has a row, "
                                                "cold-start ones (no edge yet) included")], partitions))
    @publishes
    def entity_embeddings(context: dg.AssetExecutionContext, config: EntityEmbeddingsRun,
                          storage: PartitionStorage) -> dg.MaterializeResult:
        """Every user, product, advertiser and campaign in one metric space; cold-start ones from content and type alone."""
        window, store = window_of(context), storage.store()
        gate = Gate(context, embeddings_checks)
        build = publish_embeddings(store, window, config.embed_config(embed_base), gate)
        emb = build.embeddings
        types, counts = np.unique(emb.entity_type.astype(str), return_counts=True)
        return dg.MaterializeResult(check_results=gate.results, metadata={
            "dagster/row_count": len(emb), "by_type": {t: int(c) for t, c in zip(types, counts)},
            "cold_start": int(emb.cold_start.sum()), "no_engagement_edge": build.no_engagement,
            "width": int(emb.vectors.shape[1]), "model_version": build.model_version, "seconds": round(emb.seconds, 2),
            "view": f"{build.view.name} fanout={list(build.view.fanout)}" + (
                f"; users: {build.user_view.name} fanout={list(build.user_view.fanout)} max_age_days={build.user_view.max_age_days}"
                if build.user_view else ""),
            "entities_per_s": round(len(emb) / max(emb.seconds, 1e-9), 1),
            "path": dg.MetadataValue.path(store.uri(EMBEDDINGS_ASSET, window.key))})

    @dg.asset(name=HIERARCHY_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"},
              deps=[EMBEDDINGS_ASSET, ENCODER_ASSET, GRAPH_ASSET, CATALOG_ASSET, dg.AssetDep(HIERARCHY_ASSET, partition_mapping=PREVIOUS)],
              check_specs=partitioned([dg.AssetCheckSpec(ASSIGNED_CHECK, asset=HIERARCHY_ASSET, blocking=True,
                                                         description="every embedded entity has top-k primitives at every level")],
                                      partitions),
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)  # window t matches its ids to window t-1's
    @publishes
    def interest_hierarchy(context: dg.AssetExecutionContext, config: InterestHierarchyRun,
                           storage: PartitionStorage) -> dg.MaterializeResult:
        """Multi-level interest primitives: soft top-k assignments, super-graph, ids stable across windows, labels."""
        window, store = window_of(context), storage.store()
        cfg = config.hierarchy_config()
        gate = Gate(context, lambda built: hierarchy_checks(built, cfg))
        h, prev_key = publish_hierarchy(store, window, cfg, gate)
        n = len(h.levels[0].primitive) if h.levels else 0
        per_level = lambda f: {f"L{i}": f(i) for i in range(len(h.levels))}  # noqa: E731
        return dg.MaterializeResult(check_results=gate.results, metadata={
            "entities": n, "primitives": per_level(lambda i: h.levels[i].num_primitives),
            "primitives_used": per_level(lambda i: int((h.levels[i].sizes() > 0).sum())),
            "prototypes_used": per_level(lambda i: h.prototypes_used[i]),  # before the centroid fit: the model's own usage
            "raw_density": h.super_graphs[0].raw_density if h.super_graphs else 0.0,
            "super_graph_density": per_level(lambda i: round(h.super_graphs[i].density, 6)),
            "density_ratio": per_level(lambda i: round(h.super_graphs[i].density_ratio, 2)),
            "super_graph_edges": per_level(lambda i: len(h.super_graphs[i].src)),
            "previous_partition": prev_key or "none (fresh ids)",
            "share_matched": per_level(lambda i: round(h.ids[i].share_matched, 4)),
            "ari_vs_previous": per_level(lambda i: None if h.ari[i] is None else round(h.ari[i], 4)),
            "entities_in_both_windows": h.common_entities,
            "top_primitives": dg.MetadataValue.md(h.markdown()),
            "path": dg.MetadataValue.path(store.uri(HIERARCHY_ASSET, window.key))})

    return [entity_embeddings, interest_hierarchy]
