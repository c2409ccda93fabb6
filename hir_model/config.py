"""Project configuration: one TOML file plus environment overrides.

`load_config()` reads `hir.toml` (or the file named by HIR_CONFIG) and applies HIR_SOURCE, HIR_WINDOW,
HIR_STORAGE_URI, HIR_DATA_DIR and HIR_SYNTHETIC_SCALE. Everything downstream (partitions, storage, sources) derives from the
returned `HIRConfig`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hir_model.data.source import Source
from hir_model.data.windows import WINDOW_LENGTHS, WindowSpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("movielens", "synthetic", "parquet")


class ConfigError(ValueError):
    """The configuration names something that does not exist or cannot work."""


@dataclass(frozen=True)
class HIRConfig:
    source: str = "movielens"  # movielens | synthetic | parquet
    window: str = "weekly"  # daily | weekly
    storage_uri: str = str(PROJECT_ROOT / ".hir" / "storage")  # local folder or s3://bucket/prefix
    data_dir: Path = PROJECT_ROOT / "data"  # fetched / generated source data
    synthetic: Mapping[str, Any] = field(default_factory=dict)  # "scale" (a preset) and overrides of SyntheticConfig fields
    parquet_path: str = ""  # the bring-your-own folder
    train: Mapping[str, Any] = field(default_factory=dict)  # TrainConfig overrides ([train], then [train.<source>])
    train_shared: Mapping[str, Any] = field(default_factory=dict)  # [train] alone, without any source's sub-table
    embed: Mapping[str, Any] = field(default_factory=dict)  # EmbedConfig fields ([embed], then [embed.<source>])
    audience: Mapping[str, Any] = field(default_factory=dict)  # AudienceConfig fields ([audience], then [audience.<source>])
    config_file: Path | None = None  # where this came from, for messages

    def __post_init__(self) -> None:
        where = f" (from {self.config_file} and the environment)" if self.config_file else ""
        if self.source not in SOURCES:
            raise ConfigError(f"source {self.source!r}{where} is not one of {SOURCES}")
        if self.window not in WINDOW_LENGTHS:
            raise ConfigError(f"window {self.window!r}{where} is not one of {tuple(WINDOW_LENGTHS)}")
        if self.source == "parquet" and not self.parquet_path:
            raise ConfigError(f"source 'parquet'{where} needs [parquet] path = <folder> (or HIR_PARQUET_PATH)")

    def make_source(self) -> Source:
        """The configured data source (nothing is read yet)."""
        if self.source == "movielens":
            from hir_model.data.movielens import MovieLensSource

            return MovieLensSource(self.data_dir)
        if self.source == "synthetic":
            from hir_model.data.synthetic import SyntheticSource

            cfg = _synthetic_config(self.synthetic)
            return SyntheticSource(cfg, self.data_dir / f"{_synthetic_label(self.synthetic)}-seed{cfg.seed}")
        from hir_model.data.parquet_source import ParquetSource

        return ParquetSource(self.parquet_path, self.window)

    @property
    def label(self) -> str:
        """The source as its folders are named (storage, Dagster instance): `synthetic-<scale>` for a synthetic preset
        other than small."""
        return _label(self.source, self.synthetic)

    def window_spec(self, source: Source | None = None) -> WindowSpec:
        """Aligned windows from the source's first event to its last."""
        first, last = (source or self.make_source()).span()
        return WindowSpec.covering(self.window, first, last)


def _synthetic_config(overrides: Mapping[str, Any]):
    """The preset named by overrides["scale"] (default small), then every other key over it."""
    from hir_model.data.synthetic_config import DEFAULT_SCALE, SCALES, SyntheticConfig, preset

    values = dict(overrides)
    scale = values.pop("scale", DEFAULT_SCALE)
    if scale not in SCALES:
        raise ConfigError(f"[synthetic] scale {scale!r} (or HIR_SYNTHETIC_SCALE) is not one of {tuple(SCALES)}")
    names = set(SyntheticConfig.__dataclass_fields__)
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"[synthetic] has unknown keys {unknown}; known: {sorted(names | {'scale'})}")
    if isinstance(values.get("start"), str):
        values["start"] = datetime.fromisoformat(values["start"]).replace(tzinfo=timezone.utc)
    return replace(preset(scale), **values)


