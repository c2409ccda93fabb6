"""Image encoder: an open_clip image tower, from pretrained weights or from a catalog_clip checkpoint.

Three ways to get weights, chosen by `ImageEncoderConfig.model`:
- `catalog_clip`: the checkpoint the catalog_clip asset trained on the catalogue (the offline default);
- an open_clip model name with `pretrained` = a pretrained tag (weights already in the local cache, or
  downloadable where there is internet) or a local weights file; `hf-hub:org/repo` and
  `local-dir:/folder` (an open_clip_config.json + weights) work as open_clip defines them;
- `none`: no image tower (entities keep their text; images are ignored and counted).
A configured file or folder that does not exist, or a model without weights, is refused by name: an
image tower with random weights would embed noise that looks like data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hir_model.content.catalog_clip import ClipCheckpoint, build_model, load_checkpoint, preprocess
from hir_model.content.text import ModelNotFoundError, folder_digest

CATALOG_CLIP, NO_IMAGES = "catalog_clip", "none"
Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class ImageEncoderConfig:
    model: str = CATALOG_CLIP  # "catalog_clip" | an open_clip model name ("ViT-B-32", "hf-hub:...", "local-dir:...") | "none"
    pretrained: str = ""  # with a model name: an open_clip pretrained tag or a local weights file
    batch_size: int = 256  # images per forward pass
    max_frames: int = 16  # frames sampled from a video (folder of frames or, with PyAV, a file)


class ImageEncoder:
    """PIL images -> (N, dim) float32 unit vectors with an open_clip image tower."""

    def __init__(self, model: torch.nn.Module, transform: Callable[[Image.Image], torch.Tensor], version: str,
                 weights: str, batch_size: int = 256):
        self.model, self.transform, self.version, self.weights = model.eval(), transform, version, weights
        self.batch_size = batch_size
        self.dim = int(self._forward([Image.new("RGB", (8, 8))]).shape[1])

    @classmethod
    def from_checkpoint(cls, ckpt: ClipCheckpoint, source: str = "", batch_size: int = 256) -> ImageEncoder:
        model = build_model(ckpt.model_config)
        model.load_state_dict(ckpt.state_dict)
        where = f" from {source}" if source else ""
        return cls(model, preprocess(ckpt.model_config["vision_cfg"]["image_size"]), ckpt.version,
                   f"{ckpt.version} (trained on {len(ckpt.image_digests)} catalogue images, step {ckpt.step}{where})", batch_size)

    @torch.inference_mode()
    def _forward(self, images: Sequence[Image.Image]) -> np.ndarray:
        pixels = torch.stack([self.transform(im) for im in images])  # (B, 3, S, S)
        return self.model.encode_image(pixels, normalize=True).float().numpy()  # (B, dim)

    def encode(self, images: Sequence[Image.Image], on_progress: Progress | None = None,
               batch_size: int | None = None) -> np.ndarray:
        """(N, dim) float32, L2-normalised."""
        step = batch_size or self.batch_size
        out = np.zeros((len(images), self.dim), np.float32)
        for start in range(0, len(images), step):
            out[start:start + step] = self._forward(images[start:start + step])
            if on_progress:
                on_progress(min(start + step, len(images)), len(images))
        return out


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_open_clip(name: str, pretrained: str = "", batch_size: int = 256) -> ImageEncoder:
    """An open_clip image tower with real weights: a pretrained tag, a local weights file or a local-dir/hf-hub model."""
    import open_clip

    if name.startswith("local-dir:"):
        folder = Path(name.removeprefix("local-dir:")).expanduser()
        if not folder.is_dir():
            raise ModelNotFoundError(f"open_clip model folder {folder} does not exist (configured image model {name!r})")
        if not any(p.suffix in (".safetensors", ".bin", ".pth") for p in folder.iterdir()):
            raise ModelNotFoundError(f"open_clip model folder {folder} holds no weights (*.safetensors, *.bin, *.pth)")
        version = f"{folder.name}@{folder_digest(folder)[:12]}"
    elif name.startswith("hf-hub:"):
        version = name
    elif name not in open_clip.list_models():
        raise ModelNotFoundError(f"image model {name!r} is not an open_clip model name, 'catalog_clip' or 'none'")
    elif pretrained and pretrained in open_clip.list_pretrained_tags_by_model(name):
        version = f"{name}:{pretrained}"
    elif pretrained:
        path = Path(pretrained).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"image weights file {pretrained} does not exist (configured pretrained for {name}; "
                                     f"known tags: {open_clip.list_pretrained_tags_by_model(name)})")
        version = f"{name}@{_file_digest(path)[:12]}"
        pretrained = str(path)
    else:
        raise ModelNotFoundError(f"open_clip model {name} needs weights: set pretrained to a tag "
                                 f"{open_clip.list_pretrained_tags_by_model(name)} or a local weights file")
    try:
        model, _, transform = open_clip.create_model_and_transforms(name, pretrained=pretrained or None)
    except (RuntimeError, OSError, ValueError) as exc:
        raise ModelNotFoundError(f"open_clip weights for {name} ({pretrained or 'from the model folder'}) could not be "
                                 f"loaded here (offline: only the local cache is reachable): {exc}") from exc
    return ImageEncoder(model, transform, version, f"open_clip {name} ({pretrained or version})", batch_size)


def load_image_encoder(config: ImageEncoderConfig, clip_checkpoint: Path | None = None) -> ImageEncoder | None:
    """The configured image tower, or None for `none` and for catalog_clip without a checkpoint (no images)."""
    if config.model == NO_IMAGES:
        return None
    if config.model == CATALOG_CLIP:
        if clip_checkpoint is None:
            return None
        return ImageEncoder.from_checkpoint(load_checkpoint(clip_checkpoint), str(clip_checkpoint), config.batch_size)
    return load_open_clip(config.model, config.pretrained, config.batch_size)
