"""Structural-bias attention: FlexAttention vs dense SDPA, side by side, at growing sequence lengths.

B = max(1, tokens // N) sequences per batch (--tokens, default 4096), H = 4 heads, head dim 32, random BFS trees of
depth <= 3 with the full bias (type pair, tree distance, edge type, edge age). Per (N, mode), one key=value line:

  flex_ms            flex_attention, compiled, incl. its per-batch block mask (score_mod reads the bias tensors)
  dense_ms           SDPA incl. building its [B, H, N, N] bias (every batch has a new structure, so this is real use)
  dense_ready_ms     SDPA with the bias already built
  bias_build_ms      the dense bias build alone (one compiled kernel, into the reused buffer the encoder uses
                     under no_grad; fresh each time with --mode fwdbwd); bias_build_eager_ms: same code, eager
  auto_backend       the backend `choose_backend` picks for (device, grad mode, N); auto_why: crossover (the speed
                     table, hir_model.nn.backends.FLEX_FROM_TOKENS), memory (dense bias over its budget), cpu_backward
  auto_ms            auto timed through the same path; auto_vs_best = auto_ms / min(flex_ms, dense_ms) (target <= 1.10)
  flex_mb, dense_mb  peak extra memory of one attention call incl. its per-batch structure, over the inputs
  dense_bias_mb      the bias tensor alone

A backend that runs out of memory at some N shows `oom` in its fields (the other still runs); `na`: not run (flex
has no CPU backward). Per mode a `summary` line: where flex is faster, auto's worst ratio, and `flex_from`: the
smallest measured N from which flex is faster at every larger measured N (none: dense everywhere), the value for
FLEX_FROM_TOKENS.

Memory: tracemalloc cannot see torch's allocations. On CPU this measures the process's peak resident set
during the call over its resident set before it (the kernel's high-water mark VmHWM is reset through
/proc/self/clear_refs first). glibc's mmap threshold is pinned at 128 KiB (mallopt), so every larger
allocation is a fresh mapping that counts when touched and is returned when freed, instead of reusing heap
pages that are already resident; smaller ones may go unseen (the figure is a floor, exact for big buffers).
On CUDA: torch.cuda.max_memory_allocated over the allocated memory before the call.

    python benchmarks/attention.py                     # CPU, inference, N = 256, 1024, 4096 (under a minute)
    python benchmarks/attention.py --quick             # N = 256, 1024
    python benchmarks/attention.py --mode fwd,fwdbwd --threads 1
    python benchmarks/attention.py --device cuda --mode fwd,fwdbwd
    python benchmarks/attention.py --device cuda --mode fwd,fwdbwd --lengths 256,1024,2048,4096,8192,16384

The first call of each shape compiles (tens of seconds on CPU) and is not timed. Times are best-of-rounds;
auto runs the very code of the backend it picks, so its ratio is 1 up to timing noise (on a shared machine,
+-10% is noise; --threads 1 is steadier where other processes hold the cores). With --mode fwdbwd on CPU,
flex is skipped (no CPU backward).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hir_model.graph.types import EDGE_TYPES, NODE_TYPES, SampledBatch  # noqa: E402
from hir_model.nn import backends  # noqa: E402
from hir_model.nn.batch import collate  # noqa: E402
from hir_model.nn.bias import StructuralBias, dense_bias  # noqa: E402
from hir_model.nn.config import EncoderConfig  # noqa: E402

TOKENS, HEADS, HEAD_DIM, DEPTH = 4096, 4, 32, 3  # TOKENS: the default token budget per batch
OOM = (torch.OutOfMemoryError, MemoryError)


def random_trees(rng: np.random.Generator, batch: int, n: int) -> SampledBatch:
    """`batch` BFS trees of n tokens each: level sizes 1, f, f^2, ... (f = 16) cut at n; random parents."""
    level = np.minimum(np.searchsorted(np.cumsum([16 ** d for d in range(DEPTH + 1)]), np.arange(n), side="right"), DEPTH)
    starts = np.searchsorted(level, np.arange(DEPTH + 2))  # first token of each depth
    parent = np.full((batch, n), -1)
    for d in range(1, DEPTH + 1):
        lo, hi = starts[d - 1], starts[d]
        parent[:, starts[d]:starts[d + 1]] = rng.integers(lo, max(hi, lo + 1), (batch, starts[d + 1] - starts[d]))
    anc = np.full((batch, n, DEPTH + 1), -1)
    anc[:, :, 0] = 0
    idx = np.arange(n)
    for d in range(1, DEPTH + 1):
        at = level == d
        anc[:, at, :d] = np.take_along_axis(anc, parent[:, at, None].repeat(DEPTH + 1, 2), 1)[:, :, :d]
        anc[:, at, d] = idx[at]
    T = batch * n
    return SampledBatch(
        offsets=np.arange(0, T + 1, n), seeds=np.arange(batch), node=rng.integers(0, 10**8, T),
        hash_codes=rng.integers(0, 10**6, (T, 16)), node_type=rng.integers(0, len(NODE_TYPES), T),
        depth=np.tile(level, batch), ancestors=anc.reshape(T, DEPTH + 1),
        edge_type=np.where(np.tile(level, batch) == 0, 0, rng.integers(1, len(EDGE_TYPES), T)),
        edge_age=rng.exponential(86400 * 7, T).astype(np.float32), cutoff_us=0)


class Meter:
    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def times(self, fns: dict, repeats: int) -> dict[str, float | str]:
        """Best-of-`repeats` milliseconds per function, measured in rounds (each round in a new order) so that
        load on a shared machine hits every variant alike. The first call of each (compilation) is not timed.
        A function that runs out of memory gets "oom" and is left out of the later rounds."""
        best: dict[str, float | str] = {name: float("inf") for name in fns}
        live = dict(fns)
        for name in list(live):
            if self.guard(live[name]) == "oom":
                best[name] = "oom"
                del live[name]
        order = list(live)
        for r in range(repeats):
            random.Random(r).shuffle(order)  # no variant always runs right after the same other one
            for name in order:
                if best[name] == "oom":
                    continue
                t0 = time.perf_counter()
                if self.guard(live[name]) == "oom":
                    best[name] = "oom"
                    continue
                best[name] = min(best[name], 1000 * (time.perf_counter() - t0))
        return best

    def guard(self, fn) -> str | None:
        """Run fn and wait for the device; "oom" (memory freed) if it ran out of memory."""
        try:
            fn()
            self.sync()
            return None
        except OOM:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            return "oom"

    def peak_mb(self, fn) -> float | str:
        if self.guard(fn) == "oom":
            return "oom"
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            if self.guard(fn) == "oom":
                return "oom"
            return (torch.cuda.max_memory_allocated() - before) / 2**20
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        before = _status_kb("VmRSS")
        fn()
        return (_status_kb("VmHWM") - before) / 1024


def pin_mmap_threshold(nbytes: int = 128 * 1024) -> None:
    """glibc: allocations above nbytes always get their own mapping (no dynamic threshold, no heap reuse)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except OSError:
        print("warning: not glibc; CPU memory figures may miss reused heap pages", file=sys.stderr)


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def run_case(n: int, mode: str, device: torch.device, repeats: int, rng: np.random.Generator, tokens: int = TOKENS,
             budget_mb: float | None = None) -> dict:
    B, training = max(1, tokens // n), mode == "fwdbwd"
    cfg = EncoderConfig(heads=HEADS, width=HEADS * HEAD_DIM, max_depth=DEPTH)
    budget_mb = cfg.dense_bias_budget_mb if budget_mb is None else budget_mb
    sbias = StructuralBias(cfg).to(device)
    for p in sbias.parameters():
        torch.nn.init.normal_(p)
    batch = collate(random_trees(rng, B, n)).to(device)
    q, k, v = (torch.randn(B, HEADS, n, HEAD_DIM, device=device, requires_grad=training) for _ in range(3))
    meter = Meter(device)
    grad = torch.enable_grad() if training else torch.no_grad()

    def step(attention) -> None:  # one attention call incl. its per-batch structure; backward in fwdbwd mode
        with grad:
            out = attention()
            if training:
                out.sum().backward()

    workspace = backends.BiasWorkspace()  # what the encoder uses: reused across no-grad batches

    def dense() -> torch.Tensor:
        return backends.DenseAttention(sbias.tensors(batch), True, workspace)(q, k, v)

    def dense_cold() -> torch.Tensor:  # for memory: a fresh workspace, so its allocation counts
        return backends.DenseAttention(sbias.tensors(batch), True, backends.BiasWorkspace())(q, k, v)

    rows, length = backends.flex_shape(B, n)  # == (B, n) here: both powers of two

    def flex() -> torch.Tensor:
        return backends.FlexAttention(sbias.tensors(batch, length, 0, rows))(q, k, v)

    ready: list[torch.Tensor] = []  # the prebuilt bias, made lazily: at large N it may not fit beside the others

    def dense_ready() -> torch.Tensor:
        if not ready:
            with grad:
                ready.append(backends.build_dense_bias(sbias.tensors(batch)).detach())
        return F.scaled_dot_product_attention(q, k, v, attn_mask=ready[0])

    with grad:
        tensors = sbias.tensors(batch)

    def build(fn) -> None:
        with grad:
            fn()

    row = {"case": f"N{n}", "mode": mode, "device": device.type, "B": B, "N": n, "H": HEADS, "head_dim": HEAD_DIM}
    flex_ok = not (training and device.type == "cpu")  # no flex backward on CPU
    bias_bytes = 4 * B * HEADS * n * n
    choice = backends.choose_backend("auto", device, training, n, bias_bytes, backends.dense_budget_bytes(budget_mb, device))
    why = "crossover" if "crossover" in choice.reason or "measured" in choice.reason else \
        "memory" if "budget" in choice.reason else "cpu_backward" if "backward" in choice.reason else "other"
    cases = {"dense_ms": lambda: step(dense),
             "dense_ready_ms": lambda: step(dense_ready),
             "bias_build_ms": lambda: build(lambda: backends.build_dense_bias(tensors, True, workspace)),
             "flex_ms": lambda: step(flex),
             "auto_ms": lambda: step(flex if choice.backend == "flex" else dense)}
    if not flex_ok:
        del cases["flex_ms"]
    row.update(meter.times(cases, repeats))
    ready.clear()
    workspace.release()
    row["bias_build_eager_ms"] = meter.times({"eager": lambda: build(lambda: dense_bias(tensors))}, 1)["eager"]
    row["flex_ms"] = row.get("flex_ms", "na")
    row["auto_backend"], row["auto_why"] = choice.backend, why
    timed = [row[key] for key in ("dense_ms", "flex_ms") if isinstance(row[key], float)]
    row["auto_vs_best"] = row["auto_ms"] / min(timed) if timed and isinstance(row["auto_ms"], float) else "oom"
    row["flex_vs_dense"] = ratio(row["dense_ms"], row["flex_ms"])  # > 1: flex faster
    row["dense_mb"] = meter.peak_mb(lambda: step(dense_cold))
    row["flex_mb"] = meter.peak_mb(lambda: step(flex)) if flex_ok else "na"
    row["dense_bias_mb"] = bias_bytes / 2**20
    row["memory_ratio"] = ratio(row["dense_mb"], row["flex_mb"], 1e-3)
    return row


def ratio(a, b, floor: float = 0.0) -> float | str:
    """a / b where both were measured (b at least `floor` when given); inf where only a ran out of memory; else "na"."""
    if isinstance(a, float) and isinstance(b, float):
        return a / max(b, floor) if floor else a / b
    if a == "oom" and isinstance(b, float):
        return float("inf")
    return "na"


def flex_from(rows: list[dict]) -> int | None:
    """The smallest measured N from which flex is faster at every larger measured N (dense out of memory counts as
    flex faster); None: dense wins at the longest measured N."""
    found = None
    for r in sorted(rows, key=lambda r: -r["N"]):
        if not (isinstance(r["flex_vs_dense"], float) and r["flex_vs_dense"] > 1):
            break
        found = r["N"]
    return found


def fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 256 and 1024 only, fewer repeats")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="fwd", help="comma-separated: fwd (inference), fwdbwd (forward + backward)")
    parser.add_argument("--lengths", default=None, help="comma-separated N (default 256,1024,4096)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="token budget per batch: B = max(1, tokens // N)")
    parser.add_argument("--dense-budget-mb", type=float, default=None,
                        help="the dense bias budget auto uses (default: EncoderConfig.dense_bias_budget_mb)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per case (best of; default 5, quick 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cpu":
        pin_mmap_threshold()
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [256, 1024] if args.quick else [256, 1024, 4096]
    repeats = args.repeats or (3 if args.quick else 5)
    rng = np.random.default_rng(0)
    gpu = " gpu=" + torch.cuda.get_device_name(device).replace(" ", "_") if device.type == "cuda" else ""
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} device={device}{gpu} tokens_per_batch={args.tokens}",
          flush=True)
    for mode in args.mode.split(","):
        rows = []
        for n in lengths:
            try:
                row = run_case(n, mode, device, repeats, rng, args.tokens, args.dense_budget_mb)
            except OOM as e:  # outside the guarded calls (inputs, bias tensors): this N does not fit at all
                row = {"case": f"N{n}", "mode": mode, "device": device.type, "N": n, "error": "oom",
                       "detail": type(e).__name__}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(" ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)
                continue
            rows.append(row)
            print(" ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)
        flex_wins = [r["N"] for r in rows if isinstance(r["flex_vs_dense"], float) and r["flex_vs_dense"] > 1]
        ratios = [r["auto_vs_best"] for r in rows if isinstance(r["auto_vs_best"], float)]
        speedups = [r["flex_vs_dense"] for r in rows if isinstance(r["flex_vs_dense"], float) and np.isfinite(r["flex_vs_dense"])]
        worst = max(ratios) if ratios else float("nan")
        print(f"summary mode={mode} device={device.type} flex_faster_at={','.join(map(str, flex_wins)) or 'none'} "
              f"flex_from={(flex_from(rows) or 'none') if flex_ok_mode(mode, device) else 'na'} "
              f"auto_worst_vs_best={worst:.3f} auto_within_10pct={'yes' if worst <= 1.10 else 'no'} "
              f"median_speedup_flex_over_dense={statistics.median(speedups) if speedups else float('nan'):.3g}", flush=True)


def flex_ok_mode(mode: str, device: torch.device) -> bool:
    return not (mode == "fwdbwd" and device.type == "cpu")


if __name__ == "__main__":
    main()
