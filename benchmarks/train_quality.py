"""Quality proxies of trained windows for benchmarks/train.py: the teacher of a checkpoint, NMI of its level
assignments vs the synthetic source's planted interests, and the next-window recall proxy (--eval-next)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.graph.types import NODE_TYPES
from hir_model.train.checkpoint import load_checkpoint
from hir_model.train.config import TrainConfig
from hir_model.train.data import TrainData
from hir_model.train.model import HIRModel
from hir_model.train.trainer import assignments, embed_nodes


def teacher_of(path: Path) -> tuple[HIRModel, TrainConfig]:
    payload = load_checkpoint(path)
    cfg = TrainConfig.from_dict(payload["extra"]["train_config"])
    model = HIRModel(replace(cfg, encoder=type(cfg.encoder)(**payload["config"])))
    model.load_state_dict(payload["extra"]["teacher"])
    return model.eval(), cfg


def nmi_report(model: HIRModel, cfg: TrainConfig, data: TrainData, source, seed: int = 0) -> dict:
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score as nmi
    truth = source.ground_truth.entities.filter(pc.equal(source.ground_truth.entities.column("entity_type"), "product"))
    node = data.graph.nodes.index_of(truth.column("entity_id"))
    keep = (node >= 0) & np.isin(node, data.active)
    node = node[keep]
    learned = assignments(model, data, node, cfg)
    planted = sum(c.startswith("interest_l") for c in truth.column_names)
    out = {}
    for lvl, a in enumerate(learned[:planted]):  # learned level l vs planted level l (finer learned levels: none to compare)
        gt = truth.column(f"interest_l{lvl}").to_numpy()[keep]
        out[f"nmi_l{lvl}"] = round(nmi(gt, a), 3)
        if lvl == 0:
            z = embed_nodes(model, model.global_tokens(), data, node, cfg).numpy()
        out[f"kmeans_embedding_nmi_l{lvl}"] = round(nmi(gt, KMeans(len(np.unique(gt)), n_init=4, random_state=seed).fit_predict(z)), 3)
        x = data.content[node]
        km = KMeans(len(np.unique(gt)), n_init=4, random_state=seed).fit_predict(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9))
        out[f"kmeans_content_nmi_l{lvl}"] = round(nmi(gt, km), 3)
    out["nmi_products"] = int(len(node))
    return out


def next_window_recall(model: HIRModel, cfg: TrainConfig, data: TrainData, events: pa.Table, k: int = 20) -> dict:
    """The recall proxy of --eval-next (see the module docstring): {next_r20_dot, next_r20_prior, next_users}."""
    g = data.graph
    node_type = np.asarray(g.nodes.node_type, np.int64)
    active = np.zeros(g.num_nodes, bool)
    active[data.active] = True
    user_code, film_code = NODE_TYPES.index("user"), NODE_TYPES.index("product")
    ev = events.filter(pc.equal(events.column("event_type"), "purchase"))
    u, i = g.nodes.index_of(ev.column("user_id")), g.nodes.index_of(ev.column("entity_id"))
    films = np.flatnonzero(active & (node_type == film_code))  # the candidates: films with engagement up to the cutoff
    col = np.full(g.num_nodes, -1)
    col[films] = np.arange(len(films))
    keep = (u >= 0) & (i >= 0)
    keep[keep] &= active[u[keep]] & (node_type[u[keep]] == user_code) & (col[i[keep]] >= 0)
    users, row = np.unique(u[keep], return_inverse=True)
    if not len(users) or not len(films):
        return {"next_r20_dot": float("nan"), "next_r20_prior": float("nan"), "next_users": 0}
    target = np.zeros((len(users), len(films)), bool)
    target[row, col[i[keep]]] = True
    seen = np.zeros_like(target)  # films each user engaged with up to the cutoff
    ts, nb = np.asarray(g.last_ts), np.asarray(g.neighbours)
    for r, user in enumerate(users):
        lo, hi = g.indptr[user], g.indptr[user + 1]
        c = col[nb[lo:hi][ts[lo:hi] <= data.cutoff_us]]
        seen[r, c[c >= 0]] = True
    target &= ~seen
    glob = model.global_tokens()
    zu = embed_nodes(model, glob, data, users, cfg).double().numpy()  # (U, W)
    zf = embed_nodes(model, glob, data, films, cfg).double().numpy()  # (F, W)
    prior = cfg.objective.engagement_temp * np.log(np.maximum(g.strength_until(data.cutoff_us)[films], 1e-12))  # (F,)
    out = {}
    for name, scores in (("next_r20_dot", zu @ zf.T), ("next_r20_prior", zu @ zf.T + prior[None, :])):
        scores = np.where(seen, -np.inf, scores)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        hits = np.take_along_axis(target, top, axis=1).sum(1)
        n = target.sum(1)
        out[name] = float(np.mean(hits[n > 0] / n[n > 0])) if (n > 0).any() else float("nan")
    out["next_users"] = int((target.sum(1) > 0).sum())
    return out
