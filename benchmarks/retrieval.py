"""Bag-of-Meaning retrieval vs exact faiss on the synthetic source, side by side in one run: recall@100 against exact
top-100, candidates scored per query, queries per second.

The encoder is trained window by window as `hir_encoder` does (hir.toml's [train] for the synthetic source, warm-started
from t-1), with one exception: the interest levels are [train]'s own (8 / 32 / 128, the hierarchy every source gets
unless it overrides it), not [train.synthetic]'s 4 / 12 / 36. Those mirror the planted tree so that NMI per level
compares like with like (benchmarks/train.py); as an index they make 36 cells of ~91 items for 3,292, and the finest
level is the index's resolution (`--levels 4,12,36` measures them: README, Hierarchy and retrieval). Content vectors
are the hashed TF-IDF stand-in of hir_model.eval.text_vectors, as in benchmarks/train.py, or with --store a synthetic
demo's materialised graph, events and MiniLM + CLIP content_embeddings. Then the last window's entities are embedded,
assigned to the hierarchy and indexed exactly as `entity_embeddings`, `interest_hierarchy` and `bom_index` do
(the `case=build` line times them; training is benchmarks/train.py's subject).

    .venv/bin/python benchmarks/retrieval.py [--quick] [--windows N] [--steps S] [--levels 4,12,36] [--users U] [--threads T]
        [--store .hir/storage/synthetic] [--set field=value]

Prints one `key=value` line per case: `case=exact` (faiss over every item), `case=bom` (what `bom_index` keeps:
a fixed or an adaptive budget, whichever reaches recall 0.95 on 500 calibration users, none of them a query user, with
fewer candidates), `case=bom_10x` (adaptive: the widest priority margin whose mean budget on those users stays within
a tenth of the catalogue, a query taking at most max(the tuned budget, a tenth): the acceptance target),
`case=bom_10x_fixed` (every query a tenth of the catalogue), `case=bom_10x_list_by_list` (the same with weight_prior 0:
each primitive's list read whole before the next, the probe before adaptive budgets), `case=bom_tokens` (the query's
stored top-k tokens per level, no probing) and `case=bom_sweep` lines over fixed budgets.
qps: single queries one after another on one thread, Python overhead (hits as objects) included, best of 3 passes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 shared cores: threaded BLAS on small matrices is slower
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hir_model.data.synthetic import SyntheticConfig, SyntheticSource  # noqa: E402
from hir_model.data.windows import WindowSpec  # noqa: E402
from hir_model.embed import embed_entities, trained_view  # noqa: E402
from hir_model.embed.entities import EmbedConfig  # noqa: E402
from hir_model.eval.text_vectors import stand_in_table  # noqa: E402
from hir_model.graph.build import build_graph  # noqa: E402
from hir_model.graph.window import to_us  # noqa: E402
from hir_model.hierarchy import build_hierarchy, catalog_texts  # noqa: E402
from hir_model.retrieval import (ITEM_TYPES, IndexConfig, Retriever, bom_tokens, build_postings, calibrate,  # noqa: E402
                                 budget_curves, calibration_users, recall_at_k, sample_users, write_index)
from hir_model.train.checkpoint import load_checkpoint, load_trained_model  # noqa: E402
from hir_model.config import load_config  # noqa: E402
from hir_model.train.config import TrainConfig, parse_overrides, with_overrides  # noqa: E402
from hir_model.hierarchy.window import window_train_data  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train.data import TrainData, active_nodes, align_content, engagement_pairs  # noqa: E402
from hir_model.train.trainer import train_window  # noqa: E402


def train_windows(source, windows, cfg: TrainConfig, tmp: Path, store: PartitionStore | None = None):
    """Train window by window, warm-started; returns (graph, content, catalog, checkpoint, end_us) of the last. With a
    `store` (a demo's storage root), each window's graph, events and content_embeddings (MiniLM + CLIP) come from it."""
    graph, ckpt = None, None
    for w in windows:
        catalog = pa.concat_tables([b.table for b in source.catalog(w.end)])
        end = to_us(w.end)
        if store is not None:
            data, content = window_train_data(store, w.key)
            graph = data.graph
        else:
            relations = pa.concat_tables([b.table for b in source.relations(w.end)])
            events = pa.concat_tables([b.table for b in source.events(w)])
            graph, _ = build_graph(graph, catalog, relations, [events], end)
            content = stand_in_table(catalog)
            user, entity, sign, prob = engagement_pairs(graph, events.select(["user_id", "entity_id", "event_type", "ts"]), end)
            data = TrainData(graph, end, active_nodes(graph, end), user, entity, sign, prob, *align_content(graph, content))
        out = tmp / f"{w.key}.pt"
        r = train_window(data, cfg, out, ckpt, w.key)
        ckpt = out
        print(f"case=train key={w.key} nodes={graph.num_nodes} steps={r.window_steps} seconds={r.seconds:.1f} "
              f"last_loss={r.losses[-1]:.3f} usage_share={r.usage_share}", flush=True)
    return graph, content, catalog, ckpt, end


def build_index(graph, content, catalog, ckpt: Path, end: int, folder: Path, config: IndexConfig, queries: int):
    """Embed, assign, tokenise and index the window as the three assets do, the probe budget tuned on other users
    than the `queries` sampled; returns (retriever, query users)."""
    t0 = time.perf_counter()
    model = load_trained_model(ckpt)
    emb = embed_entities(model, graph, end, content, EmbedConfig(view=trained_view(load_checkpoint(ckpt)["extra"])))
    t1 = time.perf_counter()
    h = build_hierarchy(emb, [p.numpy() for p in model.prototypes], graph, end, catalog_texts(catalog))
    t2 = time.perf_counter()
    tokens = bom_tokens(h.tables["assignments"])
    postings, stats = build_postings(tokens, emb.entity_id[np.isin(emb.entity_type, ITEM_TYPES)], config.max_posting_share)
    write_index(folder, emb, tokens, postings, config, h.tables["primitives"])
    users = sample_users(emb, queries, config.seed)
    factor = calibrate(folder, emb, users, config)
    t3 = time.perf_counter()
    print(f"case=build entities={len(emb)} cold_start={int(emb.cold_start.sum())} embed_s={t1 - t0:.2f} hierarchy_s={t2 - t1:.2f} "
          f"index_s={t3 - t2:.2f} levels={list(model.levels)} primitives_used={[int((a.sizes() > 0).sum()) for a in h.levels]} "
          f"tokens={stats.tokens} posting_cap={stats.cap} longest_posting={stats.longest} truncated={stats.truncated} "
          f"tuned_probe_factor={factor}", flush=True)
    return Retriever.load(folder, emb), users


def best_qps(retriever: Retriever, users: list[str], k: int, exact: bool = False, repeats: int = 3) -> float:
    """Queries per second, single queries one after another, best of `repeats` passes (the cores are shared)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for u in users:
            retriever.retrieve(u, k, exact=exact)
        best = min(best, time.perf_counter() - t0)
    return len(users) / max(best, 1e-9)


def line(case: str, retriever: Retriever, users: list[str], k: int, **extra) -> str:
    r = recall_at_k(retriever, users, k)
    fields = {"case": case, **extra, "n": r.queries, "items": r.items, "recall_at_100": f"{r.recall:.4f}",
              "candidates_per_query": f"{r.candidates_per_query:.1f}", "candidate_fraction": f"{r.candidates_per_query / max(r.items, 1):.4f}",
              "qps": f"{best_qps(retriever, users, k):.0f}"}
    return " ".join(f"{k}={v}" for k, v in fields.items())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 windows, 200 users")
    p.add_argument("--windows", type=int, default=0, help="windows trained (default: all 8; --quick: 4)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per window (default: hir.toml's [train.synthetic])")
    p.add_argument("--levels", default="", help="prototypes per level, e.g. 4,12,36 (default: hir.toml's [train] levels, "
                   "not the synthetic source's planted-tree sizes)")
    p.add_argument("--users", type=int, default=0, help="query users (default 1000; --quick: 200)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=[], help="override a TrainConfig field (JSON value), e.g. --set refine_iters=0")
    p.add_argument("--store", default="", help="a synthetic demo's storage root: read engagement_graph, raw_events and "
                   "content_embeddings (MiniLM + CLIP) of each window from it instead of the TF-IDF stand-in")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = SyntheticSource(SyntheticConfig(), Path(os.environ.get("HIR_DATA_DIR", REPO / "data")) / "synthetic-seed7")
    source.prepare()
    windows = WindowSpec.covering("weekly", *source.span()).windows()[: args.windows or (4 if args.quick else 8)]
    settings = load_config(env={**os.environ, "HIR_SOURCE": "synthetic"})
    cfg = with_overrides(TrainConfig(), settings.train)  # as hir_encoder, but for the levels (see the docstring)
    levels = args.levels.split(",") if args.levels else settings.train_shared.get("levels", TrainConfig().levels)
    cfg = replace(cfg, levels=tuple(int(x) for x in levels), **({"steps": args.steps} if args.steps else {}))
    cfg = with_overrides(cfg, parse_overrides(args.set))
    config = IndexConfig()
    with tempfile.TemporaryDirectory(prefix="hir-retrieval-bench-") as tmp:
        graph, content, catalog, ckpt, end = train_windows(source, windows, cfg, Path(tmp), PartitionStore(Path(args.store)) if args.store else None)
        retriever, users = build_index(graph, content, catalog, ckpt, end, Path(tmp), config,
                                       args.users or (200 if args.quick else 1000))
        k = config.recall_k
        items = retriever.index.ntotal
        print(f"case=exact index={type(retriever.index).__name__} n={len(users)} items={items} recall_at_100=1.0000 "
              f"candidates_per_query={items} candidate_fraction=1.0000 qps={best_qps(retriever, users, k, exact=True):.0f}", flush=True)
        print(line("bom", retriever, users, k, probe_margin=retriever.probe_margin, probe_factor=retriever.probe_factor), flush=True)
        tenth = math.floor(100 * items / 10 / k) / 100  # the probe factor that scores at most a tenth of the catalogue
        calibration = calibration_users(retriever.emb, users, config)  # the asset's calibration users
        ceiling = max(retriever.probe_factor, tenth)  # the tuned budget may be a fixed one under a tenth
        margin = budget_curves(retriever, calibration, k, math.ceil(ceiling * k)).margin_within(items / 10)
        print(line("bom_10x", retriever.with_probe_margin(margin, ceiling), users, k, probe_margin=round(margin, 4),
                   max_probe_factor=ceiling, weight_prior=retriever.weight_prior), flush=True)
        print(line("bom_10x_fixed", retriever.with_probe_factor(tenth), users, k, probe_factor=tenth,
                   weight_prior=retriever.weight_prior), flush=True)
        print(line("bom_10x_list_by_list", Retriever.load(Path(tmp), retriever.emb, tenth, weight_prior=0.0), users, k,
                   probe_factor=tenth, weight_prior=0.0), flush=True)
        print(line("bom_tokens", retriever.with_probe_factor(0), users, k, probe_factor=0), flush=True)
        for factor in (1.0, 2.0, 4.0, 6.0):
            print(line("bom_sweep", retriever.with_probe_factor(factor), users, k, probe_factor=factor), flush=True)

if __name__ == "__main__":
    main()
