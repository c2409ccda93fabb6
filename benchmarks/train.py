"""Training on real windows: seconds per window (warm-started), samples/s, collapse metrics, and on the synthetic source
NMI of the learned level assignments vs the planted interests (with k-means on content vectors as the floor).

    .venv/bin/python benchmarks/train.py [--quick] [--source movielens|synthetic] [--windows N] [--steps S] [--no-global-tokens]
        [--store .hir/storage/synthetic]   # train on a demo's materialised graph + content_embeddings (MiniLM + CLIP)
        [--set field=value]                # any TrainConfig field
        [--set budget='"cpu"']             # a named budget (hir_model.train.config.BUDGETS): epochs over each window's pairs

Without --store the content vectors are a hashed TF-IDF stand-in (no model weights needed).

Prints one key=value line per window and a summary line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hir_model.data.windows import WindowSpec  # noqa: E402
from hir_model.graph.build import build_graph  # noqa: E402
from hir_model.graph.window import to_us  # noqa: E402
from hir_model.train.checkpoint import load_checkpoint  # noqa: E402
from hir_model.config import load_config  # noqa: E402
from hir_model.train.config import TrainConfig, parse_overrides, with_overrides  # noqa: E402
from hir_model.eval.text_vectors import stand_in_table  # noqa: E402
from hir_model.train.window_data import window_train_data  # noqa: E402
from hir_model.storage import PartitionStore  # noqa: E402
from hir_model.train.data import TrainData, active_nodes, align_content, engagement_pairs  # noqa: E402
from hir_model.train.model import HIRModel  # noqa: E402
from hir_model.train.trainer import assignments, embed_nodes, train_window  # noqa: E402


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


def teacher_of(path: Path) -> tuple[HIRModel, TrainConfig]:
    payload = load_checkpoint(path)
    cfg = TrainConfig.from_dict(payload["extra"]["train_config"])
    model = HIRModel(replace(cfg, encoder=TrainConfig.from_dict(payload["extra"]["train_config"]).encoder.__class__(**payload["config"])))
    model.load_state_dict(payload["extra"]["teacher"])
    return model.eval(), cfg


def nmi_report(model: HIRModel, cfg: TrainConfig, data: TrainData, source, seed: int = 0) -> dict:
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score as nmi
    truth = source.ground_truth.entities.filter(pa.compute.equal(source.ground_truth.entities.column("entity_type"), "product"))
    node = data.graph.nodes.index_of(truth.column("entity_id"))
    keep = (node >= 0) & np.isin(node, data.active)
    node = node[keep]
    learned = assignments(model, data, node, cfg)
    planted = sum(c.startswith("interest_l") for c in truth.column_names)
    out = {}
    for lvl, a in enumerate(learned[:planted]):  # learned level l vs planted level l (finer learned levels: none to compare)
        gt = truth.column(f"interest_l{lvl}").to_numpy()[keep]
        out[f"nmi_l{lvl}"] = round(nmi(gt, a), 3)
        z = embed_nodes(model, model.global_tokens(), data, node, cfg).numpy() if lvl == 0 else z
        out[f"kmeans_embedding_nmi_l{lvl}"] = round(nmi(gt, KMeans(len(np.unique(gt)), n_init=4, random_state=seed).fit_predict(z)), 3)
        x = data.content[node]
        km = KMeans(len(np.unique(gt)), n_init=4, random_state=seed).fit_predict(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9))
        out[f"kmeans_content_nmi_l{lvl}"] = round(nmi(gt, km), 3)
    out["nmi_products"] = int(len(node))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--source", default="movielens", choices=["movielens", "synthetic"])
    p.add_argument("--windows", type=int, default=0)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--levels", default="")
    p.add_argument("--no-global-tokens", action="store_true")
    p.add_argument("--no-content", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--store", default="", help="a materialised storage root: read engagement_graph, raw_events and "
                   "content_embeddings of each window from it instead of building them")
    p.add_argument("--set", action="append", default=[], help="override a TrainConfig field (JSON value), e.g. --set lr=0.005")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = source_of(args.source)
    # the demo's settings for this source: hir.toml [train] and [train.<source>]
    cfg = with_overrides(TrainConfig(global_tokens=not args.no_global_tokens), load_config(env={"HIR_SOURCE": args.source}).train)
    if args.levels:
        cfg = replace(cfg, levels=tuple(int(k) for k in args.levels.split(",")))
    if args.steps or args.quick:
        cfg = replace(cfg, steps=args.steps or 10)
    cfg = with_overrides(cfg, parse_overrides(args.set))
    n_windows = args.windows or (2 if args.quick else 6)
    windows = WindowSpec.covering("weekly", *source.span()).windows()[:n_windows]
    prev_graph, prev_ckpt, times, sps, steps = None, None, [], [], []
    tmp = Path(tempfile.mkdtemp(prefix="hir-train-bench-"))
    for w in windows:
        if args.store:
            data, _ = window_train_data(PartitionStore(Path(args.store)), w.key, content=not args.no_content)
            prev_graph, user = data.graph, data.pair_user
        else:
            catalog = pa.concat_tables([b.table for b in source.catalog(w.end)])
            relations = pa.concat_tables([b.table for b in source.relations(w.end)])
            events = pa.concat_tables([b.table for b in source.events(w)])
            end = to_us(w.end)
            prev_graph, _ = build_graph(prev_graph, catalog, relations, [events], end)
            user, entity, sign, prob = engagement_pairs(prev_graph, events.select(["user_id", "entity_id", "event_type", "ts"]), end)
            mat, has = (None, None) if args.no_content else align_content(prev_graph, stand_in_table(catalog))
            data = TrainData(prev_graph, end, active_nodes(prev_graph, end), user, entity, sign, prob, mat, has)
        out = tmp / f"{w.key}.pt"
        r = train_window(data, cfg, out, prev_ckpt, w.key)
        prev_ckpt = out
        times.append(r.seconds), sps.append(r.samples_per_s), steps.append(r.window_steps)
        print(f"case=window key={w.key} nodes={prev_graph.num_nodes} pairs={len(user)} steps={r.window_steps} "
              f"seconds={r.seconds:.2f} samples_per_s={r.samples_per_s:.1f} first_loss={r.losses[0]:.3f} "
              f"last_loss={r.losses[-1]:.3f} usage_entropy={r.usage_entropy} usage_share={r.usage_share} backend={r.backend}", flush=True)
    line = (f"case=summary source={args.source} windows={len(windows)} steps={cfg.steps} epochs={cfg.epochs} "
            f"pair_batch={cfg.pair_batch} shared_negatives={cfg.shared_negatives} replay_share={cfg.replay_share} "
            f"id_table_rows={cfg.encoder.id_table_rows} mean_steps_per_window={np.mean(steps):.1f} batch={cfg.batch_size} "
            f"global_tokens={cfg.global_tokens} content={not args.no_content} mean_seconds_per_window={np.mean(times):.2f} "
            f"mean_samples_per_s={np.mean(sps):.1f}")
    if args.source == "synthetic":
        model, tcfg = teacher_of(prev_ckpt)
        line += " " + " ".join(f"{k}={v}" for k, v in nmi_report(model, tcfg, data, source).items())
    print(line, flush=True)


if __name__ == "__main__":
    main()
