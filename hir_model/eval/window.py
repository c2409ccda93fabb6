"""One window's full evaluation from the published tables: what the `window_evaluation` asset computes.

HIR (window t's `entity_embeddings`, `hir_encoder`, `engagement_graph`, `content_embeddings`) and the baselines are
scored on the same split of t+1 (`hir_model.eval.run`); on top of the ranking table:
- the downstream conversion model with and without HIR's pair features (embedding score of warm users and, when
  `interest_hierarchy` of t exists, per-level primitive affinities, i.e. shared BoM tokens weighted);
- with planted ground truth (synthetic source): NMI and ARI per level of the hierarchy's top primitives;
- when `bom_index` of t exists: BoM vs exact top-20 agreement for the warm users evaluated;
- the stateful baselines warm-start from the latest earlier window's saved state (never a later one).

Reads: raw_events <= t+1, entity_catalog t and t+1, content_embeddings t and t+1 (new items only), and window t's
HIR artefacts. `opened` lists every (asset, partition) read, so the asset can check that nothing else was.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa

from hir_model.data.tables import CATALOG_ASSET, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.eval.agreement import LevelAgreement, planted_agreement, primitive_affinity
from hir_model.eval.baselines import BaselinesConfig, baselines
from hir_model.eval.artefacts import load_artefacts, missing_artefacts
from hir_model.eval.hir import HIR, HIRMethodConfig
from hir_model.eval.lift import PairFeatures
from hir_model.eval.method import Method
from hir_model.eval.publish import (EVALUATION_ASSET, STATE_FILE, load_states, method_state, previous_state_key,
                                    restore_state)
from hir_model.eval.run import CONTENT_ASSET, EvalConfig, TableReader, WindowEvaluation, WindowSkipped, evaluate_window
from hir_model.eval.split import to_us

log = logging.getLogger("hir")

HIERARCHY_ASSET, ASSIGNMENTS_FILE, BOM_ASSET = "interest_hierarchy", "assignments", "bom_index"
ALL_METHODS = ("hir", "popularity", "content", "mf_als", "lightgcn")
NEXT_WINDOW_ASSETS = (EVENTS_ASSET, CATALOG_ASSET, CONTENT_ASSET)  # the only assets whose t+1 partition may be read


@dataclass(frozen=True)
class WindowEvalConfig:
    eval: EvalConfig = EvalConfig(lift_method="hir")
    baselines: BaselinesConfig = BaselinesConfig()
    hir: HIRMethodConfig = HIRMethodConfig()
    methods: tuple[str, ...] = ALL_METHODS  # report columns, in order
    warm_start: bool = True  # stateful baselines start from the latest earlier window's saved state
    bom_k: int = 20  # BoM vs exact top-k agreement
    truth_entity_types: tuple[str, ...] = ("product",)  # planted-interest agreement on these entities


@dataclass(frozen=True)
class WindowOutcome:
    evaluation: WindowEvaluation
    methods: list[Method]  # fitted (their state is what the next window warm-starts from)
    extras: dict = field(default_factory=dict)  # HIR status, agreement, BoM recall, warm start (JSON-ready)
    agreement: list[LevelAgreement] = field(default_factory=list)
    opened: list[tuple[str, str]] = field(default_factory=list)  # (asset, partition) read, in order


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


def make_methods(names: tuple[str, ...], config: BaselinesConfig, hir: HIR | None) -> list[Method]:
    pool = {m.name: m for m in baselines(config)}
    if hir is not None:
        pool[hir.name] = hir
    return [pool[n] for n in names if n in pool]


def _bom_agreement(store, key: str, users: np.ndarray, k: int) -> dict | None:
    from hir_model.retrieval.calibrate import recall_at_k
    from hir_model.retrieval.window import load_window_index

    if not store.exists(BOM_ASSET, key):
        return None
    retriever = load_window_index(store, key).retriever
    users = [u for u in users if u in retriever.emb_row]
    if not users:
        return None
    r = recall_at_k(retriever, users, k)
    return {"k": k, "recall": r.recall, "queries": r.queries, "candidates_per_query": r.candidates_per_query, "items": r.items}


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
    extras: dict = {}
    hir_missing = missing_artefacts(store, key) if "hir" in config.methods else "not requested"
    hir = None
    if hir_missing is None:
        artefacts = load_artefacts(store, key, end_us)
        hir = HIR(artefacts, config.hir)
        opened += [("hir_encoder", key), ("entity_embeddings", key)]
        opened += [("engagement_graph", key)] if artefacts.graph is not None else []
        opened += [(CONTENT_ASSET, key)] if artefacts.content is not None else []
        extras["hir"] = {"evaluated": True, "model_version": artefacts.model.version, "cold_users": config.hir.cold_users}
    else:
        extras["hir"] = {"evaluated": False, "reason": hir_missing}
        log.warning("window %s: HIR not evaluated: %s", key, hir_missing)
    methods = make_methods(config.methods, config.baselines, hir)

    restored, source = [], None
    if config.warm_start and previous is not None and previous.evaluation.window < key:
        states = {m.name: method_state(m) for m in previous.methods}
        restored = [m.name for m in methods if restore_state(m, states.get(m.name, {}))]
        source = previous.evaluation.window
    elif config.warm_start and (source := previous_state_key(store, key)):
        restored = load_states(store.partition_dir(EVALUATION_ASSET, source) / STATE_FILE, methods)
        opened += [(EVALUATION_ASSET, source)] if restored else []
    extras["warm_started_from"] = {m: source for m in restored}

    assignments = None
    if store.exists(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE):
        assignments = store.read(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE)
        opened.append((HIERARCHY_ASSET, key))

    def lift_features(pairs: PairFeatures) -> tuple[np.ndarray, tuple[str, ...]]:
        if assignments is None:
            return np.zeros((len(pairs.y), 0)), ()
        return primitive_affinity(assignments, pairs.user_ids, pairs.item_ids)

    eval_config = config.eval if hir is not None else replace(config.eval, lift_method="mf_als")
    reader = TableReader(store)
    result = evaluate_window(store, spec, key, methods, eval_config, reader, lift_features if hir is not None else None)
    opened = reader.opened + opened
    if isinstance(result, WindowSkipped):
        return result
    if hir is not None:
        extras["hir"].update(cold_users_encoded=hir.cold_encoded, single_token_items=hir.single_token_items,
                             prior_scale=hir.prior_scale, prior_weight=hir.prior_weight,  # as fitted on window t (readout)
                             prior_calibration=hir.calibration.as_dict() if hir.calibration is not None else None,
                             recent_weight=config.hir.recent_weight, recent_half_life_days=config.hir.recent_half_life_days,
                             kernel_weight=config.hir.kernel_weight, kernel_temp=config.hir.kernel_temp,
                             cold_structure_weight=config.hir.cold_structure_weight, cold_prior_days=config.hir.cold_prior_days,
                             cold_prior_weight=config.hir.cold_prior_weight,
                             cold_prior_half_life_days=config.hir.cold_prior_half_life_days,
                             structural_readout=hir.structural_readout, cold_prior=hir.cold_prior is not None)
    agreement = []
    if truth is not None and assignments is not None:
        agreement = planted_agreement(assignments, truth, config.truth_entity_types)
        extras["agreement"] = [asdict(a) for a in agreement]
    if hir is not None:
        bom = _bom_agreement(store, key, hir.warm_users(), config.bom_k)
        if bom is not None:
            extras["bom_vs_exact"] = bom
            opened.append((BOM_ASSET, key))
    return WindowOutcome(result, methods, extras, agreement, opened)


def future_reads(opened: list[tuple[str, str]], key: str, next_key: str) -> list[tuple[str, str]]:
    """Reads that break causality: any partition after t, except t+1 of the assets the protocol allows."""
    return [(a, p) for a, p in opened if p > key and not (p == next_key and a in NEXT_WINDOW_ASSETS)]
