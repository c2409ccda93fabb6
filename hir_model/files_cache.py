"""Per process, what is parsed or loaded from local files, kept while the files are unchanged.

Each Dagster asset builds its own source and encoders, and the demo runs every window's assets in one process; these
keep one parse or load per process for as long as the files keep their sizes and mtimes (a changed file is read again,
replacing the entry).

    tables = cached(("movielens", str(root.resolve())), [root / name for name in FILES], parse)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_LOADED: dict[tuple, tuple[tuple, object]] = {}  # name -> (its files' sizes and mtimes, what was loaded from them)


def files_key(paths: Sequence[Path]) -> tuple:
    """The files' resolved paths, sizes and mtimes."""
    return tuple((str(p.resolve()), st.st_size, st.st_mtime_ns) for p in paths for st in [p.stat()])


def cached(name: tuple, paths: Sequence[Path], load: Callable[[], T]) -> T:
    """`load()` once per process for `name` while `paths` are unchanged; loaded again (and kept instead) after a change."""
    key = files_key(paths)
    hit = _LOADED.get(name)
    if hit is None or hit[0] != key:
        hit = _LOADED[name] = (key, load())
    return hit[1]  # type: ignore[return-value]
