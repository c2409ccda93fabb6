"""The one training entry point: a single process, `torchrun` with DDP (gloo on CPU, nccl on GPU), and Dagster Pipes.

    python -m hir_model.train.entry --graph G --events E.parquet [--content C.parquet] --out ckpt.pt [--init prev.pt]
    torchrun --nproc-per-node 2 -m hir_model.train.entry ...

Every torch.distributed call is guarded, so one CPU process needs no launcher. Only rank 0 writes the checkpoint
and a `<out>.metrics.json` beside it, and logs. Dagster launches `dagster_project.train_entry`, which wraps `run`
and reports through Dagster Pipes, so this library stays free of Dagster-family packages.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

import torch

from hir_model.train.config import TrainConfig, set_fields, with_overrides
from hir_model.train.data import load_train_data
from hir_model.train.trainer import train_window

log = logging.getLogger("hir")


def _init_dist() -> bool:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend)
    return True


def metrics_of(result) -> dict:
    """The scalar metrics reported as materialisation metadata (JSON-friendly)."""
    d = asdict(result)
    losses = d.pop("losses")
    d.pop("probe_embeddings"), d.pop("probe_nodes"), d.pop("parts")
    d.update(first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
             steps_run=len(losses), usage_entropy_min=min(result.usage_entropy, default=None))
    return d


def scalar_metrics(metrics: dict) -> dict:
    """The metrics a launcher reports as materialisation metadata: the set scalars (lists go to the metrics file)."""
    return {k: v for k, v in metrics.items() if v is not None and not isinstance(v, list)}


def run(args: argparse.Namespace) -> dict | None:
    distributed = _init_dist()
    rank = torch.distributed.get_rank() if distributed else 0
    try:
        cfg = TrainConfig.from_dict(json.loads(args.config)) if args.config else TrainConfig()
        if args.overrides:
            cfg = with_overrides(cfg, json.loads(args.overrides))
        if args.steps:
            cfg = set_fields(cfg, steps=args.steps, root_steps=0.0, epochs=0.0)  # a fixed count, whatever the rule
        if args.levels:
            cfg = set_fields(cfg, levels=tuple(int(k) for k in args.levels.split(",")))
        torch.set_num_threads(max(1, args.threads or torch.get_num_threads()))
        data = load_train_data(Path(args.graph), Path(args.events) if args.events else None,
                               Path(args.content) if args.content else None)
        result = train_window(data, cfg, Path(args.out), Path(args.init) if args.init else None, args.window,
                              stop_after=args.stop_after)
        if rank != 0:
            return None
        full = asdict(result)
        Path(f"{args.out}.metrics.json").write_text(json.dumps(full) + "\n")
        return metrics_of(result)
    finally:
        if distributed:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", required=True, help="engagement_graph partition folder (as of the window end)")
    p.add_argument("--events", help="raw_events parquet of the window (engagement pairs)")
    p.add_argument("--content", help="content_embeddings parquet of the window")
    p.add_argument("--out", required=True, help="checkpoint path (resumed from when it holds this window's unfinished run)")
    p.add_argument("--init", help="previous window's checkpoint to warm-start from")
    p.add_argument("--window", default="", help="window key recorded in the checkpoint")
    p.add_argument("--config", help="TrainConfig as JSON (TrainConfig.to_dict())")
    p.add_argument("--overrides", help='some TrainConfig fields as JSON, e.g. {"levels": [4, 12, 36], "steps": 40}')
    p.add_argument("--steps", type=int, default=0, help="a fixed step count per window (TrainConfig.budget.steps; turns a budget rule off)")
    p.add_argument("--levels", default="", help="override TrainConfig.prototypes.levels, coarse to fine, e.g. 4,12,36")
    p.add_argument("--stop-after", type=int, default=None, help="stop after this many steps (simulates a kill)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per process (0: torch's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse(argv)
    metrics = run(args)
    if metrics is not None:
        log.info("trained %s: %s", args.window, json.dumps(metrics))


if __name__ == "__main__":
    main()
