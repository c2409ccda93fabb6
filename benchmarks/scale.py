"""Seconds and peak memory per window of every pipeline stage, at two synthetic sizes side by side (issue 28).

    python benchmarks/scale.py                          # small vs medium (10x), 1 window evaluated on the next
    python benchmarks/scale.py --quick                  # small/20 vs small/2 (10x), content stand-in, 4 training
                                                        # steps: every stage runs, in under a minute
    python benchmarks/scale.py --sizes medium,large     # 10x further; --windows 2 for a warm-started second window
    python benchmarks/scale.py --skip content           # content vectors from a hashed TF-IDF stand-in, not timed
    python benchmarks/scale.py --sizes medium,large --skip content --max-users 250
                                                        # the same judged users per evaluation slice at both sizes:
                                                        # evaluation's ratio is then its cost per judged user

A size is a preset of the synthetic source (hir_model/data/synthetic_config.py: small, medium, large, xl) or a
preset divided by an integer (small/20: every entity and event count / 20). Each size generates `--windows` + 1
windows into a scratch folder and runs, window by window in asset order, the library call each Dagster asset makes
on a PartitionStore there: prepare (the source's images and ground truth), ingest (`build_catalog`, `build_events`:
generation included), catalog_clip (`refresh`), content (`embed_window`: MiniLM text + catalog_clip images),
graph (`build_window_graph`), training (`hir_model.train.entry.run`, hir.toml's [train] + [train.synthetic]),
embeddings (`embed_window`), hierarchy (`hierarchy_window`), ranking_head (`build_head_state`), bom
(`build_window_index`) and evaluation (`evaluate_published_window` of window t on t+1). Library defaults are the
assets' run-config defaults. torch runs one intra-op thread (quality.py measured 1 thread ~4x faster than 2 on two
shared cores).

Memory: every (size, stage, window) runs in a child forked from this process after the libraries are imported; its
peak is the child's ru_maxrss from os.wait4, so it holds the imported libraries (`idle_child_mb`, printed first: the
peak of a child that does nothing) and nothing of the other stages. Seconds are the child's wall clock around the call, imports excluded. A child whose
resident memory passes --max-mb (default 7500) is killed and its stage reported as an error (the machine is shared).

Prints a `key=value` line per (size, stage, window), then per stage: mean seconds per window at each size, their
`ratio` (target: at most 12 for 10x the entities and events), peak MB at each size (target at large: under 8192),
and `entities_ratio` / `events_ratio` of the two sizes' inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Everything the stages call is imported here, before the children are forked, so no stage's seconds hold imports.
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from hir_model.config import load_config  # noqa: E402
from hir_model.content.catalog_clip import CLIP_ASSET, CLIP_CHECKPOINT_FILE, load_checkpoint, refresh, write_checkpoint  # noqa: E402
from hir_model.content.embed import REUSED_COLUMNS, ContentConfig, embed_window as embed_content  # noqa: E402
from hir_model.content.text import TextEncoderConfig, resolve_dtype  # noqa: E402
from hir_model.content.vectors import CONTENT_ASSET, CONTENT_FILE  # noqa: E402
from hir_model.data.synthetic import SyntheticSource  # noqa: E402
from hir_model.data.synthetic_config import SCALED_FIELDS, SyntheticConfig, preset  # noqa: E402
from hir_model.data.tables import (CATALOG_ASSET, CATALOG_REFERENCE, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE,  # noqa: E402
                                   build_catalog, build_events)
from hir_model.data.windows import Window, WindowSpec  # noqa: E402
from hir_model.embed import EMBEDDINGS_ASSET, EMBEDDINGS_FILE, EmbedConfig, embeddings_table  # noqa: E402
from hir_model.embed.entity_embeddings import embed_window as embed_entities  # noqa: E402
from hir_model.eval.publish import write_evaluation  # noqa: E402
from hir_model.eval.text_vectors import stand_in_table  # noqa: E402
from hir_model.eval.window_evaluation import WindowEvalConfig, WindowOutcome, evaluate_published_window  # noqa: E402
from hir_model.graph.window import GRAPH_ASSET, build_window_graph, to_us  # noqa: E402
from hir_model.hierarchy import ASSIGNMENTS_FILE, PRIMITIVES_FILE, SUPER_GRAPH_FILE  # noqa: E402
from hir_model.hierarchy.build import HIERARCHY_ASSET  # noqa: E402
from hir_model.hierarchy.interest_hierarchy import hierarchy_window  # noqa: E402
from hir_model.rank.bom_index import build_window_index  # noqa: E402
from hir_model.rank.ranking_head import build_head_state  # noqa: E402
from hir_model.rank.state import HEAD_ASSET, write_head  # noqa: E402
from hir_model.retrieval import BOM_ASSET  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train import entry  # noqa: E402
from hir_model.train.checkpoint import CHECKPOINT_FILE, ENCODER_ASSET  # noqa: E402

STAGES = ("prepare", "ingest", "catalog_clip", "content", "graph", "training", "embeddings", "hierarchy", "ranking_head",
          "bom", "evaluation")
EVERY_WINDOW = ("prepare", "ingest", "catalog_clip", "content")  # also run on the last window (t+1 of the evaluation)
TARGET_RATIO, TARGET_PEAK_MB = 12.0, 8192


def size_config(size: str, windows: int) -> SyntheticConfig:
    """A preset, or `preset/divisor` with every count of SCALED_FIELDS divided (at least 1); windows + 1 windows."""
    name, _, divisor = size.partition("/")
    cfg = preset(name)
    if divisor:
        cfg = replace(cfg, **{f: max(1, getattr(cfg, f) // int(divisor)) for f in SCALED_FIELDS})
    return replace(cfg, n_windows=windows + 1)


@dataclass
class Run:
    """One size's scratch world: the source, the store the stages publish into, and the window spec."""

    source: SyntheticSource
    store: PartitionStore
    spec: WindowSpec
    scratch: Path
    stand_in_content: bool  # --skip content: the hashed TF-IDF stand-in instead of MiniLM + catalog_clip
    train_overrides: dict  # hir.toml's [train] + [train.synthetic], as hir_assets/training.py gets them, then --steps
    text_dtype: str = "auto"  # MiniLM's dtype: the demo's (Makefile: HIR_TEXT_DTYPE=auto)
    max_users: int | None = None  # --max-users: judged users per evaluation slice (None: EvalConfig's)

    def previous(self, window: Window) -> str | None:
        prev = self.spec.previous(window)
        return prev.key if prev is not None else None


