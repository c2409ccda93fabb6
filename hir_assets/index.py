"""Index stage: ranking_head (the state HIR's one ranking head scores with, fitted at the window's end) and bom_index
(Bag-of-Meaning tokens, the inverted index token -> items, the faiss index over the head's items)."""

from typing import ClassVar, Optional

import dagster as dg
import numpy as np

from hir_assets.evaluation import spec_of
from hir_assets.overrides import Overrides
from hir_assets.partitions import window_of
from hir_assets.publication import Gate, STEP_RETRY, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.data.tables import CATALOG_ASSET, EVENTS_ASSET
from hir_model.data.windows import WindowSpec
from hir_model.embed import EMBEDDINGS_ASSET
from hir_model.graph.window import GRAPH_ASSET
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.rank.bom_index import BomBuild, build_window_index
from hir_model.rank.coengagement import COENGAGEMENT_WEIGHTS
from hir_model.rank.examples import ranker_problems
from hir_model.rank.fit import WEIGHTS
from hir_model.rank.head import HeadConfig
from hir_model.rank.ranker import RankerConfig
from hir_model.rank.ranking_head import build_head_state
from hir_model.rank.state import HEAD_ASSET, HeadState, write_head
from hir_model.rank.track import TRACK_WEIGHTS
from hir_model.retrieval import BOM_ASSET, IndexConfig
from hir_model.train.checkpoint import ENCODER_ASSET

PREVIOUS = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)

GROUP = "index"
TOKENS_PER_LEVEL_CHECK = "token_per_level"
POSTING_SHARE_CHECK = "posting_share"
RECALL_CHECK = "bom_recall_at_100"
HEAD_FINITE_CHECK = "head_finite"
HEAD_COVERAGE_CHECK = "head_items_covered"
HEAD_WEIGHTS_CHECK = "head_weights_in_grid"
HEAD_RANKER_CHECK = "head_ranker_sound"
RECALL_THRESHOLD = 0.9  # the bom_index recall check's default threshold (the asset's own setting, not the library's)


class RankingHeadRun(Overrides):
    """Overrides of HeadConfig (hir_model.rank.head) and RankerConfig (hir_model.rank.ranker), where the defaults and
    their meaning are declared."""

    zero_means_none: ClassVar[frozenset[str]] = frozenset({"calibrate_days", "cold_prior_days", "track_min_users",
                                                         "rows_track_min_users", "prior_half_life_days"})
    prior_weight: Optional[float] = None  # the item prior's weight where it is not fitted; 0: no prior
    prior_half_life_days: Optional[float] = None  # the prior from the window's history decayed at this half-life; 0: graph(t)'s
    rows_prior_weight: Optional[float] = None  # its weight beside the rows alone until the track has evidence; unset: the head's
    coengagement_weight: Optional[float] = None  # co-engagement's weight until the track has evidence; 0: none till then
    calibrate_days: Optional[float] = None  # the prior's weight fitted on the window's last days; 0: not fitted
    track_min_users: Optional[int] = None  # judged users the earlier heads' track must hold to set the weights; 0: never
    rows_track_min_users: Optional[int] = None  # the same for the rows' own weight; 0: at track_min_users
    recent_weight: Optional[float] = None  # a warm user's query: the recent items' share; 0: the published row alone
    kernel_weight: Optional[float] = None  # a warm user's score: the interest kernel's share; 0: off
    cold_structure_weight: Optional[float] = None  # a cold user's score: the structural readout's share; 0: off
    cold_prior_days: Optional[float] = None  # cold users' prior from their users' first days; 0: the warm users' prior
    enabled: Optional[bool] = None  # the learned ranker (RankerConfig, hir_model.rank.ranker); false: the hand-set head
    depth: Optional[int] = None  # first-stage candidates the ranker re-scores per user
    num_leaves: Optional[int] = None  # the ranker's tree size
    rounds: Optional[int] = None  # its boosting rounds

    def head_config(self, base: HeadConfig = HeadConfig()) -> HeadConfig:
        return self.apply(base)

    def ranker_config(self, base: RankerConfig = RankerConfig()) -> RankerConfig:
        return self.apply(base)


