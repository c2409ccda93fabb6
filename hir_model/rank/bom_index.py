"""One window's Bag-of-Meaning index over the ranking head's items (what the `bom_index` asset computes), with its
candidate budget tuned against the head's exact ranking (hir_model.rank.tune); hir_model.retrieval.load_index reads it
back for queries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.embed.entity_embeddings import load_embeddings
from hir_model.hierarchy.build import ASSIGNMENTS_FILE, HIERARCHY_ASSET, PRIMITIVES_FILE
from hir_model.rank.recommender import Recommender, user_rows
from hir_model.rank.state import HEAD_ASSET, read_head
from hir_model.rank.tune import served_recall, tune_probe_factor
from hir_model.retrieval.index import PROBE_FILE, IndexConfig, Retriever, write_index
from hir_model.retrieval.tokens import PostingStats, bom_tokens, build_postings
from hir_model.storage import PartitionStore


@dataclass(frozen=True)
class BomBuild:
    tokens: pa.Table
    postings: PostingStats
    recall: object  # hir_model.rank.tune.RecallReport: served top-k vs the head's exact top-k on the check's users
    items: int
    levels: int
    entities: int
    missing_per_level: dict[int, int]  # entities with no token at a level (0 everywhere when sound)
    probe_factor: float  # candidates per query / (k + items already engaged), tuned unless the config fixes it
    calibration_recall: float  # the tuned factor's mean recall on the calibration users


def sample_users(user_ids: np.ndarray, n: int, seed: int = 0) -> list[str]:
    users = np.sort(np.asarray(user_ids, object).astype(str))
    rng = np.random.default_rng(seed)
    return list(rng.choice(users, size=min(n, len(users)), replace=False)) if len(users) else []


def build_window_index(store: PartitionStore, key: str, folder: Path, config: IndexConfig = IndexConfig()) -> BomBuild:
    """Write tokens, postings, items (the ranking head's, in its order) and the faiss index into `folder` (a staging
    folder); tune the candidate budget on calibration users and measure recall on other users."""
    for asset, name in ((HIERARCHY_ASSET, ASSIGNMENTS_FILE), (HEAD_ASSET, None)):
        if not store.exists(asset, key, name):
            raise FileNotFoundError(f"{asset} for window {key} was never materialised under {store.root}")
    emb = load_embeddings(store, key)
    state = read_head(store.partition_dir(HEAD_ASSET, key))
    tokens = bom_tokens(store.read(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE))
    postings, stats = build_postings(tokens, state.item_ids, config.max_posting_share)
    primitives = store.read(HIERARCHY_ASSET, key, PRIMITIVES_FILE, columns=["level", "primitive", "centroid"])
    n_items = write_index(folder, state.item_ids, state.item_types, state.vectors, tokens, postings, config, primitives)
    rows, has = user_rows(emb, state.history.user_ids)
    retriever = Retriever.load(folder, emb)
    retriever.ivf_scan = config.ivf_scan  # probe.json, which holds it for serving, is written once the budget is tuned
    rec = Recommender(state, rows, has, retriever)
    with_rows = state.history.user_ids[has]
    check = sample_users(with_rows, config.recall_users, config.seed)
    rest = np.setdiff1d(with_rows.astype(str), np.asarray(check, str))
    calibration = sample_users(rest, config.calibration_users, config.seed + 1)
    factor, calibrated = config.probe_factor, float("nan")
    if factor is None:
        factor, calibrated = tune_probe_factor(rec, calibration, config.recall_k, config.target_recall,
                                               config.max_candidate_share)
    (Path(folder) / PROBE_FILE).write_text(json.dumps({
        "probe_factor": factor, "weight_prior": config.weight_prior, "tuned": config.probe_factor is None, "k": config.recall_k,
        "target_recall": config.target_recall, "calibration_users": len(calibration),
        "calibration_recall": None if np.isnan(calibrated) else calibrated,
        **({"ivf_scan": config.ivf_scan} if n_items > config.exact_max else {})}) + "\n")  # an IVF index's probe width
    recall = served_recall(rec, check, config.recall_k, factor)
    levels = sorted(set(tokens["level"].to_pylist()))
    ids = set(emb.entity_id)
    missing = {lv: len(ids - set(tokens.filter(pc.equal(tokens["level"], lv))["entity_id"].to_pylist())) for lv in levels}
    return BomBuild(tokens, stats, recall, n_items, len(levels), len(emb), missing, factor, calibrated)
