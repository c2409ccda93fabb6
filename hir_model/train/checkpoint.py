"""Checkpoints: config, weights, prototypes per level, optimizer state, step (nanoGPT style).

Saved with `torch.save` as a dict of tensors and plain values; loaded with `weights_only=True`, so a file
that is not a valid weights file (or carries pickled code) is refused with an error naming it.
Levels run coarse to fine: level 0 has the fewest prototypes (e.g. 8 / 64 / 512), and BoM tokens read
`L<level>:<primitive>`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hir_model.nn import Encoder, EncoderConfig
from hir_model.storage import PartitionStore

FORMAT = 1  # bump when the layout below changes
ENCODER_ASSET, CHECKPOINT_FILE = "hir_encoder", "checkpoint.pt"  # the asset and its one file


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, not a weights file, or of another format."""


@dataclass(frozen=True)
class TrainedModel:
    encoder: Encoder  # in eval mode
    prototypes: tuple[Tensor, ...]  # per level, coarse to fine: [K_l, width], L2-normalised rows
    step: int
    version: str  # content hash of config + weights: what produced an embedding
    window: str = ""  # the window whose data it was trained on (up to its end)
    global_levels: int = 0  # the first this many levels' prototypes are the encoder's global tokens (hir_model.train)
    extra: dict = field(default_factory=dict, compare=False)  # the checkpoint's `extra` (its train_config, views, prior scale)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(p.shape[0] for p in self.prototypes)

    @property
    def global_tokens(self) -> Tensor | None:
        """[G, width]: what to pass as `encoder(batch, global_tokens)` to embed as in training (None: none)."""
        return torch.cat(self.prototypes[: self.global_levels]) if self.global_levels else None


def save_checkpoint(path: str | Path, encoder: Encoder, prototypes: list[Tensor] | tuple[Tensor, ...], step: int,
                    optimizer: dict | None = None, extra: dict[str, Any] | None = None, window: str = "") -> str:
    """Write atomically (tmp file + rename); returns the version string."""
    state = {k: v.detach().cpu() for k, v in encoder.state_dict().items()}
    protos = [p.detach().cpu().float() for p in prototypes]
    digest = hashlib.sha256(repr(asdict(encoder.cfg)).encode())
    for t in [*state.values(), *protos]:
        digest.update(t.contiguous().numpy().tobytes())
    version = f"hir-{digest.hexdigest()[:12]}"
    payload = {"format": FORMAT, "config": asdict(encoder.cfg), "model": state, "prototypes": protos, "step": int(step),
               "version": version, "window": window, "optimizer": optimizer or {}, "extra": extra or {}}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return version


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict, or a CheckpointError that says what is wrong with which file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError ... for bad files
        raise CheckpointError(f"checkpoint {path} is not a valid weights file: {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not an hir checkpoint of format {FORMAT}")
    return payload


def load_trained_model(path: str | Path, map_location: str | torch.device = "cpu") -> TrainedModel:
    payload = load_checkpoint(path, map_location)
    encoder = Encoder(EncoderConfig.from_dict(payload["config"]))
    encoder.load_state_dict(payload["model"])
    encoder.eval()
    return TrainedModel(encoder, tuple(payload["prototypes"]), payload["step"], payload["version"], payload.get("window", ""),
                        int(payload.get("extra", {}).get("global_levels", 0)), payload.get("extra", {}))


def checkpoint_path(store: PartitionStore, key: str) -> Path:
    """Where window `key`'s `hir_encoder` checkpoint lies in `store`."""
    return store.partition_dir(ENCODER_ASSET, key) / CHECKPOINT_FILE


def window_model(store: PartitionStore, key: str) -> TrainedModel:
    """The window's TrainedModel (a CheckpointError naming the file when hir_encoder was not materialised)."""
    return load_trained_model(checkpoint_path(store, key))