class BomIndexRun(Overrides):
    """Overrides of IndexConfig (hir_model.retrieval.index), and the recall check's threshold."""

    zero_means_none: ClassVar[frozenset[str]] = frozenset({"probe_factor"})
    exact_max: Optional[int] = None  # items up to this many: exact IndexFlatIP, probing the postings; above: IVF lists
    max_posting_share: Optional[float] = None  # no token's posting list may hold more than this share of the items
    recall_users: Optional[int] = None  # users sampled for the recall measurement
    probe_factor: Optional[float] = None  # candidates per query: this x (k + the user's engaged items); 0: tuned per window
    target_recall: Optional[float] = None  # the tuned budget's target recall@100 on calibration users (not the check's)
    max_candidate_share: Optional[float] = None  # the tuned budget scores at most this share of the items per query
    recall_threshold: float = RECALL_THRESHOLD  # served recall@100 vs the head's exact top-100 below this blocks downstream

    def index_config(self, base: IndexConfig = IndexConfig()) -> IndexConfig:
        return self.apply(base)


def publish_head(store, spec: WindowSpec, key: str, config: HeadConfig, gate=None,
                 ranker: RankerConfig = RankerConfig()) -> HeadState:
    """Window `key`'s ranking_head state with its learned rankers (`ranker`), fitted and published (`gate(state)` judges
    it before the commit)."""
    state = build_head_state(store, spec, key, config, ranker=ranker)
    with store.writing() as staging:
        write_head(staging.path(HEAD_ASSET, key), state)
        if gate:
            gate(state)
    return state


def publish_index(store, key: str, config: IndexConfig, gate=None) -> BomBuild:
    """Window `key`'s bom_index over its ranking head's items, its probe budget tuned, built and published (`gate(build)`
    judges it before the commit)."""
    with store.writing() as staging:
        build = build_window_index(store, key, staging.path(BOM_ASSET, key), config)
        if gate:
            gate(build)
        return build


def head_results(state: HeadState) -> list[dg.AssetCheckResult]:
    return [dg.AssetCheckResult(asset_key=HEAD_ASSET, check_name=n, passed=bool(ok), description=d, metadata=m)
            for n, ok, d, m in head_checks(state)]


def bom_results(build: BomBuild, cfg: IndexConfig, recall_threshold: float) -> list[dg.AssetCheckResult]:
    """The bom_index's checks on a build (before it is committed)."""
    p, r = build.postings, build.recall
    limit = cfg.max_posting_share * max(p.items, 1)
    return [dg.AssetCheckResult(asset_key=BOM_ASSET, check_name=name, passed=bool(ok), description=text, metadata=meta)
            for name, ok, text, meta in (
        (TOKENS_PER_LEVEL_CHECK, build.levels > 0 and not any(build.missing_per_level.values()),
         f"entities without a token per level: {build.missing_per_level}",
         {"entities_missing_a_level": int(sum(build.missing_per_level.values()))}),
        (POSTING_SHARE_CHECK, p.longest <= max(limit, 1),
         f"longest posting list {p.longest} items, limit {limit:.1f} ({cfg.max_posting_share:.0%} of {p.items}); "
         f"{p.truncated} of {p.tokens} lists were cut to their {p.cap} heaviest",
         {"longest_posting": int(p.longest), "limit": float(limit)}),
        (RECALL_CHECK, r.recall >= recall_threshold,
         f"recall@{r.k} {r.recall:.3f} of the head's exact top-{r.k} (threshold {recall_threshold}) over "
         f"{r.queries} users, {r.candidates_per_query:.0f} of {r.items} items scored per query on average "
         f"({r.candidate_fraction:.1%}; probe factor {build.probe_factor:g}"
         f"{', tuned on other users' if cfg.probe_factor is None else ''})",
         {"recall": float(r.recall), "candidate_fraction": float(r.candidate_fraction), "users": int(r.queries)}))]


