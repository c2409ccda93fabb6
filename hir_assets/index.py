"""Index stage: bom_index (Bag-of-Meaning tokens, the inverted index token -> items, the faiss index over items)."""

import dagster as dg

from dagster_project.partitions import window_of
from dagster_project.resources import PartitionStorage
from hir_model.hierarchy.window import EMBEDDINGS_ASSET, HIERARCHY_ASSET
from hir_model.retrieval import IndexConfig
from hir_model.retrieval.window import BOM_ASSET, build_window_index

GROUP = "index"
TOKENS_PER_LEVEL_CHECK = "token_per_level"
POSTING_SHARE_CHECK = "posting_share"
RECALL_CHECK = "bom_recall_at_100"


class BomIndexRun(dg.Config):
    exact_max: int = 50_000  # items up to this many: exact IndexFlatIP; above: HNSW
    max_posting_share: float = 0.05  # no token's posting list may hold more than this share of the items
    recall_threshold: float = 0.9  # BoM recall@100 vs exact faiss below this blocks publication downstream
    recall_users: int = 200  # users sampled for the recall measurement
    probe_factor: float = 0.0  # a top-k query scores this x k candidates from its nearest fine primitives' postings
    # (0: tuned per window, fixed or adaptive per-query budgets, whichever needs fewer: see hir_model.retrieval.index)
    target_recall: float = 0.95  # the tuned budget's target recall@100 on calibration users (other than the check's)


def build_index_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    specs = [dg.AssetCheckSpec(name, asset=BOM_ASSET, blocking=True, description=text) for name, text in (
        (TOKENS_PER_LEVEL_CHECK, "every embedded entity has at least one token at every level"),
        (POSTING_SHARE_CHECK, "no token's posting list holds more than the configured share of the items (default 5%)"),
        (RECALL_CHECK, "BoM recall@100 against exact faiss top-100 on sampled users is at least the threshold (default 0.9)"))]

    @dg.asset(name=BOM_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet", "faiss"},
              backfill_policy=dg.BackfillPolicy.multi_run(1), deps=[EMBEDDINGS_ASSET, HIERARCHY_ASSET], check_specs=specs)
    def bom_index(context: dg.AssetExecutionContext, config: BomIndexRun, storage: PartitionStorage) -> dg.MaterializeResult:
        """Bag-of-Meaning tokens per entity, an inverted index token -> items by weight, and a faiss index over items."""
        window, store = window_of(context), storage.store()
        cfg = IndexConfig(exact_max=config.exact_max, max_posting_share=config.max_posting_share, recall_users=config.recall_users,
                          probe_factor=config.probe_factor or None, target_recall=config.target_recall)
        with store.writing() as staging:
            build = build_window_index(store, window.key, staging.path(BOM_ASSET, window.key), cfg)
        p, r = build.postings, build.recall
        limit = config.max_posting_share * max(p.items, 1)
        checks = [dg.AssetCheckResult(asset_key=BOM_ASSET, check_name=name, passed=bool(ok), description=text) for name, ok, text in (
            (TOKENS_PER_LEVEL_CHECK, build.levels > 0 and not any(build.missing_per_level.values()),
             f"entities without a token per level: {build.missing_per_level}"),
            (POSTING_SHARE_CHECK, p.longest <= max(limit, 1),
             f"longest posting list {p.longest} items, limit {limit:.1f} ({config.max_posting_share:.0%} of {p.items}); "
             f"{p.truncated} of {p.tokens} lists were cut to their {p.cap} heaviest"),
            (RECALL_CHECK, r.recall >= config.recall_threshold,
             f"recall@{r.k} {r.recall:.3f} (threshold {config.recall_threshold}) over {r.queries} users, "
             f"{r.candidates_per_query:.0f} of {r.items} items scored per query on average ("
             + (f"fixed budget, probe factor {build.probe_factor:g}" if build.probe_margin is None else
                f"adaptive budgets, margin {build.probe_margin:g}, at most {build.probe_factor:g} x k")
             + f"{', tuned on other users' if not config.probe_factor else ''})"))]
        return dg.MaterializeResult(check_results=checks, metadata={
            "dagster/row_count": build.tokens.num_rows, "entities": build.entities, "items": build.items, "levels": build.levels,
            "tokens": p.tokens, "posting_cap": p.cap, "longest_posting": p.longest, "postings_truncated": p.truncated,
            "recall_at_100": round(r.recall, 4), "recall_queries": r.queries,
            "candidates_per_query": round(r.candidates_per_query, 1), "probe_factor": build.probe_factor,
            "probe_factor_tuned": not config.probe_factor,
            "probe_margin": dg.MetadataValue.float(build.probe_margin) if build.probe_margin is not None else "fixed budget",
            "candidate_fraction": round(r.candidates_per_query / max(r.items, 1), 4),
            "bom_qps": round(r.bom_qps, 1), "exact_qps": round(r.exact_qps, 1),
            "faiss": "IndexFlatIP (exact)" if build.items <= config.exact_max else "IndexHNSWFlat",
            "path": dg.MetadataValue.path(store.uri(BOM_ASSET, window.key))})

    return [bom_index]
