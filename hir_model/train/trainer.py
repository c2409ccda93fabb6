"""One window's training: student (narrow view) vs EMA teacher (broad view), resumable, warm-started from t-1.

Never receives a Dagster context: it returns a `TrainResult` and the caller reports it. Under DDP (torch.distributed
initialised by hir_model.train.entry) each rank computes one shard of the global batch; on one process the same
shards run in turn, so both give the same gradients (the loss is the mean over shards). Where the prototypes start
is hir_model.train.prototypes; the teacher's embeddings, assignments and collapse metrics of sampled nodes are
hir_model.train.probe (both re-exported here).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hir_model.graph.types import NODE_TYPES
from hir_model.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from hir_model.train.config import TrainConfig, lr_schedule, momentum_schedule, set_fields
from hir_model.train.data import PairBatch, TrainData, pair_order, step_batch, with_item_pairs
from hir_model.train.loader import NodeTables, Prefetcher, ProcessPrefetcher, ReadyStep, can_fork, lean_inputs
from hir_model.train.loss import (
    DistillationLoss,
    all_reduce_sum,
    engagement_loss,
    parent_assignment,
)
from hir_model.train.model import HIRModel, ema_update, make_teacher
from hir_model.train.probe import PROBE_SEED, assignments, collapse_metrics, embed_nodes, probe_nodes, sample_active  # noqa: F401
from hir_model.train.prototypes import seed_prototypes

log = logging.getLogger("hir")
HELD_OUT_STEP = 2**31 - 1024  # the held-out batches' step numbers (no window reaches them)


class NonFiniteLoss(FloatingPointError):
    """The training loss became NaN or inf: training stops rather than publish a broken model."""


@dataclass(frozen=True)
class TrainResult:
    window: str
    step: int  # cumulative optimizer steps over all windows so far
    window_steps: int  # steps of this window completed (== cfg.budget.steps when done)
    resumed_from: int  # window step it resumed from (0: fresh or warm start)
    warm_started: bool
    losses: list[float]  # total loss per step run in this call
    parts: dict[str, list[float]]  # distill / consistency / engagement (/ swap when weighted) per step run
    usage_entropy: list[float]  # per level, coarse -> fine: normalised entropy of the teacher's hard assignments
    usage_share: list[float]  # per level: share of prototypes used at least once
    seconds: float
    samples_per_s: float
    backend: str
    probe_nodes: list[int] = field(default_factory=list)
    probe_embeddings: list[list[float]] = field(default_factory=list)  # (probe_size, W) of the exported model (TeacherConfig.publish)
    held_out_start: float = float("nan")  # total loss on the fixed held-out batches before this call's steps
    held_out_final: float = float("nan")  # ... and after them
    version: str = ""
    weights_digest: str = ""  # sha256 of the student's weights on this rank (DDP ranks must agree)
    loader_wait_s: float = 0.0  # of `seconds`, the time the loop waited for its next batch (the rest: compute, copies)
    loader: str = "thread"  # what sampled the batches: "thread" or "N processes" (+ ", lean": node tables on the device;
    # ", shm" / ", pipe": how the batches came back)
    steady_samples_per_s: float = float("nan")  # samples/s after the first step (no loader start-up, no first-step costs)
    precision: str = "fp32"  # the encoder's arithmetic while training: "fp32" or "bf16"


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_reduce_mean(x: float, device: torch.device) -> float:
    rank, world = _dist()
    if world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return float(t) / world


def _state(student: HIRModel, teacher: HIRModel, loss_fn: DistillationLoss, opt: torch.optim.Optimizer, cfg: TrainConfig,
           window: str, window_step: int, base_step: int, complete: bool, extra: dict) -> dict:
    exported = published(student, teacher, cfg)
    protos = exported.normalised_prototypes()
    parents = [parent_assignment(protos[l], protos[l - 1], cfg.objective.consistency_temp).argmax(-1).cpu() for l in range(1, len(protos))]
    return dict(path_args=(exported.encoder, protos, base_step + window_step),
                optimizer=opt.state_dict(), window=window,
                extra={"train_config": cfg.to_dict(), "student": _cpu(student.state_dict()), "teacher": _cpu(teacher.state_dict()),
                       "loss": _cpu(loss_fn.state_dict()), "window_step": window_step, "base_step": base_step, "complete": complete,
                       "global_levels": cfg.prototypes.global_levels, "parents": parents, **extra})


def published(student: HIRModel, teacher: HIRModel, cfg: TrainConfig) -> HIRModel:
    """The network the checkpoint exports (TrainConfig.teacher.publish): what embeds, assigns and is checked downstream."""
    return student if cfg.teacher.publish == "student" else teacher


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu() for k, v in state.items()}


def _save(path: Path, state: dict) -> str:
    encoder, protos, step = state.pop("path_args")
    return save_checkpoint(path, encoder, protos, step, optimizer=state["optimizer"], extra=state["extra"], window=state["window"])


def _load_into(payload: dict, student: HIRModel, teacher: HIRModel, loss_fn: DistillationLoss, cfg: TrainConfig) -> None:
    extra = payload.get("extra", {})
    old = extra.get("train_config")
    old = TrainConfig.from_dict(old) if old is not None else None
    if old is not None and (old.prototypes.levels != cfg.prototypes.levels or old.encoder != cfg.encoder):
        raise CheckpointError(f"checkpoint was trained with levels {old.prototypes.levels} / encoder {old.encoder}, "
                              f"this run uses {cfg.prototypes.levels} / {cfg.encoder}: start from scratch (no --init)")
    if "student" in extra:
        student.load_state_dict(extra["student"])
        teacher.load_state_dict(extra["teacher"])
        loss_fn.load_state_dict(extra["loss"])
    else:  # a bare checkpoint (encoder + prototypes only): both start from it
        for m in (student, teacher):
            m.encoder.load_state_dict(payload["model"])
            with torch.no_grad():
                for p, q in zip(m.prototypes, payload["prototypes"]):
                    p.copy_(q)


@torch.no_grad()
def recentre(student: HIRModel, teacher: HIRModel, centre: Tensor, momentum: float, centre_users: bool = True) -> None:
    """Keep the readout centred per seed type while training: `centre` (types, W + 1) holds the teacher's readout sums
    and counts per seed type over the global batch, and each type's out_mean absorbs (1 - momentum) of its mean (types
    absent from the batch keep theirs). Set once at the start, the centre drifted: by MovieLens window 4 the common
    direction was back and every node chose one coarse prototype (usage entropy 0.0). Without `centre_users` the user
    type's row is left as it is (TrainConfig.objective.centre_users)."""
    count = centre[:, -1:]
    step = torch.where(count > 0, centre[:, :-1] / count.clamp_min(1), torch.zeros_like(centre[:, :-1]))
    if not centre_users:
        step[NODE_TYPES.index("user")] = 0
    for m in (student, teacher):
        m.encoder.out_mean.add_(step.to(m.encoder.out_mean.device), alpha=1 - momentum)