def prepare(run: Run, window: Window) -> dict:
    run.source.prepare()
    return {"products": len(run.source.world.products.fs)}


def ingest(run: Run, window: Window) -> dict:
    with run.store.writing() as staging:
        build_catalog(run.source, window, staging)
    catalog = run.store.read(CATALOG_ASSET, window.key, ENTITIES_FILE, columns=CATALOG_REFERENCE)
    with run.store.writing() as staging:
        report = build_events(run.source, window, catalog, staging)
    return {"entities": catalog.num_rows, "events": report.accepted}


def catalog_clip(run: Run, window: Window) -> dict:
    prev = run.previous(window)
    prev_path = run.store.partition_dir(CLIP_ASSET, prev) / CLIP_CHECKPOINT_FILE if prev else None
    prev_path = prev_path if prev_path is not None and prev_path.is_file() else None
    result = refresh(run.store.read(CATALOG_ASSET, window.key, ENTITIES_FILE), load_checkpoint(prev_path) if prev_path else None)
    with run.store.writing() as staging:
        if result.checkpoint is not None:
            write_checkpoint(result, staging.path(CLIP_ASSET, window.key) / CLIP_CHECKPOINT_FILE, prev_path)
        else:
            staging.path(CLIP_ASSET, window.key)
    return {"pairs": result.pairs, "trained": int(result.training is not None)}


