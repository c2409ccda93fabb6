r"""New-item placements side by side on a store `benchmarks/worlds.py --workdir DIR` kept: warm users, items first seen
in t+1, Recall@20 of `hir_exact` with each `InductiveConfig.new_items` path (and each blended with content kNN's
score), against content kNN, paired bootstrap 95% CIs over users pooled over the evaluated windows. Only HIR's head
and content kNN are scored, so a medium world's windows take minutes, not the half hour of a full worlds.py run.

    python benchmarks/worlds.py --worlds 1 --scale medium --first 4 --windows 4 --workdir /tmp/w4
    python benchmarks/new_items_probe.py /tmp/w4 --world 4 --scale medium --windows 4
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class Renamed:
    """A method under another name (one row per placement)."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def fit(self, train, items):
        self.inner.fit(train, items)

    def score(self, queries, items):
        return self.inner.score(queries, items)


class Blend:
    """(1 - share) x the head's score + share x content kNN's."""

    def __init__(self, head, content, share: float, name: str):
        self.head, self.content, self.share, self.name = head, content, share, name

    def fit(self, train, items):
        pass

    def score(self, queries, items):
        return (1 - self.share) * self.head.score(queries, items) + self.share * self.content.score(queries, items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path, help="the --workdir of a worlds.py run")
    parser.add_argument("--world", type=int, required=True, help="the world's number")
    parser.add_argument("--scale", default="small", choices=("small", "medium"))
    parser.add_argument("--windows", type=int, help="as given to worlds.py")
    parser.add_argument("--paths", default="neighbours,content_map,encoder", help="InductiveConfig.new_items values")
    parser.add_argument("--shares", default="0.25,0.5,0.75", help="content kNN's shares of the blends ('' for none)")
    args = parser.parse_args(argv)

    import torch

    from worlds import draw_world
    from hir_model.baselines.content_knn import ContentKNN
    from hir_model.data.synthetic import SyntheticSource
    from hir_model.data.windows import WindowSpec
    from hir_model.eval.compare import compare
    from hir_model.eval.run import evaluate_window
    from hir_model.eval.scoring import EvalConfig
    from hir_model.eval.window_evaluation import hir_methods
    from hir_model.protocol.split import to_us
    from hir_model.rank.inductive import InductiveConfig
    from hir_model.storage import PartitionStore

    torch.set_num_threads(1)
    name = f"world{args.world}_{args.scale}"
    source = SyntheticSource(draw_world(args.world, args.scale, args.windows), args.workdir / f"{name}-data")
    spec = WindowSpec.covering("weekly", *source.span())
    store = PartitionStore(args.workdir / name)
    shares = [float(x) for x in args.shares.split(",") if x]
    results = []
    for window in spec.windows():
        if spec.next(window) is None:
            continue
        content, methods = ContentKNN(), []
        for path in args.paths.split(","):
            rows, status, _ = hir_methods(store, window.key, to_us(window.end), ("hir_exact",), 20, InductiveConfig(new_items=path))
            if not rows:
                break
            methods.append(Renamed(rows[0], f"exact_{path}"))
            methods += [Blend(rows[0], content, s, f"blend_{path}_{s:g}") for s in shares]
        if not methods:
            print(f"world={name} window={window.key} hir=no reason={status.reason!r}", flush=True)
            continue
        results.append(evaluate_window(store, spec, window.key, [content] + methods, EvalConfig(lift_method=None)))
        print(f"world={name} window={window.key} evaluated=1", flush=True)
    for target in ("engagement", "deep_funnel"):
        for r in compare(results, reference="content", users="warm", items="new", target=target, last=None, per_window=False):
            print(f"world={name} target={target} {r.method}={r.method_value:.4f} content={r.reference_value:.4f} "
                  f"diff={r.diff:+.4f} ci95={r.low:+.4f}..{r.high:+.4f} verdict={r.verdict} judged={sum(r.n_users)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