def _label(source: str, synthetic: Mapping[str, Any]) -> str:
    return _synthetic_label(synthetic) if source == "synthetic" else source


def _synthetic_label(synthetic: Mapping[str, Any]) -> str:
    """`synthetic`, or `synthetic-<scale>` for a preset other than small: its data and tables get their own folders."""
    from hir_model.data.synthetic_config import DEFAULT_SCALE

    scale = synthetic.get("scale", DEFAULT_SCALE)
    return "synthetic" if scale == DEFAULT_SCALE else f"synthetic-{scale}"


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> HIRConfig:
    """Read the config file and apply environment overrides."""
    env = os.environ if env is None else env
    path = Path(path or env.get("HIR_CONFIG") or PROJECT_ROOT / "hir.toml")
    raw: dict[str, Any] = {}
    if path.exists():
        with path.open("rb") as fh:
            try:
                raw = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    elif "HIR_CONFIG" in env:
        raise ConfigError(f"HIR_CONFIG={env['HIR_CONFIG']} does not exist")
    base = path.resolve().parent

    def local(value: str) -> str:
        return value if "://" in value else str((base / value).resolve())

    source = env.get("HIR_SOURCE") or raw.get("source", "movielens")
    synthetic = dict(raw.get("synthetic", {}))
    if env.get("HIR_SYNTHETIC_SCALE"):
        synthetic["scale"] = env["HIR_SYNTHETIC_SCALE"]
    # "{source}" in the storage URI keeps each source's tables apart (the default: .hir/storage/{source}); a synthetic
    # scale other than small is a source of its own there (synthetic-large)
    label = _label(source, synthetic)
    storage = (env.get("HIR_STORAGE_URI") or raw.get("storage_uri", ".hir/storage/{source}")).replace("{source}", label)
    return HIRConfig(
        source=source,
        window=env.get("HIR_WINDOW") or raw.get("window", "weekly"),
        storage_uri=local(storage),
        data_dir=Path(local(env.get("HIR_DATA_DIR") or raw.get("data_dir", "data"))),
        synthetic=synthetic,
        parquet_path=local(p) if (p := env.get("HIR_PARQUET_PATH") or raw.get("parquet", {}).get("path", "")) else "",
        train=_source_overrides(raw.get("train", {}), source, layer_train),
        train_shared=_source_overrides(raw.get("train", {}), ""),
        embed=_source_overrides(raw.get("embed", {}), source),
        audience=_source_overrides(raw.get("audience", {}), source),
        config_file=path if path.exists() else None,
    )


def layer_train(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """TrainConfig fields `top` over `base`; a step count or an epoch budget in `top` replaces the budget rule below
    it (`steps = 40` in [train.<source>] or `--set steps=40` means 40 steps a window, not a fallback)."""
    out = dict(base)
    if "root_steps" not in top and ("steps" in top or "epochs" in top):
        out.pop("root_steps", None)
    if "epochs" not in top and ("steps" in top or "root_steps" in top):
        out.pop("epochs", None)
    out.update(top)
    return out


def _source_overrides(table: Mapping[str, Any], source: str, layer=None) -> dict[str, Any]:
    """A table's keys ([train], [embed]), then its <source> sub-table's keys over them (other sources' sub-tables
    dropped; `layer(base, top)` merges the two where a plain update would not)."""
    out = {k: v for k, v in table.items() if k not in SOURCES}
    top = table.get(source, {})
    return layer(out, top) if layer else {**out, **top}