def content(run: Run, window: Window) -> dict:
    catalog = run.store.read(CATALOG_ASSET, window.key, ENTITIES_FILE)
    if run.stand_in_content:
        with run.store.writing() as staging:
            staging.write_table(CONTENT_ASSET, window.key, CONTENT_FILE, stand_in_table(catalog))
        return {"stand_in": 1}

    prev = run.previous(window)
    checkpoint = run.store.partition_dir(CLIP_ASSET, window.key) / CLIP_CHECKPOINT_FILE
    build = embed_content(catalog, ContentConfig(text=TextEncoderConfig(dtype=run.text_dtype)), checkpoint if checkpoint.is_file() else None,
                         run.store.read(CONTENT_ASSET, prev, CONTENT_FILE, columns=REUSED_COLUMNS) if prev else None)
    with run.store.writing() as staging:
        staging.write_table(CONTENT_ASSET, window.key, CONTENT_FILE, build.table)
    return {"embedded": build.embedded, "texts": build.texts_encoded, "images": build.visuals_encoded}


def graph(run: Run, window: Window) -> dict:
    with run.store.writing() as staging:
        built = build_window_graph(run.store, window, run.previous(window), staging)
    return {"new_nodes": built.report.new_nodes, "events_used": built.report.events_used}


def training(run: Run, window: Window) -> dict:
    store, key, prev = run.store, window.key, run.previous(window)
    out = run.scratch / "training" / key / CHECKPOINT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["--graph", str(store.partition_dir(GRAPH_ASSET, key)), "--out", str(out), "--window", key,
            "--events", str(store.partition_dir(EVENTS_ASSET, key) / f"{EVENTS_FILE}.parquet"),
            "--content", str(store.partition_dir(CONTENT_ASSET, key) / f"{CONTENT_FILE}.parquet"),
            "--overrides", json.dumps(run.train_overrides)]
    args += ["--init", str(store.partition_dir(ENCODER_ASSET, prev) / CHECKPOINT_FILE)] if prev else []
    metrics = entry.run(entry.parse(args)) or {}
    with store.writing() as staging:
        folder = staging.path(ENCODER_ASSET, key)
        shutil.copyfile(out, folder / CHECKPOINT_FILE)
        shutil.copyfile(f"{out}.metrics.json", folder / "metrics.json")
    return {"steps": metrics.get("window_steps", -1)}


def embeddings(run: Run, window: Window) -> dict:
    build = embed_entities(run.store, window.key, to_us(window.end), EmbedConfig())
    with run.store.writing() as staging:
        staging.write_table(EMBEDDINGS_ASSET, window.key, EMBEDDINGS_FILE, embeddings_table(build.embeddings))
    return {"rows": len(build.embeddings)}


def hierarchy(run: Run, window: Window) -> dict:
    h = hierarchy_window(run.store, window.key, run.previous(window), to_us(window.end))
    with run.store.writing() as staging:
        for name, file in (("assignments", ASSIGNMENTS_FILE), ("primitives", PRIMITIVES_FILE), ("super_graph", SUPER_GRAPH_FILE)):
            staging.write_table(HIERARCHY_ASSET, window.key, file, h.tables[name])
    return {"entities": len(h.levels[0].primitive) if h.levels else 0}


def ranking_head(run: Run, window: Window) -> dict:
    state = build_head_state(run.store, run.spec, window.key)
    with run.store.writing() as staging:
        write_head(staging.path(HEAD_ASSET, window.key), state)
    return {"items": state.n_items}


def bom(run: Run, window: Window) -> dict:
    with run.store.writing() as staging:
        build = build_window_index(run.store, window.key, staging.path(BOM_ASSET, window.key))
    return {"items": build.items, "recall": round(float(build.recall.recall), 4)}