def add_to_centre(centre: Tensor, readouts: Tensor, seed_types: Tensor) -> None:
    """Accumulate (types, W + 1) readout sums and counts per seed type."""
    centre[:, :-1].index_add_(0, seed_types, readouts)
    centre[:, -1].index_add_(0, seed_types, torch.ones_like(seed_types, dtype=centre.dtype))


@torch.no_grad()
def centre_inputs_and_readout(student: HIRModel, teacher: HIRModel, data: TrainData, cfg: TrainConfig) -> None:
    """Data-dependent initialisation of a fresh model: the mean content vector is subtracted before the content
    projection, and each seed type's mean readout over a sample of active nodes before the unit norm (see the
    buffers' comments)."""
    for m in (student, teacher):
        if data.content is not None and data.has_content.any():
            m.encoder.embed.content_mean.copy_(torch.from_numpy(data.content[data.has_content].mean(0)))
    nodes = sample_active(data, cfg, PROBE_SEED + 4, cfg.runtime.metric_nodes)
    if not len(nodes):
        return
    h = embed_nodes(teacher, teacher.global_tokens(), data, nodes, cfg, seed=PROBE_SEED + 4, readout=True)  # (M, W)
    centre = torch.zeros(teacher.encoder.out_mean.shape[0], h.shape[1] + 1)
    add_to_centre(centre, h, torch.from_numpy(data.graph.nodes.node_type[nodes].astype(np.int64)))
    recentre(student, teacher, centre, 0.0, cfg.objective.centre_users)


