"""Quality measures: neighbour agreement, chance, and the table report."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from hir_model.content import chance_agreement, embedding_report, neighbour_agreement
from hir_model.content.embed import _scatter


def test_neighbour_agreement_is_one_on_separated_clusters_and_near_chance_on_noise():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 25)
    centres = np.eye(8)[:4] * 10
    x = centres[labels] + rng.standard_normal((100, 8))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert neighbour_agreement(x, labels, k=10) == 1.0
    noise = rng.standard_normal((100, 8))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    assert abs(neighbour_agreement(noise, labels, k=10) - chance_agreement(labels)) < 0.1
    assert chance_agreement(labels) == 24 / 99


def test_report_finds_missing_rows_nan_and_bad_norms():
    vec = np.array([[1, 0], [np.nan, 0], [2, 0]], np.float32)
    valid = np.array([True, True, True])
    table = pa.table({"entity_id": ["a", "b", "c"], "embedding": _scatter(3, np.arange(3), vec, valid),
                      "text_embedding": _scatter(3, np.arange(3), vec, valid),
                      "image_embedding": pa.nulls(3, pa.list_(pa.float32(), 0)), "has_text": [True] * 3,
                      "has_image": [False] * 3, "encoder_version": ["v"] * 3})
    report = embedding_report(table, pa.array(["a", "b", "c", "d"]))
    assert (report.missing, report.missing_sample, report.nonfinite) == (1, ["d"], 2)
    assert report.max_norm_error == 1.0 and not report.covered and report.dims["image_embedding"] == 0
