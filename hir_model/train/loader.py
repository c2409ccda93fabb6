"""What feeds the training loop: the next steps' batches, made while the model trains on this one.

- `Prefetcher`: one background thread (the CPU default). Each item is a pure function of its key (the trainer's step
  batches are seeded by (seed, step, shard)), and one worker makes them in key order, so the items, and the training
  figures, are the same as without prefetching. The queue is bounded (`depth` items ahead), a worker's exception is
  raised in the consumer at the item it broke, and leaving the `with` block (normally, early, or on an exception in the
  training loop) stops and joins the worker.
- `ProcessPrefetcher`: the same contract over several forked worker processes (torch's DataLoader: items in key order,
  optionally in pinned memory), for a GPU that one sampling process cannot keep busy. Tensors come back through shared
  memory (/dev/shm) where it has room, else pickled through the workers' pipes (containers often mount 64 MB there).
- `ReadyStep`: one shard of a step with both views collated, what the loss reads; `NodeTables` fills in the per-node
  columns (hash codes, content, structural encoding) of "lean" batches on the device, so that a worker ships node
  indices instead of B x N x C floats.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor

from hir_model.nn import EncoderBatch, collate
from hir_model.train.data import PairBatch, StepBatch, TrainData

log = logging.getLogger("hir")

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


class _Keyed(torch.utils.data.Dataset):
    def __init__(self, make: Callable, keys: list):
        self.make, self.keys = make, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        return self.make(self.keys[i])


def _as_is(item):
    return item


SHM_NEEDED = 2 * 2**30  # free bytes in /dev/shm below which workers pickle their items instead


def shm_free() -> int:
    try:
        return shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    except OSError:
        return 0


class _Shipped:
    """A tensor travelling as a numpy array (pickled through a pipe, not through shared memory)."""

    def __init__(self, t: Tensor):
        self.array = t.numpy()


def _map_tensors(x, leaf: type, fn: Callable):
    """x with each `leaf` in it (in lists, tuples and dataclasses) replaced by fn(leaf)."""
    if isinstance(x, leaf):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, leaf, fn) for v in x)
    if hasattr(x, "__dataclass_fields__"):
        return replace(x, **{f: _map_tensors(getattr(x, f), leaf, fn) for f in x.__dataclass_fields__})
    return x


def _ship(x):
    """x with its tensors (in lists, tuples and dataclasses) as `_Shipped` arrays; `_unship` undoes it."""
    return _map_tensors(x, Tensor, _Shipped)


def _unship(x):
    return _map_tensors(x, _Shipped, lambda s: torch.from_numpy(s.array))


class _Pickled:
    """make(key) with its tensors shipped as numpy arrays (module level: DataLoader may pickle it)."""

    def __init__(self, make: Callable):
        self.make = make

    def __call__(self, key):
        return _ship(self.make(key))


class ProcessPrefetcher(Generic[K, V]):
    """Iterates make(key) for key in keys, made in `workers` forked processes (each up to `depth` items ahead), in key
    order; with `pin`, items are moved to page-locked memory (their `pin_memory()`). `make` and what it reads are
    inherited by the fork, not pickled. Items come back through shared memory (`via_shm`; default: where /dev/shm has
    SHM_NEEDED free) or pickled through pipes (their tensors as numpy arrays), so they should be tensors, arrays and
    numbers in lists, tuples and dataclasses. `transport` says which ("shm" or "pipe")."""

    def __init__(self, make: Callable[[K], V], keys: Iterable[K], workers: int, depth: int = DEPTH, pin: bool = False,
                 via_shm: bool | None = None):
        if workers < 1 or depth < 1:
            raise ValueError(f"ProcessPrefetcher needs workers >= 1 and depth >= 1, got {workers}, {depth}")
        keys = list(keys)
        via_shm = shm_free() >= SHM_NEEDED if via_shm is None else via_shm
        self.transport, self._pin = ("shm", False) if via_shm else ("pipe", pin)  # pipe: pinned here, after unpickling
        self._loader = torch.utils.data.DataLoader(
            _Keyed(make if via_shm else _Pickled(make), keys), batch_size=None, shuffle=False,
            num_workers=min(workers, max(len(keys), 1)), collate_fn=_as_is, pin_memory=pin and via_shm,
            prefetch_factor=depth, multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(0))  # its own seed generator: the global torch RNG is not drawn from
        self._it = iter(self._loader) if keys else iter(())

    def __iter__(self) -> Iterator[V]:
        return self

    def __next__(self) -> V:
        item = next(self._it)
        if self.transport == "shm":
            return item
        item = _unship(item)
        return torch.utils.data._utils.pin_memory.pin_memory(item) if self._pin else item

    def close(self) -> None:
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = iter(())

    @property
    def alive(self) -> bool:
        return any(w.is_alive() for w in getattr(self._it, "_workers", []))

    def __enter__(self) -> ProcessPrefetcher[K, V]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


@dataclass(frozen=True)
class ReadyStep:
    """One shard of one step with both views collated: a `StepBatch` minus its numpy views (`step_loss` reads this)."""
    narrow: EncoderBatch  # the student's view: the B seeds, then the pair batch's nodes
    broad: EncoderBatch  # the teacher's view of the B seeds
    pairs: int  # P: seeds[:P] are users, seeds[P:2P] their entities
    sign: np.ndarray  # int64 [P]
    log_q: np.ndarray | None = None  # float64 [2, P]
    pair_batch: PairBatch | None = None

    @property
    def seeds(self) -> int:
        return self.broad.num_sequences

    @classmethod
    def of(cls, sb: StepBatch, lean: bool = False) -> ReadyStep:
        """Collate `sb`'s views; `lean`: the batch was sampled without content and structure (see `NodeTables`), and
        its hash codes are dropped too: the views carry node indices, and the device fills in the rest."""
        if lean:
            narrow, broad = (collate(replace(v, hash_codes=np.zeros((len(v.node), 0), np.int64), code_table=None), keep_node=True) for v in (sb.narrow, sb.broad))
        else:
            narrow, broad = collate(sb.narrow), collate(sb.broad)
        return cls(narrow, broad, sb.pairs, sb.sign, sb.log_q, sb.pair_batch)

    def pin_memory(self) -> ReadyStep:
        return replace(self, narrow=self.narrow.pin_memory(), broad=self.broad.pin_memory())

    def to(self, device: torch.device, tables: NodeTables | None = None) -> ReadyStep:
        """On `device` (copies overlap compute from pinned memory); a lean step's per-node columns from `tables`."""
        non_blocking = device.type == "cuda"
        narrow, broad = self.narrow.to(device, non_blocking), self.broad.to(device, non_blocking)
        if narrow.node is not None:
            if tables is None:
                raise ValueError("a lean step (node indices only) needs the NodeTables of its data")
            narrow, broad = tables.fill(narrow), tables.fill(broad)
        return replace(self, narrow=narrow, broad=broad)


