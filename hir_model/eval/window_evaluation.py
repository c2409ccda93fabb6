"""One window's full evaluation from the published tables: what the `window_evaluation` asset computes.

HIR (window t's `ranking_head` state with its `entity_embeddings`, `hir_encoder`, `engagement_graph`, `content_embeddings`
and `bom_index`: three rows, hir_model.eval.hir) and the baselines are scored on the same split of t+1
(`hir_model.eval.run`); on top of the ranking table:
- the downstream conversion model with and without HIR's pair features (embedding score of warm users and, when
  `interest_hierarchy` of t exists, per-level primitive affinities, i.e. shared BoM tokens weighted);
- with planted ground truth (synthetic source): NMI and ARI per level of the hierarchy's top primitives;
- the stateful baselines warm-start from the latest earlier window's saved state (never a later one).

Reads: raw_events <= t+1, entity_catalog t and t+1, content_embeddings t and t+1 (new items only), window t's HIR
artefacts and the increments of window t (catalog_increment of the days of t+1: items first seen in t+1, placed in
window t's space, each causal by its own blocking check). `opened` lists every (asset, partition) read, so the asset can
check that nothing else was.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa

from hir_model.content import CONTENT_ASSET
from hir_model.data.tables import CATALOG_ASSET, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.eval.agreement import LevelAgreement, planted_agreement, primitive_affinity
from hir_model.baselines.registry import BaselinesConfig, baselines
from hir_model.rank.artefacts import load_artefacts, missing_artefacts
from hir_model.rank.increment import ARRIVAL_LAG_S, CADENCES, INCREMENT_ASSET
from hir_model.rank.inductive import InductiveConfig
from hir_model.eval.hir import HeadMethod
from hir_model.eval.lift import PairFeatures
from hir_model.protocol.method import Method
from hir_model.eval.publish import (EVALUATION_ASSET, STATE_FILE, load_states, method_state, previous_state_key,
                                    restore_state)
from hir_model.eval.run import TableReader, WindowEvaluation, WindowSkipped, evaluate_window
from hir_model.eval.scoring import EvalConfig
from hir_model.protocol.split import to_us
from hir_model.embed import EMBEDDINGS_ASSET
from hir_model.graph.window import GRAPH_ASSET
from hir_model.hierarchy.build import ASSIGNMENTS_FILE, HIERARCHY_ASSET
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET
from hir_model.train.checkpoint import ENCODER_ASSET

log = logging.getLogger("hir")

HIR_ROWS = ("hir", "hir_exact", "hir_embeddings", "ranker_base")  # ranker_base: the ranker without HIR's features
ALL_METHODS = HIR_ROWS + ("popularity", "item2item_recent", "content", "mf_als", "lightgcn")
NEXT_WINDOW_ASSETS = (EVENTS_ASSET, CATALOG_ASSET, CONTENT_ASSET)  # the only assets whose t+1 partition may be read


@dataclass(frozen=True)
class WindowEvalConfig:
    eval: EvalConfig = EvalConfig(lift_method="hir_exact")
    baselines: BaselinesConfig = BaselinesConfig()
    methods: tuple[str, ...] = ALL_METHODS  # report columns, in order
    warm_start: bool = True  # stateful baselines start from the latest earlier window's saved state
    truth_entity_types: tuple[str, ...] = ("product",)  # planted-interest agreement on these entities
    inductive: InductiveConfig = InductiveConfig()  # cold users and items without a row (hir_model.rank.inductive)
    increments: bool = True  # the served row answers items first seen in t+1 from window t's published increments
    arrival_cadence: str = "arrival"  # when an increment's item became servable: "arrival" (its first_seen_ts, the
    # arrival sensor's cadence) or "day_end" (its day's end, the daily schedule's), plus arrival_lag_s
    arrival_lag_s: float = ARRIVAL_LAG_S  # from a catalogue file landing to the item served (benchmarks/arrivals.py)

    def __post_init__(self) -> None:
        if self.arrival_cadence not in CADENCES:
            raise ValueError(f"WindowEvalConfig.arrival_cadence must be one of {CADENCES}, got {self.arrival_cadence!r}")


@dataclass(frozen=True)
class HIRStatus:
    """What the evaluation of one window says about HIR's rows (published as the summary's `hir` extras)."""

    evaluated: bool  # HIR's artefacts of the window were there and at least one of its rows was asked for
    reason: str | None = None  # why not (evaluated False)
    model_version: str | None = None  # the checkpoint the rows read
    head: dict | None = None  # the ranking head's state (HeadState.summary(), what head.json holds)
    prior_scale: float | None = None  # the item prior's scale in the scores: weight x temperature (0: no prior)
    prior_weight: float | None = None
    prior_calibration: dict | None = None  # the prior weight's fit (None: configured, not fitted)
    probe_factor: float | None = None  # the served row's candidate budget, bom_index's
    served: str | None = None  # why the served row is missing (no bom_index)
    cold_users_encoded: int | None = None  # cold users the frozen encoder read
    single_token_items: int | None = None  # items first seen in t+1, read as a single token
    rows: list[str] | None = None  # HIR's rows in the table
    increments: dict | None = None  # the served row's increments: days, items, cadence, lag

    def as_dict(self) -> dict:
        """JSON-ready: the fields known (the prior's fit also when None, once evaluated)."""
        return {k: v for k, v in asdict(self).items()
                if v is not None or (k == "prior_calibration" and self.evaluated)}


@dataclass(frozen=True)
class WindowOutcome:
    evaluation: WindowEvaluation
    methods: list[Method]  # fitted (their state is what the next window warm-starts from)
    hir: HIRStatus
    warm_started_from: dict[str, str] = field(default_factory=dict)  # method -> the window whose state it started from
    agreement: list[LevelAgreement] | None = None  # with planted truth and a hierarchy: per (level, planted level)
    opened: list[tuple[str, str]] = field(default_factory=list)  # (asset, partition) read, in order

    @property
    def extras(self) -> dict:
        """What is published beside the metrics (hir_model.eval.publish): HIR's status, warm starts, agreement."""
        extras = {"hir": self.hir.as_dict(), "warm_started_from": dict(self.warm_started_from)}
        if self.agreement is not None:
            extras["agreement"] = [asdict(a) for a in self.agreement]
        return extras


def skip_reason(store, spec: WindowSpec, key: str) -> str | None:
    """Why window `key` cannot be evaluated yet (None: it can): no successor window, or its events not published."""
    window = spec.window(key)
    nxt = spec.next(window)
    if nxt is None:
        return (f"skipped: window {key} has no successor (the data ends {window.end:%Y-%m-%d}); it is evaluated once "
                f"window {window.end:%Y-%m-%d} exists and its {EVENTS_ASSET} are materialised")
    if not store.exists(EVENTS_ASSET, nxt.key, EVENTS_FILE):
        return (f"skipped: {EVENTS_ASSET} of the next window {nxt.key} is not materialised yet; materialise it, then "
                f"{EVALUATION_ASSET} for {key}")
    return None


def make_methods(names: tuple[str, ...], config: BaselinesConfig, hir: list[HeadMethod]) -> list[Method]:
    pool = {m.name: m for m in baselines(config)} | {m.name: m for m in hir}
    return [pool[n] for n in names if n in pool]


def hir_methods(store, key: str, end_us: int, names: tuple[str, ...], depth: int,
                inductive_config: InductiveConfig = InductiveConfig(), next_end_us: int | None = None,
                config: WindowEvalConfig = WindowEvalConfig()) -> tuple[list[HeadMethod], HIRStatus, list]:
    """HIR's rows of `names` from window `key`'s published ranking head (and bom_index for the served row, with the
    increments of the days before `next_end_us` when `config.increments`): the methods, their status for the report and
    the partitions read. No row without the head; no served row without the index."""
    from hir_model.rank.inductive import InductiveEncoder
    from hir_model.rank.recommender import Recommender, user_rows
    from hir_model.rank.state import read_head
    from hir_model.retrieval.load_index import load_probe_factor, load_retriever

    wanted = [n for n in HIR_ROWS if n in names]
    if not wanted:
        return [], HIRStatus(False, "not requested"), []
    missing = missing_artefacts(store, key) or (None if store.exists(HEAD_ASSET, key) else f"{HEAD_ASSET} for {key} is not materialised")
    if missing:
        return [], HIRStatus(False, missing), []
    artefacts = load_artefacts(store, key, end_us)
    inductive = InductiveEncoder(artefacts, inductive_config)
    state = read_head(store.partition_dir(HEAD_ASSET, key))
    rows, has = user_rows(artefacts.embeddings, state.history.user_ids)
    opened = [(HEAD_ASSET, key), (ENCODER_ASSET, key), (EMBEDDINGS_ASSET, key)]
    opened += [(GRAPH_ASSET, key)] if artefacts.graph is not None else []
    opened += [(CONTENT_ASSET, key)] if artefacts.content is not None else []
    retriever, probe_factor, served = None, None, None
    if "hir" in wanted and store.exists(BOM_ASSET, key):
        retriever = load_retriever(store, key, artefacts.embeddings)
        probe_factor = load_probe_factor(store, key)
        opened.append((BOM_ASSET, key))
    elif "hir" in wanted:
        wanted.remove("hir")
        served = f"not evaluated: {BOM_ASSET} for {key} is not materialised"
    status = HIRStatus(True, model_version=artefacts.model.version, head=state.summary(),
                       prior_scale=state.prior_weight * state.temp if state.log_prior is not None else 0.0,
                       prior_weight=state.prior_weight,
                       prior_calibration=None if state.calibration is None else state.calibration.as_dict(),
                       probe_factor=probe_factor, served=served)
    rec = Recommender(state, rows, has, retriever, inductive, probe_factor=probe_factor)
    arrivals, available = None, None
    if retriever is not None and config.increments:
        from hir_model.rank.increment import load_increments

        incs = load_increments(store, key, end_us, next_end_us)
        opened += [(INCREMENT_ASSET, inc.day) for inc in incs]
        if incs:
            arrivals = rec.with_increments(incs)
            available = np.concatenate([inc.available_us(config.arrival_cadence, config.arrival_lag_s) for inc in incs])
        status = replace(status, increments={"days": [inc.day for inc in incs], "items": int(sum(len(i) for i in incs)),
                                             "cadence": config.arrival_cadence, "lag_s": config.arrival_lag_s})
    return [HeadMethod(rec, inductive, n, depth, arrivals if n == "hir" else None, available if n == "hir" else None)
            for n in wanted], status, opened


def evaluate_published_window(store, spec: WindowSpec, key: str, config: WindowEvalConfig = WindowEvalConfig(),
                              truth: pa.Table | None = None, previous: WindowOutcome | None = None) -> WindowOutcome | WindowSkipped:
    """HIR and the baselines on window `key` (see the module docstring); `truth`: planted interests (synthetic).

    `previous`: an earlier window's outcome in this process to warm-start from (instead of the store's saved state);
    a benchmark over a read-only store passes each window's outcome to the next."""
    reason = skip_reason(store, spec, key)
    if reason:
        return WindowSkipped(key, reason)
    window = spec.window(key)
    end_us = to_us(window.end)
    opened: list[tuple[str, str]] = []
    depth = max(config.eval.recall_ks + config.eval.ndcg_ks)
    nxt = spec.next(window)
    hir, status, hir_opened = hir_methods(store, key, end_us, config.methods, depth, config.inductive,
                                          to_us(nxt.end) if nxt is not None else None, config)
    opened += hir_opened
    if not hir and status.reason is not None and status.reason != "not requested":
        log.warning("window %s: HIR not evaluated: %s", key, status.reason)
    methods = make_methods(config.methods, config.baselines, hir)

    restored, source = [], None
    if config.warm_start and previous is not None and previous.evaluation.window < key:
        states = {m.name: method_state(m) for m in previous.methods}
        restored = [m.name for m in methods if restore_state(m, states.get(m.name, {}))]
        source = previous.evaluation.window
    elif config.warm_start and (source := previous_state_key(store, key)):
        restored = load_states(store.partition_dir(EVALUATION_ASSET, source) / STATE_FILE, methods)
        opened += [(EVALUATION_ASSET, source)] if restored else []
    warm_started_from = {m: source for m in restored}

    assignments = None
    if store.exists(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE):
        assignments = store.read(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE)
        opened.append((HIERARCHY_ASSET, key))

    def lift_features(pairs: PairFeatures) -> tuple[np.ndarray, tuple[str, ...]]:
        if assignments is None:
            return np.zeros((len(pairs.y), 0)), ()
        return primitive_affinity(assignments, pairs.user_ids, pairs.item_ids)

    lift = config.eval.lift_method
    eval_config = config.eval if lift in {m.name for m in methods} else replace(config.eval, lift_method="mf_als")
    reader = TableReader(store)
    result = evaluate_window(store, spec, key, methods, eval_config, reader, lift_features if hir else None)
    opened = reader.opened + opened
    if isinstance(result, WindowSkipped):
        return result
    if hir:
        inductive = hir[0].inductive
        status = replace(status, cold_users_encoded=inductive.cold_encoded, single_token_items=inductive.single_token_items,
                         rows=[m.name for m in hir])
    agreement = None
    if truth is not None and assignments is not None:
        agreement = planted_agreement(assignments, truth, config.truth_entity_types)
    return WindowOutcome(result, methods, status, warm_started_from, agreement, opened)


def future_reads(opened: list[tuple[str, str]], key: str, next_key: str, next_end_key: str | None = None) -> list[tuple[str, str]]:
    """Reads that break causality: any partition after t, except t+1 of the assets the protocol allows and window t's
    increments of the days of t+1 ([next_key, next_end_key): each reads nothing after its own day, a blocking check)."""
    return [(a, p) for a, p in opened if p > key and not (p == next_key and a in NEXT_WINDOW_ASSETS)
            and not (a == INCREMENT_ASSET and next_end_key is not None and next_key <= p < next_end_key)]
