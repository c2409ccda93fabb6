"""Training hyper-parameters: frozen dataclasses (nanoGPT style) grouped by concern and composed in `TrainConfig`, plus
the schedules derived from them. hir.toml and `--set` name fields flat (`lr`, `steps`); `with_overrides` finds each one's
group."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from hir_model.graph.sampler import ViewConfig
from hir_model.nn import EncoderConfig

# The views used for training. The sampler's NARROW/BROAD defaults make the teacher's dense [B, H, N, N] bias too slow
# for a CPU window; these keep the contrast (narrow: recent, shallow, noisy; broad: full history, deeper) at a fraction
# of the tokens.
TRAIN_NARROW = ViewConfig("narrow", fanout=(6, 3), max_age_days=14.0, edge_drop=0.2)  # <= 1 + 6 + 18 = 25 tokens
TRAIN_BROAD = ViewConfig("broad", fanout=(8, 4, 2))  # <= 1 + 8 + 32 + 64 = 105 tokens

# Engagement pair weights by event type: deeper funnel stages count more (they are drawn more often as positives).
# `not_interested` is an explicit negative (weight of its own, sign -1); `interested` is a positive.
PAIR_WEIGHTS: dict[str, float] = {"impression": 0.25, "click": 1.0, "add_to_cart": 2.0, "purchase": 4.0,
                                  "interested": 2.0, "not_interested": 2.0}
NEGATIVE_EVENTS: tuple[str, ...] = ("not_interested",)


PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class BudgetConfig:
    """How much a window trains on: its steps and what each step's batch holds."""
    steps: int = 12  # optimizer steps per window (warm-started from t-1, so a window refines the last one)
    epochs: float = 0.0  # > 0: a budget in passes over the window's engagement pairs instead of `steps`: the window trains
    # ceil(epochs * pairs / window pairs per step) steps (at least 1, at most max_steps), each step's pair batch taking the
    # next pairs of a seeded permutation, so every pair is seen once an epoch (needs pair_batch)
    max_steps: int = 0  # cap on the steps an epoch or root budget gives a window (0: none)
    root_steps: float = 0.0  # > 0: the window trains ceil(root_steps * sqrt(pairs / pairs per step)) steps instead of
    # `steps`, growing with the square root of its engagement pairs (docs/decisions.md, "The training budget follows
    # the window's pairs"): 5 gives MovieLens's median week ~45 steps, a small synthetic window ~125, a medium one ~395
    batch_size: int = 64  # seeds per step (global, over all ranks): half engagement pairs (user, entity), half active nodes
    pair_share: float = 1.0  # share of a step's seeds drawn as engagement pairs (P users + P entities); the rest: active nodes
    pair_batch: int = 0  # engagement pairs per step (global) encoded on the student's narrow view beside the distillation
    # seeds, for the engagement term only (no teacher view: a narrow sequence costs a fraction of a seed's two views);
    # 0: none, the engagement term reads the seeds' own pairs only
    replay_share: float = 0.0  # share of the pair batch replayed from earlier windows: user -> entity engagement edges of
    # the cumulative graph, drawn by decayed weight
    shared_negatives: int = 0  # entities per step drawn by the pair stream's entity frequency, encoded once and shared by
    # every user of the pair batch as extra negatives (logQ-corrected when logq_correction is on)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.epochs < 0 or self.max_steps < 0 or self.pair_batch < 0 or self.shared_negatives < 0:
            raise ValueError(f"epochs, max_steps, pair_batch and shared_negatives must be >= 0, got {self.epochs}, "
                             f"{self.max_steps}, {self.pair_batch}, {self.shared_negatives}")
        if self.root_steps < 0:
            raise ValueError(f"root_steps must be >= 0, got {self.root_steps}")
        if self.root_steps > 0 and self.epochs > 0:
            raise ValueError(f"one budget rule at a time: epochs={self.epochs} and root_steps={self.root_steps} are both set")
        if self.epochs > 0 and not self.pair_batch:
            raise ValueError(f"an epoch budget (epochs={self.epochs}) needs pair_batch > 0: the pairs an epoch passes over")
        if not 0 <= self.replay_share < 1:
            raise ValueError(f"replay_share must be in [0, 1), got {self.replay_share}")

    @property
    def replay_pairs(self) -> int:
        """Pairs of each step's pair batch replayed from earlier windows (the rest are the window's own)."""
        return int(round(self.pair_batch * self.replay_share))

    @property
    def step_pairs(self) -> int:
        """The window's own engagement pairs one step reads: its seeds' pairs plus the pair batch's unreplayed share."""
        return max(1, int(self.batch_size * self.pair_share) // 2 + self.pair_batch - self.replay_pairs)

    def window_steps(self, pairs: int) -> int:
        """Optimizer steps of a window with `pairs` engagement pairs: `steps`, the epoch budget's count (passes over the
        pair batch's share) or the root budget's (root_steps x the square root of the steps one pass would take)."""
        if self.root_steps > 0:
            n = max(1, math.ceil(self.root_steps * math.sqrt(max(pairs, 0) / self.step_pairs)))
        elif self.epochs > 0:
            n = max(1, math.ceil(self.epochs * pairs / (self.pair_batch - self.replay_pairs)))
        else:
            return self.steps
        return min(n, self.max_steps) if self.max_steps else n


@dataclass(frozen=True)
class OptimConfig:
    """The student's AdamW optimizer and its learning-rate schedule (lr_schedule)."""
    lr: float = 2e-3  # peak learning rate (linear warm-up, cosine decay to lr/10)
    warmup_steps: int = 5  # steps of the linear warm-up
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    grad_clip: float = 3.0  # max global grad norm


@dataclass(frozen=True)
class PrototypeConfig:
    """The interest levels' prototypes: how many, how a window starts them, and whether the encoder sees them."""
    levels: tuple[int, ...] = (8, 32, 128)  # prototypes per level, coarse -> fine
    init_prototypes: bool = True  # k-means the prototypes on a fresh start; refine them (refine_iters) on a warm start
    refine_iters: int = 10  # warm start: spherical k-means steps moving each level's prototypes to its centroids (0: they stay as trained)
    prototype_restarts: int = 4  # warm start: fresh spherical k-means runs per level, one taken over the refined prototypes
    # only where it fits the teacher's embeddings better by more than restart_gain (hir_model.train.prototypes.restarted;
    # none with refine_iters 0)
    restart_gain: float = 0.01  # mean cosine to the nearest prototype
    global_tokens: bool = True  # feed the coarse levels' prototypes (all but the finest) to the encoder as global tokens

    def __post_init__(self) -> None:
        if len(self.levels) < 1 or any(k < 2 for k in self.levels) or list(self.levels) != sorted(self.levels):
            raise ValueError(f"levels must be >= 2 prototypes each, coarse to fine (non-decreasing), got {self.levels}")
        if self.refine_iters < 0 or self.prototype_restarts < 0:
            raise ValueError(f"refine_iters and prototype_restarts must be >= 0, got {self.refine_iters}, {self.prototype_restarts}")

    @property
    def global_levels(self) -> int:
        """How many coarse levels enter the encoder as global tokens (0: none)."""
        return len(self.levels) - 1 if self.global_tokens and len(self.levels) > 1 else 0


@dataclass(frozen=True)
class TeacherConfig:
    """The DINO teacher (an EMA of the student) and the balanced targets it gives the student."""
    momentum_start: float = 0.9  # teacher EMA momentum, cosine from start to end over the window's steps
    momentum_end: float = 0.995  # the EMA momentum at the window's last step
    student_temp: float = 0.1  # softmax temperature of the student's prototype scores
    centre_momentum: float = 0.9  # EMA momentum of the readout centre (hir_model.train.trainer.recentre)
    sinkhorn_eps: float = 0.05  # entropic regularisation of the balanced teacher targets (SwAV's epsilon)
    sinkhorn_iters: int = 3  # Sinkhorn-Knopp iterations
    publish: str = "teacher"  # which network the checkpoint exports (its `model`, prototypes and version): "teacher" | "student"

    def __post_init__(self) -> None:
        if self.publish not in ("teacher", "student"):
            raise ValueError(f"TeacherConfig.publish must be 'teacher' or 'student', got {self.publish!r}")
        if not 0 <= self.momentum_start <= self.momentum_end <= 1:
            raise ValueError(f"0 <= momentum_start <= momentum_end <= 1 is required, got {self.momentum_start}, "
                             f"{self.momentum_end}")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The loss: its terms' weights and temperatures, and the seeds trained as cold starts."""
    distill_weight: float = 1.0  # weight of the cross-view distillation term
    consistency_weight: float = 0.5  # weight of the fine -> coarse consistency term
    consistency_temp: float = 0.1  # temperature of the derived fine -> coarse parent assignment
    engagement_weight: float = 1.0  # weight of the contrastive user-entity term
    engagement_temp: float = 0.1  # InfoNCE temperature on cosine similarities
    logq_correction: bool = False  # subtract each in-batch candidate's log draw probability from its InfoNCE logit (Yi et
    # al. 2019): pairs are drawn by frequency, so uncorrected the term learns engagement over popularity (hir.toml turns
    # it on for MovieLens, README Training)
    centre_users: bool = True  # subtract the user type's mean readout too (off: users keep the direction they share, where
    # a preference for what everyone engages with lives, and can collapse onto it; the other types are centred either way)
    swap_weight: float = 0.0  # swapped prediction over engagement pairs: the student's user predicts the teacher's code of
    # the entity it engaged with, and the entity its user's (SwAV's swap, the pair as two views of one interest)
    cold_share: float = 0.0  # share of engageable seeds whose student (narrow) view is their own token only (DropoutNet-style
    # cold-start training; off by default, docs/decisions.md)
    item_pair_share: float = 0.0  # share of the engagement pairs' draw probability given to entity -> entity pairs: two
    # entities a user engaged with at most item_pair_window distinct entities apart (hir_model.train.data.with_item_pairs)
    item_pair_window: int = 10

    def __post_init__(self) -> None:
        if not 0 <= self.cold_share <= 1:
            raise ValueError(f"cold_share must be in [0, 1], got {self.cold_share}")
        if not 0 <= self.item_pair_share < 1 or self.item_pair_window < 1:
            raise ValueError(f"item_pair_share must be in [0, 1) and item_pair_window >= 1, got {self.item_pair_share}, "
                             f"{self.item_pair_window}")


@dataclass(frozen=True)
class RuntimeConfig:
    """How a window's training runs: sharding, checkpoints, the batches held out for checks, seeding and arithmetic."""
    shards: int = 1  # micro-batches per step: the loss is the mean over shards (DDP: one shard per rank)
    checkpoint_every: int = 10  # write a resumable checkpoint every this many steps (0: only at the end)
    held_out_batches: int = 4  # fixed batches scored before and after a window's steps (the loss-decreased check)
    probe_size: int = 16  # fixed probe batch whose embeddings are logged and re-checked after loading
    metric_nodes: int = 512  # active nodes scored by the teacher at the end for the collapse metrics
    seed: int = 0  # seeds every batch, initialisation and k-means: the same inputs give the same weights
    deterministic: bool = True  # torch's deterministic algorithms while training: a CPU backward kernel's parallel sums
    # otherwise differ between runs; with them two runs of a window give identical weights, at no measurable cost
    precision: str = "auto"  # the encoder's arithmetic while training: "auto" = bf16 autocast on CUDA, float32 elsewhere;
    # "fp32" / "bf16" force one. The readout, the losses and the optimizer stay float32 either way
    loader_workers: int = -1  # forked processes sampling the next steps (every step batch is seeded by its step: the same
    # batches as one thread makes); -1 = auto (CUDA: the free cores, at most 12; CPU: 0); 0 = one background thread

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.precision not in PRECISIONS or self.loader_workers < -1:
            raise ValueError(f"precision must be one of {PRECISIONS} and loader_workers >= -1, got {self.precision!r}, "
                             f"{self.loader_workers}")


# TrainConfig's groups: attribute -> class. hir.toml and overrides name the groups' fields flat (FIELD_GROUP).
GROUPS: dict[str, type] = {"budget": BudgetConfig, "optim": OptimConfig, "prototypes": PrototypeConfig,
                           "teacher": TeacherConfig, "objective": ObjectiveConfig, "runtime": RuntimeConfig}
FIELD_GROUP: dict[str, str] = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}
_TOP = ("narrow", "broad", "encoder")  # TrainConfig's own fields beside the groups


