r"""Next-window ranking quality of HIR and the baselines (popularity, content kNN, ALS, LightGCN), side by side.

Cases:
- `synthetic`: the synthetic ad ecosystem at two sizes (events per window), 8 weekly windows, every window
  with a successor evaluated (7). Ground truth is planted, cold-start items appear every window. HIR is one of the
  methods (`--no-hir`: the baselines only).
- `movielens`: the real MovieLens-100K windows (31 with a successor), deep-funnel Recall@20 of warm and cold
  users averaged over the last 4 windows, and the total time. HIR is trained on every window (hir.toml's [train] and
  [train.movielens], as the asset gets them), with the same content stand-in (`--no-hir`: the baselines only).

Each case materialises its source's `entity_catalog` and `raw_events` into a temporary partition store
exactly as the assets publish them (not timed). Without HIR it then runs `evaluate_windows` over it (timed: fits,
scoring, metrics, lift), content vectors being the evaluation's hashed TF-IDF stand-in.

With HIR (the default; `--no-hir` leaves it out) it publishes, window by window into the same store, what the pipeline's
assets publish for HIR, through the functions the assets call (hir_assets: `entry_args`, `commit_checkpoint`,
`publish_embeddings`, `publish_hierarchy`, `publish_head`, `publish_index`; hir_model: `build_window_graph`, the training
entry point) with the library configs the assets resolve from their run config (`<Asset>Run().<x>_config()`: the
dataclasses' defaults unless a flag below sets a field): `content_embeddings` (here the hashed TF-IDF stand-in of the
window's catalogue text, `hir_model.eval.text_vectors`: no model weights), `engagement_graph`, `hir_encoder` (the
training entry point with the asset's arguments, in this process instead of under Dagster Pipes: hir.toml's [train] +
[train.<source>], warm-started from t-1), `entity_embeddings`, `interest_hierarchy`, `ranking_head` and `bom_index`, for
every window but the last (it has no successor to be evaluated on; timed, the `hir_build_s` line). It then evaluates
every window with a successor as the `window_evaluation` asset does (`evaluate_published_window` with
`WindowEvaluationRun`'s config: HIR and the baselines on the same split, the baselines warm-starting from the previous
window's outcome, the conversion lift on HIR's pair score; timed), so every method reads the stand-in
`content_embeddings` (`content=asset`; the content kNN baseline's figures then differ from `--no-hir`'s in the third
decimal: IDF over window t's catalogue instead of the items known by end(t)). The synthetic cases print no NMI lines
(the planted truth is not passed).

    python benchmarks/quality.py            # synthetic at 100k and 400k events/window, all MovieLens windows
    python benchmarks/quality.py --quick    # synthetic at 20k and 80k events/window, the last 8 MovieLens windows
                                            # (HIR trained fresh from the first of them: not the demo's warm chain)
    python benchmarks/quality.py --quick --cases synthetic --no-hir   # the baselines only
    python benchmarks/quality.py --quick --cases synthetic --set steps=20   # a TrainConfig field, as if in hir.toml's
                                            # [train.<source>]
    python benchmarks/quality.py --cases movielens --set steps=24   # HIR on every MovieLens window, one override
    python benchmarks/quality.py --store .hir/storage/movielens   # HIR beside the baselines on a materialised store
    python benchmarks/quality.py --quick --cases movielens --prior-weight 0   # HIR's scores without the item prior
    python benchmarks/quality.py --quick --cases movielens --calibrate-days 0 --track-min-users 0 --recent-weight 0 \
        --kernel-weight 0                   # HIR ranked by its published rows alone, the prior at weight 1
                                            # (no recent items, no interest kernel, no fit, no track record)
    python benchmarks/quality.py --quick --cases movielens --skip-last 4 --track-min-users 0   # the held-out fit's weights
    python benchmarks/quality.py --quick --cases movielens --cold-structure-weight 0   # cold users by the encoder alone
    python benchmarks/quality.py --quick --cases movielens --skip-last 4   # the 8 MovieLens windows before the last 4
                                            # evaluated ones: for choices that must not be made on the reported windows
    python benchmarks/quality.py --quick --cases movielens --skip-last 4 --save-users /tmp/a.parquet
    python benchmarks/quality.py --quick --cases movielens --skip-last 4 --set steps=24 --against /tmp/a.parquet
                                            # a setting against the run saved before it, paired over users (each
                                            # method: the difference pooled over all windows and the last 4, its CI)
    python benchmarks/quality.py --quick --cases movielens --skip-last 4 --head-set rows_track_min_users=100 \
        --embed-set users='"broad"'             # any HeadConfig / EmbedConfig field (JSON values)

The publishing and in-process evaluation live in benchmarks/quality_pipeline.py.

`--store` reads a store the pipeline materialised (the demo's: HIR's entity_embeddings, hir_encoder, graph and
content of every window), evaluates every window with a successor exactly as the `window_evaluation` asset does
(`evaluate_published_window`, warm-starting window to window in process; nothing is written to the store) and prints
the same lines with HIR as one more method. The windows come from the configured source (HIR_SOURCE, hir.toml).

Prints, with HIR, a line per evaluated window with the item prior's weight HIR ranked with (`hir_prior_weight`, fitted
on `hir_prior_fitted_users` users of the window's last days; 0 users: not fitted), then one `key=value` line per
(case, method, slice, target) with Recall@20 and NDCG@20, a line per case
with its cost (with HIR first a `hir_build_s` line: seconds of the content stand-in, graphs, training and embedding,
and the last window's loss and the lowest prototype-usage entropy), the MovieLens
last-4 line per method, and writes markdown + HTML reports under --out.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # on 2 shared cores, threaded BLAS on small matrices is 10-40x slower
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hir_model.data.source import Source  # noqa: E402
from hir_model.baselines.registry import baselines  # noqa: E402
from hir_model.embed import EmbedConfig  # noqa: E402
from hir_model.eval.compare import compare, compare_runs, user_values  # noqa: E402
from hir_model.rank.head import HeadConfig  # noqa: E402
from hir_model.eval.pages import write_report  # noqa: E402
from hir_model.eval.report import evaluated, summary  # noqa: E402
from hir_model.eval.run import evaluate_windows  # noqa: E402
from hir_model.eval.scoring import EvalConfig  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train.config import TrainConfig, with_overrides  # noqa: E402
from quality_pipeline import (evaluate_published, hir_embed_config, hir_train_overrides, materialise,  # noqa: E402
                              publish_hir)  # benchmarks/ (the script's folder) is on sys.path

torch.set_num_threads(1)  # measured: 1 intra-op thread is ~4x faster than 2 on 2 shared cores


def run_case(name: str, source: Source, workdir: Path, out: Path, windows: int | None = None, last: int = 4,
             hir=None, head: HeadConfig = HeadConfig(), skip_last: int = 0, embed=None, inductive=None) -> list:
    """`hir` (TrainConfig overrides): publish HIR's artefacts trained with them (`publish_hir`, embedded with `embed`)
    and evaluate as `window_evaluation` does, HIR among the methods; None: the baselines only. `skip_last`: the last that many windows with a successor are
    left out (neither trained on nor evaluated; the first of them only serves as the successor of the last evaluated)."""
    store = PartitionStore(workdir / name)
    t0 = time.perf_counter()
    spec = materialise(source, store)
    setup = time.perf_counter() - t0
    keys = [w.key for w in spec.windows()]
    if skip_last:  # every key kept has a successor: all are evaluated (the last one's successor is read, not evaluated)
        keys = keys[:-(skip_last + 1)]
        keys = keys[-windows:] if windows else keys
    else:
        keys = keys[-(windows + 1):] if windows else keys  # + 1: the last window is skipped (no successor)
    if hir is not None:
        t0 = time.perf_counter()
        built = publish_hir(store, spec, keys, hir, workdir / f"{name}-hir-scratch", head, embed)
        s, cfg = built["seconds"], with_overrides(TrainConfig(), hir)
        print(f"case={name} hir_build_s={time.perf_counter() - t0:.1f} hir_content_s={s['content']:.1f} hir_graph_s={s['graph']:.1f} "
              f"hir_train_s={s['train']:.1f} hir_embed_s={s['embed']:.1f} hir_index_s={s['index']:.1f} windows_trained={built['windows_trained']} "
              f"steps_per_window={','.join(map(str, built['steps']))} users_view={(embed or EmbedConfig()).users} levels={','.join(map(str, cfg.prototypes.levels))} last_loss={built['last_loss']:.3f} "
              f"min_usage_entropy={built['min_usage_entropy']:.3f}", flush=True)
        t0 = time.perf_counter()
        unevaluated = {}

        def note(key, outcome):
            if not outcome.hir.evaluated:
                unevaluated[key] = outcome.hir.reason or ""
            else:
                print(f"case={name} window={key} {prior_fields(outcome.hir)}", flush=True)

        results = evaluate_published(store, spec, keys, on_window=note, inductive=inductive)
        for key, reason in unevaluated.items():
            print(f"case={name} window={key} hir=no reason={reason!r}", flush=True)
    else:
        t0 = time.perf_counter()
        results = evaluate_windows(store, spec, keys, baselines(), EvalConfig())
    seconds = time.perf_counter() - t0
    evals = evaluated(results)
    for row in summary(results):
        print(f"case={name} method={row.method} users={row.users} items={row.items} target={row.target} windows={row.windows} "
              f"users_per_window={row.users_per_window:.1f} candidates={row.candidates:.0f} "
              f"recall@20={row.values['recall@20']:.4f} ndcg@20={row.values['ndcg@20']:.4f}", flush=True)
    fit = {}
    for e in evals:
        for t in e.timings:
            fit[t.method] = fit.get(t.method, 0.0) + t.fit_s + t.score_s
    lifts = [e.lift for e in evals if e.lift is not None and e.lift.extended is not None]
    auc_lift = sum(lf.auc_lift for lf in lifts) / len(lifts) if lifts else float("nan")
    content = ",".join(sorted({e.content_source for e in evals}))
    print(f"case={name} windows_evaluated={len(evals)} windows_skipped={len(results) - len(evals)} setup_s={setup:.1f} "
          f"eval_s={seconds:.1f} " + " ".join(f"{m}_s={s:.1f}" for m, s in fit.items())
          + f" content={content} mean_lift_auc_{'mf_als' if hir is None else 'hir_exact'}={auc_lift:+.4f}", flush=True)
    comparisons(name, results, last)
    what = "baselines" if hir is None else "HIR and baselines"
    files = write_report(results, out / name, title=f"{name}: {what}, next-window evaluation", last=last)
    print(f"case={name} report={files.html}", flush=True)
    return results


PAIRS = (("hir", "hir_exact"), ("hir_exact", "hir_embeddings"), ("hir", "ranker_base"))  # served vs the head; the head
# vs the representation; HIR's lift to the ranker


def comparisons(name: str, results: list, last: int = 4) -> None:
    """Paired bootstrap 95% CIs over users (pooled over all windows and the last `last`): HIR as served against every
    other method, and the pairs above; warm and cold users' deep-funnel Recall@20 on known items."""
    methods = {r.method for e in evaluated(results) for r in e.results}
    reference = "hir" if "hir" in methods else ("hir_exact" if "hir_exact" in methods else "popularity")
    for users in ("warm", "cold"):
        rows = compare(results, reference=reference, pairs=[p for p in PAIRS if set(p) <= methods], users=users,
                       items="known", target="deep_funnel", metric="recall@20", last=last, per_window=False)
        for r in rows:
            users_per_window = sum(r.n_users) / max(r.windows, 1)
            print(f"case={name} compare={r.method}-{r.reference} users={users} scope={r.scope} "
                  f"{r.method}={r.method_value:.4f} {r.reference}={r.reference_value:.4f} diff={r.diff:+.4f} "
                  f"ci95={r.low:+.4f}..{r.high:+.4f} verdict={r.verdict} windows={r.windows} "
                  f"users_per_window={users_per_window:.1f}", flush=True)