def evaluation(run: Run, window: Window) -> dict:
    truth = pq.read_table(run.source.data_dir / "ground_truth" / "entities.parquet")
    config = WindowEvalConfig()
    if run.max_users is not None:
        config = replace(config, eval=replace(config.eval, max_users=run.max_users))
    outcome = evaluate_published_window(run.store, run.spec, window.key, config, truth)
    if not isinstance(outcome, WindowOutcome):
        raise RuntimeError(f"evaluation skipped: {outcome.reason}")
    with run.store.writing() as staging:
        write_evaluation(staging, window.key, outcome.evaluation, outcome.extras, outcome.methods)
    c = outcome.evaluation.counts
    scored = {(r.users, r.items, r.target): r.metrics.n_users for r in outcome.evaluation.results}  # users scored (sampled)
    return {"warm_users": c.warm_users, "cold_users": c.cold_users, "known_items": c.known_items,
            "slice_users": sum(scored.values()), "scored_warm_deep_known": scored.get(("warm", "known", "deep_funnel"), 0),
            **{f"{t.method}_s": round(t.fit_s + t.score_s, 1) for t in outcome.evaluation.timings}}


STAGE_FUNCTIONS = {name: globals()[name] for name in STAGES}


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def watch(pid: int, limit_mb: float, done: threading.Event, killed: list) -> None:
    """Kill the child when its resident memory passes `limit_mb` (a shared machine: better a failed stage than swap)."""
    while not done.wait(0.2):
        if limit_mb and rss_mb(pid) > limit_mb:
            killed.append(rss_mb(pid))
            os.kill(pid, signal.SIGKILL)
            return


def in_child(fn, *args, limit_mb: float = 0) -> dict:
    """fn(*args) in a forked child: {"seconds", "peak_mb", **fn's numbers} or {"error", "peak_mb"}."""
    sys.stdout.flush(), sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report through the pipe, leave without running the parent's atexit handlers
        os.close(read)
        try:
            t0 = time.perf_counter()
            out = dict(fn(*args) or {})
            out = {"seconds": round(time.perf_counter() - t0, 3), **out}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which carries on with the next size
            traceback.print_exc()
            out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        with os.fdopen(write, "w") as fh:
            json.dump(out, fh)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
    os.close(write)
    done, killed = threading.Event(), []
    threading.Thread(target=watch, args=(pid, limit_mb, done, killed), daemon=True).start()
    with os.fdopen(read) as fh:
        text = fh.read()
    _, status, usage = os.wait4(pid, 0)
    done.set()
    out = json.loads(text) if text else {"error": f"killed_over_{limit_mb:.0f}_mb" if killed else f"child_died_status_{status}"}
    return {**out, "peak_mb": round(usage.ru_maxrss / 1024)}  # Linux: ru_maxrss in KiB


def fmt(d: dict) -> str:
    """One `scale key=value ...` line."""
    return "scale " + " ".join(f"{k}={v}" for k, v in d.items())


def run_size(size: str, windows: int, workdir: Path, stages: tuple[str, ...], stand_in: bool, train: dict,
             limit_mb: float, text_dtype: str, max_users: int | None = None) -> dict[str, list[dict]]:
    cfg = size_config(size, windows)
    source = SyntheticSource(cfg, workdir / "data")
    spec = WindowSpec.covering("weekly", *source.span())
    run = Run(source, PartitionStore(workdir / "store"), spec, workdir / "scratch", stand_in, train, text_dtype, max_users)
    keys = spec.windows()
    print(fmt({"size": size, "users": cfg.n_users, "products": cfg.n_products, "advertisers": cfg.n_advertisers,
               "events_per_window": cfg.events_per_window, "windows": len(keys), "dir": workdir}), flush=True)
    results: dict[str, list[dict]] = {s: [] for s in stages}
    failed = False
    for i, window in enumerate(keys):
        last = i == len(keys) - 1
        todo = [s for s in stages if s != "evaluation" and (not last or s in EVERY_WINDOW)]
        todo += [("evaluation", keys[i - 1])] if i and "evaluation" in stages else []
        for item in todo:
            stage, at = item if isinstance(item, tuple) else (item, window)
            if failed:
                break
            out = in_child(STAGE_FUNCTIONS[stage], run, at, limit_mb=limit_mb)
            print(fmt({"size": size, "stage": stage, "window": at.key, **out}), flush=True)
            results[stage].append(out)
            failed = "error" in out  # later stages read what this one publishes
    return results


