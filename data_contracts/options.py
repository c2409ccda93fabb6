"""Contract options: what a bring-your-own folder must declare because the Parquet types cannot say it.

Read from `<folder>/contract.toml`. Top-level keys apply to every table; a `[events]`, `[catalog]` or
`[relations]` table overrides them for that folder::

    ts_unit = "ms"      # integer timestamp columns hold milliseconds since 1970-01-01 UTC
    assume_utc = true   # timestamps without a time zone are UTC (each file it applies to is warned)

Without the file every option is off: integer and naive timestamps are refused, naming the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from data_contracts.errors import ContractError

OPTIONS_FILE = "contract.toml"
TS_UNITS = ("s", "ms", "us", "ns")
SECTIONS = ("events", "catalog", "relations")  # the folders of a bring-your-own source


@dataclass(frozen=True)
class ContractOptions:
    ts_unit: str | None = None  # unit of integer timestamp columns ("s", "ms", "us", "ns"); None: integers are refused
    assume_utc: bool = False  # timezone-naive timestamps are taken as UTC (warned per file); False: refused

    def __post_init__(self) -> None:
        if self.ts_unit is not None and self.ts_unit not in TS_UNITS:
            raise ValueError(f"ts_unit {self.ts_unit!r} is not one of {TS_UNITS}")
        if not isinstance(self.assume_utc, bool):
            raise ValueError(f"assume_utc must be true or false, not {self.assume_utc!r}")


def load_options(folder: str | Path, section: str) -> ContractOptions:
    """The options of one table (`section`, one of SECTIONS) from `<folder>/contract.toml`; defaults without the file."""
    path = Path(folder) / OPTIONS_FILE
    if not path.is_file():
        return ContractOptions()
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ContractError(str(path), "contract.options", 0, f"not a readable TOML file: {exc}") from exc
    known = {f.name for f in fields(ContractOptions)}
    unknown = sorted(set(raw) - known - set(SECTIONS))
    unknown += sorted(f"[{s}] {k}" for s in SECTIONS if isinstance(raw.get(s), dict) for k in set(raw[s]) - known)
    if unknown:
        raise ContractError(str(path), "contract.options", 0, f"unknown options {unknown}; known: {sorted(known)} "
                                                              f"at the top or in [{'], ['.join(SECTIONS)}]")
    values = {k: v for k, v in raw.items() if k in known} | dict(raw.get(section, {}))
    try:
        return ContractOptions(**values)
    except ValueError as exc:
        raise ContractError(str(path), "contract.options", 0, str(exc)) from exc