def per_case(path: Path | None, case: str) -> Path | None:
    """`path` for one synthetic case: its stem + `-<case>` (a.parquet -> a-synthetic_20k.parquet)."""
    return None if path is None else path.with_name(f"{path.stem}-{case}{path.suffix}")


def save_and_compare(name: str, results: list, save: Path | None, against: Path | None, last: int = 4,
                     targets: tuple[tuple[str, str], ...] = (("known", "deep_funnel"),)) -> None:
    """Write the run's per-user values to `save` (parquet); compare every method with the same method of the run saved
    in `against` (paired over the users both judged: `compare_runs`), warm and cold Recall@20 for each (items, target)
    of `targets` (known items' deep funnel; the synthetic cases add new items' engagement)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(user_values(results), preserve_index=False), save)
        print(f"case={name} saved_users={save}", flush=True)
    if against is None:
        return
    saved = pq.read_table(against)
    for (items, target), users in itertools.product(targets, ("warm", "cold")):
        for r in compare_runs(results, saved, users=users, items=items, target=target, last=last):
            print(f"case={name} against={against.name} method={r.method} users={users} items={items} target={target} scope={r.scope} "
                  f"now={r.method_value:.4f} saved={r.reference_value:.4f} diff={r.diff:+.4f} ci95={r.low:+.4f}..{r.high:+.4f} "
                  f"verdict={r.verdict} windows={r.windows}", flush=True)


def movielens_last(results: list, last: int = 4) -> None:
    """Deep-funnel Recall@20 of warm and cold users per method, averaged over the last `last` evaluated windows."""
    rows = {(r.method, r.users): r for r in summary(results, last) if r.target == "deep_funnel" and r.items == "known"}
    for method in dict.fromkeys(m for m, _ in rows):
        warm, cold = rows.get((method, "warm")), rows.get((method, "cold"))
        print(f"case=movielens_last{last} method={method} target=deep_funnel "
              f"warm_recall@20={warm.values['recall@20'] if warm else float('nan'):.4f} "
              f"cold_recall@20={cold.values['recall@20'] if cold else float('nan'):.4f} "
              f"warm_users_per_window={warm.users_per_window if warm else 0:.1f} "
              f"cold_users_per_window={cold.users_per_window if cold else 0:.1f}", flush=True)


def prior_fields(hir) -> str:
    """HIR's weights in a window (the prior's, the users it was fitted on: 0 when not fitted, where it came from, the
    prior's beside the rows alone, the co-engagement's) as key=value pairs;
    `hir`: the window's HIRStatus."""
    fitted, head = hir.prior_calibration or {}, hir.head or {}
    return (f"hir_prior_weight={hir.prior_weight:g} hir_prior_fitted_users={fitted.get('users', 0)} "
            f"hir_prior_source={head.get('prior_source', '-')} hir_rows_prior_weight={head.get('embeddings_prior_weight', '-')} "
            f"hir_rows_source={head.get('rows_source', '-')} "
            f"hir_coengagement_weight={head.get('coengagement_weight', '-')}")


