"""The prefetching loader: same items in the same order as without it, bounded, errors raised where they happen, and a
worker that never outlives its `with` block."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hir_model.train.loader import Prefetcher


def make(key: int) -> np.ndarray:
    return np.random.default_rng([7, key]).random(3)  # a pure function of the key, like the trainer's step batches


def test_items_are_the_keys_made_in_order_as_without_prefetching():
    with Prefetcher(make, range(20), depth=3) as p:
        got = list(p)
    assert len(got) == 20 and all(np.array_equal(a, make(k)) for k, a in zip(range(20), got))
    assert not p.alive


def test_the_worker_runs_at_most_depth_items_ahead():
    made = []

    def record(key):
        made.append(key)
        return key

    with Prefetcher(record, range(100), depth=2) as p:
        assert next(p) == 0
        time.sleep(0.3)  # time to run ahead, were the queue unbounded
        assert len(made) <= 1 + 2 + 1  # the one consumed, a full queue, the one waiting to be put
    assert not p.alive and len(made) < 100


def test_a_worker_error_is_raised_in_the_consumer_at_its_item():
    def fail_at_3(key):
        if key == 3:
            raise ValueError("bad batch 3")
        return key

    got = []
    with pytest.raises(ValueError, match="bad batch 3"), Prefetcher(fail_at_3, range(10)) as p:
        for item in p:
            got.append(item)
    assert got == [0, 1, 2] and not p.alive


def test_an_error_in_the_training_loop_stops_and_joins_the_worker():
    started = threading.active_count()
    with pytest.raises(RuntimeError, match="loss went NaN"), Prefetcher(make, range(10_000), depth=2) as p:
        for i, _ in enumerate(p):
            if i == 2:
                raise RuntimeError("loss went NaN")
    assert not p.alive and threading.active_count() == started


def test_leaving_early_stops_the_worker_and_depth_must_be_positive():
    with Prefetcher(make, iter(range(10_000))) as p:
        next(p)
    assert not p.alive
    with pytest.raises(StopIteration):
        next(p)
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(make, range(3), depth=0)
