"""One window's ranking-head state from the published tables (what the `ranking_head` asset computes): window t's
engagement history (raw_events <= t), the items catalog(t) knows by end(t), the published rows, graph(t) and the
checkpoint's temperature. Nothing of t+1 is read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.protocol.split import CATALOG_COLUMNS, EVENT_COLUMNS, SplitConfig, build_train, to_us
from hir_model.rank.artefacts import load_artefacts, missing_artefacts
from hir_model.rank.head import HeadConfig
from hir_model.rank.inductive import InductiveEncoder
from hir_model.rank.state import HeadState, fit_head


def history_table(store, spec: WindowSpec, key: str, config: SplitConfig = SplitConfig()) -> tuple[pa.Table, list[str]]:
    """Engagement events of every window <= `key` with ts < end(key), and the partitions read."""
    window = spec.window(key)
    parts, read = [], []
    for w in spec.windows():
        if w.end > window.end or not store.exists(EVENTS_ASSET, w.key, EVENTS_FILE):
            continue
        table = store.read(EVENTS_ASSET, w.key, EVENTS_FILE, columns=EVENT_COLUMNS)
        table = table.filter(pc.is_in(table["event_type"], pa.array(config.engagement_types, pa.string())))
        parts.append(table.filter(pc.less(table["ts"], pa.scalar(window.end, table["ts"].type))))
        read.append(w.key)
    if not parts:
        raise FileNotFoundError(f"no {EVENTS_ASSET} of a window <= {key} is materialised under {store.root}")
    return pa.concat_tables(parts), read


def build_head_state(store, spec: WindowSpec, key: str, config: HeadConfig = HeadConfig(),
                     split: SplitConfig = SplitConfig()) -> HeadState:
    """Window `key`'s head state (hir_model.rank.state); FileNotFoundError naming a missing input."""
    missing = missing_artefacts(store, key)
    if missing:
        raise FileNotFoundError(missing)
    if not store.exists(CATALOG_ASSET, key, ENTITIES_FILE):
        raise FileNotFoundError(f"{CATALOG_ASSET} for {key} is not materialised")
    window = spec.window(key)
    history, _ = history_table(store, spec, key, split)
    catalog = store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=CATALOG_COLUMNS)
    train, items = build_train(history, catalog, window, split)
    inductive = InductiveEncoder(load_artefacts(store, key, to_us(window.end)))
    types = dict(zip(catalog["entity_id"].to_pylist(), catalog["entity_type"].to_pylist()))
    graph = inductive.artefacts.graph
    nodes = inductive.item_nodes(items)
    strength_at = None if graph is None else (lambda cut: graph.strength_at(nodes, cut))
    return fit_head(train, items.ids, np.array([types[i] for i in items.ids], object), inductive.item_vectors(items),
                    strength_at, inductive.artefacts.prior_scale, inductive.item_structure(items), config)
