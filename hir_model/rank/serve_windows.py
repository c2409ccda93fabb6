"""`hir serve`'s snapshots: the newest materialised window with its increments, loaded, extended and switched in the
background (hir_model.rank.serve's docstring)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from hir_model.rank.audience import AudienceConfig
from hir_model.rank.increment import INCREMENT_ASSET, manifests, read_increment
from hir_model.rank.recommender import Recommender
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET

log = logging.getLogger("hir.serve")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # loopback unless an operator opens it
    port: int = 8000
    window: str | None = None  # serve this window only (None: the newest materialised, switching to newer ones)
    poll_seconds: float = 30.0  # how often the store is looked at for a newer window and new increments
    access_log: bool = False  # one log line per request
    audience: AudienceConfig | None = None  # the served audiences' config (None: the library's defaults)
    graceful_seconds: int = 30  # on SIGINT/SIGTERM, how long requests in flight may take to finish


def materialised_windows(store) -> list[str]:
    """Windows with both ranking_head and bom_index committed, oldest first (keys sort by date)."""
    return sorted(set(store.partitions(HEAD_ASSET)) & set(store.partitions(BOM_ASSET)))


@dataclass(frozen=True)
class Served:
    """One window with its increments, ready to answer: what a request reads once at its start."""

    rec: Recommender
    loaded_at: float  # time.time() when it was ready
    load_seconds: float
    digests: tuple[tuple[str, str], ...] = ()  # (day, digest) of each increment served, oldest day first

    @property
    def increments(self) -> list[dict]:
        """Per day served: its key, the items it added and its digest."""
        items: dict[str, int] = {}
        for inc in self.rec.increments:
            items[inc.day] = items.get(inc.day, 0) + len(inc)
        return [{"day": d, "items": items.get(d, 0), "digest": g} for d, g in self.digests]


def load_served(store, window: str) -> Served:
    """Window `window` and its published increments loaded completely, the encoder for context queries included
    (FileNotFoundError naming what is missing)."""
    start = time.perf_counter()
    rec = Recommender.load(store, window, increments=True)
    rec.inductive  # noqa: B018 - loaded now, not by the first context query after the swap
    return Served(rec, time.time(), time.perf_counter() - start, tuple((i.day, i.digest) for i in rec.increments))


def extend_served(store, served: Served) -> Served | None:
    """`served` with the window's increments published since it was loaded appended in place (None: nothing new): a new
    day's items, or the items a republished day added; a day that lost items or moved one, or disappeared, reloads the
    window (`load_served`)."""
    rec = served.rec
    start = time.perf_counter()
    current = {d: m["digest"] for d, m in manifests(store, rec.window, rec.state.end_us).items()}
    before = dict(served.digests)
    if current == before:
        return None
    if set(before) - set(current):
        return load_served(store, rec.window)
    added = []
    for day, digest in current.items():
        if before.get(day) == digest:
            continue
        inc = read_increment(store.partition_dir(INCREMENT_ASSET, day))
        old = [e for i in rec.increments if i.day == day for e in i.item_ids]
        fresh = np.array([e not in rec.item_row for e in inc.item_ids], bool)
        kept = np.flatnonzero(~fresh)
        same = set(old) <= set(inc.item_ids[kept]) and len(kept) == len(old) and np.allclose(
            rec.items.vectors[[rec.item_row[e] for e in inc.item_ids[kept]]], inc.vectors[kept], atol=1e-6)
        if not same:
            return load_served(store, rec.window)
        added.append(inc.take(np.flatnonzero(fresh)))
    extended = rec.with_increments(added)
    return Served(extended, time.time(), time.perf_counter() - start, tuple(current.items()))


class WindowSwitcher:
    """Holds the served window; a daemon thread polls the store and swaps in newer windows once they are loaded."""

    def __init__(self, store, config: ServeConfig):
        self.store, self.config = store, config
        window = config.window
        if window is None:
            windows = materialised_windows(store)
            if not windows:
                raise FileNotFoundError(f"no window under {store.root} has both {HEAD_ASSET} and {BOM_ASSET}: materialise "
                                        f"one first (or pin one with --window)")
            window = windows[-1]
        self.served = load_served(store, window)
        self._log_ready(self.served, None)
        self.started = time.monotonic()
        self.switches = 0
        self.increment_updates = 0  # snapshots swapped in for new increments of the served window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: tuple[str, str] | None = None  # the last failed load (window, message), logged once

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hir-serve-poller", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a load in progress only reads files: a daemon thread left behind is harmless

    def _run(self) -> None:
        while not self._stop.wait(self.config.poll_seconds):
            try:
                self.poll()
            except Exception:  # the poller must outlive a bad window or a flaky store
                log.exception("looking for a newer window failed; still serving %s", self.served.rec.window)

    def poll(self) -> bool:
        """Load and swap in the newest materialised window if it is newer than the one served (unless pinned), else the
        served window's new increments; True if it swapped."""
        windows = [] if self.config.window is not None else materialised_windows(self.store)
        current = self.served.rec.window
        if not windows or windows[-1] <= current:  # never backwards (a re-run briefly hides its partition)
            return self._poll_increments()
        window = windows[-1]
        try:
            served = load_served(self.store, window)
        except Exception as exc:
            if self._failed != (window, str(exc)):
                log.warning("window %s could not be loaded (still serving %s): %s", window, current, exc)
                self._failed = (window, str(exc))
            return False
        self.served = served  # the one reference requests read: old requests keep theirs
        self.switches += 1
        self._log_ready(served, current)
        return True

    def _poll_increments(self) -> bool:
        served = self.served
        try:
            extended = extend_served(self.store, served)
        except Exception as exc:
            if self._failed != (served.rec.window, str(exc)):
                log.warning("the increments of window %s could not be loaded (still serving %d of them): %s",
                            served.rec.window, len(served.digests), exc)
                self._failed = (served.rec.window, str(exc))
            return False
        if extended is None:
            return False
        self.served = extended  # the one reference requests read: old requests keep theirs
        self.increment_updates += 1
        log.info("window %s: increments %s served (%d items arrived, %d in all), in %.2fs", extended.rec.window,
                 ", ".join(d for d, _ in extended.digests), extended.rec.arrived_items, extended.rec.n_items,
                 extended.load_seconds)
        return True

    @staticmethod
    def _log_ready(served: Served, previous: str | None) -> None:
        rec = served.rec
        what = f"switched from window {previous} to {rec.window}" if previous else f"serving window {rec.window}"
        log.info("%s: %d items (%d from %d increments), %d users, loaded in %.2fs", what, rec.n_items, rec.arrived_items,
                 len(served.digests), len(rec.user_index), served.load_seconds)

    def health(self) -> dict:
        served = self.served
        rec = served.rec
        return {"status": "ok", "window": rec.window, "items": rec.n_items, "window_items": rec.n_window,
                "arrived_items": rec.arrived_items, "increments": served.increments, "users": len(rec.user_index),
                "uptime_seconds": round(time.monotonic() - self.started, 3), "window_loaded_at": served.loaded_at,
                "switches": self.switches, "increment_updates": self.increment_updates,
                "pinned": self.config.window is not None}
