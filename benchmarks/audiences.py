r"""Audiences judged causally: window t's audiences on window t+1's conversions (hir_model.eval.audience), HIR beside
the transposed baselines, paired bootstrap 95% CIs over entities, and the served audience's cost.

Over a store the pipeline (or benchmarks/quality.py --workdir) materialised, or a synthetic world this script builds
first (`--world N`: decision world N of benchmarks/worlds.py, 0 the demo's world; `materialise` + `publish_hir` of
benchmarks/quality_pipeline.py with hir.toml's settings, as the assets publish them), every window with a successor and a
`ranking_head`: the split as `window_evaluation` builds it, HIR's `hir_exact` head (the audience slice's `hir` row: the
served audience path's scores), the baselines fitted fresh on the split, and the audience slice with each `--variant`
(AudienceConfig fields; the first is the reference the others are compared with, paired over entities). Prints
`key=value` lines: per (entity kind, group, method) the metrics over the windows, `compare=` lines of hir minus each
baseline and of each variant minus the first, and `audience_s=` the time to serve one audience of every judged entity
kind through `Audiences.audience` (p50 / p99 over a sample of entities) and to score every advertiser and campaign of a
window (what the `audiences` asset spends).

    python benchmarks/audiences.py --store .hir/aud/1 --source synthetic            # every window of the store
    python benchmarks/audiences.py --store S --variant aggregate=max --variant aggregate=lse --variant propensity_weight=0.5
    python benchmarks/audiences.py --store S --first 2024-01-14 --last 2024-02-11   # a range of windows (t keys)
    python benchmarks/audiences.py --store S --quick                                # the last 2 windows
    python benchmarks/audiences.py --world 1 --quick     # build decision world 1 at small, 4 windows, then evaluate
    python benchmarks/audiences.py --cost 300000,200000  # the cost alone at large's size: a random head state (not a
                                                         # trained one), audience p50/p99 and the asset's work extrapolated
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from datetime import datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hir_model.data.windows import KEY_FORMAT, WindowSpec, utc  # noqa: E402
from hir_model.eval.audience import AUDIENCE_USERS, KINDS, AudienceEvalConfig  # noqa: E402
from hir_model.eval.compare import compare  # noqa: E402
from hir_model.eval.run import TableReader, WindowEvaluation, audience_results, item_content, load_split  # noqa: E402
from hir_model.eval.scoring import EvalConfig  # noqa: E402
from hir_model.eval.window_evaluation import hir_methods, make_methods  # noqa: E402
from hir_model.rank.audience import AudienceConfig  # noqa: E402
from hir_model.rank.state import HEAD_ASSET  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.baselines.registry import BaselinesConfig  # noqa: E402
from hir_model.protocol.split import to_us  # noqa: E402

BASELINES = ("popularity", "item2item_recent", "content", "mf_als", "lightgcn")
METRICS = ("recall@100", "recall@1000", "recall@1pct", "auc")


def spec_of(store: PartitionStore) -> WindowSpec:
    keys = store.partitions("raw_events")
    first, last = (utc(datetime.strptime(k, KEY_FORMAT)) for k in (keys[0], keys[-1]))
    return WindowSpec("weekly", first, last + timedelta(days=7))


def served() -> AudienceConfig:
    """What `hir serve` and the `audiences` asset score with: hir.toml's [audience] (and [audience.<HIR_SOURCE>])."""
    from hir_model.config import load_config
    from hir_model.rank.audience import audience_config

    return audience_config(load_config().audience)


def variant(fields: str) -> AudienceConfig:
    """The served config with these fields over it (FIELD=VALUE,...; JSON values, bare words as strings)."""
    values = dict(kv.split("=", 1) for kv in fields.split(",") if kv)
    return replace(served(), **{k: json.loads(v) if v[:1] not in "abcdefghijklmnopqrstuvwxyz" else v
                                for k, v in values.items()})


