"""Content embeddings: text (transformers), images and video frames (open_clip), fused; incremental per window.

Public API
- `ContentConfig` (text, image, fusion), `load_encoders(config, clip_checkpoint)`, `embed_catalog(catalog, encoders,
  previous)` -> `ContentBuild` (the table in `content_schema`, new / changed / reused counts, weights, timings);
  `REUSED_COLUMNS`: the columns of the previous table that `embed_catalog` reads.
- `TextEncoder` / `TextEncoderConfig`, `ImageEncoder` / `ImageEncoderConfig` / `load_image_encoder`, `FusionConfig` / `fuse`.
- catalog_clip: `CatalogClipConfig`, `refresh(catalog, previous)` -> `ClipRefresh`, `train`, `save_checkpoint`,
  `write_checkpoint`, `load_checkpoint`, `export_local_dir` (an open_clip `local-dir:` folder).
- Quality: `embedding_report`, `interest_agreement`, `neighbour_agreement`, `chance_agreement`.
- `ModelNotFoundError`: a configured model folder, file, name or tag that is not on this machine.

- The published table: `CONTENT_ASSET`, `CONTENT_FILE`; `to_matrix` reads its vector column.

Imports are lazy (PEP 562): `to_matrix` and the other light names do not pull in transformers, open_clip and
torchvision (3 s of imports in every training subprocess otherwise); a tower loads when its name is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    **dict.fromkeys(["CLIP_ASSET", "CLIP_CHECKPOINT_FILE", "CLIP_STATUS_FILE", "CatalogClipConfig", "ClipCheckpoint", "ClipRefresh", "ClipTraining", "export_local_dir",
                     "load_checkpoint", "refresh", "save_checkpoint", "train", "write_checkpoint"], "catalog_clip"),
    **dict.fromkeys(["ContentBuild", "ContentConfig", "Encoders", "REUSED_COLUMNS", "content_schema", "embed_catalog",
                     "load_encoders", "embed_window", "parse_version"], "embed"),
    **dict.fromkeys(["FusionConfig", "fuse"], "fusion"),
    **dict.fromkeys(["CATALOG_CLIP", "NO_IMAGES", "ImageEncoder", "ImageEncoderConfig", "load_image_encoder"], "image"),
    **dict.fromkeys(["EmbeddingReport", "chance_agreement", "embedding_report", "interest_agreement",
                     "neighbour_agreement"], "quality"),
    **dict.fromkeys(["ModelNotFoundError", "TextEncoder", "TextEncoderConfig", "packaged_model_dir"], "text"),
    **dict.fromkeys(["CONTENT_ASSET", "CONTENT_FILE", "to_matrix"], "vectors"),
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_MODULE_OF))


__all__ = [
    "CATALOG_CLIP", "CONTENT_ASSET", "CONTENT_FILE", "NO_IMAGES", "CatalogClipConfig", "ClipCheckpoint", "ClipRefresh", "ClipTraining", "ContentBuild",
    "ContentConfig", "EmbeddingReport", "Encoders", "FusionConfig", "ImageEncoder", "ImageEncoderConfig",
    "ModelNotFoundError", "REUSED_COLUMNS", "TextEncoder", "TextEncoderConfig", "chance_agreement", "content_schema", "embed_catalog",
    "embed_window", "embedding_report", "export_local_dir", "fuse", "interest_agreement", "load_checkpoint", "load_encoders", "load_image_encoder",
    "neighbour_agreement", "packaged_model_dir", "parse_version", "refresh", "save_checkpoint", "to_matrix", "train",
    "write_checkpoint",
]
