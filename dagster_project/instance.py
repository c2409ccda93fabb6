"""The local Dagster instance, one per source: where it lives, its dagster.yaml, and the guard that keeps one source's
definitions off another source's instance.

    python -m dagster_project.instance    # prepare the configured source's instance, print its folder (the Makefile)

Without DAGSTER_HOME, a source's instance is `.hir/dagster_home/<source>` (the source as hir_model.config names its
folders: `synthetic-large` for the large synthetic preset). Its first use writes the source into a marker file there;
definitions loaded against an instance marked for another source refuse to load, instead of mixing two worlds'
partitions, runs and plots in one UI. Imports no Dagster, so the Makefile's call stays quick.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from hir_model.config import PROJECT_ROOT, ConfigError, HIRConfig, load_config

HOMES = PROJECT_ROOT / ".hir" / "dagster_home"  # one instance per source under it
LOCAL_INSTANCE = PROJECT_ROOT / "deploy" / "dagster.local.yaml"  # installed as a new instance's dagster.yaml
MARKER = "hir_source"  # the file in DAGSTER_HOME naming the source the instance belongs to


class InstanceSourceError(RuntimeError):
    """DAGSTER_HOME belongs to another source than the configured one."""


def home_for(config: HIRConfig, env: Mapping[str, str] | None = None) -> Path:
    """DAGSTER_HOME when set, else the source's own instance folder."""
    env = os.environ if env is None else env
    return Path(env["DAGSTER_HOME"]) if env.get("DAGSTER_HOME") else HOMES / config.label


def claim(home: str | Path | None, source: str) -> None:
    """Mark the instance at `home` as `source`'s on first use; raise if another source marked it first.

    An instance without a marker (new, or made before markers existed) is claimed by the first source that loads;
    no `home` (Dagster's temporary instance) or a folder that does not exist yet is left alone."""
    if not home or not Path(home).is_dir():
        return
    marker = Path(home) / MARKER
    owner = marker.read_text().strip() if marker.exists() else ""
    if not owner:
        marker.write_text(source + "\n")
    elif owner != source:
        raise InstanceSourceError(
            f"DAGSTER_HOME={home} is the {owner!r} source's Dagster instance ({marker}), but the configured source is "
            f"{source!r} (HIR_SOURCE or hir.toml): loading it there would mix {source}'s partitions and runs into "
            f"{owner}'s UI. Unset DAGSTER_HOME (`make demo` and `make ui` then use {HOMES / source}), point it at "
            f"another folder, or set HIR_SOURCE={owner} to work on {owner}.")


def prepare(config: HIRConfig, env: Mapping[str, str] | None = None) -> Path:
    """The configured source's instance folder, with deploy/dagster.local.yaml as its dagster.yaml when it has none
    (an existing one is kept), claimed for the source."""
    home = home_for(config, env)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(LOCAL_INSTANCE, home / "dagster.yaml")
    claim(home, config.label)
    return home


def main() -> int:
    try:
        print(prepare(load_config()))
    except (ConfigError, InstanceSourceError) as exc:
        print(f"hir instance: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