def head_checks(state: HeadState) -> list[tuple[str, bool, str, dict]]:
    """(check, passed, description, numeric metadata) of a head state before it is published."""
    arrays = {"embedding": state.vectors, "log_prior": state.log_prior, "cold_log_prior": state.cold_log_prior,
              "structure": state.structure}
    bad = {k: int((~np.isfinite(v)).sum()) for k, v in arrays.items() if v is not None}
    norms = np.linalg.norm(state.vectors, axis=1) if state.n_items else np.ones(0)
    off_unit = int((np.abs(norms - 1) > 1e-3).sum())
    fitted = state.calibration is not None
    c, track = state.config, state.prior_source == "track"
    grids = {"prior": (state.prior_weight, TRACK_WEIGHTS if track else WEIGHTS if fitted else (c.prior_weight,)),
             "rows": (state.rows_prior_weight, TRACK_WEIGHTS if state.rows_source == "track"
                      else (c.rows_prior_weight,) if state.rows_source == "config" else (state.prior_weight,)),
             "co-engagement": (state.coengagement_weight, (0.0,) + COENGAGEMENT_WEIGHTS if track
                               else (c.coengagement_weight if state.coengagement is not None else 0.0,))}
    in_grid = all(any(np.isclose(v, w) for w in grid) for v, grid in grids.values())
    shares = [state.config.recent_weight, state.config.kernel_weight, state.config.cold_structure_weight]
    history_ok = bool(len(state.history.item) == 0 or (state.history.item.max() < state.n_items and state.history.ts.max() < state.end_us))
    return [
        (HEAD_FINITE_CHECK, not any(bad.values()), f"non-finite values per column: {bad}", {"non_finite": sum(bad.values())}),
        (HEAD_COVERAGE_CHECK, state.n_items > 0 and off_unit == 0 and history_ok,
         f"{state.n_items} items, each with a vector ({off_unit} not unit norm); history: every event on a head item "
         f"before the window's end: {history_ok}", {"items": state.n_items, "not_unit_norm": off_unit,
                                                     "users": int(state.history.n_users)}),
        (HEAD_WEIGHTS_CHECK, in_grid and all(0 <= s <= 1 for s in shares),
         f"weights from {state.prior_source}: " + "; ".join(f"{k} {v:g} in {list(g)}" for k, (v, g) in grids.items())
         + f"; shares recent/kernel/cold-structure {shares}",
         {"prior_weight": float(state.prior_weight), "rows_prior_weight": float(state.rows_prior_weight),
          "coengagement_weight": float(state.coengagement_weight),
          "calibration_users": state.calibration.users if fitted else 0,
          "track_users": sum(r.users for r in state.track)}),
        (HEAD_RANKER_CHECK, not (problems := ranker_problems(state.rankers, state.examples)),
         "; ".join(problems) or (f"rankers {[r.variant for r in state.rankers]}: {state.ranker_note}; gain by feature "
                                 + ", ".join(f"{r.variant}: " + " ".join(f"{k}={v:.0f}" for k, v in sorted(
                                     r.importance.items(), key=lambda kv: -kv[1])[:5]) for r in state.rankers)),
         {"rankers": len(state.rankers), "examples": 0 if state.examples is None else state.examples.num_rows,
          "training_queries": max((r.trained.get("queries", 0) for r in state.rankers), default=0)}),
    ]


