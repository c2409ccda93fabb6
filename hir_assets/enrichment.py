"""Enrichment stage: catalog_clip (an image tower fitted to the catalogue) and content_embeddings (text + image, fused)."""


import dagster as dg
import pyarrow as pa

from hir_assets.content_resources import ContentModels
from hir_assets.publication import STEP_RETRY, audit, partitioned, publishes
from hir_assets.resources import PartitionStorage, SourceResource
from hir_model.content import (CATALOG_CLIP, CLIP_ASSET, CLIP_CHECKPOINT_FILE, CLIP_STATUS_FILE, CONTENT_ASSET, CONTENT_FILE,
                               REUSED_COLUMNS, embed_window, embedding_report, interest_agreement, load_checkpoint, refresh, write_checkpoint)
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE
from hir_model.storage import latest_before

GROUP = "enrichment"
COVERAGE_CHECK, FINITE_CHECK, UNIT_NORM_CHECK = "coverage", "finite", "unit_norm"
DIMENSION_CHECK, VERSION_CHECK, INTEREST_CHECK = "dimension", "single_encoder_version", "interest_agreement"
CLIP_LOSS_CHECK = "loss_decreased"
NORM_TOLERANCE = 1e-3  # |norm - 1| allowed (float32)
NEIGHBOURS = 10  # k of the interest-agreement check
INTEREST_THRESHOLD = 0.3  # share of the k nearest products sharing the planted fine interest; chance is about 1/36
PREVIOUS = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)  # window t-1 of the same asset


