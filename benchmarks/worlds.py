r"""HIR and the baselines on N synthetic worlds drawn from documented ranges: the decision set, so that no single
world's tuning passes for a result.

Each world is the synthetic ad ecosystem (`SyntheticConfig`) at a scale preset with its own seed, interest tree and
mix, drawn from RANGES below by a generator seeded with the world's number. Every world goes through
benchmarks/quality.py's case (`run_case`: the content stand-in, graphs, training with hir.toml's [train] and
[train.synthetic], embeddings, hierarchy, head and index as the assets publish them, then every window with a
successor evaluated as `window_evaluation` does) and prints, besides that case's lines, the figures the
generalisation issue judges, each a paired bootstrap 95% CI over users pooled over the evaluated windows
(`verdict=lead|tie|behind`):

- `rows_vs=mf_als|lightgcn`: `hir_embeddings` minus the peer, warm users, known items, deep funnel;
- `new_items_vs=content`: `hir_exact` minus content kNN, warm users, items first seen in t+1, engagement;
- `cold_head_vs=rows`: `hir` (the served head) minus `hir_embeddings`, cold users, known items, deep funnel.

Worlds are numbered: decisions use the decision worlds (numbers from 1, the default); a world from `--held-out` draws
from another stream (numbers from 1001) and is for reporting once, after every choice is made. Record in
docs/decisions.md which held-out numbers have been looked at.

    python benchmarks/worlds.py --quick               # 1 decision world, small, 4 windows: a smoke run in minutes
    python benchmarks/worlds.py --worlds 3            # decision worlds 1..3 at small (the demo's size), 8 windows
    python benchmarks/worlds.py --worlds 1 --scale medium --first 4   # decision world 4 at medium (10x)
    python benchmarks/worlds.py --worlds 1 --held-out  # held-out world 1001: report once
    python benchmarks/worlds.py --worlds 2 --set steps=60   # a TrainConfig field for every world, as in [train.synthetic]
    python benchmarks/worlds.py --save-users /tmp/a && python benchmarks/worlds.py --new-items encoder --against /tmp/a
                                                       # a setting against the run before it, paired over users per world
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as benchmarks/quality.py: threaded BLAS is slower on 2 shared cores
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hir_model.data.synthetic_config import SCALES, SyntheticConfig, preset  # noqa: E402
from hir_model.eval.compare import compare  # noqa: E402

# Each field is drawn uniformly from its range (ints inclusive); the demo world (seed 7, branching 4/3/3, 3 interests
# per user, drift 0.8, Zipf 1.0, 70% targeted) lies inside every range.
RANGES = {
    "branching": ((3, 6), (2, 4), (2, 4)),  # coarse, mid, fine: 12 to 96 fine interests
    "interests_per_user": (1, 4),
    "drift": (0.4, 1.2),  # amplitude of a user's drifting interest weights
    "zipf_exponent": (0.8, 1.2),  # popularity skew
    "targeted_share": (0.5, 0.85),  # impressions drawn from the user's interests, the rest by popularity
    "campaign_share": (0.04, 0.12),
}
HELD_OUT_FIRST = 1001  # held-out worlds' numbers start here: a stream the decision worlds never draw from
# (method, reference, users, items, target, label): the figures each world is judged by
VERDICTS = (("hir_embeddings", "mf_als", "warm", "known", "deep_funnel", "rows_vs=mf_als"),
            ("hir_embeddings", "lightgcn", "warm", "known", "deep_funnel", "rows_vs=lightgcn"),
            ("hir_exact", "content", "warm", "new", "engagement", "new_items_vs=content"),
            ("hir", "hir_embeddings", "cold", "known", "deep_funnel", "cold_head_vs=rows"))


def draw_world(number: int, scale: str = "small", windows: int | None = None) -> SyntheticConfig:
    """World `number`'s config: the scale preset with its seed, tree and mix drawn from RANGES."""
    rng = np.random.default_rng(number)
    uniform = lambda lo_hi: float(rng.uniform(*lo_hi))  # noqa: E731
    drawn = {"seed": 10_000 + number,
             "branching": tuple(int(rng.integers(lo, hi + 1)) for lo, hi in RANGES["branching"]),
             "interests_per_user": int(rng.integers(RANGES["interests_per_user"][0], RANGES["interests_per_user"][1] + 1)),
             **{name: round(uniform(RANGES[name]), 3) for name in ("drift", "zipf_exponent", "targeted_share", "campaign_share")}}
    config = replace(preset(scale), **drawn)
    return replace(config, n_windows=windows) if windows else config


