"""catalog_clip: a small open_clip model fitted to the catalogue's own image-text pairs.

Where no pretrained CLIP weights are available (as offline), the image tower is learned from the
catalogue: a tiny ViT image tower and a small text tower, built by open_clip from the config below and
trained with open_clip's contrastive `ClipLoss` on (product image, product text) pairs. The text is the
entity text the text encoder sees, so images land where their descriptions' words point: on the
synthetic source that is the planted interest (shape, colour and pattern follow it).

Checkpoints hold the open_clip model config, the training config, weights, optimizer state, the step,
the digests of the training images and a version: a content hash of config + data + weights. Loading
uses `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import open_clip
import torch
from PIL import Image

Progress = Callable[[int, int], None]  # (done, total) steps

CLIP_ASSET, CLIP_CHECKPOINT_FILE, CLIP_STATUS_FILE = "catalog_clip", "checkpoint.pt", "status"  # the asset and its files


@dataclass(frozen=True)
class CatalogClipConfig:
    embed_dim: int = 64  # the shared image-text space: the image vectors' width
    image_size: int = 32  # images are resized to this square (the synthetic catalogue draws 32 px)
    patch_size: int = 8  # (32 / 8)^2 = 16 patch tokens; 4x cheaper than 4 px patches for ~1 point of NN agreement
    vision_width: int = 96
    vision_layers: int = 2
    vision_head_width: int = 32  # 3 heads
    text_width: int = 64
    text_heads: int = 2
    text_layers: int = 2
    context_length: int = 32  # BPE tokens per caption (open_clip's SimpleTokenizer; longer ones are cut)
    epochs: int = 8  # when training from scratch (~20 s for 2k pairs on one CPU core)
    warm_epochs: int = 3  # when warm-started from the previous window's checkpoint
    batch_size: int = 128  # pairs per contrastive batch (the rest of the batch are the negatives)
    lr: float = 2e-3  # peak AdamW learning rate (cosine decay after warm-up)
    warmup_steps: int = 20
    weight_decay: float = 0.05  # on matrices only (not on gains, biases, embeddings or the logit scale)
    seed: int = 0  # initialisation and batch order
    retrain_fraction: float = 0.5  # retrain once this share of the catalogue's images were not in the last training set
    max_pairs: int = 16_384  # fit on at most this many pairs, a seeded sample of a larger catalogue: the fit's cost stops
    #                          growing with the catalogue (medium 21.5k pairs, large 215k); the demo's 2k are all used

    def model_config(self) -> dict:
        """The open_clip CLIP(...) arguments: stored in the checkpoint and enough to rebuild the model."""
        return {"embed_dim": self.embed_dim,
                "vision_cfg": {"image_size": self.image_size, "patch_size": self.patch_size, "width": self.vision_width,
                               "layers": self.vision_layers, "head_width": self.vision_head_width},
                "text_cfg": {"context_length": self.context_length, "width": self.text_width, "heads": self.text_heads,
                             "layers": self.text_layers}}


@dataclass
class ClipCheckpoint:
    model_config: dict  # open_clip CLIP(...) arguments
    train_config: dict  # the CatalogClipConfig it was trained with
    state_dict: dict  # weights
    optimizer: dict  # AdamW state, for a warm start
    step: int  # optimizer steps over the model's whole life
    version: str  # catalog_clip@<sha256(config + data + weights)[:16]>
    image_digests: list[str]  # sorted digests of the catalogue's images when it was last trained (its pairs came from these)
    losses: list[float]  # mean training loss per epoch of the last training


@dataclass(frozen=True)
class ClipPairs:
    images: torch.Tensor  # (N, 3, S, S) float32, normalised like open_clip's eval transform
    tokens: torch.Tensor  # (N, L) int64 BPE ids
    image_digests: list[str]  # (N,) digest of each image's bytes
    data_digest: str  # sha256 over the sorted (image, text) digests


@dataclass(frozen=True)
class ClipTraining:
    checkpoint: ClipCheckpoint
    warm_started: bool
    initial_loss: float  # mean contrastive loss over the pairs before training (fixed batches)
    final_loss: float  # the same after training
    epochs: int
    steps: int
    seconds: float


def build_model(model_config: dict) -> open_clip.CLIP:
    """The open_clip CLIP model that a config describes (random weights)."""
    cfg = json.loads(json.dumps(model_config))  # a private copy: open_clip may edit the dicts
    return open_clip.CLIP(embed_dim=cfg["embed_dim"], vision_cfg=cfg["vision_cfg"], text_cfg=cfg["text_cfg"])


def preprocess(image_size: int) -> Callable[[Image.Image], torch.Tensor]:
    """open_clip's eval transform (resize, centre crop, normalise) at the model's image size."""
    return open_clip.image_transform(image_size, is_train=False)


def make_pairs(images: Sequence[Image.Image], texts: Sequence[str], image_digests: Sequence[str],
               config: CatalogClipConfig) -> ClipPairs:
    """Tensors for training from decoded images and their texts (same order)."""
    if not (len(images) == len(texts) == len(image_digests)):
        raise ValueError("make_pairs needs one text and one digest per image")
    transform = preprocess(config.image_size)
    pixels = torch.stack([transform(im) for im in images]) if images else torch.zeros(0, 3, config.image_size, config.image_size)
    tokens = open_clip.tokenize(list(texts), context_length=config.context_length)  # (N, L)
    pair_digests = sorted(d + hashlib.sha256(t.encode()).hexdigest() for d, t in zip(image_digests, texts))
    return ClipPairs(pixels, tokens, list(image_digests), hashlib.sha256("".join(pair_digests).encode()).hexdigest())


def sample_pairs(n: int, config: CatalogClipConfig) -> np.ndarray:
    """(M,) sorted indices of the pairs to fit on: all n up to config.max_pairs, else a sample seeded by config.seed."""
    if n <= config.max_pairs:
        return np.arange(n)
    return np.sort(np.random.default_rng(config.seed).choice(n, config.max_pairs, replace=False))


def refresh_decision(image_digests: Sequence[str], previous: ClipCheckpoint | None, config: CatalogClipConfig,
                     force: bool = False) -> tuple[str, str, float]:
    """("train" | "warm_start" | "reuse", reason, novelty): novelty is the share of images the last training never saw."""
    if previous is None:
        return "train", "no earlier checkpoint", 1.0
    seen = set(previous.image_digests)
    novelty = float(np.mean([d not in seen for d in image_digests])) if len(image_digests) else 0.0
    if previous.model_config != config.model_config():
        return "train", "the model config changed", novelty
    if force:
        return "warm_start", "forced", novelty
    if novelty >= config.retrain_fraction:
        return "warm_start", f"{novelty:.0%} of the images are new (threshold {config.retrain_fraction:.0%})", novelty
    return "reuse", f"{novelty:.0%} of the images are new (threshold {config.retrain_fraction:.0%})", novelty


def _decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, keep = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embedding" not in name else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def _lr_schedule(config: CatalogClipConfig, steps: int) -> np.ndarray:
    """(steps,) linear warm-up then cosine decay to 10% of the peak; indexed by step."""
    t = np.arange(steps, dtype=np.float64)
    warm = min(config.warmup_steps, max(steps // 4, 1))
    cosine = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * np.clip((t - warm) / max(steps - warm, 1), 0, 1)))
    return config.lr * np.where(t < warm, (t + 1) / warm, cosine)


@torch.no_grad()
def _eval_loss(model: open_clip.CLIP, pairs: ClipPairs, batch_size: int) -> float:
    model.eval()
    loss_fn, losses = open_clip.ClipLoss(), []
    for start in range(0, len(pairs.tokens), batch_size):
        sl = slice(start, start + batch_size)
        if len(pairs.tokens[sl]) > 1:
            losses.append(float(loss_fn(*model(pairs.images[sl], pairs.tokens[sl]))))
    return float(np.mean(losses)) if losses else float("nan")


def version_of(model_config: dict, train_config: dict, data_digest: str, state_dict: dict) -> str:
    h = hashlib.sha256(json.dumps([model_config, train_config, data_digest], sort_keys=True).encode())
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(state_dict[key].detach().cpu().contiguous().numpy().tobytes())
    return f"catalog_clip@{h.hexdigest()[:16]}"


def train(pairs: ClipPairs, config: CatalogClipConfig, previous: ClipCheckpoint | None = None,
          on_progress: Progress | None = None) -> ClipTraining:
    """Fit catalog_clip to the pairs: from scratch, or warm-started from `previous` when its model config matches."""
    n = len(pairs.tokens)
    if n < 2:
        raise ValueError(f"catalog_clip needs at least 2 image-text pairs, got {n}")
    t0 = time.perf_counter()
    warm = previous is not None and previous.model_config == config.model_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = build_model(config.model_config())
        if warm:
            model.load_state_dict(previous.state_dict)
        generator = torch.Generator().manual_seed(config.seed + (previous.step if warm else 0))
    optimizer = torch.optim.AdamW(_decay_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.98), eps=1e-6)
    if warm and previous.optimizer:
        optimizer.load_state_dict(previous.optimizer)
    epochs = config.warm_epochs if warm else config.epochs
    batch = min(config.batch_size, n)
    per_epoch = max(n // batch, 1)  # drop the ragged tail: a tiny batch has too few negatives
    lrs = _lr_schedule(config, epochs * per_epoch)
    loss_fn = open_clip.ClipLoss()
    initial = _eval_loss(model, pairs, batch)
    step0, losses, step = (previous.step if warm else 0), [], 0
    for _ in range(epochs):
        model.train()
        order, total = torch.randperm(n, generator=generator), 0.0
        for b in range(per_epoch):
            idx = order[b * batch:(b + 1) * batch]
            for group in optimizer.param_groups:
                group["lr"] = float(lrs[step])
            image_f, text_f, scale = model(pairs.images[idx], pairs.tokens[idx])  # (B, E), (B, E), ()
            loss = loss_fn(image_f, text_f, scale)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"catalog_clip loss is {loss.item()} at step {step0 + step}; training stopped")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))  # as in CLIP
            total += loss.item()
            step += 1
            if on_progress:
                on_progress(step, epochs * per_epoch)
        losses.append(total / per_epoch)
    final = _eval_loss(model, pairs, batch)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_config = asdict(config)
    ckpt = ClipCheckpoint(config.model_config(), train_config, state, optimizer.state_dict(), step0 + step,
                          version_of(config.model_config(), train_config, pairs.data_digest, state),
                          sorted(set(pairs.image_digests)), losses)
    return ClipTraining(ckpt, warm, initial, final, epochs, step, time.perf_counter() - t0)


def save_checkpoint(ckpt: ClipCheckpoint, path: Path) -> Path:
    torch.save({f.name: getattr(ckpt, f.name) for f in fields(ClipCheckpoint)}, path)
    return path


def write_checkpoint(result: ClipRefresh, target: Path, previous_path: Path | None = None) -> Path | None:
    """Put the checkpoint that stands after `result` at `target`: a hard link to `previous_path` when it was
    reused (the same bytes; partitions are replaced whole, never edited in place), else a fresh save."""
    if result.checkpoint is None:
        return None
    if result.action == "reused" and previous_path is not None:
        try:
            os.link(previous_path, target)
        except OSError:  # another filesystem, or links unsupported
            shutil.copyfile(previous_path, target)
        return target
    return save_checkpoint(result.checkpoint, target)


def export_local_dir(ckpt: ClipCheckpoint, folder: Path) -> Path:
    """Write the model as an open_clip `local-dir:` folder (open_clip_config.json + weights), for any open_clip tool."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": ckpt.model_config, "preprocess_cfg": {"size": ckpt.model_config["vision_cfg"]["image_size"]},
              "hir": {"version": ckpt.version, "step": ckpt.step}}
    (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2))
    torch.save(ckpt.state_dict, folder / "open_clip_pytorch_model.bin")
    return folder


