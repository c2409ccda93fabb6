"""The synthetic scale preset reaches the assets: load_config -> SourceResource -> the source the assets read."""

from __future__ import annotations

from hir_assets.resources import SourceResource
from hir_model.config import load_config
from hir_model.data.synthetic_config import preset


def test_the_scale_travels_through_the_dagster_resource(tmp_path):
    path = tmp_path / "hir.toml"
    path.write_text('source = "synthetic"\n')
    resource = SourceResource.from_config(load_config(path, env={"HIR_SYNTHETIC_SCALE": "large"}))
    assert resource.get().config == preset("large")