@dataclass(frozen=True)
class TrainConfig:
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    prototypes: PrototypeConfig = field(default_factory=PrototypeConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    narrow: ViewConfig = TRAIN_NARROW  # the student's view: recent, shallow, noisy
    broad: ViewConfig = TRAIN_BROAD  # the teacher's view: full history, deeper (also the view embeddings are made with)
    # a small encoder; the compiled dense-bias kernel takes longer to compile per process than a window takes to train
    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(width=64, heads=4, layers=2, hash_hidden=128,
                                                                         compile_dense_bias=False))

    def __post_init__(self) -> None:  # the rules that span groups; each group checks its own
        b, shards = self.budget, self.runtime.shards
        if b.batch_size % (2 * shards):
            raise ValueError(f"batch_size {b.batch_size} must be a multiple of 2 * shards ({2 * shards})")
        if b.pair_batch % shards or b.shared_negatives % shards:
            raise ValueError(f"pair_batch {b.pair_batch} and shared_negatives {b.shared_negatives} must be multiples of "
                             f"shards ({shards})")

    def to_dict(self) -> dict:
        """JSON-ready: one dict per group, the views and the encoder (a checkpoint's `extra["train_config"]`)."""
        d = asdict(self)
        d["prototypes"]["levels"] = list(self.prototypes.levels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The inverse of to_dict; also reads the flat dict of hir versions before the groups (older checkpoints)."""
        groups: dict[str, dict] = {g: {} for g in GROUPS}
        top: dict = {}
        unknown = []
        for k, v in d.items():
            if k in GROUPS and isinstance(v, dict):
                bad = sorted(set(v) - {f.name for f in fields(GROUPS[k])})
                unknown += [f"{k}.{b}" for b in bad]
                groups[k].update(v)
            elif k in FIELD_GROUP:
                groups[FIELD_GROUP[k]][k] = v
            elif k in _TOP:
                top[k] = v
            else:
                unknown.append(k)
        if unknown:  # e.g. a checkpoint written by a newer hir: silently dropping a setting would misread it
            raise ValueError(f"training config has fields this version of hir does not know: {sorted(unknown)}; "
                             "load it with the version that wrote it, or retrain")
        if "levels" in groups["prototypes"]:
            groups["prototypes"]["levels"] = tuple(groups["prototypes"]["levels"])
        for view in ("narrow", "broad"):
            if view in top:
                v = dict(top[view])
                v["fanout"] = tuple(v["fanout"])
                top[view] = ViewConfig(**v)
        if "encoder" in top:
            top["encoder"] = EncoderConfig.from_dict(top["encoder"])
        return cls(**{g: GROUPS[g](**groups[g]) for g in GROUPS}, **top)


# Named training budgets (`budget = "<name>"` in hir.toml's [train] tables or an override): each is a set of field
# overrides applied before the fields beside it. `cpu`: one pass a window over its engagement pairs, sized for CPU
# cores; `full`: eight passes, larger batches and more shared negatives, for a GPU. Neither is on by default
# (docs/decisions.md).
BUDGETS: dict[str, dict] = {
    "cpu": {"epochs": 1.0, "pair_batch": 256, "shared_negatives": 128, "replay_share": 0.25, "max_steps": 40,
            "encoder": {"id_table_rows": 2**15}},
    "full": {"epochs": 8.0, "batch_size": 256, "pair_batch": 1024, "shared_negatives": 2048, "replay_share": 0.25,
             "max_steps": 400, "encoder": {"id_table_rows": 2**20}},
}


def with_overrides(cfg: TrainConfig, overrides: dict) -> TrainConfig:
    """cfg with the given fields replaced, named flat as in hir.toml (`lr`, `steps`: each goes to its group; lists become
    tuples); `encoder` may be a dict of EncoderConfig fields to replace (e.g. {"strength_buckets": 24}), `narrow` and
    `broad` dicts of ViewConfig fields (e.g. {"fanout": [12, 3]}); `budget` names a
    BUDGETS preset, applied before the other fields; `steps` or `epochs` without `root_steps` turns the root rule off;
    unknown names raise a ValueError naming them."""
    overrides = dict(overrides)
    if "budget" in overrides:
        name = overrides.pop("budget")
        if name not in BUDGETS:
            raise ValueError(f"unknown training budget {name!r}; known: {sorted(BUDGETS)}")
        cfg = with_overrides(cfg, BUDGETS[name])
    if ("steps" in overrides or "epochs" in overrides) and "root_steps" not in overrides:
        overrides["root_steps"] = 0.0  # a step count or an epoch budget named here replaces the root rule
    unknown = sorted(set(overrides) - set(FIELD_GROUP) - set(_TOP))
    if unknown:
        raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted([*FIELD_GROUP, *_TOP])}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    if isinstance(values.get("encoder"), dict):
        bad = sorted(set(values["encoder"]) - set(EncoderConfig.__dataclass_fields__))
        if bad:
            raise ValueError(f"unknown EncoderConfig fields {bad}; known: {sorted(EncoderConfig.__dataclass_fields__)}")
        values["encoder"] = replace(cfg.encoder, **values["encoder"])
    for view in ("narrow", "broad"):  # a dict of ViewConfig fields over the view's own ({"fanout": [12, 3]})
        if isinstance(values.get(view), dict):
            bad = sorted(set(values[view]) - set(ViewConfig.__dataclass_fields__) | ({"name"} & set(values[view])))
            if bad:
                raise ValueError(f"{view}: unknown or fixed ViewConfig fields {bad}; known: "
                                 f"{sorted(set(ViewConfig.__dataclass_fields__) - {'name'})}")
            values[view] = replace(getattr(cfg, view), **values[view])
    return set_fields(cfg, **values)


def set_fields(cfg: TrainConfig, **values) -> TrainConfig:
    """cfg with fields replaced by their flat names (`set_fields(cfg, steps=4, lr=0.01)`), each in its group."""
    top = {k: values.pop(k) for k in _TOP if k in values}
    by_group: dict[str, dict] = {}
    for k, v in values.items():
        if k not in FIELD_GROUP:
            raise ValueError(f"unknown TrainConfig field {k!r}; known: {sorted([*FIELD_GROUP, *_TOP])}")
        by_group.setdefault(FIELD_GROUP[k], {})[k] = v
    # each group checks its own fields as it is replaced; TrainConfig checks the rules spanning groups once all are set
    return replace(cfg, **{g: replace(getattr(cfg, g), **v) for g, v in by_group.items()}, **top)


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
    steps, t_cfg = cfg.budget.steps, cfg.teacher
    t = np.arange(steps) / max(steps - 1, 1)
    return t_cfg.momentum_end - (t_cfg.momentum_end - t_cfg.momentum_start) * (np.cos(np.pi * t) + 1) / 2


def lr_schedule(cfg: TrainConfig) -> np.ndarray:
    """float64 [steps]: linear warm-up to lr, cosine decay to lr / 10."""
    steps, o = cfg.budget.steps, cfg.optim
    s = np.arange(steps, dtype=np.float64)
    warm = np.minimum(1.0, (s + 1) / max(o.warmup_steps, 1))
    t = np.clip((s - o.warmup_steps) / max(steps - o.warmup_steps, 1), 0, 1)
    return o.lr * warm * (0.1 + 0.9 * (np.cos(np.pi * t) + 1) / 2)