def verdicts(name: str, results: list) -> list[str]:
    """One `key=value` line per judged figure of VERDICTS, pooled over every evaluated window."""
    lines = []
    for method, reference, users, items, target, label in VERDICTS:
        rows = [r for r in compare(results, reference=reference, methods=[method], users=users, items=items, target=target,
                                   metric="recall@20", last=None, per_window=False) if r.method == method]
        if not rows:
            lines.append(f"world={name} {label} users={users} items={items} target={target} judged=0")
            continue
        r = rows[0]
        lines.append(f"world={name} {label} users={users} items={items} target={target} {method}={r.method_value:.4f} "
                     f"{reference}={r.reference_value:.4f} diff={r.diff:+.4f} ci95={r.low:+.4f}..{r.high:+.4f} "
                     f"verdict={r.verdict} windows={r.windows} judged={sum(r.n_users)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, default=3, help="how many worlds")
    parser.add_argument("--first", type=int, default=1, help="the first world's number (decision worlds: from 1)")
    parser.add_argument("--held-out", action="store_true", help=f"held-out worlds (numbers from {HELD_OUT_FIRST} + first - 1)")
    parser.add_argument("--scale", default="small", choices=[s for s in SCALES if s in ("small", "medium")])
    parser.add_argument("--windows", type=int, help="windows of events per world (default: the preset's 8)")
    parser.add_argument("--quick", action="store_true", help="one world, small, 4 windows")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a TrainConfig field for every world")
    parser.add_argument("--no-hir", action="store_true", help="the baselines only")
    parser.add_argument("--new-items", choices=("neighbours", "content_map", "encoder"), help="items without engagement (the "
                        "evaluation's InductiveConfig.new_items and entity_embeddings' EmbedConfig.new_items; default: theirs)")
    parser.add_argument("--save-users", type=Path, metavar="DIR", help="write each world's per-user values to DIR/<world>.parquet")
    parser.add_argument("--against", type=Path, metavar="DIR", help="compare each method with a run saved by --save-users "
                                                                   "(paired over users: known items' deep funnel, new items' engagement)")
    parser.add_argument("--workdir", type=Path, help="keep the worlds' stores here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=ROOT / ".hir" / "benchmarks" / "worlds", help="reports")
    args = parser.parse_args(argv)
    if args.quick:
        args.worlds, args.scale, args.windows = 1, "small", args.windows or 4

    import torch

    from quality import run_case, save_and_compare
    from quality_pipeline import hir_embed_config, hir_train_overrides
    from hir_model.data.synthetic import SyntheticSource
    from hir_model.rank.inductive import InductiveConfig

    torch.set_num_threads(1)
    hir = None if args.no_hir else hir_train_overrides("synthetic", args.set)
    first = (HELD_OUT_FIRST - 1 if args.held_out else 0) + args.first
    new_items = {"new_items": args.new_items} if args.new_items else {}
    summary = []
    with (contextlib.nullcontext(str(args.workdir)) if args.workdir else tempfile.TemporaryDirectory()) as tmp:
        workdir = Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for number in range(first, first + args.worlds):
            config = draw_world(number, args.scale, args.windows)
            name = f"world{number}_{args.scale}"
            fields = {k: v for k, v in asdict(config).items() if k in ("seed", "branching", *RANGES)}
            print(f"world={name} " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
            t0 = time.perf_counter()
            results = run_case(name, SyntheticSource(config, workdir / f"{name}-data"), workdir, args.out, hir=hir,
                               embed=replace(hir_embed_config("synthetic"), **new_items),
                               inductive=InductiveConfig(**new_items))
            save_and_compare(name, results, args.save_users / f"{name}.parquet" if args.save_users else None,
                             args.against / f"{name}.parquet" if args.against else None,
                             targets=(("known", "deep_funnel"), ("new", "engagement")))
            lines = verdicts(name, results) if hir is not None else []
            for line in lines:
                print(line, flush=True)
            summary += lines
            print(f"world={name} seconds={time.perf_counter() - t0:.1f}", flush=True)
    if summary:
        print("\n".join(["", "summary:"] + summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