def load_checkpoint(path: Path) -> ClipCheckpoint:
    """A checkpoint written by save_checkpoint (weights_only: no code is unpickled)."""
    path = Path(path)
    if not path.is_file():
        from hir_model.content.text import ModelNotFoundError

        raise ModelNotFoundError(f"catalog_clip checkpoint {path} does not exist: materialise catalog_clip for this window first")
    raw = torch.load(path, map_location="cpu", weights_only=True)
    missing = {f.name for f in fields(ClipCheckpoint)} - set(raw)
    if missing:
        raise ValueError(f"{path} is not a catalog_clip checkpoint (missing {sorted(missing)})")
    return ClipCheckpoint(**{f.name: raw[f.name] for f in fields(ClipCheckpoint)})


@dataclass(frozen=True)
class ClipRefresh:
    """What catalog_clip did for a window, and the checkpoint that now stands (None: no images)."""

    action: str  # "trained" | "warm_started" | "reused" | "no_images"
    reason: str
    novelty: float  # share of the catalogue's images the standing checkpoint had not been trained on before
    pairs: int  # image-text pairs in the catalogue
    checkpoint: ClipCheckpoint | None
    training: ClipTraining | None  # set when it trained
    problems: list[str]  # unreadable images (first 50)
    fitted_pairs: int = 0  # the pairs the training saw: all of them, or a sample of config.max_pairs


