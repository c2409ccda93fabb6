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
                # The reference (e.g. every catalog id) can be 10^5+ values, which GE copies per metric. Only the
                # reference values that occur in the column can ever match, so the allowed set is narrowed to them:
                # same verdict, same unexpected rows, a set no larger than the column's distinct values.
                ref = _value_set(params[self.param], pa.string())
                present = pc.unique(table.column(col).cast(pa.string())) if table is not None else ref
                allowed = pc.filter(present, pc.fill_null(pc.is_in(present, value_set=ref), False)).to_pylist()
                out.append(gxe.ExpectColumnValuesToBeInSet(column=col, value_set=allowed, meta=meta))
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


def string_hashes(strings: pa.Array) -> np.ndarray:
    """(n,) uint64 a hash of each string's UTF-8 bytes, computed from the Arrow buffers (no Python string per row; a
    null's value is arbitrary): a polynomial over the bytes modulo 2^64, mixed with the length."""
    width = np.int32 if strings.type == pa.string() else np.int64
    offsets = np.frombuffer(strings.buffers()[1], width)[strings.offset:strings.offset + len(strings) + 1].astype(np.int64)
    data = np.frombuffer(strings.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] if len(strings) else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
    within = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)  # each byte's place in its string
    powers = np.cumprod(np.full(max(int(lengths.max(initial=0)), 1), 0x100000001B3, np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        total = np.concatenate([np.zeros(1, np.uint64), np.cumsum(data * powers[within], dtype=np.uint64)])
        h = (total[starts + lengths] - total[starts]) ^ (lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        h ^= h >> np.uint64(33)  # murmur3's 64-bit finaliser spreads the bits
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return h


class Reference:
    """A reference's values hashed once: each batch's lookup costs its own rows, not the reference's.

    `pc.is_in` / `pc.index_in` build a hash set of the whole value set on every call; ingestion validates a window in
    batches of ~65k rows against one catalogue of up to 10^6 ids, so rebuilding it per batch was most of the time.
    Here the reference's distinct values are kept sorted by a 64-bit hash; a batch's ids are hashed, found by binary
    search and compared with the value found, so the answer is exactly index_in's (the first position of the value, a
    null id at the reference's first null). References with two values of one hash are not cached (`usable`)."""

    def __init__(self, keys: pa.Array | pa.ChunkedArray):
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        self.keys = keys
        valid = ~np.asarray(keys.is_null().to_numpy(zero_copy_only=False), bool)
        nulls = np.flatnonzero(~valid)
        self.null_position = int(nulls[0]) if len(nulls) else -1
        h = string_hashes(keys)
        positions = np.flatnonzero(valid)
        order = positions[np.argsort(h[positions], kind="stable")]  # equal hashes keep position order: first wins
        hs = h[order]
        first = np.concatenate([[True], hs[1:] != hs[:-1]]) if len(hs) else np.zeros(0, bool)
        self.hashes, self.positions = hs[first], order[first]  # (R,) sorted distinct hashes, their first position
        self.shift = np.uint64(64 - max(1, int(np.ceil(np.log2(max(len(self.hashes), 2)))) + 1))  # <= 1/2 hash per bucket
        buckets = self.hashes >> self.shift
        self.ptr = np.searchsorted(buckets, np.arange((1 << (64 - int(self.shift))) + 1, dtype=np.uint64))  # bucket -> rows
        self.depth = int(np.diff(self.ptr).max(initial=0))  # the fullest bucket
        # every repeat of a hash must be a repeat of the value, else two values share a hash
        repeat = order[~first]
        self.usable = bool(pc.all(pc.equal(keys.take(pa.array(repeat)),
                                           keys.take(pa.array(self.positions[np.searchsorted(self.hashes, hs[~first])])))).as_py()
                           ) if len(repeat) else True

    def find(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """(len(ids),) int64 position of each id in the reference's keys (index_in's), -1 where absent."""
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        out = np.full(len(ids), -1, np.int64)
        if len(self.hashes):
            h = string_hashes(ids)
            b = (h >> self.shift).astype(np.int64)
            lo, hi = self.ptr[b], self.ptr[b + 1]
            candidate = np.full(len(ids), -1, np.int64)
            rows = np.flatnonzero(hi > lo)  # ids whose bucket holds a hash
            for k in range(self.depth):  # the k-th hash of each id's bucket (most hold none or one)
                at = lo[rows] + k
                hit = self.hashes[at] == h[rows]
                candidate[rows[hit]] = self.positions[at[hit]]
                rows = rows[~hit & (at + 1 < hi[rows])]
                if not len(rows):
                    break
            maybe = np.flatnonzero(candidate >= 0)
            same = pc.equal(ids.take(pa.array(maybe)), self.keys.take(pa.array(candidate[maybe])))
            found = maybe[np.asarray(pc.fill_null(same, False).to_numpy(zero_copy_only=False), bool)]
            out[found] = candidate[found]
        null = ~np.asarray(ids.is_valid().to_numpy(zero_copy_only=False), bool)
        out[null] = self.null_position
        return out


_STRINGS = (pa.string(), pa.large_string())
# id(owner) -> [owner, lookups so far, its Reference or None], last used last
_REFERENCES: OrderedDict[int, list] = OrderedDict()
CACHED_REFERENCES = 8  # references kept (a window's run uses 2-3: ids, user ids, the catalogue)
HASH_AFTER = 3  # pyarrow answers a reference's first lookups: hashing it costs ~9 of them, so only a reused one is hashed
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
        if not entry[2].usable:
            entry[2] = False
    return entry[2] or None


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
