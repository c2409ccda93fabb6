"""Which weights embed entity content: the text model, the image tower, the fusion, catalog_clip's training knobs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields, replace

import dagster as dg

from hir_model.content import CatalogClipConfig, ContentConfig, FusionConfig, ImageEncoderConfig, TextEncoderConfig


class ContentModels(dg.ConfigurableResource):
    """Model choices for `catalog_clip` and `content_embeddings`. Defaults work offline (packaged MiniLM + catalog_clip)."""

    text_model: str = ""  # a local transformers folder or a name in the local HF cache; "" = packaged all-MiniLM-L6-v2
    text_dtype: str = "float32"  # "bfloat16": ~2.8x faster on CPUs with AMX/AVX512-BF16, ~7x slower without; "auto" picks
    image_model: str = "catalog_clip"  # "catalog_clip" | an open_clip name ("ViT-B-32", "local-dir:/path") | "none"
    image_pretrained: str = ""  # with an open_clip name: a pretrained tag or a local weights file
    fused_dim: int = 0  # 0 = text dim + image dim
    clip_json: str = "{}"  # overrides of hir_model.content.CatalogClipConfig fields, as JSON

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ContentModels:
        """Defaults, overridden by HIR_TEXT_MODEL, HIR_TEXT_DTYPE, HIR_IMAGE_MODEL, HIR_IMAGE_PRETRAINED, HIR_CLIP_JSON."""
        env = os.environ if env is None else env
        names = {"text_model": "HIR_TEXT_MODEL", "text_dtype": "HIR_TEXT_DTYPE", "image_model": "HIR_IMAGE_MODEL",
                 "image_pretrained": "HIR_IMAGE_PRETRAINED", "clip_json": "HIR_CLIP_JSON"}
        return cls(**{field: env[var] for field, var in names.items() if env.get(var)})

    def content_config(self) -> ContentConfig:
        return ContentConfig(text=TextEncoderConfig(model=self.text_model, dtype=self.text_dtype),
                             image=ImageEncoderConfig(model=self.image_model, pretrained=self.image_pretrained),
                             fusion=FusionConfig(dim=self.fused_dim))

    def clip_config(self) -> CatalogClipConfig:
        overrides = json.loads(self.clip_json or "{}")
        unknown = sorted(set(overrides) - {f.name for f in fields(CatalogClipConfig)})
        if unknown:
            raise ValueError(f"clip_json has unknown CatalogClipConfig fields {unknown}")
        return replace(CatalogClipConfig(), **overrides)
