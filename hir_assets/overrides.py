"""Run config as optional overrides of the library's frozen config dataclasses, so each default is declared once.

An asset's run config (`<Asset>Run`) names fields of the dataclass its library call takes (e.g. `RankingHeadRun` ->
`hir_model.rank.head.HeadConfig`). A field left unset (None, what the Launchpad shows) keeps the dataclass's
default; a set one replaces it through `dataclasses.replace`, so the dataclass's own checks still run. The defaults
and what they mean are documented on the dataclass, not here.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, ClassVar, TypeVar

import dagster as dg

T = TypeVar("T")


class Overrides(dg.Config):
    """Optional fields (None: the library's default) applied by name onto a library dataclass."""

    # fields whose 0 in the run config means None in the library (off / tuned), since None here means "the default"
    zero_means_none: ClassVar[frozenset[str]] = frozenset()

    def overrides(self) -> dict[str, Any]:
        """The fields this run sets, as the library reads them."""
        return {name: None if name in self.zero_means_none and value == 0 else value
                for name, value in self if value is not None}

    def apply(self, base: T) -> T:
        """`base` with the fields this run sets that `base` has (the others are left to another dataclass)."""
        own = {f.name for f in fields(base)}
        return replace(base, **{k: v for k, v in self.overrides().items() if k in own})