def _progress(context: dg.AssetExecutionContext, what: str):
    marks: dict[str, int] = {}

    def report(stage: str, done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth > marks.get(stage, -1) or done == total:
            marks[stage] = tenth
            context.log.info(f"{what} {context.partition_key}: {stage} {done:,}/{total:,}")
    return report


def _status(action: str, reason: str, version: str | None, trained_in: str | None, pairs: int, novelty: float) -> pa.Table:
    return pa.table({"action": [action], "reason": [reason], "version": pa.array([version], pa.string()),
                     "trained_in": pa.array([trained_in], pa.string()), "pairs": [pairs], "novelty": [novelty]})


class CatalogClipRun(dg.Config):
    force_retrain: bool = False  # retrain (warm-started) even when few of the catalogue's images are new


class ContentEmbeddingsRun(dg.Config):
    force_reembed: bool = False  # embed every entity again instead of reusing the previous window's vectors


def build_enrichment_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    @dg.asset(name=CLIP_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"pytorch"},
              deps=[CATALOG_ASSET, dg.AssetDep(CLIP_ASSET, partition_mapping=PREVIOUS)],
              check_specs=partitioned([dg.AssetCheckSpec(CLIP_LOSS_CHECK, asset=CLIP_ASSET, blocking=False,
                                                         description="training lowered the contrastive loss on the catalogue's pairs")],
                                      partitions),
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    @publishes
    def catalog_clip(context: dg.AssetExecutionContext, config: CatalogClipRun, storage: PartitionStorage,
                     content: ContentModels) -> dg.MaterializeResult:
        """An open_clip model fitted to the catalogue's image-text pairs, for where no pretrained weights are available."""
        key, store, models = context.partition_key, storage.store(), content.content_config()
        prev_key = latest_before(store, CLIP_ASSET, key, CLIP_CHECKPOINT_FILE)
        prev_path = store.partition_dir(CLIP_ASSET, prev_key) / CLIP_CHECKPOINT_FILE if prev_key else None
        if models.image.model != CATALOG_CLIP:
            result, status = None, _status("not_used", f"image tower is {models.image.model!r}", None, None, 0, 0.0)
        else:
            catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE)
            progress = _progress(context, CLIP_ASSET)
            result = refresh(catalog, load_checkpoint(prev_path) if prev_path else None, content.clip_config(),
                             config.force_retrain, models.listed_products, lambda done, total: progress("step", done, total))
            trained_in = key if result.training else (store.read(CLIP_ASSET, prev_key, CLIP_STATUS_FILE)["trained_in"][0].as_py()
                                                     if result.checkpoint else None)
            status = _status(result.action, result.reason, result.checkpoint.version if result.checkpoint else None,
                             trained_in, result.pairs, result.novelty)
        with store.writing() as staging:
            if result:
                write_checkpoint(result, staging.path(CLIP_ASSET, key) / CLIP_CHECKPOINT_FILE, prev_path)
            staging.write_table(CLIP_ASSET, key, CLIP_STATUS_FILE, status)
        row = status.to_pylist()[0]
        context.log.info(f"{CLIP_ASSET} {key}: {row['action']} ({row['reason']})")
        training = result.training if result else None
        metadata = {**{k: v for k, v in row.items() if v is not None}, "problems": len(result.problems) if result else 0,
                    "path": dg.MetadataValue.path(str(store.partition_dir(CLIP_ASSET, key)))}
        if training:
            metadata.update(fitted_pairs=result.fitted_pairs, initial_loss=training.initial_loss,
                            final_loss=training.final_loss, epochs=training.epochs,
                            steps=training.steps, seconds=round(training.seconds, 1), step=training.checkpoint.step,
                            warm_started=training.warm_started, epoch_losses=[round(x, 4) for x in training.checkpoint.losses])
        improved = training is None or training.final_loss < training.initial_loss
        described = f"loss {training.initial_loss:.3f} -> {training.final_loss:.3f}" if training else f"no training: {row['action']}"
        losses = {"initial_loss": dg.MetadataValue.float(float(training.initial_loss)),
                  "final_loss": dg.MetadataValue.float(float(training.final_loss))} if training else {}
        check = dg.AssetCheckResult(asset_key=CLIP_ASSET, check_name=CLIP_LOSS_CHECK, passed=improved, description=described,
                                    metadata={**losses, "trained": training is not None})
        return dg.MaterializeResult(metadata=metadata, check_results=[check])

    specs = [dg.AssetCheckSpec(name, asset=CONTENT_ASSET, blocking=True, description=text) for name, text in (
        (COVERAGE_CHECK, "every catalogue entity has a row; every entity with text or an image has a vector"),
        (FINITE_CHECK, "no NaN or inf in any vector"),
        (UNIT_NORM_CHECK, "every vector has unit L2 norm"),
        (DIMENSION_CHECK, "vector widths match the encoders (fused = text + image unless configured)"),
        (VERSION_CHECK, "every row was produced by the same encoder version"))]
    specs.append(dg.AssetCheckSpec(INTEREST_CHECK, asset=CONTENT_ASSET, blocking=False, description=(
        f"synthetic source: share of each product's {NEIGHBOURS} nearest neighbours sharing its planted fine interest "
        f">= {INTEREST_THRESHOLD} (fused; text-only and image-only reported)")))

    @dg.asset(name=CONTENT_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"pytorch", "parquet"},
              deps=[CATALOG_ASSET, CLIP_ASSET, dg.AssetDep(CONTENT_ASSET, partition_mapping=PREVIOUS)], check_specs=partitioned(specs, partitions),
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)
    @publishes
    def content_embeddings(context: dg.AssetExecutionContext, config: ContentEmbeddingsRun, storage: PartitionStorage,
                           source: SourceResource, content: ContentModels) -> dg.MaterializeResult:
        """One content vector per entity from text (transformers) and images (open_clip), fused; only new or changed ones are embedded."""
        key, store, models = context.partition_key, storage.store(), content.content_config()
        catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE)
        clip_status = store.read(CLIP_ASSET, key, CLIP_STATUS_FILE).to_pylist()[0]  # (fails clearly if catalog_clip did not run)
        checkpoint = store.partition_dir(CLIP_ASSET, key) / CLIP_CHECKPOINT_FILE
        prev_key = latest_before(store, CONTENT_ASSET, key, f"{CONTENT_FILE}.parquet")
        previous = store.read(CONTENT_ASSET, prev_key, CONTENT_FILE, columns=REUSED_COLUMNS) if prev_key else None
        build = embed_window(catalog, models, checkpoint if checkpoint.is_file() else None, previous,
                             _progress(context, CONTENT_ASSET), config.force_reembed)
        report = embedding_report(build.table, catalog.column("entity_id"))
        src = source.get()
        truth = src.ground_truth.entities if hasattr(src, "ground_truth") else None
        agreement = interest_agreement(build.table, truth, NEIGHBOURS) if truth is not None else {}
        for problem in build.problems[:10]:
            context.log.warning(problem)
        context.log.info(f"{CONTENT_ASSET} {key}: {build.new} new, {build.changed} changed, {build.version_changed} re-embedded "
                         f"for a new encoder version, {build.reused} reused in {build.seconds:.1f}s")
        entities = len(catalog)
        checks = [
            (COVERAGE_CHECK, report.covered, f"{report.missing} entities without a row (e.g. {report.missing_sample}), "
             f"{report.unexpected} rows not in the catalogue, {report.vector_without_content} vectors disagree with has_text/has_image; "
             f"{report.no_content} entities have neither text nor image (null vector by design)",
             {"missing": report.missing, "unexpected": report.unexpected, "vector_without_content": report.vector_without_content,
              "no_content": report.no_content, "coverage": dg.MetadataValue.float((entities - report.missing) / max(entities, 1))}),
            (FINITE_CHECK, report.nonfinite == 0, f"{report.nonfinite} vectors with NaN or inf", {"nonfinite": report.nonfinite}),
            (UNIT_NORM_CHECK, report.max_norm_error <= NORM_TOLERANCE, f"max |norm - 1| = {report.max_norm_error:.2e}",
             {"max_norm_error": dg.MetadataValue.float(float(report.max_norm_error)),
              "tolerance": dg.MetadataValue.float(NORM_TOLERANCE)}),
            (DIMENSION_CHECK, report.dims == build.dims, f"widths {report.dims}, encoders {build.dims}",
             {f"width_{k}": int(v) for k, v in report.dims.items()}),
            (VERSION_CHECK, report.versions == [build.version], f"versions {report.versions}", {"versions": len(report.versions)}),
        ]
        results = [dg.AssetCheckResult(asset_key=CONTENT_ASSET, check_name=name, passed=bool(ok), description=text, metadata=meta)
                   for name, ok, text, meta in checks]
        if agreement:
            results.append(dg.AssetCheckResult(
                asset_key=CONTENT_ASSET, check_name=INTEREST_CHECK, passed=agreement["fused"] >= INTEREST_THRESHOLD,
                severity=dg.AssetCheckSeverity.WARN, metadata={k: dg.MetadataValue.float(float(v)) for k, v in agreement.items()},
                description=(f"{NEIGHBOURS}-NN share with the same fine interest over {agreement['n']:.0f} products: fused "
                             f"{agreement['fused']:.3f}, text-only {agreement['text']:.3f}, image-only {agreement['image']:.3f}, "
                             f"chance {agreement['chance']:.3f}")))
        else:
            results.append(dg.AssetCheckResult(asset_key=CONTENT_ASSET, check_name=INTEREST_CHECK, passed=True,
                                               description=f"source {src.name!r} has no planted interests: skipped"))
        with store.writing() as staging:  # committed only if the blocking checks pass
            staging.write_table(CONTENT_ASSET, key, CONTENT_FILE, build.table)
            audit(context, results)
        return dg.MaterializeResult(metadata={
            "dagster/row_count": build.table.num_rows,
            "new": build.new, "changed": build.changed, "reembedded_for_version": build.version_changed, "reused": build.reused,
            "embedded": build.embedded, "texts_encoded": build.texts_encoded, "visuals_encoded": build.visuals_encoded,
            "no_content": build.no_content, "images_without_tower": build.visual_without_tower,
            "media_problems": build.n_problems, "previous_partition": prev_key or "none",
            "encoder_version": build.version, "weights": build.weights, "catalog_clip": clip_status["action"],
            "dims": report.dims, "seconds": round(build.seconds, 2), "entities_per_s": round(build.entities_per_s, 1),
            "coverage": dg.MetadataValue.float((entities - report.missing) / max(entities, 1)),  # plotted per window
            **{f"interest_agreement_{k}": round(float(v), 4) for k, v in agreement.items() if k != "n"},
            "path": dg.MetadataValue.path(str(store.partition_dir(CONTENT_ASSET, key))),
        }, check_results=results)

    return [catalog_clip, content_embeddings]