def run_store(root: Path, out: Path, last: int = 4) -> list:
    """Every window of a materialised store through `evaluate_published_window` (HIR + baselines), in time order."""
    import pyarrow.parquet as pq

    from hir_model.config import load_config

    config = load_config()
    source = config.make_source()
    spec = config.window_spec(source)
    truth_path = Path(getattr(source, "data_dir", "")) / "ground_truth" / "entities.parquet"
    truth = pq.read_table(truth_path) if config.source == "synthetic" and truth_path.is_file() else None

    def line(key, outcome):
        hir = outcome.hir
        print(f"case=store window={key} hir={'yes' if hir.evaluated else 'no (' + (hir.reason or '') + ')'} "
              + " ".join(f"{t.method}_s={t.fit_s + t.score_s:.2f}" for t in outcome.evaluation.timings)
              + (f" {prior_fields(hir)}" if hir.evaluated else "")
              + "".join(f" nmi_L{a.level}={a.nmi:.3f} ari_L{a.level}={a.ari:.3f}" for a in outcome.agreement or ()
                        if a.level == a.planted_level), flush=True)

    t0 = time.perf_counter()
    results = evaluate_published(PartitionStore(root), spec, [w.key for w in spec.windows()], truth, line)
    name = f"store_{config.source}"
    for row in summary(results):
        print(f"case={name} method={row.method} users={row.users} items={row.items} target={row.target} windows={row.windows} "
              f"recall@20={row.values['recall@20']:.4f} ndcg@20={row.values['ndcg@20']:.4f}", flush=True)
    movielens_last(results, last)
    comparisons(name, results, last)
    print(f"case={name} windows_evaluated={len(evaluated(results))} eval_s={time.perf_counter() - t0:.1f}", flush=True)
    files = write_report(results, out / name, title=f"{root}: HIR and baselines, next-window evaluation", last=last)
    print(f"case={name} report={files.html}", flush=True)
    return results


