"""Training on real windows: seconds per window (warm-started), samples/s and where the time went, collapse metrics, on
the synthetic source NMI of the learned level assignments vs the planted interests (with k-means on content vectors as
the floor), and optionally a next-window recall proxy of the published embeddings; a throughput grid; a budget sweep.

    .venv/bin/python benchmarks/train.py [--quick] [--source movielens|synthetic] [--windows N] [--steps S] [--no-global-tokens]
        [--store .hir/storage/synthetic]   # train on a demo's materialised graph + content_embeddings (MiniLM + CLIP)
        [--set field=value]                # any TrainConfig field
        [--set budget='"cpu"']             # a named budget (hir_model.train.config.BUDGETS): epochs over each window's pairs
        [--first F] [--eval-next]          # train fresh from window F; score each window's embeddings on the next window
    .venv/bin/python benchmarks/train.py --throughput --case "batch_size=4096 loader_workers=12" --case "..." [--steps 30]
    .venv/bin/python benchmarks/train.py --budgets default,cpu,full --first 20 --windows 31 --eval-next

Without --store the content vectors are a hashed TF-IDF stand-in (no model weights needed).

Per window a key=value line: seconds (the training loop) = wait_s (waiting for the next batch: the sampler) + compute_s
(everything else: copies, forward, backward, optimizer), samples/s = (batch_size + 2 * pair_batch) * steps / seconds,
steady_samples_per_s the same after the first step (no loader start-up, no first-step costs), the loader (thread, or N
worker processes; "lean": node indices shipped, per-node columns gathered on the GPU; "shm" / "pipe": how batches came
back) and the precision (fp32 / bf16). On CUDA, gpu_util is the mean GPU utilisation NVML reports (the share of time a kernel ran,
sampled every 50 ms during the window's train_window call, so it includes its set-up and metrics: loop_share says how
much of the call the loop was), read with torch.cuda.utilization() when pynvml is installed, else from
libnvidia-ml through ctypes (gpu_util_source says which; na where neither works, e.g. MIG). A case with profile=true
also gets gpu_kernel_busy: the union of its CUDA kernels' intervals (torch.profiler, CUPTI) over the call's wall time.

--eval-next (MovieLens): each window's teacher embeds the users with engagement up to its end and every film it knows;
users' purchases (rating >= 4) of known films in the next window are the targets, films they already rated are left
out, and Recall@20 = |top 20 ∩ targets| / |targets| averaged over users. next_r20_dot ranks by the embeddings' dot
product alone, next_r20_prior adds the item prior (engagement_temp x log decayed engagement, weight 1): a proxy of the
evaluation's hir_embeddings row (no fitted prior weight, no paired CIs; benchmarks/quality.py has those).

--throughput builds the data of one window (--window-index, default 7) once and trains it fresh once per --case
(space-separated field=value overrides; held_out_batches=0 unless a case sets it), --steps steps each.
--budgets runs the window chain (--first .. --windows) once per budget (default = hir.toml's settings) with
--eval-next and prints per budget the samples seen and the training seconds per window and the proxies over the last 4
evaluated windows.

benchmarks/gpu_meter.py holds the GPU meter, benchmarks/train_quality.py the NMI report and the recall proxy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_meter import GpuMeter  # noqa: E402 - benchmarks/ (the script's folder) is on sys.path
from hir_model.config import load_config  # noqa: E402
from hir_model.data.windows import WindowSpec  # noqa: E402
from hir_model.eval.text_vectors import stand_in_table  # noqa: E402
from hir_model.graph.build import build_graph  # noqa: E402
from hir_model.graph.window import to_us  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train.config import TrainConfig, parse_overrides, set_fields, with_overrides  # noqa: E402
from hir_model.train.data import TrainData, active_nodes, align_content, engagement_pairs  # noqa: E402
from hir_model.train.trainer import TrainResult, train_window  # noqa: E402
from hir_model.train.window_data import window_train_data  # noqa: E402
from train_quality import next_window_recall, nmi_report, teacher_of  # noqa: E402


def source_of(name: str):
    data_dir = Path(os.environ.get("HIR_DATA_DIR", REPO / "data"))
    if name == "movielens":
        from hir_model.data.movielens import MovieLensSource
        src = MovieLensSource(data_dir)
    else:
        from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
        src = SyntheticSource(SyntheticConfig(), data_dir / "synthetic-seed7")
    src.prepare()
    return src


@dataclass
class Window:
    key: str
    data: TrainData
    next_events: pa.Table | None  # the next window's events (None: the last window)


def windows_of(source, args, upto: int, no_content: bool) -> list[Window]:
    """The first `upto` windows' training data (the graph built window by window), each with the next window's events."""
    spec = WindowSpec.covering("weekly", *source.span()).windows()
    out, graph = [], None
    for i, w in enumerate(spec[:upto]):
        nxt = pa.concat_tables([b.table for b in source.events(spec[i + 1])]) if i + 1 < len(spec) else None
        if args.store:
            data, _ = window_train_data(PartitionStore(Path(args.store)), w.key, content=not no_content)
        else:
            catalog = pa.concat_tables([b.table for b in source.catalog(w.end)])
            relations = pa.concat_tables([b.table for b in source.relations(w.end)])
            events = pa.concat_tables([b.table for b in source.events(w)])
            end = to_us(w.end)
            graph, _ = build_graph(graph, catalog, relations, [events], end)
            user, entity, sign, prob = engagement_pairs(graph, events.select(["user_id", "entity_id", "event_type", "ts"]), end)
            mat, has = (None, None) if no_content else align_content(graph, stand_in_table(catalog))
            data = TrainData(graph, end, active_nodes(graph, end), user, entity, sign, prob, mat, has)
        out.append(Window(w.key, data, nxt))
    return out


def timing_fields(r: TrainResult, call_s: float) -> str:
    compute = max(r.seconds - r.loader_wait_s, 0.0)
    return (f"seconds={r.seconds:.2f} samples_per_s={r.samples_per_s:.1f} steady_samples_per_s={r.steady_samples_per_s:.1f} "
            f"wait_s={r.loader_wait_s:.2f} compute_s={compute:.2f} "
            f"wait_share={r.loader_wait_s / max(r.seconds, 1e-9):.3f} loop_share={r.seconds / max(call_s, 1e-9):.3f} "
            f"loader={r.loader.replace(' ', '_')} precision={r.precision} backend={r.backend}")


def run_chain(windows: list[Window], cfg: TrainConfig, first: int, eval_next: bool, device: torch.device,
              label: str = "") -> tuple[list[dict], Path | None]:
    """Train windows[first:] warm-started window to window (fresh at `first`): a printed line and a dict each, and the
    last checkpoint."""
    tmp = Path(tempfile.mkdtemp(prefix="hir-train-bench-"))
    prev, rows = None, []
    for w in windows[first:]:
        out = tmp / f"{w.key}.pt"
        with GpuMeter(device) as meter:
            t0 = time.perf_counter()
            r = train_window(w.data, cfg, out, prev, w.key)
            call = time.perf_counter() - t0
        prev = out
        row = {"seconds": r.seconds, "samples_per_s": r.samples_per_s, "steps": r.window_steps,
               "samples": (cfg.budget.batch_size + 2 * cfg.budget.pair_batch) * r.window_steps}
        quality = ""
        if eval_next and w.next_events is not None:
            model, tcfg = teacher_of(out)
            model.to(device)
            row.update(next_window_recall(model, tcfg, w.data, w.next_events))
            quality = f" next_r20_dot={row['next_r20_dot']:.4f} next_r20_prior={row['next_r20_prior']:.4f} next_users={row['next_users']}"
        rows.append(row)
        print(f"case=window{label} key={w.key} nodes={w.data.graph.num_nodes} pairs={len(w.data.pair_user)} steps={r.window_steps} "
              f"{timing_fields(r, call)}{meter.fields()} first_loss={r.losses[0]:.3f} last_loss={r.losses[-1]:.3f} "
              f"usage_entropy={r.usage_entropy} usage_share={r.usage_share}{quality}", flush=True)
    return rows, prev


def throughput(windows: list[Window], cfg: TrainConfig, cases: list[str], index: int, device: torch.device) -> None:
    data = windows[min(index, len(windows) - 1)].data
    for case in cases:
        try:
            overrides = parse_overrides(case.split())
            profile = bool(overrides.pop("profile", False))
            c = with_overrides(set_fields(cfg, held_out_batches=0), overrides)
            with GpuMeter(device, profile) as meter:
                t0 = time.perf_counter()
                r = train_window(data, c)
                call = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - one case failing (e.g. out of memory) must not end the grid
            print(f"case=throughput set={case.replace(' ', ',')} error={type(e).__name__} detail={str(e).splitlines()[0][:200]!r}",
                  flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        print(f"case=throughput set={case.replace(' ', ',')} batch={c.budget.batch_size} pair_batch={c.budget.pair_batch} shards={c.runtime.shards} "
              f"steps={r.window_steps} {timing_fields(r, call)}{meter.fields()} call_s={call:.2f} last_loss={r.losses[-1]:.3f}",
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--source", default="movielens", choices=["movielens", "synthetic"])
    p.add_argument("--windows", type=int, default=0, help="windows built (and trained, from --first on)")
    p.add_argument("--first", type=int, default=0, help="the first window trained (fresh; the earlier ones only build the graph)")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--levels", default="")
    p.add_argument("--no-global-tokens", action="store_true")
    p.add_argument("--no-content", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--store", default="", help="a materialised storage root: read engagement_graph, raw_events and "
                   "content_embeddings of each window from it instead of building them")
    p.add_argument("--set", action="append", default=[], help="override a TrainConfig field (JSON value), e.g. --set lr=0.005")
    p.add_argument("--eval-next", action="store_true", help="MovieLens: the next-window recall proxy of each window's embeddings")
    p.add_argument("--throughput", action="store_true", help="train one window once per --case instead of the chain")
    p.add_argument("--case", action="append", default=[], help='--throughput: "field=value field=value" (profile=true: '
                   "also the profiler's kernel-busy share)")
    p.add_argument("--window-index", type=int, default=7, help="--throughput: the window trained")
    p.add_argument("--budgets", default="", help="comma-separated: default (hir.toml's settings) or BUDGETS names")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    gpu = f" gpu={torch.cuda.get_device_name(0).replace(' ', '_')}" if device.type == "cuda" else ""
    print(f"case=setup torch={torch.__version__} device={device.type}{gpu} cores={os.cpu_count()} threads={args.threads}", flush=True)
    source = source_of(args.source)
    # the demo's settings for this source: hir.toml [train] and [train.<source>]
    cfg = with_overrides(set_fields(TrainConfig(), global_tokens=not args.no_global_tokens), load_config(env={"HIR_SOURCE": args.source}).train)
    if args.levels:
        cfg = set_fields(cfg, levels=tuple(int(k) for k in args.levels.split(",")))
    if args.steps or args.quick:
        cfg = set_fields(cfg, steps=args.steps or 10)
    cfg = with_overrides(cfg, parse_overrides(args.set))
    n_windows = args.windows or (args.window_index + 1 if args.throughput else 2 if args.quick else 6)
    t0 = time.perf_counter()
    windows = windows_of(source, args, n_windows, args.no_content)
    print(f"case=data windows={len(windows)} seconds={time.perf_counter() - t0:.1f}", flush=True)
    if args.throughput:
        throughput(windows, cfg, args.case or [""], args.window_index, device)
        return
    if args.budgets:
        for name in args.budgets.split(","):
            c = cfg if name == "default" else with_overrides(cfg, {"budget": name})
            rows, _ = run_chain(windows, c, args.first, True, device, label=f" budget={name}")
            last = [r for r in rows if "next_r20_prior" in r][-4:]
            print(f"case=budget budget={name} windows={len(rows)} samples_per_window={np.mean([r['samples'] for r in rows]):.0f} "
                  f"steps_per_window={np.mean([r['steps'] for r in rows]):.1f} train_s_per_window={np.mean([r['seconds'] for r in rows]):.2f} "
                  f"samples_per_s={np.mean([r['samples_per_s'] for r in rows]):.0f} "
                  f"next_r20_dot_last4={np.mean([r['next_r20_dot'] for r in last]) if last else float('nan'):.4f} "
                  f"next_r20_prior_last4={np.mean([r['next_r20_prior'] for r in last]) if last else float('nan'):.4f} "
                  f"evaluated={len(last)}", flush=True)
        return
    rows, last = run_chain(windows, cfg, args.first, args.eval_next and args.source == "movielens", device)
    line = (f"case=summary source={args.source} windows={len(rows)} steps={cfg.budget.steps} epochs={cfg.budget.epochs} "
            f"pair_batch={cfg.budget.pair_batch} shared_negatives={cfg.budget.shared_negatives} replay_share={cfg.budget.replay_share} "
            f"id_table_rows={cfg.encoder.id_table_rows} mean_steps_per_window={np.mean([r['steps'] for r in rows]):.1f} "
            f"batch={cfg.budget.batch_size} global_tokens={cfg.prototypes.global_tokens} content={not args.no_content} "
            f"mean_seconds_per_window={np.mean([r['seconds'] for r in rows]):.2f} "
            f"mean_samples_per_s={np.mean([r['samples_per_s'] for r in rows]):.1f}")
    if args.source == "synthetic":
        model, tcfg = teacher_of(last)
        line += " " + " ".join(f"{k}={v}" for k, v in nmi_report(model, tcfg, windows[-1].data, source).items())
    print(line, flush=True)


if __name__ == "__main__":
    main()
