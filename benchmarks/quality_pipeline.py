"""The pipeline's artefacts in process, as the assets publish them, for benchmarks/quality.py: a source's
`entity_catalog` and `raw_events` (`materialise`), HIR's artefacts window by window through the functions the assets
call (`publish_hir`, with the configs the assets resolve from hir.toml: `hir_train_overrides`, `hir_embed_config`),
and every window evaluated as `window_evaluation` does (`evaluate_published`)."""

from __future__ import annotations

from dataclasses import replace

import json
import os
import time
from pathlib import Path

from hir_model.data.source import Source
from hir_model.data.tables import CATALOG_ASSET, CATALOG_REFERENCE, ENTITIES_FILE, build_catalog, build_events
from hir_model.data.windows import WindowSpec
from hir_model.rank.head import HeadConfig
from hir_model.storage import PartitionStore


def materialise(source: Source, store: PartitionStore) -> WindowSpec:
    """entity_catalog and raw_events of every window, as the assets publish them."""
    spec = WindowSpec.covering("weekly", *source.span())
    for window in spec.windows():
        with store.writing() as staging:
            build_catalog(source, window, staging)
        catalog = store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=CATALOG_REFERENCE)
        with store.writing() as staging:
            build_events(source, window, catalog, staging)
    return spec


def hir_embed_config(source: str, users: str | None = None):
    """entity_embeddings' EmbedConfig for `source`: hir.toml's [embed] and [embed.<source>] (what the asset gets), then
    `users` over them when given."""
    from hir_assets.hierarchy import EntityEmbeddingsRun
    from hir_model.config import load_config
    from hir_model.embed import embed_defaults

    base = embed_defaults(load_config(env={**os.environ, "HIR_SOURCE": source}).embed)
    return EntityEmbeddingsRun(users=users).embed_config(base)


def hir_train_overrides(source: str, overrides: list[str] = ()) -> dict:
    """hir_encoder's TrainConfig overrides for `source`: hir.toml's [train] and [train.<source>] (what the asset passes
    the entry point), then `overrides` (`field=value`, JSON values) over them, as if [train.<source>] held them."""
    from hir_model.config import layer_train, load_config
    from hir_model.train.config import parse_overrides

    return layer_train(load_config(env={**os.environ, "HIR_SOURCE": source}).train, parse_overrides(list(overrides)))


def publish_hir(store: PartitionStore, spec: WindowSpec, keys: list[str], overrides: dict, scratch: Path,
                head: HeadConfig = HeadConfig(), embed=None) -> dict:
    """Publish HIR's artefacts of every window up to the last of `keys` with a successor, through the functions the
    assets call: content_embeddings (the stand-in; every window, t+1's new items read it), engagement_graph (every
    window: graph(t) grows from graph(t-1)), hir_encoder (from the first of `keys` on: fresh there, then warm-started
    from t-1; `overrides`: TrainConfig fields, as hir.toml's [train]), entity_embeddings, interest_hierarchy,
    ranking_head (with `head`) and bom_index; `embed`: entity_embeddings' EmbedConfig (None: the asset's default under an
    empty run config). Returns seconds per stage and the training summary."""
    from hir_assets.hierarchy import EntityEmbeddingsRun, InterestHierarchyRun, publish_embeddings, publish_hierarchy
    from hir_assets.index import BomIndexRun, publish_head, publish_index
    from hir_assets.training import HirEncoderRun, commit_checkpoint, entry_args, previous_checkpoint
    from hir_model.content import CONTENT_ASSET, CONTENT_FILE
    from hir_model.eval.text_vectors import stand_in_table
    from hir_model.graph.window import build_window_graph
    from hir_model.train import entry
    from hir_model.train.checkpoint import CHECKPOINT_FILE

    embed = embed or EntityEmbeddingsRun().embed_config()
    hierarchy, index = InterestHierarchyRun().hierarchy_config(), BomIndexRun().index_config()  # under an empty run config
    needed = [k for k in keys if spec.next(spec.window(k)) is not None]
    first, upto = min(keys, default=""), max(needed, default="")
    seconds = {"content": 0.0, "graph": 0.0, "train": 0.0, "embed": 0.0, "index": 0.0}
    losses, entropy, steps, previous = [], [], [], None
    for window in spec.windows():
        key = window.key
        t0 = time.perf_counter()
        catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=["entity_id", "title", "description", "category"])
        with store.writing() as staging:
            staging.write_table(CONTENT_ASSET, key, CONTENT_FILE, stand_in_table(catalog))
        t1 = time.perf_counter()
        seconds["content"] += t1 - t0
        if key > upto:
            continue
        with store.writing() as staging:  # engagement_graph: graph(t) from graph(t-1) and window t's tables
            build_window_graph(store, window, previous, staging)
        t2 = time.perf_counter()
        seconds["graph"] += t2 - t1
        previous = key
        if key < first:  # before the evaluated windows (--quick's MovieLens case): the graph only
            continue
        out = scratch / key / CHECKPOINT_FILE  # hir_encoder: trained beside the store, then committed like the asset does
        out.parent.mkdir(parents=True, exist_ok=True)
        entry.run(entry.parse(entry_args(store, key, out, previous_checkpoint(store, key), overrides, HirEncoderRun())))
        metrics = json.loads(Path(f"{out}.metrics.json").read_text())
        commit_checkpoint(store, key, out, metrics)
        t3 = time.perf_counter()
        publish_embeddings(store, window, embed)  # entity_embeddings, in the checkpoint's view
        t4 = time.perf_counter()
        publish_hierarchy(store, window, hierarchy)  # interest_hierarchy, ranking_head, bom_index
        publish_head(store, spec, key, head)
        publish_index(store, key, index)
        seconds["train"] += t3 - t2
        seconds["embed"] += t4 - t3
        seconds["index"] += time.perf_counter() - t4
        losses.append(metrics["losses"][-1] if metrics["losses"] else float("nan"))
        entropy.append(min(metrics["usage_entropy"], default=float("nan")))
        steps.append(int(metrics.get("window_steps", len(metrics["losses"]))))
    return {"seconds": seconds, "windows_trained": len(losses), "steps": steps,
            "last_loss": losses[-1] if losses else float("nan"), "min_usage_entropy": min(entropy, default=float("nan"))}


def evaluate_published(store: PartitionStore, spec: WindowSpec, keys, truth=None, on_window=None, inductive=None) -> list:
    """Every window of `keys` through `evaluate_published_window` (HIR's rows + baselines) with the window_evaluation
    asset's config, in time order, each warm-starting from the previous window's outcome in process; `on_window(key,
    outcome)` after each evaluated window."""
    from hir_assets.evaluation import WindowEvaluationRun
    from hir_model.eval.window_evaluation import WindowOutcome, evaluate_published_window

    config = WindowEvaluationRun().eval_config()
    config = replace(config, inductive=inductive) if inductive is not None else config  # items without a row, cold users
    results, previous = [], None
    for key in sorted(keys):
        outcome = evaluate_published_window(store, spec, key, config, truth=truth, previous=previous)
        if isinstance(outcome, WindowOutcome):
            previous = outcome
            results.append(outcome.evaluation)
            if on_window is not None:
                on_window(key, outcome)
        else:
            results.append(outcome)
    return results