def evaluate(store: PartitionStore, keys: list[str], variants: list[AudienceConfig], serve: int) -> tuple[list, list]:
    """Per variant, the WindowEvaluations holding the audience slice of every window in `keys`; serving timings."""
    spec = spec_of(store)
    reader, config = TableReader(store), EvalConfig()
    out: list[list] = [[] for _ in variants]
    timings = []
    for key in keys:
        window = spec.window(key)
        nxt = spec.next(window)
        split, next_events = load_split(reader, spec, window, nxt, config)
        items, content = item_content(reader, split.items, window, nxt, config)
        split = replace(split, items=items)
        head, _, _ = hir_methods(store, key, to_us(window.end), ("hir_exact",), 20)
        methods = make_methods(BASELINES, BaselinesConfig(), []) + head
        t0 = time.perf_counter()
        for m in methods:
            m.fit(split.train, split.items.known())
        fit_s = time.perf_counter() - t0
        for i, v in enumerate(variants):
            t0 = time.perf_counter()
            chosen = methods if i == 0 else head  # the baselines once: their rows do not depend on the variant
            results = audience_results(split, next_events, chosen, replace(config, audience=AudienceEvalConfig(audience=v)))
            if i:
                results = [r for r in results if r.method == "hir"]
            out[i].append(WindowEvaluation(key, nxt.key, split.counts, content, tuple(results), (), None,
                                           tuple(dict.fromkeys(r.method for r in results))))
            print(f"window={key} variant={i} users={split.train.n_users} fit_s={fit_s:.1f} "
                  f"slice_s={time.perf_counter() - t0:.1f}", flush=True)
        if serve:
            timings.append(serve_timings(store, key, serve))
        reader.forget_before(key)
    return out, timings


def serve_timings(store: PartitionStore, key: str, n: int) -> dict:
    """Seconds per `Audiences.audience` call for up to `n` advertisers and `n` products of window `key` (k=1000), and
    for every advertiser and campaign of the window (the asset's work)."""
    from hir_model.rank.audience import Audiences, AudienceTooSmall

    t0 = time.perf_counter()
    audiences = Audiences.load(store, key, config=served(), increments=False)
    load_s = time.perf_counter() - t0
    types = audiences.linker.types
    rng = np.random.default_rng(0)
    out = {"load_s": load_s}
    for kind in ("advertiser", "product"):
        ids = sorted(e for e, t in types.items() if t == kind)
        picked = [ids[i] for i in rng.choice(len(ids), min(n, len(ids)), replace=False)] if ids else []
        seconds = []
        for e in picked:
            t1 = time.perf_counter()
            try:
                audiences.audience(e, k=1000)
            except (AudienceTooSmall, LookupError):
                continue
            seconds.append(time.perf_counter() - t1)
        if seconds:
            out[kind] = (float(np.percentile(seconds, 50)), float(np.percentile(seconds, 99)), len(seconds))
    return out


