"""Content embeddings: text (transformers), images and video frames (open_clip), fused; incremental per window.

Public API
- `ContentConfig` (text, image, fusion), `load_encoders(config, clip_checkpoint)`, `embed_catalog(catalog, encoders,
  previous)` -> `ContentBuild` (the table in `content_schema`, new / changed / reused counts, weights, timings).
- `TextEncoder` / `TextEncoderConfig`, `ImageEncoder` / `ImageEncoderConfig` / `load_image_encoder`, `FusionConfig` / `fuse`.
- catalog_clip: `CatalogClipConfig`, `refresh(catalog, previous)` -> `ClipRefresh`, `train`, `save_checkpoint`,
  `write_checkpoint`, `load_checkpoint`, `export_local_dir` (an open_clip `local-dir:` folder).
- Quality: `embedding_report`, `interest_agreement`, `neighbour_agreement`, `chance_agreement`.
- `ModelNotFoundError`: a configured model folder, file, name or tag that is not on this machine.
"""

from hir_model.content.catalog_clip import (CatalogClipConfig, ClipCheckpoint, ClipRefresh, ClipTraining, export_local_dir,
                                            load_checkpoint, refresh, save_checkpoint, train, write_checkpoint)
from hir_model.content.embed import (ContentBuild, ContentConfig, Encoders, content_schema, embed_catalog, load_encoders,
                                     embed_window, parse_version, to_matrix)
from hir_model.content.fusion import FusionConfig, fuse
from hir_model.content.image import CATALOG_CLIP, NO_IMAGES, ImageEncoder, ImageEncoderConfig, load_image_encoder
from hir_model.content.quality import (EmbeddingReport, chance_agreement, embedding_report, interest_agreement,
                                       neighbour_agreement)
from hir_model.content.text import ModelNotFoundError, TextEncoder, TextEncoderConfig, packaged_model_dir

__all__ = [
    "CATALOG_CLIP", "NO_IMAGES", "CatalogClipConfig", "ClipCheckpoint", "ClipRefresh", "ClipTraining", "ContentBuild",
    "ContentConfig", "EmbeddingReport", "Encoders", "FusionConfig", "ImageEncoder", "ImageEncoderConfig",
    "ModelNotFoundError", "TextEncoder", "TextEncoderConfig", "chance_agreement", "content_schema", "embed_catalog",
    "embed_window", "embedding_report", "export_local_dir", "fuse", "interest_agreement", "load_checkpoint", "load_encoders", "load_image_encoder",
    "neighbour_agreement", "packaged_model_dir", "parse_version", "refresh", "save_checkpoint", "to_matrix", "train",
    "write_checkpoint",
]