def field_values(pairs: list[str]) -> dict:
    """`--head-set` / `--embed-set` values: FIELD=JSON pairs as a dict of dataclass fields."""
    return {k: json.loads(v) for k, v in (p.split("=", 1) for p in pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller synthetic sizes, the last 8 MovieLens windows")
    parser.add_argument("--out", type=Path, default=ROOT / ".hir" / "benchmarks" / "quality", help="where reports go")
    parser.add_argument("--cases", default="synthetic,movielens", help="comma-separated: synthetic, movielens")
    parser.add_argument("--new-items", choices=("neighbours", "content_map", "encoder"), help="items without engagement (the "
                        "evaluation's InductiveConfig.new_items and entity_embeddings' EmbedConfig.new_items; default: theirs)")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data", help="holds ml-100k/ (fetched by `make data`)")
    parser.add_argument("--store", type=Path, help="evaluate HIR beside the baselines on this materialised store (and nothing else)")
    parser.add_argument("--no-hir", action="store_true", help="the baselines only (no HIR training, embedding, column)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a TrainConfig field of HIR's training (JSON value) over hir.toml's, e.g. --set steps=20")
    parser.add_argument("--users-view", choices=("broad", "narrow"),
                        help="warm users' embedding view over hir.toml's [embed] users (EmbedConfig.users)")
    parser.add_argument("--save-users", type=Path, metavar="FILE",
                        help="write the MovieLens case's per-user values (parquet), for a later --against; each synthetic "
                             "case's go beside it (FILE's stem + -synthetic_20k ...)")
    parser.add_argument("--against", type=Path, metavar="FILE",
                        help="compare each method with the same method of a run saved with --save-users, paired over users")
    parser.add_argument("--skip-last", type=int, default=0, metavar="N",
                        help="leave the last N evaluated windows out (MovieLens), so choices are made on earlier windows")
    # the ranking head's fields (RankingHeadRun, so unset ones keep HeadConfig's defaults; 0 days: off)
    parser.add_argument("--prior-weight", type=float, help="HIR's item prior weight in logit units where it is not fitted "
                                                           "(hir_model.rank.head; 0: the plain dot product)")
    parser.add_argument("--calibrate-days", type=float,
                        help="fit the prior's weight on each window's last days (hir_model.rank.fit; 0: off)")
    parser.add_argument("--track-min-users", type=int,
                        help="judged users the earlier heads' track record must hold to set the prior's weights "
                             "(hir_model.rank.track; 0: never, the held-out fit)")
    parser.add_argument("--recent-weight", type=float,
                        help="a warm user's query: (1 - w) * published row + w * recent items (0: the row alone)")
    parser.add_argument("--kernel-weight", type=float,
                        help="a warm user's score: (1 - k) * query.v + k * the interest kernel over recent items (0: off)")
    parser.add_argument("--cold-structure-weight", type=float,
                        help="a cold user's score: (1 - s) * encoder vector.v + s * the structural readout (0: off)")
    parser.add_argument("--cold-prior-days", type=float,
                        help="cold users' item prior: engagements made in their users' first days (0: warm users' prior)")
    parser.add_argument("--workdir", type=Path, help="materialise the cases' stores here and keep them (default: a "
                                                     "temporary folder, removed at the end)")
    parser.add_argument("--head-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a HeadConfig field (hir_model.rank.head; JSON value) over the flags above, e.g. "
                             "--head-set coengagement=false")
    parser.add_argument("--embed-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="an EmbedConfig field (hir_model.embed; JSON value) over hir.toml's [embed], e.g. "
                             "--embed-set batch_size=64")
    args = parser.parse_args()
    from hir_assets.index import RankingHeadRun

    embed_set = field_values(args.embed_set)

    head = RankingHeadRun(prior_weight=args.prior_weight, calibrate_days=args.calibrate_days,
                          track_min_users=args.track_min_users, recent_weight=args.recent_weight,
                          kernel_weight=args.kernel_weight, cold_structure_weight=args.cold_structure_weight,
                          cold_prior_days=args.cold_prior_days).head_config()
    head = replace(head, **field_values(args.head_set))
    if args.store:
        run_store(args.store, args.out)
        return
    cases = set(args.cases.split(","))
    from hir_model.rank.inductive import InductiveConfig

    inductive = InductiveConfig(**({"new_items": args.new_items} if args.new_items else {}))
    if args.new_items:
        embed_set = {**embed_set, "new_items": args.new_items}
    hir = None if args.no_hir else hir_train_overrides("synthetic", args.set)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(str(args.workdir)) if args.workdir else tempfile.TemporaryDirectory()) as tmp:
        workdir = Path(tmp)
        if "synthetic" in cases:
            from hir_model.data.synthetic import SyntheticConfig, SyntheticSource

            for size in ((20_000, 80_000) if args.quick else (100_000, 400_000)):
                source = SyntheticSource(replace(SyntheticConfig(), events_per_window=size), workdir / f"synthetic-{size}")
                name = f"synthetic_{size // 1000}k"
                results = run_case(name, source, workdir, args.out, hir=hir, head=head, inductive=inductive,
                                   embed=replace(hir_embed_config("synthetic", args.users_view), **embed_set))
                save_and_compare(name, results, per_case(args.save_users, name), per_case(args.against, name),
                                 targets=(("known", "deep_funnel"), ("new", "engagement")))
        if "movielens" in cases:
            from hir_model.data.movielens import MovieLensSource

            source = MovieLensSource(args.data_dir)
            source.prepare()
            t0 = time.perf_counter()
            hir_ml = None if args.no_hir else hir_train_overrides("movielens", args.set)
            results = run_case("movielens", source, workdir, args.out, windows=8 if args.quick else None, hir=hir_ml,
                               head=head, skip_last=args.skip_last, inductive=inductive,
                               embed=replace(hir_embed_config("movielens", args.users_view), **embed_set))
            movielens_last(results)
            save_and_compare("movielens", results, args.save_users, args.against,
                             targets=(("known", "deep_funnel"), ("new", "engagement"), ("new", "deep_funnel")))
            print(f"case=movielens_total seconds={time.perf_counter() - t0:.1f} windows={len(evaluated(results))}", flush=True)


if __name__ == "__main__":
    main()
