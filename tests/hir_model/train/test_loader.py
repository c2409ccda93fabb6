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


def fail_at_3(key: int) -> int:
    if key == 3:
        raise ValueError("bad batch 3")
    return key


def test_worker_processes_make_the_same_items_in_key_order_and_raise_where_one_broke():
    from hir_model.train.loader import ProcessPrefetcher
    with ProcessPrefetcher(make, range(12), workers=2, depth=2) as p:
        got = list(p)
    assert len(got) == 12 and all(np.array_equal(a, make(k)) for k, a in zip(range(12), got))
    assert not p.alive
    got = []
    with pytest.raises(ValueError, match="bad batch 3"), ProcessPrefetcher(fail_at_3, range(10), workers=2) as p:
        for item in p:
            got.append(item)
    assert got == [0, 1, 2] and not p.alive


def test_a_lean_step_filled_on_the_device_equals_the_full_step():
    """What worker processes ship (node indices; no content, structure or hash codes) plus NodeTables gives the very
    tensors a full step batch collates to: the sampler's per-node columns are lookups by node."""
    from dataclasses import fields, replace

    import torch

    from hir_model.train.config import with_overrides
    from hir_model.train.data import step_batch
    from hir_model.train.loader import NodeTables, ReadyStep, lean_inputs
    from tests.hir_model.train.tiny import tiny_config, tiny_data
    data, _ = tiny_data()
    rng = np.random.default_rng(0)
    has = rng.random(data.graph.num_nodes) < 0.7
    data = replace(data, content=np.where(has[:, None], rng.normal(size=(data.graph.num_nodes, 5)), 0).astype(np.float32),
                   has_content=has)
    cfg = with_overrides(tiny_config(pair_batch=4, shared_negatives=4), {"encoder": {"structure_dim": 8}})
    full = ReadyStep.of(step_batch(data, cfg, 3, 0)).to(torch.device("cpu"))
    lean_data, lean_cfg = lean_inputs(data, cfg)
    lean = ReadyStep.of(step_batch(lean_data, lean_cfg, 3, 0), lean=True)
    assert lean.narrow.node is not None and lean.narrow.content is None and lean.narrow.hash_codes.shape[-1] == 0
    filled = lean.to(torch.device("cpu"), NodeTables(data, 8, torch.device("cpu")))
    for view in ("narrow", "broad"):
        a, b = getattr(filled, view), getattr(full, view)
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert (x is None) == (y is None), (view, f.name)
            if x is not None:
                assert x.dtype == y.dtype and torch.equal(x, y), (view, f.name)
    assert filled.pairs == full.pairs and np.array_equal(filled.sign, full.sign)


def test_without_room_in_shared_memory_items_come_back_through_pipes_unchanged():
    import torch

    from hir_model.train.loader import ProcessPrefetcher, ReadyStep
    from hir_model.train.data import step_batch
    from tests.hir_model.train.tiny import tiny_config, tiny_data
    data, _ = tiny_data()
    cfg = tiny_config()

    def ready(key: int) -> list:
        return [ReadyStep.of(step_batch(data, cfg, key, 0))]

    with ProcessPrefetcher(ready, range(3), workers=2, via_shm=False) as p:
        got = list(p)
    assert p.transport == "pipe"
    for key, [item] in zip(range(3), got):
        [expected] = ready(key)
        assert isinstance(item.broad.hash_codes, torch.Tensor) and isinstance(item.sign, np.ndarray)
        assert torch.equal(item.broad.hash_codes, expected.broad.hash_codes) and torch.equal(item.narrow.depth, expected.narrow.depth)
        assert np.array_equal(item.sign, expected.sign)