def step_loss(model: torch.nn.Module, student: HIRModel, teacher: HIRModel, loss_fn: DistillationLoss, batches: list,
              cfg: TrainConfig, device: torch.device, backward: bool = True, centre: Tensor | None = None,
              tables: NodeTables | None = None) -> np.ndarray:
    """float64 [5]: (total, distill, consistency, engagement, swap) of one step's shards (this rank's: `StepBatch`es or
    `ReadyStep`s; lean ones need the data's `tables`), mean over shards; with `backward`, the gradients of that mean are
    accumulated into the student."""
    steps = [(r if isinstance(r, ReadyStep) else ReadyStep.of(r)).to(device, tables) for r in batches]
    with torch.no_grad():  # the teacher's targets are balanced over the global batch: all shards (ranks) at once
        broad = [r.broad for r in steps]
        readouts = [teacher.encoder.readout(b, teacher.global_tokens()) for b in broad]  # (b, W) each
        t_all = [[z @ p.T for p in teacher.normalised_prototypes()] for z in (F.normalize(h, dim=-1) for h in readouts)]
        if centre is not None:  # the teacher's readouts per seed type, summed over this rank's shards (the caller all-reduces)
            add_to_centre(centre, torch.cat(readouts), torch.cat([b.node_type[:, 0] for b in broad]))
        targets = loss_fn.targets([torch.cat([t[l] for t in t_all]) for l in range(len(cfg.prototypes.levels))])
    acc = np.zeros(5)
    for i, r in enumerate(steps):
        b = r.seeds
        with torch.set_grad_enabled(backward):
            z_all, s_all = model(r.narrow)  # (b [+ pair batch], W), per level (b [+ ...], K_l)
            z, s_scores = z_all[:b], [s[:b] for s in s_all]  # the distillation seeds
            mine = [t[i * b:(i + 1) * b] for t in targets]
            distill = loss_fn.distill(s_scores, mine)
            cons = loss_fn.consistency(s_scores, list(student.prototypes))
            p, sign = r.pairs, torch.from_numpy(r.sign).to(device)
            log_q = None if r.log_q is None else torch.from_numpy(r.log_q).to(device, torch.float32)
            eng = engagement_loss(z[:p], z[p:2 * p], sign, cfg.objective.engagement_temp, log_q) if p else z.new_zeros(())
            if r.pair_batch is not None:
                eng = eng + pair_batch_loss(z_all[b:], r.pair_batch, cfg.objective.engagement_temp, device)
            loss = cfg.objective.distill_weight * distill + cfg.objective.consistency_weight * cons + cfg.objective.engagement_weight * eng
            swap = loss_fn.swap(s_scores, mine, p, sign) if cfg.objective.swap_weight else z.new_zeros(())
            loss = loss + cfg.objective.swap_weight * swap
        if backward:
            (loss / len(batches)).backward()
        parts = torch.stack([x.detach().double() for x in (loss, distill, cons, eng, swap)])  # one copy to the host
        acc += parts.cpu().numpy() / len(batches)
    return acc


def pair_batch_loss(z: Tensor, pb: PairBatch, temp: float, device: torch.device) -> Tensor:
    """The engagement term over a step's pair batch: z (2Q + M, W) holds its users, entities and shared negatives."""
    q = len(pb.sign)
    if not q:
        return z.new_zeros(())
    t = lambda a: None if a is None else torch.from_numpy(a).to(device)  # noqa: E731
    log_q = None if pb.log_q is None else t(pb.log_q).float()
    neg_log_q = None if pb.neg_log_q is None else t(pb.neg_log_q).float()
    return engagement_loss(z[:q], z[q:2 * q], t(pb.sign), temp, log_q, weight=t(pb.weight), negatives=z[2 * q:],
                           neg_log_q=neg_log_q, neg_is_pos=t(pb.neg_is_pos))


def held_out_loss(student: HIRModel, teacher: HIRModel, loss_fn: DistillationLoss, data: TrainData, cfg: TrainConfig,
                  shards: list[int], device: torch.device) -> float:
    """The total loss on fixed batches no training step draws (seeded by HELD_OUT_STEP): compared before and after a
    window's training, it measures progress without the step-to-step sampling noise of the training losses."""
    acc = np.mean([step_loss(student, student, teacher, loss_fn, [step_batch(data, cfg, HELD_OUT_STEP + i, sh) for sh in shards],
                             cfg, device, backward=False)[0] for i in range(cfg.runtime.held_out_batches)])
    return _all_reduce_mean(float(acc), device)


