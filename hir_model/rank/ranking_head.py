"""One window's ranking-head state from the published tables (what the `ranking_head` asset computes): window t's
engagement history (raw_events <= t), the items catalog(t) knows by end(t), the published rows, graph(t) and the
checkpoint's temperature; and head(t-1) with the rows of t-1, judged on window t (the prior's track record). Nothing of
t+1 is read."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import WindowSpec
from hir_model.embed.content_map import content_rows
from hir_model.embed.entities import EMBEDDINGS_ASSET
from hir_model.embed.entity_embeddings import load_embeddings
from hir_model.protocol.split import CATALOG_COLUMNS, EVENT_COLUMNS, Interactions, SplitConfig, build_train, to_us
from hir_model.rank.artefacts import load_artefacts, missing_artefacts
from hir_model.rank.examples import train_rankers, window_examples
from hir_model.rank.head import HeadConfig
from hir_model.rank.inductive import InductiveEncoder
from hir_model.rank.recommender import user_rows
from hir_model.rank.ranker import RankerConfig
from hir_model.rank.state import HEAD_ASSET, HeadState, fit_head, read_examples, read_head
from hir_model.rank.track import TrackRecord, track_record


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
                     split: SplitConfig = SplitConfig(), ranker: RankerConfig = RankerConfig()) -> HeadState:
    """Window `key`'s head state (hir_model.rank.state) with its learned rankers (hir_model.rank.examples: trained on
    head(t-1)'s examples judged by window t and those the earlier heads published); FileNotFoundError naming a missing
    input."""
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
    previous = previous_head(store, spec, key, train, items.ids)
    track = head_track(previous, key, config) if config.track_min_users is not None else ()
    table = inductive.artefacts.content
    content = content_rows(table, items.ids)[0] if config.content_weight and table is not None else None
    state = fit_head(train, items.ids, np.array([types[i] for i in items.ids], object), inductive.item_vectors(items),
                     strength_at, inductive.artefacts.prior_scale, inductive.item_structure(items), config, track,
                     content)
    if not ranker.enabled:
        return replace(state, ranker_config=ranker, ranker_note="off (RankerConfig.enabled): the head's hand-set score")
    examples = window_examples(*previous, ranker) if previous is not None else None
    earlier = earlier_examples(store, spec, key, ranker.windows - 1)
    rankers, note = train_rankers(earlier + [examples], ranker)
    return replace(state, rankers=tuple(r for r in rankers.values() if r is not None), ranker_config=ranker,
                   ranker_note=note, examples=examples)


def earlier_examples(store, spec: WindowSpec, key: str, n: int) -> list:
    """The ranker examples published by the `n` heads before window `key` that have them, oldest first."""
    keys = [w.key for w in spec.windows() if w.key < key and store.exists(HEAD_ASSET, w.key)]
    out = []
    for k in reversed(keys):
        if len(out) >= n:
            break
        table = read_examples(store.partition_dir(HEAD_ASSET, k))
        if table is not None:
            out.append(table)
    return out[::-1]


def previous_head(store, spec: WindowSpec, key: str, train: Interactions, item_ids: np.ndarray):
    """(head(t-1)'s state, its users' rows of entity_embeddings(t-1), which exist, window t's engagements on its items
    as (user_id, item row, deep)); None when t-1 has no published head or rows."""
    prev = spec.previous(spec.window(key))
    if prev is None or not store.exists(HEAD_ASSET, prev.key) or not store.exists(EMBEDDINGS_ASSET, prev.key):
        return None
    state = read_head(store.partition_dir(HEAD_ASSET, prev.key))
    rows, has = user_rows(load_embeddings(store, prev.key), state.history.user_ids)
    new = train.ts >= state.end_us
    pos = np.searchsorted(state.item_ids, item_ids[train.item[new]])
    pos = np.minimum(pos, state.n_items - 1)
    found = state.item_ids[pos] == item_ids[train.item[new]]  # items head(t-1) knew
    later = pd.DataFrame({"user_id": train.user_ids[train.user[new]][found], "item": pos[found],
                          "deep": train.deep[new][found]})
    return state, rows, has, later


def head_track(previous, key: str, config: HeadConfig) -> tuple[TrackRecord, ...]:
    """The track records head(t) weighs its prior by (hir_model.rank.track): head(t-1)'s, and head(t-1) judged on
    window t's engagements (events < end(t)) with its users' rows of entity_embeddings(t-1); () when there is no
    `previous_head`."""
    if previous is None:
        return ()
    state, rows, has, later = previous
    if state.log_prior is None:
        return state.track
    record = track_record(state.history, state.vectors, state.log_prior, rows, has, config, later, key,
                          similarity=state.coengagement)
    return state.track + ((record,) if record is not None else ())
