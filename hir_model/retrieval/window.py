"""One window's Bag-of-Meaning index from the published tables (what the `bom_index` asset computes), and loading a
materialised window for queries (what `hir retrieve` does)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.embed import EntityEmbeddings
from hir_model.hierarchy.build import ASSIGNMENTS_FILE, PRIMITIVES_FILE
from hir_model.hierarchy.window import HIERARCHY_ASSET, load_embeddings
from hir_model.retrieval.calibrate import calibrate, recall_at_k, sample_users
from hir_model.retrieval.index import ITEM_TYPES, IndexConfig, RecallReport, Retriever, write_index
from hir_model.retrieval.tokens import PostingStats, bom_tokens, build_postings
from hir_model.storage import PartitionStore

BOM_ASSET = "bom_index"


@dataclass(frozen=True)
class BomBuild:
    tokens: pa.Table
    postings: PostingStats
    recall: RecallReport
    items: int
    levels: int
    entities: int
    missing_per_level: dict[int, int]  # entities with no token at a level (0 everywhere when sound)
    probe_factor: float  # candidates per query / k (adaptive: its ceiling; tuned unless the config fixes it)
    probe_margin: float | None  # adaptive budgets: a query takes the items within this of its best priority (None: fixed)


def build_window_index(store: PartitionStore, key: str, folder: Path, config: IndexConfig = IndexConfig()) -> BomBuild:
    """Write tokens, postings, items and the faiss index into `folder` (a staging folder); measure recall from them."""
    if not store.exists(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE):
        raise FileNotFoundError(f"{HIERARCHY_ASSET} for window {key} was never materialised under {store.root}")
    emb = load_embeddings(store, key)
    tokens = bom_tokens(store.read(HIERARCHY_ASSET, key, ASSIGNMENTS_FILE))
    items = emb.entity_id[np.isin(emb.entity_type, ITEM_TYPES)]
    postings, stats = build_postings(tokens, items, config.max_posting_share)
    primitives = store.read(HIERARCHY_ASSET, key, PRIMITIVES_FILE, columns=["level", "primitive", "centroid"])
    n_items = write_index(folder, emb, tokens, postings, config, primitives)
    users = sample_users(emb, config.recall_users, config.seed)
    factor = calibrate(folder, emb, users, config)  # on other users than the check's
    retriever = Retriever.load(folder, emb)
    recall = recall_at_k(retriever, users, config.recall_k)
    levels = sorted(set(tokens["level"].to_pylist()))
    ids = set(emb.entity_id)
    missing = {lv: len(ids - set(tokens.filter(pc.equal(tokens["level"], lv))["entity_id"].to_pylist())) for lv in levels}
    return BomBuild(tokens, stats, recall, n_items, len(levels), len(emb), missing, factor, retriever.probe_margin)


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
    available = store.partitions(BOM_ASSET)
    if not store.exists(BOM_ASSET, key):
        raise FileNotFoundError(f"window {key} was never materialised: no {BOM_ASSET}/{key} under {store.root} "
                                f"(materialised windows: {', '.join(available) or 'none'})")
    emb: EntityEmbeddings = load_embeddings(store, key)
    labels = {}
    if store.exists(HIERARCHY_ASSET, key, PRIMITIVES_FILE):
        prim = store.read(HIERARCHY_ASSET, key, PRIMITIVES_FILE, columns=["level", "primitive", "label"])
        labels = {f"L{lv}:{p}": lab or "" for lv, p, lab in zip(*(prim[c].to_pylist() for c in ("level", "primitive", "label")))}
    return WindowIndex(Retriever.load(store.partition_dir(BOM_ASSET, key), emb), labels)