def build_index_assets(partitions: dg.PartitionsDefinition) -> list[dg.AssetsDefinition]:
    spec_at_load = spec_of(partitions)
    head_specs = [dg.AssetCheckSpec(name, asset=HEAD_ASSET, blocking=True, description=text) for name, text in (
        (HEAD_FINITE_CHECK, "every vector, prior and structural encoding the head scores with is finite"),
        (HEAD_COVERAGE_CHECK, "every item the window knows has a unit vector; the history only holds those items, "
                              "before the window's end"),
        (HEAD_WEIGHTS_CHECK, "the prior's and the co-engagement's weights are in the grid of what chose them (the track "
                             "record's, the held-out calibration's, or the configured one); shares in [0, 1]"),
        (HEAD_RANKER_CHECK, "the learned rankers read their variant's features, record each feature's importance and "
                            "score their training examples finitely; the examples' features are finite or missing"))]

    @dg.asset(name=HEAD_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet"}, check_specs=partitioned(head_specs, partitions),
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY,
              deps=[EVENTS_ASSET, CATALOG_ASSET, GRAPH_ASSET, ENCODER_ASSET, EMBEDDINGS_ASSET,
                    dg.AssetDep(HEAD_ASSET, partition_mapping=PREVIOUS)])  # head(t-1)'s track record, judged on t
    @publishes
    def ranking_head(context: dg.AssetExecutionContext, config: RankingHeadRun, storage: PartitionStorage) -> dg.MaterializeResult:
        """The state HIR's ranking head scores with at the window's end: items' vectors and priors, fitted weights, history."""
        window, store = window_of(context), storage.store()
        gate = Gate(context, head_results)
        state = publish_head(store, spec_at_load, window.key, config.head_config(), gate, config.ranker_config())
        context.log.info(f"ranking head {window.key}: {state.n_items} items, {state.history.n_users} users, prior weight "
                         f"{state.prior_weight:g} from {state.prior_source} (rows alone {state.rows_prior_weight:g} from "
                         f"{state.rows_source}), "
                         f"track of {len(state.track)} windows, {sum(r.users for r in state.track)} users")
        summary = state.summary()
        return dg.MaterializeResult(
            check_results=gate.results,
            metadata={"dagster/row_count": state.n_items, "users": summary["users"], "events": summary["events"],
                      "prior_weight": float(state.prior_weight), "rows_prior_weight": float(state.rows_prior_weight),
                      "prior_source": state.prior_source, "track_users": sum(r.users for r in state.track),
                      "temp": float(state.temp),
                      "structural_readout": summary["structural_readout"], "cold_prior": summary["cold_prior"],
                      "calibration": dg.MetadataValue.json(summary["calibration"] or {}),
                      "ranker": state.ranker_note, "rankers": dg.MetadataValue.json(summary["rankers"]),
                      "config": dg.MetadataValue.json(summary["config"]),
                      "path": dg.MetadataValue.path(store.uri(HEAD_ASSET, window.key))})

    specs = [dg.AssetCheckSpec(name, asset=BOM_ASSET, blocking=True, description=text) for name, text in (
        (TOKENS_PER_LEVEL_CHECK, "every embedded entity has at least one token at every level"),
        (POSTING_SHARE_CHECK, "no token's posting list holds more than the configured share of the items "
                              f"(default {IndexConfig().max_posting_share:.0%})"),
        (RECALL_CHECK, "served top-100 (BoM candidates reranked by the ranking head) against the head's exact top-100 on "
                       f"sampled users: mean recall at least the threshold (default {RECALL_THRESHOLD})"))]

    @dg.asset(name=BOM_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"parquet", "faiss"},
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY, deps=[EMBEDDINGS_ASSET, HIERARCHY_ASSET, HEAD_ASSET],
              check_specs=partitioned(specs, partitions))
    @publishes
    def bom_index(context: dg.AssetExecutionContext, config: BomIndexRun, storage: PartitionStorage) -> dg.MaterializeResult:
        """Bag-of-Meaning tokens per entity, an inverted index token -> items by weight, a faiss index over the head's items."""
        window, store = window_of(context), storage.store()
        cfg = config.index_config()
        gate = Gate(context, lambda built: bom_results(built, cfg, config.recall_threshold))
        build = publish_index(store, window.key, cfg, gate)
        p, r = build.postings, build.recall
        return dg.MaterializeResult(check_results=gate.results, metadata={
            "dagster/row_count": build.tokens.num_rows, "entities": build.entities, "items": build.items, "levels": build.levels,
            "tokens": p.tokens, "posting_cap": p.cap, "longest_posting": p.longest, "postings_truncated": p.truncated,
            "recall_at_100": round(r.recall, 4), "recall_queries": r.queries,
            "candidates_per_query": round(r.candidates_per_query, 1), "probe_factor": float(build.probe_factor),
            "probe_factor_tuned": cfg.probe_factor is None, "candidate_fraction": round(r.candidate_fraction, 4),
            "served_qps": round(r.served_qps, 1), "exact_qps": round(r.exact_qps, 1),
            "faiss": "IndexFlatIP (exact)" if build.items <= cfg.exact_max else "IndexIVFFlat (candidates from its lists)",
            "path": dg.MetadataValue.path(store.uri(BOM_ASSET, window.key))})

    return [ranking_head, bom_index]
