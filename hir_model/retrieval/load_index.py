"""A materialised window's Bag-of-Meaning index read back from the store (built by hir_model.rank.bom_index): the
retriever over the ranking head's items, its tuned candidate budget and the primitives' labels."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hir_model.embed import EntityEmbeddings
from hir_model.embed.entity_embeddings import load_embeddings
from hir_model.hierarchy.build import HIERARCHY_ASSET, PRIMITIVES_FILE
from hir_model.retrieval.index import BOM_ASSET, PROBE_FILE, Retriever
from hir_model.storage import PartitionStore


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
