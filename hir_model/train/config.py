"""Training hyper-parameters: one frozen dataclass (nanoGPT style), plus the schedules derived from it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from hir_model.graph.sampler import ViewConfig
from hir_model.nn import EncoderConfig

# The views used for training. The sampler's NARROW/BROAD defaults (8x4 vs 16x8x4, up to 657 tokens) make the
# teacher's dense [B, H, N, N] bias too slow for a 5-10 s CPU window; these keep the contrast (narrow: recent,
# shallow, noisy; broad: full history, deeper) at ~1/5 of the tokens.
TRAIN_NARROW = ViewConfig("narrow", fanout=(6, 3), max_age_days=14.0, edge_drop=0.2)  # <= 1 + 6 + 18 = 25 tokens
TRAIN_BROAD = ViewConfig("broad", fanout=(8, 4, 2))  # <= 1 + 8 + 32 + 64 = 105 tokens

# Engagement pair weights by event type: deeper funnel stages count more (they are drawn more often as positives).
# `not_interested` is an explicit negative (weight of its own, sign -1); `interested` is a positive.
PAIR_WEIGHTS: dict[str, float] = {"impression": 0.25, "click": 1.0, "add_to_cart": 2.0, "purchase": 4.0,
                                  "interested": 2.0, "not_interested": 2.0}
NEGATIVE_EVENTS: tuple[str, ...] = ("not_interested",)


PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    levels: tuple[int, ...] = (8, 32, 128)  # prototypes per level, coarse -> fine (MovieLens has ~1.7k movies + users)
    steps: int = 12  # optimizer steps per window (~0.6 s each on 2 CPU cores: 5-10 s a window; warm-started from t-1, so a window refines)
    epochs: float = 0.0  # > 0: a budget in passes over the window's engagement pairs instead of `steps`: the window trains
    # ceil(epochs * pairs / window pairs per step) steps (at least 1, at most max_steps), each step's pair batch taking the
    # next pairs of a seeded permutation, so every pair is seen once an epoch (needs pair_batch)
    max_steps: int = 0  # cap on the steps an epoch budget gives a window (0: none)
    pair_batch: int = 0  # engagement pairs per step (global) encoded on the student's narrow view beside the distillation
    # seeds, for the engagement term only (no teacher view: a narrow sequence costs ~1/10 of a seed's two views); 0: none,
    # the engagement term reads the seeds' own pairs only
    replay_share: float = 0.0  # share of the pair batch replayed from earlier windows: user -> entity engagement edges of
    # the cumulative graph, drawn by decayed weight
    shared_negatives: int = 0  # entities per step drawn by the pair stream's entity frequency, encoded once and shared by
    # every user of the pair batch as extra negatives (logQ-corrected when logq_correction is on)
    batch_size: int = 64  # seeds per step (global, over all ranks): half engagement pairs (user, entity), half active nodes
    pair_share: float = 1.0  # share of a step's seeds drawn as engagement pairs (P users + P entities); the rest: active nodes
    lr: float = 2e-3  # AdamW peak learning rate (linear warm-up, cosine decay to lr/10)
    warmup_steps: int = 5
    weight_decay: float = 0.01
    grad_clip: float = 3.0  # max global grad norm
    momentum_start: float = 0.9  # teacher EMA momentum, cosine from start to end over the window's steps
    momentum_end: float = 0.995
    student_temp: float = 0.1  # softmax temperature of the student's prototype scores
    init_prototypes: bool = True  # k-means the prototypes on a fresh start; refine them (refine_iters) on a warm start
    cold_share: float = 0.0  # share of engageable seeds whose student (narrow) view is their own token only (DropoutNet-style
    # cold-start training; off: items crowded onto few primitives and BoM recall fell, docs/decisions.md)
    refine_iters: int = 10  # warm start: spherical k-means steps moving each level's prototypes to its centroids (0: they stay as trained)
    prototype_restarts: int = 4  # warm start: fresh spherical k-means runs per level, one taken over the refined prototypes
    # only where it fits the teacher's embeddings better by more than restart_gain (hir_model.train.prototypes.restarted;
    # none with refine_iters 0)
    restart_gain: float = 0.01  # mean cosine to the nearest prototype
    centre_momentum: float = 0.9  # EMA momentum of the readout centre (hir_model.train.trainer.recentre)
    sinkhorn_eps: float = 0.05  # entropic regularisation of the balanced teacher targets (SwAV's epsilon)
    sinkhorn_iters: int = 3  # Sinkhorn-Knopp iterations
    consistency_temp: float = 0.1  # temperature of the derived fine -> coarse parent assignment
    consistency_weight: float = 0.5  # weight of the fine -> coarse consistency term
    distill_weight: float = 1.0  # weight of the cross-view distillation term
    engagement_weight: float = 1.0  # weight of the contrastive user-entity term
    engagement_temp: float = 0.1  # InfoNCE temperature on cosine similarities
    logq_correction: bool = False  # subtract each in-batch candidate's log draw probability from its InfoNCE logit (Yi et
    # al. 2019): pairs are drawn by frequency, so uncorrected the term learns engagement over popularity (hir.toml turns
    # it on for MovieLens, README Training)
    centre_users: bool = True  # subtract the user type's mean readout too (off: users keep the direction they share, where
    # a preference for what everyone engages with lives; the other types are centred either way. Off, MovieLens users
    # collapsed onto one direction and the demo failed its BoM recall check: README, Training)
    swap_weight: float = 0.0  # swapped prediction over engagement pairs: the student's user predicts the teacher's code of
    # the entity it engaged with, and the entity its user's (SwAV's swap, the pair as two views of one interest)
    global_tokens: bool = True  # feed the coarse levels' prototypes (all but the finest) to the encoder as global tokens
    shards: int = 1  # micro-batches per step: the loss is the mean over shards (DDP: one shard per rank)
    checkpoint_every: int = 10  # write a resumable checkpoint every this many steps (0: only at the end)
    held_out_batches: int = 4  # fixed batches scored before and after a window's steps (the loss-decreased check)
    probe_size: int = 16  # fixed probe batch whose embeddings are logged and re-checked after loading
    metric_nodes: int = 512  # active nodes scored by the teacher at the end for the collapse metrics
    seed: int = 0
    deterministic: bool = True  # torch's deterministic algorithms while training: with 2 CPU threads, two runs of one window
    # on the same inputs gave different weights (a backward kernel's parallel sums; 1 thread and the forward were exact);
    # with them, identical, and no slower (synthetic window, 30 steps: 3.0-3.1 s either way)
    precision: str = "auto"  # the encoder's arithmetic while training: "auto" = bf16 autocast on CUDA, float32 elsewhere;
    # "fp32" / "bf16" force one. The readout, the losses and the optimizer stay float32 either way
    loader_workers: int = -1  # forked processes sampling the next steps (every step batch is seeded by its step: the same
    # batches as one thread makes); -1 = auto (CUDA: the free cores, at most 12; CPU: 0); 0 = one background thread
    narrow: ViewConfig = TRAIN_NARROW
    broad: ViewConfig = TRAIN_BROAD
    # a small encoder; the compiled dense-bias kernel costs ~7 s per process to compile: more than a window's training
    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(width=64, heads=4, layers=2, hash_hidden=128,
                                                                         compile_dense_bias=False))

    def __post_init__(self) -> None:
        if len(self.levels) < 1 or any(k < 2 for k in self.levels) or list(self.levels) != sorted(self.levels):
            raise ValueError(f"levels must be >= 2 prototypes each, coarse to fine (non-decreasing), got {self.levels}")
        if self.batch_size % (2 * self.shards):
            raise ValueError(f"batch_size {self.batch_size} must be a multiple of 2 * shards ({2 * self.shards})")
        if self.refine_iters < 0 or self.prototype_restarts < 0:
            raise ValueError(f"refine_iters and prototype_restarts must be >= 0, got {self.refine_iters}, {self.prototype_restarts}")
        if not 0 <= self.cold_share <= 1:
            raise ValueError(f"cold_share must be in [0, 1], got {self.cold_share}")
        if self.steps < 1 or not 0 <= self.momentum_start <= self.momentum_end <= 1:
            raise ValueError("steps >= 1 and 0 <= momentum_start <= momentum_end <= 1 are required")
        if self.epochs < 0 or self.max_steps < 0 or self.pair_batch < 0 or self.shared_negatives < 0:
            raise ValueError(f"epochs, max_steps, pair_batch and shared_negatives must be >= 0, got {self.epochs}, "
                             f"{self.max_steps}, {self.pair_batch}, {self.shared_negatives}")
        if self.epochs > 0 and not self.pair_batch:
            raise ValueError(f"an epoch budget (epochs={self.epochs}) needs pair_batch > 0: the pairs an epoch passes over")
        if self.pair_batch % self.shards or self.shared_negatives % self.shards:
            raise ValueError(f"pair_batch {self.pair_batch} and shared_negatives {self.shared_negatives} must be multiples of "
                             f"shards ({self.shards})")
        if self.precision not in PRECISIONS or self.loader_workers < -1:
            raise ValueError(f"precision must be one of {PRECISIONS} and loader_workers >= -1, got {self.precision!r}, "
                             f"{self.loader_workers}")
        if not 0 <= self.replay_share < 1:
            raise ValueError(f"replay_share must be in [0, 1), got {self.replay_share}")

    @property
    def replay_pairs(self) -> int:
        """Pairs of each step's pair batch replayed from earlier windows (the rest are the window's own)."""
        return int(round(self.pair_batch * self.replay_share))

    def window_steps(self, pairs: int) -> int:
        """Optimizer steps of a window with `pairs` engagement pairs: `steps`, or the epoch budget's count."""
        if self.epochs <= 0:
            return self.steps
        per_step = self.pair_batch - self.replay_pairs
        n = max(1, math.ceil(self.epochs * pairs / per_step))
        return min(n, self.max_steps) if self.max_steps else n

    @property
    def global_levels(self) -> int:
        """How many coarse levels enter the encoder as global tokens (0: none)."""
        return len(self.levels) - 1 if self.global_tokens and len(self.levels) > 1 else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["levels"] = list(self.levels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:  # e.g. a checkpoint written by a newer hir: silently dropping a setting would misread it
            raise ValueError(f"training config has fields this version of hir does not know: {unknown}; "
                             "load it with the version that wrote it, or retrain")
        d = dict(d)
        d["levels"] = tuple(d["levels"])
        for view in ("narrow", "broad"):
            v = dict(d[view])
            v["fanout"] = tuple(v["fanout"])
            d[view] = ViewConfig(**v)
        d["encoder"] = EncoderConfig.from_dict(d["encoder"])
        return cls(**d)


# Named training budgets (`budget = "<name>"` in hir.toml's [train] tables or an override): each is a set of field
# overrides applied before the fields beside it. `cpu`: one pass a window over its engagement pairs (MovieLens on 2 CPU
# cores: ~1.8x the default's training time); `full`: eight passes, larger batches and more shared negatives, for a GPU.
# Neither is on by default: on MovieLens neither moved the representation's recall beyond the noise (docs/model.md).
BUDGETS: dict[str, dict] = {
    "cpu": {"epochs": 1.0, "pair_batch": 256, "shared_negatives": 128, "replay_share": 0.25, "max_steps": 40,
            "encoder": {"id_table_rows": 2**15}},
    "full": {"epochs": 8.0, "batch_size": 256, "pair_batch": 1024, "shared_negatives": 2048, "replay_share": 0.25,
             "max_steps": 400, "encoder": {"id_table_rows": 2**20}},
}


def with_overrides(cfg: TrainConfig, overrides: dict) -> TrainConfig:
    """cfg with the given top-level fields replaced (lists become tuples); `encoder` may be a dict of EncoderConfig fields
    to replace (e.g. {"strength_buckets": 24}); `budget` names a BUDGETS preset, applied before the other fields; unknown
    names raise a ValueError naming them."""
    overrides = dict(overrides)
    if "budget" in overrides:
        name = overrides.pop("budget")
        if name not in BUDGETS:
            raise ValueError(f"unknown training budget {name!r}; known: {sorted(BUDGETS)}")
        cfg = with_overrides(cfg, BUDGETS[name])
    unknown = sorted(set(overrides) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted(TrainConfig.__dataclass_fields__)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    if isinstance(values.get("encoder"), dict):
        bad = sorted(set(values["encoder"]) - set(EncoderConfig.__dataclass_fields__))
        if bad:
            raise ValueError(f"unknown EncoderConfig fields {bad}; known: {sorted(EncoderConfig.__dataclass_fields__)}")
        values["encoder"] = replace(cfg.encoder, **values["encoder"])
    return replace(cfg, **values)


def parse_overrides(pairs: list[str]) -> dict:
    """`field=value` strings (values in JSON: 0.005, false, [4, 12, 36]) -> a dict for `with_overrides`."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"override {pair!r} is not field=value")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"override {pair!r}: the value is not JSON ({e.msg}); strings need quotes") from e
    return out


def momentum_schedule(cfg: TrainConfig) -> np.ndarray:
    """float64 [steps]: teacher EMA momentum per step (cosine from momentum_start to momentum_end)."""
    t = np.arange(cfg.steps) / max(cfg.steps - 1, 1)
    return cfg.momentum_end - (cfg.momentum_end - cfg.momentum_start) * (np.cos(np.pi * t) + 1) / 2


def lr_schedule(cfg: TrainConfig) -> np.ndarray:
    """float64 [steps]: linear warm-up to lr, cosine decay to lr / 10."""
    s = np.arange(cfg.steps, dtype=np.float64)
    warm = np.minimum(1.0, (s + 1) / max(cfg.warmup_steps, 1))
    t = np.clip((s - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1), 0, 1)
    return cfg.lr * warm * (0.1 + 0.9 * (np.cos(np.pi * t) + 1) / 2)
