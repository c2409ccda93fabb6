"""One window's Bag-of-Meaning index over the ranking head's items (what the `bom_index` asset computes), its candidate
budget tuned against the head's exact ranking, and loading a materialised window's index for queries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.embed import EntityEmbeddings
from hir_model.embed.entity_embeddings import load_embeddings
from hir_model.hierarchy.build import ASSIGNMENTS_FILE, HIERARCHY_ASSET, PRIMITIVES_FILE
from hir_model.rank.state import HEAD_ASSET, read_head
from hir_model.retrieval.index import BOM_ASSET, PROBE_FILE, IndexConfig, Retriever, write_index
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
    from hir_model.rank.recommender import Recommender, user_rows
    from hir_model.rank.tune import served_recall, tune_probe_factor

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
    rec = Recommender(state, rows, has, Retriever.load(folder, emb))
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
        "calibration_recall": None if np.isnan(calibrated) else calibrated}) + "\n")
    recall = served_recall(rec, check, config.recall_k, factor)
    levels = sorted(set(tokens["level"].to_pylist()))
    ids = set(emb.entity_id)
    missing = {lv: len(ids - set(tokens.filter(pc.equal(tokens["level"], lv))["entity_id"].to_pylist())) for lv in levels}
    return BomBuild(tokens, stats, recall, n_items, len(levels), len(emb), missing, factor, calibrated)


def load_probe_factor(store: PartitionStore, key: str) -> float | None:
    """The window's tuned candidate budget (None: no probe.json)."""
    path = store.partition_dir(BOM_ASSET, key) / PROBE_FILE
    return json.loads(path.read_text()).get("probe_factor") if path.is_file() else None


def load_retriever(store: PartitionStore, key: str, emb: EntityEmbeddings | None = None) -> Retriever:
    if not store.exists(BOM_ASSET, key):
        raise FileNotFoundError(f"window {key} was never materialised: no {BOM_ASSET}/{key} under {store.root} "
                                f"(materialised windows: {', '.join(store.partitions(BOM_ASSET)) or 'none'})")
    return Retriever.load(store.partition_dir(BOM_ASSET, key), emb if emb is not None else load_embeddings(store, key))


@dataclass(frozen=True)
class WindowIndex:
    retriever: Retriever
    labels: dict[str, str]  # token -> label

    def describe(self, entity: str, per_level: int = 1) -> str:
        """The entity's heaviest tokens per level with their labels, e.g. `L0:3 (0.82, drama war)`."""
        by_level: dict[str, list[tuple[str, float]]] = {}
        for t, w in self.retriever.tokens.get(entity, ()):
            by_level.setdefault(t.split(":")[0], []).append((t, w))
        out = []
        for lv in sorted(by_level):
            for t, w in sorted(by_level[lv], key=lambda x: -x[1])[:per_level]:
                out.append(f"{t} ({w:.2f}{', ' + self.labels[t] if self.labels.get(t) else ''})")
        return " ".join(out)


def load_window_index(store: PartitionStore, key: str) -> WindowIndex:
    """A materialised window, ready for queries; FileNotFoundError naming what is missing otherwise."""
    retriever = load_retriever(store, key)
    labels = {}
    if store.exists(HIERARCHY_ASSET, key, PRIMITIVES_FILE):
        prim = store.read(HIERARCHY_ASSET, key, PRIMITIVES_FILE, columns=["level", "primitive", "label"])
        labels = {f"L{lv}:{p}": lab or "" for lv, p, lab in zip(*(prim[c].to_pylist() for c in ("level", "primitive", "label")))}
    return WindowIndex(retriever, labels)