@contextmanager
def deterministic_algorithms(on: bool):
    """torch's deterministic algorithms for the block (warn-only: an op without a deterministic kernel, e.g. some CUDA
    ones without CUBLAS_WORKSPACE_CONFIG, warns rather than fails), the previous setting restored after."""
    before, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """TrainConfig.runtime.precision on `device`: the encoder's autocast dtype (None: float32)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def loader_workers(cfg: TrainConfig, device: torch.device, world: int = 1) -> int:
    """TrainConfig.runtime.loader_workers resolved: auto is 0 on CPU and the cores this rank may use but two (at most 12) on
    CUDA; 0 where processes cannot be forked."""
    n = cfg.runtime.loader_workers
    if n < 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        n = max(0, min(12, cores // world - 2)) if device.type == "cuda" else 0
    if n and not can_fork():
        log.warning("loader_workers=%d: this platform cannot fork; sampling on one background thread", n)
        return 0
    return n


def train_window(data: TrainData, cfg: TrainConfig, out: Path | None = None, init: Path | None = None, window: str = "",
                 stop_after: int | None = None) -> TrainResult:
    """Train on one window's data; resume from `out` if it holds this window's unfinished run, else warm-start from
    `init` (the previous window's checkpoint) or start fresh. `stop_after` stops after that many window steps
    (simulates a kill: the checkpoint at `out` is then resumable). With cfg.runtime.deterministic, two runs on the same inputs
    and the same number of threads give the same weights (see TrainConfig.runtime.deterministic)."""
    with deterministic_algorithms(cfg.runtime.deterministic):
        return _train_window(data, cfg, out, init, window, stop_after)


def _train_window(data: TrainData, cfg: TrainConfig, out: Path | None, init: Path | None, window: str,
                  stop_after: int | None) -> TrainResult:
    rank, world = _dist()
    if world > 1:
        cfg = set_fields(cfg, shards=world)
    cfg = set_fields(cfg, steps=cfg.budget.window_steps(len(data.pair_user)))  # an epoch budget fixes the window's step count here
    data = with_item_pairs(data, cfg.objective.item_pair_share, cfg.objective.item_pair_window)
    torch.manual_seed(cfg.runtime.seed)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    cfg_model = replace(cfg, encoder=replace(cfg.encoder, content_dim=data.content_dim))
    student = HIRModel(cfg_model).to(device)
    teacher = make_teacher(student)
    loss_fn = DistillationLoss(cfg).to(device)
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    start, base_step, warm = 0, 0, False
    resume = None
    if out is not None and Path(out).is_file():
        payload = load_checkpoint(out)
        if payload.get("window") == window and not payload["extra"].get("complete", True):
            resume = payload
    if resume is not None:
        _load_into(resume, student, teacher, loss_fn, cfg_model)
        opt.load_state_dict(resume["optimizer"])
        start, base_step = int(resume["extra"]["window_step"]), int(resume["extra"]["base_step"])
        log.info("resuming %s from window step %d", window, start)
    elif init is not None:
        payload = load_checkpoint(init)
        _load_into(payload, student, teacher, loss_fn, cfg_model)
        base_step, warm = int(payload["step"]), True
    if resume is None and not warm:
        centre_inputs_and_readout(student, teacher, data, cfg)
    if resume is None and cfg.prototypes.init_prototypes:
        seed_prototypes(student, teacher, data, cfg, fresh=not warm)
    model = student
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(student, device_ids=[local] if device.type == "cuda" else None)
    lrs, moms = lr_schedule(cfg), momentum_schedule(cfg)
    shards = [rank] if world > 1 else list(range(cfg.runtime.shards))
    losses, parts = [], {"distill": [], "consistency": [], "engagement": [], **({"swap": []} if cfg.objective.swap_weight else {})}
    end = cfg.budget.steps if stop_after is None else min(cfg.budget.steps, start + stop_after)
    dtype = autocast_dtype(cfg.runtime.precision, device)
    for m in (student, teacher):  # after the (float32) initialisation; back to float32 before the metrics and the probe
        m.encoder.autocast_dtype = dtype
    start_loss = held_out_loss(student, teacher, loss_fn, data, cfg, shards, device) if cfg.runtime.held_out_batches else float("nan")
    # the next steps' batches are sampled while this one trains (the same batches either way: seeded by step), on a thread
    # or in forked processes; these ship "lean" steps (node indices: the device fills in content, structure, hash codes)
    workers = loader_workers(cfg, device, world)
    lean = workers > 0 and cfg.objective.cold_share == 0  # cold seeds lose their structure row on the host (seed_only)
    tables = NodeTables(data, cfg.encoder.structure_dim, device) if lean else None
    sample_data, sample_cfg = lean_inputs(data, cfg) if lean else (data, cfg)
    if workers:  # the sampler's per-graph tables, built once here for the forked workers to inherit
        step_batch(sample_data, _tiny(sample_cfg), HELD_OUT_STEP, 0)
    t0 = time.perf_counter()
    order = pair_order(data, cfg, base_step, cfg.budget.steps) if cfg.budget.epochs > 0 else None  # each step's window pairs
    own = (lambda s: None) if order is None else (lambda s: order[s])  # noqa: E731

    def make(s: int) -> list[ReadyStep]:
        return [ReadyStep.of(step_batch(sample_data, sample_cfg, base_step + s, sh, own(s)), lean) for sh in shards]

    keys = range(start, end)
    loader = ProcessPrefetcher(make, keys, workers, pin=device.type == "cuda") if workers else Prefetcher(make, keys)
    wait, t_first = 0.0, None
    with loader as prefetch:
        for s in keys:
            if s == start + 1:
                t_first = time.perf_counter()
            t_next = time.perf_counter()
            batches = next(prefetch)
            wait += time.perf_counter() - t_next
            for g in opt.param_groups:
                g["lr"] = float(lrs[s])
            opt.zero_grad(set_to_none=True)
            centre = torch.zeros(*student.encoder.out_mean.shape[:1], student.encoder.cfg.width + 1, device=device)
            acc = step_loss(model, student, teacher, loss_fn, batches, cfg, device, centre=centre, tables=tables)
            total = _all_reduce_mean(float(acc[0]), device)
            if not np.isfinite(total):
                raise NonFiniteLoss(f"non-finite loss {total} at window step {s} (distill {acc[1]}, consistency {acc[2]}, "
                                    f"engagement {acc[3]}, swap {acc[4]}): stopping")
            torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.optim.grad_clip)
            opt.step()
            ema_update(teacher, student, float(moms[s]))
            recentre(student, teacher, all_reduce_sum(centre), cfg.teacher.centre_momentum, cfg.objective.centre_users)
            losses.append(total)
            for k, v in zip(parts, acc[1:]):  # swap last: left out when off
                parts[k].append(_all_reduce_mean(float(v), device))
            if rank == 0 and out is not None and cfg.runtime.checkpoint_every and (s + 1) % cfg.runtime.checkpoint_every == 0 and s + 1 < cfg.budget.steps:
                _save(Path(out), _state(student, teacher, loss_fn, opt, cfg_model, window, s + 1, base_step, False, {}))
    t_end = time.perf_counter()
    seconds = t_end - t0
    per_step = cfg.budget.batch_size + 2 * cfg.budget.pair_batch
    steady = per_step * (end - start - 1) / max(t_end - t_first, 1e-9) if t_first is not None else float("nan")
    final_loss = held_out_loss(student, teacher, loss_fn, data, cfg, shards, device) if cfg.runtime.held_out_batches else float("nan")
    for m in (student, teacher):
        m.encoder.autocast_dtype = None
    done = end >= cfg.budget.steps
    backend = getattr(student.encoder.last_choice, "backend", "none")
    digest = hashlib.sha256(b"".join(v.detach().cpu().contiguous().numpy().tobytes() for v in student.state_dict().values()))
    result = TrainResult(window, base_step + end, end, start, warm, losses, parts, [], [], seconds,
                         per_step * (end - start) / max(seconds, 1e-9), backend, weights_digest=digest.hexdigest()[:16],
                         held_out_start=start_loss, held_out_final=final_loss, loader_wait_s=wait,
                         loader=f"{workers} processes" + (", lean" if lean else "") + f", {loader.transport}" if workers else "thread",
                         steady_samples_per_s=steady,
                         precision="fp32" if dtype is None else "bf16")
    if rank != 0:
        return result
    exported = published(student, teacher, cfg)
    entropy, share = collapse_metrics(exported, data, cfg)
    nodes = probe_nodes(data, cfg)
    probe = embed_nodes(exported, exported.global_tokens(), data, nodes, cfg)
    result = replace(result, usage_entropy=entropy, usage_share=share, probe_nodes=nodes.tolist(), probe_embeddings=probe.tolist())
    if out is not None:
        extra = {"probe_nodes": torch.from_numpy(nodes), "probe_embeddings": probe, "losses": torch.tensor(losses)}
        version = _save(Path(out), _state(student, teacher, loss_fn, opt, cfg_model, window, end, base_step, done, extra))
        result = replace(result, version=version)
    return result


def _tiny(cfg: TrainConfig) -> TrainConfig:
    """cfg at the smallest batch it allows: one step batch of it touches every table the sampler builds per graph."""
    return set_fields(cfg, batch_size=2 * cfg.runtime.shards, pair_batch=cfg.runtime.shards if cfg.budget.pair_batch else 0,
                      shared_negatives=cfg.runtime.shards if cfg.budget.shared_negatives else 0)
