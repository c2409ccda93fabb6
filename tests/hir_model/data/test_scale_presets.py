"""Scale presets of the synthetic source: `small` is the demo's ecosystem, byte for byte."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pyarrow as pa
import pytest

from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
from hir_model.data.windows import WindowSpec

# sha256 prefixes of every table the default generator produced before presets existed (commit 969d82f):
# events of all 8 windows, the final catalog, the final relations, ground truth + window 3's user mixture.
# A change here changes the demo's figures: do not update these to make a test pass.
SMALL_DIGESTS = {
    7: ("e3e18d9cea872e51", "36f70523858b1052", "47990251132b7bc8", "abea2f9a0a3a74dc"),
    0: ("0c4c2d6637225514", "9b298a3be6bafe42", "51110361f86e76d4", "a70c40630f51b113"),
}


def digest(tables: list[pa.Table]) -> str:
    """A hash of the tables' values (not their chunking); image uris reduced to file names (the folder varies)."""
    h = hashlib.sha256()
    for t in tables:
        h.update(repr(t.schema).encode())
        for name in t.column_names:
            values = t[name].to_pylist()
            if name == "image_uri":
                values = [None if u is None else u.rsplit("/", 1)[-1] for u in values]
            h.update(repr(values).encode())
    return h.hexdigest()[:16]


def digests(source: SyntheticSource) -> tuple[str, ...]:
    source._ensure_images = lambda products: None  # images are drawn per product, untouched by presets
    windows = WindowSpec.covering("weekly", *source.span()).windows()
    end = windows[-1].end
    return (digest([b.table for w in windows for b in source.events(w)]),
            digest([b.table for b in source.catalog(end)]),
            digest([b.table for b in source.relations(end)]),
            digest([source.ground_truth.entities, source.ground_truth.hierarchy, source.user_mixture(3)]))


@pytest.mark.parametrize("seed", sorted(SMALL_DIGESTS))
def test_default_generator_is_unchanged(seed, tmp_path):
    assert digests(SyntheticSource(replace(SyntheticConfig(), seed=seed), tmp_path)) == SMALL_DIGESTS[seed]
