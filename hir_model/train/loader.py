"""A prefetching loader: the next steps' batches are sampled on a background thread while the model trains on this one.

Each item is a pure function of its key (the trainer's step batches are seeded by (seed, step, shard)), and one worker
makes them in key order, so the items, and the training figures, are the same as without prefetching. The queue is
bounded (`depth` items ahead), a worker's exception is raised in the consumer at the item it broke, and leaving the
`with` block (normally, early, or on an exception in the training loop) stops and joins the worker.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

DEPTH = 2  # items made ahead of the consumer: one in the queue being trained on next, one being sampled
_END = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher(Generic[K, V]):
    """Iterates make(key) for key in keys, made up to `depth` items ahead on one background thread."""

    def __init__(self, make: Callable[[K], V], keys: Iterable[K], depth: int = DEPTH):
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be >= 1, got {depth}")
        self._make, self._keys = make, iter(keys)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="hir-prefetch", daemon=True)
        self._done = False
        self._thread.start()

    def _put(self, item: object) -> bool:
        """Blocks while the queue is full; False once the consumer has stopped us."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for key in self._keys:
                if self._stop.is_set() or not self._put(self._make(key)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))
            return
        self._put(_END)

    def __iter__(self) -> Iterator[V]:
        return self

    def __next__(self) -> V:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the worker (it finishes the item it is making) and wait for it."""
        self._stop.set()
        self._done = True
        while self._thread.is_alive():
            try:  # unblock a worker waiting on a full queue
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher[K, V]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