def cost_at_scale(n_users: int, n_items: int, events: int = 20, width: int = 64, per_advertiser: int = 25,
                  queries: int = 20, asset_sample: int = 40) -> dict:
    """Seconds of `Audiences.audience` (k = 1,000) and of `Audiences.many` over a sample of advertisers, on a random head
    state of this size: unit item vectors and content in `width` dims, `events` engagements a user, advertisers of
    `per_advertiser` products (the computation's cost only; nothing here is a trained model)."""
    import pyarrow as pa

    from hir_model.protocol.split import Interactions
    from hir_model.rank.audience import Audiences, Linker, Membership
    from hir_model.rank.head import HeadConfig
    from hir_model.rank.recommender import Recommender
    from hir_model.rank.state import HeadState

    rng = np.random.default_rng(0)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    vectors, content = unit(rng.normal(size=(n_items, width))), unit(rng.normal(size=(n_items, width)))
    item_ids = np.array([f"p{i:07d}" for i in range(n_items)], object)
    user_ids = np.array([f"u{i:07d}" for i in range(n_users)], object)
    user = np.repeat(np.arange(n_users), events)
    item = (rng.zipf(1.3, len(user)) - 1) % n_items
    ts = np.sort(rng.integers(0, 7 * 86_400_000_000, len(user)).reshape(n_users, events), 1).reshape(-1)
    history = Interactions("w", 7 * 86_400_000_000, user_ids, user, item, ts, rng.random(len(user)) < 0.05, n_items)
    state = HeadState("w", 7 * 86_400_000_000, HeadConfig(), item_ids, np.full(n_items, "product", object), vectors,
                      (0.05 * np.log(np.bincount(item, minlength=n_items) + 1.0)).astype(np.float32), None, None, 1.0, 0.05,
                      history, content=content)
    t0 = time.perf_counter()
    rec = Recommender(state, unit(rng.normal(size=(n_users, width))), np.ones(n_users, bool))
    n_adv = n_items // per_advertiser
    parents = np.array([f"a{i % n_adv:06d}" for i in range(n_items)], object)
    catalog = pa.table({"entity_id": list(item_ids) + sorted(set(parents)),
                        "entity_type": ["product"] * n_items + ["advertiser"] * n_adv,
                        "parent_id": list(parents) + [None] * n_adv})
    audiences = Audiences(rec, Linker(catalog), Membership(None), served())
    out = {"setup_s": time.perf_counter() - t0}
    for kind, ids in (("product", item_ids), ("advertiser", np.array(sorted(set(parents)), object))):
        seconds = []
        for e in rng.choice(ids, queries, replace=False):
            t1 = time.perf_counter()
            audiences.audience(str(e), k=1000)
            seconds.append(time.perf_counter() - t1)
        out[kind] = (float(np.percentile(seconds, 50)), float(np.percentile(seconds, 99)), len(seconds))
    sample = [str(e) for e in rng.choice(sorted(set(parents)), asset_sample, replace=False)]
    t1 = time.perf_counter()
    audiences.many(sample, k=1000)
    per_entity = (time.perf_counter() - t1) / asset_sample
    out["many_per_advertiser_s"] = per_entity
    out["asset_advertisers_extrapolated_s"] = per_entity * n_adv
    return out