def summary(stage: str, sizes: list[str], results: list[dict[str, list[dict]]], inputs: list[SyntheticConfig]) -> str:
    per = []
    for res in results:
        rows = [r for r in res.get(stage, []) if "error" not in r]
        per.append((sum(r["seconds"] for r in rows) / len(rows) if rows else float("nan"),
                    max((r["peak_mb"] for r in res.get(stage, [])), default=0)))
    line: dict = {"stage": stage}
    for size, (s, peak) in zip(sizes, per):
        line[f"{size}_s"] = round(s, 2)
        line[f"{size}_peak_mb"] = peak
    if len(per) == 2:
        ratio = per[1][0] / per[0][0] if per[0][0] > 0 else float("nan")
        entities = [c.n_users + c.n_products + c.n_advertisers for c in inputs]
        events = [c.events_per_window for c in inputs]
        line.update(ratio=round(ratio, 2), entities_ratio=round(entities[1] / entities[0], 2),
                    events_ratio=round(events[1] / events[0], 2), within_target=ratio <= TARGET_RATIO * entities[1] / entities[0] / 10)
    return fmt(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,medium", help="comma-separated presets or preset/divisor (small/20)")
    parser.add_argument("--windows", type=int, default=1, help="windows run through every stage (each evaluated on the next)")
    parser.add_argument("--quick", action="store_true",
                        help="small/20 vs small/2, one window, content stand-in, 4 training steps: a check that every stage runs")
    parser.add_argument("--steps", type=int, default=0, help="training steps per window (0: hir.toml's [train.synthetic])")
    parser.add_argument("--skip", default="", help="comma-separated stages to leave out; 'content' uses the TF-IDF stand-in")
    parser.add_argument("--max-mb", type=float, default=7500, help="kill a stage whose resident memory passes this (0: no limit)")
    parser.add_argument("--text-dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="MiniLM's dtype in content (default auto, as the demo's Makefile sets HIR_TEXT_DTYPE)")
    parser.add_argument("--workdir", default="", help="keep the scratch folders here (default: a temporary folder, removed)")
    parser.add_argument("--only", default="",
                        help="comma-separated stages run alone, on a --workdir where an earlier run published the others "
                             "(e.g. --skip evaluation first, then --only evaluation to time it again)")
    parser.add_argument("--max-users", type=int, default=None,
                        help="judged users per evaluation slice at every size (default: EvalConfig.max_users, 5,000); "
                             "equal at both sizes, evaluation's ratio is its cost per judged user")
    args = parser.parse_args()
    sizes = ["small/20", "small/2"] if args.quick else args.sizes.split(",")
    skip = {s for s in args.skip.split(",") if s} | ({"content"} if args.quick else set())
    train = dict(load_config(env={**os.environ, "HIR_SOURCE": "synthetic"}).train)
    if args.steps or args.quick:
        train["steps"] = args.steps or 4
    stand_in = "content" in skip
    stages = tuple(s for s in STAGES if s not in skip | ({"catalog_clip"} if stand_in else set()) or s == "content")
    if args.only:
        stages = tuple(s for s in stages if s in args.only.split(","))
    torch.set_num_threads(1)
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hir-scale-"))
    print(fmt({"baseline_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
               "idle_child_mb": in_child(dict)["peak_mb"], "memory": "forked_child_ru_maxrss",
               "torch_threads": 1, "sizes": ",".join(sizes), "eval_max_users": args.max_users or "default",
               "windows": args.windows, "train_steps": train.get("steps"),
               "content": "tfidf_stand_in" if stand_in else f"minilm_{resolve_dtype(args.text_dtype)}+catalog_clip"}), flush=True)
    try:
        results = [run_size(size, args.windows, root / size.replace("/", "_div"), stages, stand_in, train, args.max_mb,
                            args.text_dtype, args.max_users) for size in sizes]
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    inputs = [size_config(s, args.windows) for s in sizes]
    for stage in stages:
        print(summary(stage, sizes, results, inputs), flush=True)


if __name__ == "__main__":
    main()