def refresh(catalog: pa.Table, previous: ClipCheckpoint | None, config: CatalogClipConfig = CatalogClipConfig(),
            force: bool = False, listed_products: int = 10, on_progress: Progress | None = None) -> ClipRefresh:
    """Train catalog_clip on the catalogue's image-text pairs, warm-start it, or keep `previous` (see refresh_decision)."""
    from hir_model.content.entity_text import entity_texts
    from hir_model.content.media import MediaError, decode_image, local_path

    texts = entity_texts(catalog, listed_products)
    blobs, captions, problems = [], [], []
    for eid, uri, text in zip(catalog.column("entity_id").to_pylist(), catalog.column("image_uri").to_pylist(), texts):
        if uri and text:
            try:
                blobs.append(local_path(uri).read_bytes())
                captions.append(text)
            except OSError as exc:
                problems.append(f"{eid}: image {uri} unreadable ({exc}); not a training pair")
    if len(blobs) < 2:
        return ClipRefresh("no_images", f"no images: image tower skipped ({len(blobs)} image-text pairs in the catalogue)",
                           0.0, len(blobs), None, None, problems[:50])
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    action, reason, novelty = refresh_decision(digests, previous, config, force)
    if action == "reuse":
        return ClipRefresh("reused", reason, novelty, len(blobs), previous, None, problems[:50])
    sample = sample_pairs(len(blobs), config)
    images, kept_texts, kept_digests = [], [], []
    for blob, text, digest in ((blobs[i], captions[i], digests[i]) for i in sample):
        try:
            images.append(decode_image(blob))
            kept_texts.append(text), kept_digests.append(digest)
        except MediaError as exc:
            problems.append(f"image {digest[:12]}: {exc}; not a training pair")
    training = train(make_pairs(images, kept_texts, kept_digests, config), config,
                     previous if action == "warm_start" else None, on_progress)
    if len(sample) < len(blobs):  # novelty is judged against the whole catalogue the sample was drawn from
        training.checkpoint.image_digests = sorted(set(digests))
    done = "warm_started" if training.warm_started else "trained"
    pairs = len(blobs) - (len(sample) - len(images))  # less the sampled images that did not decode
    return ClipRefresh(done, reason, novelty, pairs, training.checkpoint, training, problems[:50], len(images))