def build_world(number: int, root: Path, windows: int | None) -> Path:
    """Synthetic world `number` (0: the demo's) materialised and HIR published under `root`; returns the store's path."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quality_pipeline import hir_embed_config, hir_train_overrides, materialise, publish_hir
    from worlds import draw_world

    from hir_model.data.synthetic import SyntheticConfig, SyntheticSource

    config = SyntheticConfig() if number == 0 else draw_world(number, "small")
    config = replace(config, n_windows=windows) if windows else config
    t0 = time.perf_counter()
    store = PartitionStore(root / f"world{number}")
    spec = materialise(SyntheticSource(config, root / f"world{number}-source"), store)
    publish_hir(store, spec, [w.key for w in spec.windows()], hir_train_overrides("synthetic"), root / f"world{number}-scratch",
                embed=hir_embed_config("synthetic"))
    print(f"world={number} seed={config.seed} windows={config.n_windows} build_s={time.perf_counter() - t0:.1f}", flush=True)
    return root / f"world{number}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="a materialised store (ranking_head and its inputs)")
    parser.add_argument("--world", type=int, help="build this synthetic world first (0: the demo's; N: decision world N)")
    parser.add_argument("--workdir", type=Path, help="where --world's store is built and kept (default: a temporary one)")
    parser.add_argument("--cost", metavar="USERS,ITEMS", help="time audiences on a random head state of this size instead")
    parser.add_argument("--first", help="the first window key evaluated")
    parser.add_argument("--last", help="the last window key evaluated")
    parser.add_argument("--quick", action="store_true", help="the last 2 windows with a successor only")
    parser.add_argument("--variant", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                        help="AudienceConfig fields of one variant of the hir row over the served config "
                             "(hir.toml's [audience], [audience.<HIR_SOURCE>]; default: that config alone)")
    parser.add_argument("--serve", type=int, default=20, help="audiences served per kind per window for the timings")
    parser.add_argument("--name", default="audiences", help="the case's name in the output lines")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.cost:
        n_users, n_items = (int(x) for x in args.cost.split(","))
        c = cost_at_scale(n_users, n_items, queries=5 if args.quick else 20)
        print(f"case=cost users={n_users} items={n_items} setup_s={c['setup_s']:.1f} " + " ".join(
            f"{k}_p50_s={c[k][0]:.3f} {k}_p99_s={c[k][1]:.3f} {k}_n={c[k][2]}" for k in ("product", "advertiser"))
            + f" many_per_advertiser_s={c['many_per_advertiser_s']:.3f} "
            f"asset_advertisers_extrapolated_s={c['asset_advertisers_extrapolated_s']:.0f}", flush=True)
        return 0
    if args.store is None and args.world is None:
        parser.error("give --store or --world")
    if args.store is None:
        import tempfile

        root = args.workdir or Path(tempfile.mkdtemp(prefix="hir-audiences-"))
        args.store = build_world(args.world, root, 4 if args.quick else None)
    store = PartitionStore(args.store)
    spec = spec_of(store)
    keys = [k for k in store.partitions(HEAD_ASSET) if spec.next(spec.window(k)) is not None
            and store.exists("raw_events", spec.next(spec.window(k)).key)]
    keys = [k for k in keys if (not args.first or k >= args.first) and (not args.last or k <= args.last)]
    keys = keys[-2:] if args.quick else keys
    variants = [variant(v) for v in args.variant] or [served()]
    t0 = time.perf_counter()
    runs, timings = evaluate(store, keys, variants, args.serve)
    name = args.name
    print(f"case={name} windows={','.join(keys)} variants={json.dumps(args.variant or ['default'])} "
          f"seconds={time.perf_counter() - t0:.1f}", flush=True)
    base = runs[0]
    for group in ("known", "new"):
        for kind in KINDS:
            rows = [r for e in base for r in e.results if (r.items, r.target) == (group, kind)]
            for method in dict.fromkeys(r.method for r in rows):
                mine = [r for r in rows if r.method == method]
                vals = " ".join(f"{m}={np.mean([r.metrics.as_dict()[m] for r in mine]):.4f}" for m in METRICS)
                print(f"case={name} group={group} entities={kind} method={method} windows={len(mine)} "
                      f"entities_per_window={np.mean([r.metrics.n_users for r in mine]):.1f} {vals}", flush=True)
            for metric in ("recall@1pct", "recall@1000", "auc"):
                others = [m for m in dict.fromkeys(r.method for r in rows) if m != "hir"]
                for c in compare(base, reference="hir", methods=[], pairs=[("hir", m) for m in others],
                                 users=AUDIENCE_USERS, items=group, target=kind, metric=metric, last=None,
                                 per_window=False):
                    print(f"case={name} compare=hir-{c.reference} group={group} entities={kind} metric={metric} "
                          f"hir={c.method_value:.4f} other={c.reference_value:.4f} diff={c.diff:+.4f} "
                          f"ci95={c.low:+.4f}..{c.high:+.4f} verdict={c.verdict} entities={sum(c.n_users)}", flush=True)
                for i, run in enumerate(runs[1:], 1):
                    both = [WindowEvaluation(a.window, a.next_window, a.counts, a.content_source,
                                             tuple(r for r in a.results if r.method == "hir")
                                             + tuple(replace(r, method=f"variant{i}") for r in b.results if r.method == "hir"),
                                             (), None, ("hir", f"variant{i}")) for a, b in zip(base, run)]
                    for c in compare(both, reference="hir", methods=[f"variant{i}"], users=AUDIENCE_USERS, items=group,
                                     target=kind, metric=metric, last=None, per_window=False):
                        print(f"case={name} compare=variant{i}-variant0 variant={args.variant[i]} group={group} "
                              f"entities={kind} metric={metric} diff={c.diff:+.4f} ci95={c.low:+.4f}..{c.high:+.4f} "
                              f"verdict={c.verdict} entities={sum(c.n_users)}", flush=True)
    for key, s in zip(keys, timings):
        parts = " ".join(f"{k}_p50_s={v[0]:.3f} {k}_p99_s={v[1]:.3f} {k}_n={v[2]}" for k, v in s.items() if k != "load_s")
        print(f"case={name} window={key} audience_load_s={s['load_s']:.2f} {parts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
