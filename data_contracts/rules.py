"""Row rules, declared once and evaluated two ways.

A `Rule` is a declarative statement about a table's rows ("entity_id is never null", "ts lies in the
window"). From that one declaration we derive:

* `violations(table, params)`: a pyarrow boolean mask of the rows that break it, used by ingestion to
  route bad rows to the rejected table one by one (fast, streaming, no pandas);
* `expectations(params)`: great-expectations 1.x expectations, used by the asset checks to validate the
  published table (and tested to agree with the masks on every bad-input case).

Rules judge non-null values only, except `not_null`, exactly as great-expectations' column-map
expectations do, so a null key counts once, under `not_null`. Rules that compare a row with the catalog
(`matches_reference`, `not_before_reference`) judge only rows whose id is in the catalog (the others break
`in_reference`); great-expectations sees the catalog's value as a derived column beside the row's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("not_null", "in_set", "between", "unique", "in_reference", "matches_reference", "not_before_reference")
CATALOG_KINDS = ("matches_reference", "not_before_reference")  # compare a row's `other` column with the catalog's


@dataclass(frozen=True)
class Rule:
    name: str  # stable id used in rejected rows, check metadata and error messages
    kind: str  # one of KINDS
    columns: tuple[str, ...]
    description: str
    values: tuple[str, ...] = ()  # in_set: the allowed values
    param: str = ""  # between: a (min, max_exclusive) pair; in_reference: a value set; catalog kinds: a table keyed by
    # its first column (the id); all given at run time
    other: str = ""  # catalog kinds: the row's column compared with the catalog's (entity_type, ts)
    reference: str = ""  # catalog kinds: the catalog's column it is compared with (default: same name as `other`)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.name!r}: unknown kind {self.kind!r}; expected one of {KINDS}")
        if self.kind in ("between", "in_reference", *CATALOG_KINDS) and not self.param:
            raise ValueError(f"rule {self.name!r}: kind {self.kind!r} needs a run-time `param`")
        if self.kind in CATALOG_KINDS and not self.other:
            raise ValueError(f"rule {self.name!r}: kind {self.kind!r} needs the `other` column it compares")

    def derived_names(self) -> list[str]:
        """Columns great-expectations reads beside the table: the catalog's value per row (catalog kinds only)."""
        return [f"{col}.{self.reference or self.other}" for col in self.columns] if self.kind in CATALOG_KINDS else []

    def derived(self, table: pa.Table, params: dict[str, Any]) -> dict[str, pa.Array]:
        """The derived columns: for each id column, the catalog's `reference` value of that id (null when not in it)."""
        return {name: _lookup(table.column(col), params[self.param], self.reference or self.other)
                for col, name in zip(self.columns, self.derived_names())}

    def violations(self, table: pa.Table, params: dict[str, Any]) -> np.ndarray:
        """Boolean mask (len = rows) of the rows that break this rule."""
        bad = np.zeros(table.num_rows, dtype=bool)
        for col in self.columns:
            values = table.column(col)
            if self.kind == "not_null":
                mask = pc.is_null(values)
            elif self.kind == "in_set":
                mask = pc.invert(pc.is_in(values, value_set=pa.array(self.values, type=values.type)))
            elif self.kind == "in_reference":
                mask = _not_in(values, params[self.param])
            elif self.kind == "between":
                lo, hi = params[self.param]
                mask = pc.or_(pc.less(values, pa.scalar(lo, values.type)), pc.greater_equal(values, pa.scalar(hi, values.type)))
            elif self.kind in CATALOG_KINDS:  # null when the id is not in the catalog or the row's value is null: not judged
                ref = _lookup(values, params[self.param], self.reference or self.other)
                mine = table.column(self.other)
                mask = pc.not_equal(mine, ref) if self.kind == "matches_reference" else pc.less(mine, ref)
            else:  # unique: every repeat after the first occurrence is a violation
                mask = repeats(values)
            if self.kind != "not_null":
                mask = pc.and_(mask, pc.is_valid(values))  # nulls are judged by not_null alone
            bad |= np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)
        return bad

    def expectations(self, params: dict[str, Any], table: pa.Table | None = None) -> list:
        """The great-expectations 1.x expectations that state this rule (one per column).

        `table`, when given, is the table the suite will validate (used to keep value sets small).
        """
        import great_expectations.expectations as gxe  # heavy import, only where checks run

        out = []
        for col in self.columns:
            meta = {"rule": self.name}
            if self.kind == "not_null":
                out.append(gxe.ExpectColumnValuesToNotBeNull(column=col, meta=meta))
            elif self.kind == "in_set":
                out.append(gxe.ExpectColumnValuesToBeInSet(column=col, value_set=list(self.values), meta=meta))
            elif self.kind == "in_reference":
                # The reference (e.g. every catalog id) can be 10^5+ values, which GE serialises on every metric it
                # plans. With the table at hand, a value breaks the rule iff it is one of the column's distinct values
                # absent from the reference: expecting the column not to take those gives the same verdict and the
                # same unexpected rows with a set that is empty on good data.
                ref = _value_set(params[self.param], pa.string())
                if table is None:
                    out.append(gxe.ExpectColumnValuesToBeInSet(column=col, value_set=ref.to_pylist(), meta=meta))
                    continue
                present = pc.drop_null(pc.unique(table.column(col).cast(pa.string())))
                absent = pc.filter(present, pc.invert(pc.fill_null(pc.is_in(present, value_set=ref), False))).to_pylist()
                out.append(gxe.ExpectColumnValuesToNotBeInSet(column=col, value_set=absent, meta=meta))
            elif self.kind == "between":
                lo, hi = params[self.param]
                out.append(gxe.ExpectColumnValuesToBeBetween(column=col, min_value=lo, max_value=hi, strict_max=True, meta=meta))
            elif self.kind == "matches_reference":
                out.append(gxe.ExpectColumnPairValuesToBeEqual(column_A=self.other, column_B=f"{col}.{self.reference or self.other}",
                                                               ignore_row_if="either_value_is_missing", meta=meta))
            elif self.kind == "not_before_reference":
                out.append(gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                    column_A=self.other, column_B=f"{col}.{self.reference or self.other}", or_equal=True,
                    ignore_row_if="either_value_is_missing", meta=meta))
            else:
                out.append(gxe.ExpectColumnValuesToBeUnique(column=col, meta=meta))
        return out


