"""One (window, objective) adapter from the published tables (what the `objective_adapter` asset computes).

Inputs: `entity_embeddings` of window t; `raw_events` of every window up to t (events with ts < end(t) train
the adapter); `raw_events` of window t+1, read for the gain only (evaluation, never training). Outputs, in one
partition folder `<window>__<objective>` of `objective_adapter`: `adapter.pt` + `adapter.json` when an adapter
was fitted, and always `metrics.json` (what was done, or why it was skipped).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from hir_model.adapter.fit import (ENGAGEMENT_TYPES, OBJECTIVES, AdapterConfig, AdapterFit, EmbeddingSpace, Gain, event_rows,
                                   fit_adapter, next_window_gain, save_adapter)
from hir_model.data.tables import EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import Window
from hir_model.embed import EMBEDDINGS_ASSET, EMBEDDINGS_FILE
from hir_model.graph.window import to_us
from hir_model.storage import PartitionStore, Staging

ADAPTER_ASSET, METRICS_FILE = "objective_adapter", "metrics.json"
EVENT_COLUMNS = ["user_id", "entity_id", "event_type", "ts"]


def adapter_partition(window_key: str, objective: str) -> str:
    """The storage partition of one (window, objective): a flat folder name, sorted by window."""
    return f"{window_key}__{objective}"


@dataclass(frozen=True)
class AdapterRun:
    window: str
    objective: str
    skipped: str  # why no adapter was fitted ("" when one was)
    fit: AdapterFit | None
    gain: Gain | None
    gain_note: str  # why there is no gain ("" when there is one)
    events_used: int  # objective events up to end(t) whose user and item both have an embedding
    objective_events: int  # objective events up to end(t) in raw_events
    event_windows: list[str] = field(default_factory=list)  # raw_events partitions read for training
    successor: str | None = None  # window t+1's key when its raw_events were read
    seconds: float = 0.0

    def metrics(self) -> dict:
        """JSON-able summary (NaN as None), what `metrics.json` holds."""
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
        out = {"window": self.window, "objective": self.objective, "status": "skipped" if self.skipped else "trained",
               "skipped": self.skipped, "gain_note": self.gain_note, "events_used": self.events_used,
               "objective_events": self.objective_events, "event_windows": self.event_windows, "successor": self.successor,
               "seconds": round(self.seconds, 3)}
        if self.fit is not None:
            ok, first, last = self.fit.loss_decreased()
            out |= {"steps": len(self.fit.losses), "pairs": self.fit.pairs, "losses": [round(x, 5) for x in self.fit.losses],
                    "first_loss": first, "final_loss": last, "loss_decreased": ok, "fit_seconds": round(self.fit.seconds, 3)}
        if self.gain is not None:
            out["gain"] = {k: clean(v) for k, v in self.gain.as_dict().items()}
        return out


def history_events(store: PartitionStore, key: str) -> tuple[pa.Table, list[str]]:
    """Engagement events of every materialised raw_events window up to `key` (the caller cuts at end(t))."""
    keys = [p for p in store.partitions(EVENTS_ASSET) if p <= key and store.exists(EVENTS_ASSET, p, EVENTS_FILE)]
    tables = [store.read(EVENTS_ASSET, p, EVENTS_FILE, columns=EVENT_COLUMNS) for p in keys]
    tables = [t.filter(pc.is_in(t.column("event_type"), pa.array(ENGAGEMENT_TYPES))) for t in tables]
    return (pa.concat_tables(tables) if tables else _empty_events()), keys


def _empty_events() -> pa.Table:
    return pa.table({"user_id": pa.array([], pa.string()), "entity_id": pa.array([], pa.string()),
                     "event_type": pa.array([], pa.string()), "ts": pa.array([], pa.timestamp("us", tz="UTC"))})


def adapt_window(store: PartitionStore, window: Window, next_window: Window | None, objective: str,
                 config: AdapterConfig = AdapterConfig()) -> AdapterRun:
    """Fit the objective's adapter on window t's embeddings and events up to end(t); its gain on t+1's events."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    start = time.perf_counter()
    if not store.exists(EMBEDDINGS_ASSET, window.key, EMBEDDINGS_FILE):
        raise FileNotFoundError(f"{EMBEDDINGS_ASSET} for window {window.key} was never materialised under {store.root}")
    space = EmbeddingSpace.from_table(store.read(EMBEDDINGS_ASSET, window.key, EMBEDDINGS_FILE))
    history, keys = history_events(store, window.key)
    end_us = to_us(window.end)
    rows = event_rows(space, history, (objective,), None, end_us)
    base = {"window": window.key, "objective": objective, "events_used": len(rows.user), "objective_events": rows.selected,
            "event_windows": keys}
    n_pairs = len(set(zip(rows.user.tolist(), rows.item.tolist())))
    if n_pairs < 2:
        why = (f"no {objective} events up to {window.end:%Y-%m-%d} in raw_events ({len(keys)} windows read)" if rows.selected == 0
               else f"{rows.selected} {objective} events up to {window.end:%Y-%m-%d}, but only {n_pairs} distinct (user, item) "
                    f"pairs with both ends embedded (2 needed)")
        return AdapterRun(skipped=why, fit=None, gain=None, gain_note="no adapter", seconds=time.perf_counter() - start, **base)
    fit = fit_adapter(space, rows.user, rows.item, config)
    gain, note, successor = None, "", None
    if next_window is None:
        note = "no successor window"
    elif not store.exists(EVENTS_ASSET, next_window.key, EVENTS_FILE):
        note = f"no successor window: raw_events for {next_window.key} is not materialised"
    else:
        successor = next_window.key
        future = store.read(EVENTS_ASSET, next_window.key, EVENTS_FILE, columns=EVENT_COLUMNS)
        gain = next_window_gain(fit.adapter, space, history, future, objective, end_us, to_us(next_window.end), config.k, config.seed)
        if gain.users == 0:
            note = f"no warm user has a new {objective} item in {next_window.key} ({gain.next_events} {objective} events)"
    return AdapterRun(skipped="", fit=fit, gain=gain, gain_note=note, successor=successor,
                      seconds=time.perf_counter() - start, **base)


def write_adapter(staging: Staging, run: AdapterRun) -> str:
    """Stage the partition's files (the adapter when one was fitted, metrics.json always); returns the partition."""
    part = adapter_partition(run.window, run.objective)
    folder = staging.path(ADAPTER_ASSET, part)
    if run.fit is not None:
        save_adapter(folder, run.fit.adapter, {"window": run.window, "objective": run.objective})
    (folder / METRICS_FILE).write_text(json.dumps(run.metrics(), indent=1, sort_keys=True) + "\n")
    return part
