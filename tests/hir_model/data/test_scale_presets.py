"""Scale presets of the synthetic source: `small` is the demo's ecosystem, byte for byte."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pyarrow as pa
import pytest

from hir_model.config import ConfigError, load_config
from hir_model.data.synthetic import SyntheticConfig, SyntheticSource
from hir_model.data.synthetic_config import preset
from hir_model.data.windows import WindowSpec

# sha256 prefixes of every table the default generator produced before presets existed (commit 969d82f):
# events of all 8 windows, the final catalog, the final relations, ground truth + window 3's user mixture (its float
# weights at 8 significant digits: their last bits differ between CPUs; on 2026-12-06 an AMD EPYC machine produced the
# other three byte for byte and a different unrounded mixture digest at the commit that set them).
# A change here changes the demo's figures: do not update these to make a test pass.
SMALL_DIGESTS = {
    7: ("e3e18d9cea872e51", "36f70523858b1052", "47990251132b7bc8", "31e618000ef24fea"),
    0: ("0c4c2d6637225514", "9b298a3be6bafe42", "51110361f86e76d4", "95fdadfa62401dd5"),
}


def digest(tables: list[pa.Table], float_digits: int | None = None) -> str:
    """A hash of the tables' values (not their chunking); image uris reduced to file names (the folder varies); floating
    columns at `float_digits` significant digits when given."""
    h = hashlib.sha256()
    for t in tables:
        h.update(repr(t.schema).encode())
        for name in t.column_names:
            values = t[name].to_pylist()
            if name == "image_uri":
                values = [None if u is None else u.rsplit("/", 1)[-1] for u in values]
            if float_digits is not None and pa.types.is_floating(t.schema.field(name).type):
                values = [None if v is None else float(f"{v:.{float_digits}g}") for v in values]
            h.update(repr(values).encode())
    return h.hexdigest()[:16]


def digests(source: SyntheticSource) -> tuple[str, ...]:
    source._ensure_images = lambda products: None  # images are drawn per product, untouched by presets
    windows = WindowSpec.covering("weekly", *source.span()).windows()
    end = windows[-1].end
    return (digest([b.table for w in windows for b in source.events(w)]),
            digest([b.table for b in source.catalog(end)]),
            digest([b.table for b in source.relations(end)]),
            digest([source.ground_truth.entities, source.ground_truth.hierarchy, source.user_mixture(3)], float_digits=8))


@pytest.mark.parametrize("seed", sorted(SMALL_DIGESTS))
def test_default_generator_is_unchanged(seed, tmp_path):
    assert digests(SyntheticSource(replace(SyntheticConfig(), seed=seed), tmp_path)) == SMALL_DIGESTS[seed]


def test_small_preset_is_the_default_config():
    assert preset("small") == SyntheticConfig() == preset()


@pytest.mark.parametrize("scale, factor", [("medium", 10), ("large", 100), ("xl", 1000)])
def test_presets_grow_entities_and_events_together(scale, factor):
    cfg, base = preset(scale), SyntheticConfig()
    assert (cfg.n_users, cfg.n_products, cfg.events_per_window) == (base.n_users * factor, base.n_products * factor,
                                                                    base.events_per_window * factor)
    assert cfg.new_users_per_window == base.new_users_per_window * factor and cfg.branching == base.branching


def test_scale_from_the_file_or_the_environment(tmp_path):
    path = tmp_path / "hir.toml"
    path.write_text('source = "synthetic"\n[synthetic]\nscale = "medium"\nseed = 3\nevents_per_window = 500\n')
    cfg = load_config(path, env={})
    source = cfg.make_source()
    assert source.config == replace(preset("medium"), seed=3, events_per_window=500)  # explicit keys over the preset
    assert source.data_dir == tmp_path / "data" / "synthetic-medium-seed3"
    assert cfg.storage_uri == str(tmp_path / ".hir" / "storage" / "synthetic-medium")
    cfg = load_config(path, env={"HIR_SYNTHETIC_SCALE": "large"})
    assert cfg.make_source().config.n_users == preset("large").n_users
    assert cfg.storage_uri.endswith("synthetic-large")
    small = load_config(path, env={"HIR_SYNTHETIC_SCALE": "small"})
    assert small.storage_uri.endswith("storage/synthetic") and small.make_source().data_dir.name == "synthetic-seed3"


def test_unknown_scale_is_refused(tmp_path):
    path = tmp_path / "hir.toml"
    path.write_text('source = "synthetic"\n[synthetic]\nscale = "huge"\n')
    with pytest.raises(ConfigError, match="scale 'huge'"):
        load_config(path, env={}).make_source()


def test_the_world_does_not_import_the_source():
    import ast
    import inspect

    from hir_model.data import synthetic_world

    tree = ast.parse(inspect.getsource(synthetic_world))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "hir_model.data.synthetic" not in imported