def _lookup(ids: pa.ChunkedArray, catalog: pa.Table, column: str) -> pa.Array:
    """The catalog's `column` for each id (the catalog's first column is the id); null where the id is not in it."""
    values = catalog.column(column)
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    ref = _reference(catalog, lambda: catalog.column(0), ids)
    if ref is None:
        keys = catalog.column(0)
        return pc.take(values, pc.index_in(ids, value_set=keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys))
    index = ref.find(ids)
    found = pc.take(values, pa.array(index, pa.int64(), mask=index < 0))
    return pa.chunked_array([found]) if isinstance(ids, pa.ChunkedArray) else found  # the type index_in's path gives


def _not_in(values: pa.ChunkedArray, ref) -> pa.Array:
    """True where a value is not in the reference `ref` (a value set); nulls are masked by the caller."""
    found = _reference(ref, lambda: ref, values)
    if found is None:
        return pc.invert(pc.is_in(values, value_set=_value_set(ref, values.type)))
    return pa.array(found.find(values) < 0)


class Reference:
    """A reference's values indexed once: each batch's lookup costs its own rows, not the reference's.

    `pc.is_in` / `pc.index_in` build a hash set of the whole value set on every call; ingestion validates a window in
    batches of ~65k rows against one catalogue of up to 10^6 ids, so rebuilding it per batch was most of the time. A
    pandas Index keeps its hash table; it holds each value's first position, so `find` answers as index_in does (a
    null id at the reference's first null)."""

    def __init__(self, keys: pa.Array | pa.ChunkedArray):
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        values = pd.Index(keys.to_pandas())
        valid = ~np.asarray(keys.is_null().to_numpy(zero_copy_only=False), bool)
        nulls = np.flatnonzero(~valid)
        self.null_position = int(nulls[0]) if len(nulls) else -1
        first = valid & ~values.duplicated(keep="first")
        self.positions = np.flatnonzero(first)  # each distinct value's first position
        self.index = values[first]

    def find(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """(len(ids),) int64 position of each id in the reference's keys (index_in's), -1 where absent."""
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        at = self.index.get_indexer(ids.to_pandas())
        out = np.where(at >= 0, self.positions[np.maximum(at, 0)] if len(self.positions) else -1, -1).astype(np.int64)
        out[~np.asarray(ids.is_valid().to_numpy(zero_copy_only=False), bool)] = self.null_position
        return out


_STRINGS = (pa.string(), pa.large_string())
# id(owner) -> [owner, lookups so far, its Reference or None], last used last
_REFERENCES: OrderedDict[int, list] = OrderedDict()
CACHED_REFERENCES = 8  # references kept (a window's run uses 2-3: ids, user ids, the catalogue)
HASH_AFTER = 1  # pyarrow answers a reference's first lookup; indexing it costs about two, so only a reused one is indexed
HASH_RATIO = 4  # ... and only one at least this many times larger than the batch (else pyarrow's own hash set is cheaper)


def _reference(owner, keys, ids) -> Reference | None:
    """The cached Reference of `owner` (an Arrow array or table: immutable, so its identity names its values; held in
    the cache so the id is not reused), or None where pyarrow's own lookup is used: a Python collection, non-strings,
    a reference not yet looked up HASH_AFTER times or not HASH_RATIO times the batch's length."""
    if not isinstance(owner, (pa.Array, pa.ChunkedArray, pa.Table)) or ids.type not in _STRINGS:
        return None
    entry = _REFERENCES.get(id(owner))
    if entry is None or entry[0] is not owner:
        entry = _REFERENCES[id(owner)] = [owner, 0, None]
        while len(_REFERENCES) > CACHED_REFERENCES:
            _REFERENCES.popitem(last=False)
    _REFERENCES.move_to_end(id(owner))
    entry[1] += 1
    if entry[2] is None and entry[1] > HASH_AFTER:
        k = keys()
        if k.type not in _STRINGS or len(k) < HASH_RATIO * len(ids):
            return None
        entry[2] = Reference(k)
    return entry[2]


def _value_set(ref, type_: pa.DataType) -> pa.Array:
    if isinstance(ref, pa.ChunkedArray):
        ref = ref.combine_chunks()
    return ref.cast(type_) if isinstance(ref, pa.Array) else pa.array(list(ref), type=type_)


def repeats(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """True at every occurrence of a value after its first (nulls are never repeats)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    encoded = pc.dictionary_encode(arr)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    valid = ~np.asarray(pc.is_null(arr).to_numpy(zero_copy_only=False), dtype=bool)
    seen = np.zeros(len(codes), dtype=bool)
    if valid.any():
        idx = np.flatnonzero(valid)
        _, first = np.unique(codes[idx], return_index=True)
        seen[idx] = True
        seen[idx[first]] = False
    return pa.array(seen)
