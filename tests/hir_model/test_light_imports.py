"""The training entry point and the readers of content vectors must not import the content towers (transformers,
open_clip, torchvision): that was 3 s of every `hir_encoder` subprocess, ~100 s of a MovieLens demo."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("open_clip", "transformers", "torchvision")


def test_training_and_retrieval_imports_leave_the_content_towers_alone():
    code = ("import sys, hir_model.train.entry, hir_model.train.data, hir_model.retrieval, hir_model.content;"
            "from hir_model.content import to_matrix;"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"imported {out}"


def test_the_content_package_still_exposes_its_api_lazily():
    import hir_model.content as content
    assert set(content.__all__) <= set(dir(content))
    assert content.ContentConfig.__module__ == "hir_model.content.embed"
    with pytest.raises(AttributeError, match="no_such_name"):
        content.no_such_name  # noqa: B018