class NodeTables:
    """The per-node columns a view gathers (hash codes, content, has_content, structural encoding) as tensors on the
    device: `fill` turns a lean batch into the one `collate` makes from a full `step_batch` (the same values)."""

    def __init__(self, data: TrainData, structure_dim: int, device: torch.device):
        g = data.graph
        self.hash_codes = torch.from_numpy(np.asarray(g.nodes.hash_codes, np.int64)).to(device)  # (V, K)
        self.content = self.has_content = self.structure = None
        if data.content is not None:
            self.content = torch.from_numpy(np.asarray(data.content, np.float32)).to(device)  # (V, C)
            self.has_content = torch.from_numpy(np.asarray(data.has_content, bool)).to(device)  # (V,)
        if structure_dim:
            nodes = np.arange(g.num_nodes, dtype=np.int64)
            self.structure = torch.from_numpy(g.structure_at(nodes, data.cutoff_us, structure_dim)).to(device)  # (V, S)

    def fill(self, b: EncoderBatch) -> EncoderBatch:
        valid = b.node >= 0  # (B, N)
        idx = b.node.clamp_min(0)
        out = {"hash_codes": torch.where(valid[..., None], self.hash_codes[idx], 0), "node": None}  # (B, N, K)
        if self.content is not None:
            has = self.has_content[idx] & valid  # (B, N)
            out.update(has_content=has, content=torch.where(has[..., None], self.content[idx], 0.0))  # (B, N, C)
        if self.structure is not None:
            out["structure"] = torch.where(valid[..., None], self.structure[idx], 0.0)  # (B, N, S)
        return replace(b, **out)


def lean_inputs(data: TrainData, cfg) -> tuple[TrainData, object]:
    """(data, cfg) for sampling lean steps: no content and no structural encoding (the device adds them). The cached
    draw tables are built here, once, so forked workers inherit them instead of each building its own."""
    lean = replace(data, content=None, has_content=None)
    lean_cfg = replace(cfg, encoder=replace(cfg.encoder, structure_dim=0))
    lean.pair_log_q, lean.replay, lean.stream_log_q(cfg.budget.replay_share)  # noqa: B018 - cached properties, built before the fork
    return lean, lean_cfg
