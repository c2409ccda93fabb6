"""Items that arrive inside a window, served the day they arrive: the increments of window t.

An increment is one day d after end(t), t being the last window closed before d starts. It holds the catalogue's
items (products, services) first seen inside [start(d), end(d)): read from the source's catalogue snapshot at end(d)
through the catalogue contract (what entity_catalog would publish), their content embedded with window t's encoders
(the text model and catalog_clip(t), so the vectors live where window t's content table does), and placed in window
t's metric space as `InductiveEncoder.item_vectors` places items without a row (by their content among window t's warm
products, hir_model.embed.content_map; without content, the frozen encoder's single token). Each item also gets Bag-of-Meaning tokens: its soft
top-k assignment to bom_index(t)'s primitives (their centroids), as interest_hierarchy(t) assigned the window's entities.
Nothing dated at or after end(d) is read, and nothing of window t changes: serving appends the items after window t's
(hir_model.rank.recommender.Recommender.with_increments).

Files under `catalog_increment/<day>/`: `items.parquet` (data_contracts.increment: sorted by first_seen_ts, then id),
`tokens.parquet` (hir_model.retrieval.tokens.TOKENS_SCHEMA) and `increment.json` (day, window, [start, end), counts,
the content encoder's version, a digest of the items).

When an increment is servable: with the arrival sensor (a catalogue file lands, the day's increment is published again
within a bounded lag) an item is servable `lag` after its first_seen_ts (`arrival`); with the daily schedule alone,
`lag` after its day's end (`day_end`). The evaluation serves each judged event with what either cadence had published.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.increment import INCREMENT_ITEMS_SCHEMA
from hir_model.data.windows import KEY_FORMAT, Window
from hir_model.hierarchy.assign import AssignConfig, soft_assign
from hir_model.protocol.split import SplitConfig, to_us
from hir_model.retrieval.tokens import TOKENS_SCHEMA
from hir_model.storage import require_files

INCREMENT_ASSET = "catalog_increment"
ITEMS_FILE, TOKENS_FILE, MANIFEST_FILE = "items", "tokens", "increment.json"
ITEM_TYPES = SplitConfig().item_types  # what an increment carries: the entity types the head ranks
NORM_TOLERANCE = 1e-3  # |norm - 1| a published vector may show (float32)
UNIT_CHECK, NEW_IDS_CHECK, WITHIN_DAY_CHECK = "increment_unit_vectors", "increment_ids_new", "increment_within_day"
CADENCES = ("arrival", "day_end")  # when an increment's item is servable: from its arrival, or from its day's end
ARRIVAL_LAG_S = 120.0  # landing to served under the arrival sensor (the bound benchmarks/arrivals.py measures against)
US = 1_000_000


@dataclass(frozen=True)
class Increment:
    """One day's arrivals, placed in window t's space (module docstring); rows sorted by (first seen, id)."""

    day: str  # the day's key, YYYY-MM-DD (the partition)
    window: str  # key of window t, whose space the items are placed in
    start_us: int  # the day's start: every item was first seen at or after it
    end_us: int  # the day's end: nothing dated at or after it was read
    item_ids: np.ndarray  # (m,) object
    item_types: np.ndarray  # (m,) object
    first_seen_us: np.ndarray  # (m,) int64
    vectors: np.ndarray  # (m, W) float32 unit rows in window t's metric space
    content: np.ndarray | None  # (m, C) float32 fused content vectors (zeros where has_content is False); None: none
    has_content: np.ndarray  # (m,) bool
    tokens: pa.Table  # TOKENS_SCHEMA rows of the items
    content_version: str = ""  # the content encoders' version (content_embeddings' encoder_version of window t)
    single_token: int = 0  # items placed by the encoder's single token (no content, or no content map)

    def __len__(self) -> int:
        return len(self.item_ids)

    def available_us(self, cadence: str = "arrival", lag_s: float = ARRIVAL_LAG_S) -> np.ndarray:
        """(m,) int64 when each item is servable: `lag_s` after its first_seen_ts (`arrival`) or its day's end
        (`day_end`)."""
        if cadence not in CADENCES:
            raise ValueError(f"cadence must be one of {CADENCES}, got {cadence!r}")
        base = self.first_seen_us if cadence == "arrival" else np.full(len(self), self.end_us, np.int64)
        return base + int(lag_s * US)

    def take(self, rows: np.ndarray) -> Increment:
        """The increment's rows `rows` alone (e.g. the items a republished day added), their tokens with them."""
        rows = np.asarray(rows, np.int64)
        ids = self.item_ids[rows]
        tokens = self.tokens.filter(pc.is_in(self.tokens["entity_id"], pa.array(list(map(str, ids)), pa.string())))
        return Increment(self.day, self.window, self.start_us, self.end_us, ids, self.item_types[rows],
                         self.first_seen_us[rows], self.vectors[rows], None if self.content is None else self.content[rows],
                         self.has_content[rows], tokens, self.content_version,
                         int(min(self.single_token, len(rows))))

    @property
    def digest(self) -> str:
        """A short hash of the ids, first-seen times and vectors: what a server compares to see a day republished."""
        h = hashlib.sha256()
        h.update("\x1f".join(map(str, self.item_ids)).encode())
        h.update(np.ascontiguousarray(self.first_seen_us, np.int64).tobytes())
        h.update(np.ascontiguousarray(self.vectors, np.float32).tobytes())
        return h.hexdigest()[:16]

    def summary(self) -> dict:
        """JSON-ready: what `increment.json` holds."""
        return {"day": self.day, "window": self.window, "start_us": self.start_us, "end_us": self.end_us, "items": len(self),
                "width": int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0,
                "with_content": int(self.has_content.sum()), "single_token": self.single_token,
                "content_version": self.content_version, "digest": self.digest}


@dataclass(frozen=True)
class IncrementBuild:
    increment: Increment
    catalog_rows: int  # rows of the day's catalogue snapshot that passed the contract
    rejected_rows: int  # rows it rejected (the contract's row rules; they are not arrivals)
    arrivals: int  # item rows first seen inside the day
    window_items: np.ndarray  # (N,) object, sorted: window t's items (the ranking head's), what the ids must be new to
    width: int  # the width of window t's item vectors
    known_skipped: list[str] = field(default_factory=list)  # arrivals whose id window t already knows: not published
    seconds: float = 0.0


def day_of(key: str) -> Window:
    """The day partition `key` (YYYY-MM-DD) as a window [start, end) in UTC."""
    start = datetime.strptime(key, KEY_FORMAT).replace(tzinfo=timezone.utc)
    return Window(key, start, start + timedelta(days=1))


def day_catalog(source, day: Window) -> tuple[pa.Table, int]:
    """The catalogue snapshot at the day's end through the catalogue contract, as entity_catalog validates it: (accepted
    rows, rejected rows). A file-level break raises the contract's error naming the file."""
    from data_contracts import CATALOG
    from hir_model.data.ingest import ingest
    from hir_model.data.tables import catalog_params, contract_for

    from hir_model.data.source import Batch

    contract = contract_for(CATALOG, source, "catalog")
    batches = [Batch(b.origin, contract.conform(b.table, b.origin)) for b in source.catalog(day.end)]
    ids = pc.unique(pc.drop_null(pa.chunked_array([b.table.column("entity_id") for b in batches], pa.string())))
    with tempfile.TemporaryDirectory(prefix="hir-increment-") as tmp:
        accepted, rejected = Path(tmp) / "accepted.parquet", Path(tmp) / "rejected.parquet"
        report = ingest(contract, batches, catalog_params(day, ids), accepted, rejected)
        table = pq.read_table(accepted)
    return table, report.rejected


def arrivals(catalog: pa.Table, day: Window, item_types: tuple[str, ...] = ITEM_TYPES) -> pa.Table:
    """The catalogue's rows of `item_types` first seen inside the day, sorted by (first_seen_ts, entity_id)."""
    ts = catalog["first_seen_ts"]
    keep = pc.and_(pc.is_in(catalog["entity_type"], pa.array(item_types, pa.string())),
                   pc.and_(pc.greater_equal(ts, pa.scalar(day.start, ts.type)), pc.less(ts, pa.scalar(day.end, ts.type))))
    return catalog.filter(keep).sort_by([("first_seen_ts", "ascending"), ("entity_id", "ascending")])


@dataclass
class Placer:
    """What places one window's arrivals: its content encoders (the text model, catalog_clip(t)), its frozen encoder with
    the content map, and bom_index(t)'s codebooks."""

    encoders: object  # hir_model.content.Encoders
    inductive: object  # hir_model.rank.inductive.InductiveEncoder
    codebooks: list  # hir_model.retrieval.index.Codebook, finest level first


def window_placer(store, window: Window, content_config, inductive_config=None) -> Placer:
    """Window `window`'s Placer, loaded once per process while its files are unchanged (the days of one window, run one
    after another in a process, share it: the demo; a daemon-launched run loads it once)."""
    from hir_model.content import CLIP_ASSET, CLIP_CHECKPOINT_FILE, CONTENT_ASSET, load_encoders
    from hir_model.files_cache import cached
    from hir_model.rank.artefacts import load_artefacts
    from hir_model.rank.inductive import InductiveConfig, InductiveEncoder
    from hir_model.retrieval.index import BOM_ASSET, CODEBOOK_FILE, read_codebooks
    from hir_model.train.checkpoint import ENCODER_ASSET

    config = inductive_config or InductiveConfig()
    clip = None
    if store.exists(CLIP_ASSET, window.key) and (store.partition_dir(CLIP_ASSET, window.key) / CLIP_CHECKPOINT_FILE).is_file():
        clip = store.partition_dir(CLIP_ASSET, window.key) / CLIP_CHECKPOINT_FILE

    def load() -> Placer:
        inductive = InductiveEncoder(load_artefacts(store, window.key, to_us(window.end)), config)
        inductive.placer  # noqa: B018 - fitted once here, not per day
        codebooks = read_codebooks(pq.read_table(store.partition_dir(BOM_ASSET, window.key) / f"{CODEBOOK_FILE}.parquet"))
        return Placer(load_encoders(content_config, clip), inductive, codebooks)

    files = [f for asset in (ENCODER_ASSET, "entity_embeddings", CONTENT_ASSET, BOM_ASSET, CLIP_ASSET)
             if store.exists(asset, window.key) for f in store.files(asset, window.key) if f.is_file()]
    return cached(("increment", str(store.uri(BOM_ASSET, window.key)), repr(content_config), repr(config)), files, load)


def assign_tokens(codebooks, ids: np.ndarray, vectors: np.ndarray, config: AssignConfig = AssignConfig()) -> pa.Table:
    """TOKENS_SCHEMA rows: each item's soft top-k primitives per level of bom_index(t)'s codebooks (token names and
    centroids, hir_model.retrieval.index.Codebook), with interest_hierarchy's assignment rule."""
    ent, lev, tok, wt = [], [], [], []
    for book in codebooks:
        level = int(book.tokens[0].split(":")[0][1:]) if book.tokens else 0
        got = soft_assign(vectors, book.centroids, config)  # (m, k) rows of the codebook
        for i, e in enumerate(ids):
            for p, w in zip(got.primitive[i], got.weight[i]):
                ent.append(str(e)), lev.append(level), tok.append(book.tokens[int(p)]), wt.append(float(w))
    return pa.table([pa.array(ent, pa.string()), pa.array(lev, pa.int32()), pa.array(tok, pa.string()),
                     pa.array(wt, pa.float32())], schema=TOKENS_SCHEMA)


def build_increment(store, source, window: Window, day: Window, content_config, inductive_config=None) -> IncrementBuild:
    """Day `day`'s increment of window `window` (module docstring): the day's arrivals, embedded, placed and tokenised.
    FileNotFoundError naming what of window t is missing."""
    from hir_model.content import embed_catalog, to_matrix
    from hir_model.protocol.split import ItemSpace
    from hir_model.rank.artefacts import missing_artefacts
    from hir_model.rank.state import HEAD_ASSET, ITEMS_FILE as HEAD_ITEMS
    from hir_model.retrieval.index import BOM_ASSET

    t0 = time.perf_counter()
    if day.start < window.end:
        raise ValueError(f"day {day.key} starts before window {window.key} ends ({window.end:%Y-%m-%d}): its items are "
                         f"the window's own, not an increment")
    for asset in (HEAD_ASSET, BOM_ASSET):
        if not store.exists(asset, window.key):
            raise FileNotFoundError(f"the increment of {day.key} is placed in window {window.key}'s space: {asset} for "
                                    f"{window.key} is not materialised under {store.root}")
    missing = missing_artefacts(store, window.key)
    if missing:
        raise FileNotFoundError(f"the increment of {day.key} needs window {window.key}'s artefacts: {missing}")
    catalog, rejected = day_catalog(source, day)
    rows = arrivals(catalog, day)
    head = pq.read_table(store.partition_dir(HEAD_ASSET, window.key) / f"{HEAD_ITEMS}.parquet",
                         columns=["entity_id", "embedding"])
    known = np.asarray(head["entity_id"].to_pylist(), object)  # the ranking head's items, sorted
    width = len(head["embedding"][0]) if head.num_rows else 0
    ids = np.asarray(rows["entity_id"].to_pylist(), object)
    pos = np.minimum(np.searchsorted(known, ids), max(len(known) - 1, 0))
    seen = (known[pos] == ids) if len(known) else np.zeros(len(ids), bool)
    rows, ids = rows.filter(pa.array(~seen)), ids[~seen]  # an id window t knows is not an arrival (never re-placed)
    m = len(ids)
    first_seen = rows["first_seen_ts"].cast(pa.int64()).to_numpy() if m else np.zeros(0, np.int64)
    if not m:
        empty = Increment(day.key, window.key, to_us(day.start), to_us(day.end), ids, ids.copy(), first_seen,
                          np.zeros((0, width), np.float32), None, np.zeros(0, bool), TOKENS_SCHEMA.empty_table())
        return IncrementBuild(empty, catalog.num_rows, rejected, len(seen), known, width, list(known[pos][seen]),
                              time.perf_counter() - t0)
    placer = window_placer(store, window, content_config, inductive_config)
    content = embed_catalog(rows, placer.encoders)
    matrix, has = to_matrix(content.table["embedding"])  # (m, C) NaN rows where no content
    matrix = np.nan_to_num(matrix)
    space = ItemSpace(ids, 0, np.full(m, -1, np.int64), np.zeros(0, object), matrix, has)
    vectors = placer.inductive.item_vectors(space)  # (m, W): placed by content where there is some, the single token elsewhere
    mapped = placer.inductive.placer is not None and \
        matrix.shape[1] == placer.inductive.content_dim
    single = int(m - (has.sum() if mapped else 0))
    increment = Increment(day.key, window.key, to_us(day.start), to_us(day.end), ids,
                          np.asarray(rows["entity_type"].to_pylist(), object), first_seen, vectors.astype(np.float32),
                          matrix.astype(np.float32), has, assign_tokens(placer.codebooks, ids, vectors), content.version,
                          single)
    return IncrementBuild(increment, catalog.num_rows, rejected, len(seen), known, width, list(known[pos][seen]),
                          time.perf_counter() - t0)


def _vectors_column(x: np.ndarray | None, n: int, valid: np.ndarray | None = None) -> pa.Array:
    if x is None or n == 0:
        return pa.nulls(n, pa.list_(pa.float32())) if x is None else pa.array([], pa.list_(pa.float32()))
    arr = pa.array(list(np.asarray(x, np.float32)), pa.list_(pa.float32()))
    return arr if valid is None else pc.if_else(pa.array(valid), arr, pa.nulls(n, arr.type))


def write_increment(folder: Path, inc: Increment) -> None:
    """The increment's three files into `folder` (a staging folder)."""
    folder, n = Path(folder), len(inc)
    pq.write_table(pa.table({
        "entity_id": pa.array(list(inc.item_ids), pa.string()), "entity_type": pa.array(list(inc.item_types), pa.string()),
        "first_seen_ts": pa.array(inc.first_seen_us, pa.int64()).cast(INCREMENT_ITEMS_SCHEMA.field("first_seen_ts").type),
        "embedding": _vectors_column(inc.vectors, n),
        "content": (_vectors_column(inc.content, n, inc.has_content) if inc.content is not None
                    else pa.nulls(n, pa.list_(pa.float32()))),
    }, schema=INCREMENT_ITEMS_SCHEMA), folder / f"{ITEMS_FILE}.parquet")
    pq.write_table(inc.tokens.cast(TOKENS_SCHEMA), folder / f"{TOKENS_FILE}.parquet")
    (folder / MANIFEST_FILE).write_text(json.dumps(inc.summary(), indent=1) + "\n")


def _matrix(col: pa.ChunkedArray, n: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(n, d) float32 of a list<float32> column (zeros where null) and (n,) valid; (None, all False) when all null."""
    valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool) if n else np.zeros(0, bool)
    if not valid.any():
        return None, valid
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    d = int(lengths[valid][0])
    if (lengths[valid] != d).any():
        raise ValueError(f"vectors of {sorted(set(lengths[valid].tolist()))} widths in one column")
    out = np.zeros((n, d), np.float32)
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float32)
    out[valid] = flat.reshape(-1, d)
    return out, valid


def read_increment(folder: Path) -> Increment:
    """The increment `write_increment` wrote; FileNotFoundError naming what is missing, ValueError naming a file that
    breaks the contract."""
    folder = Path(folder)
    require_files(folder, (f"{ITEMS_FILE}.parquet", f"{TOKENS_FILE}.parquet", MANIFEST_FILE), "catalogue increment")
    meta = json.loads((folder / MANIFEST_FILE).read_text())
    items = pq.read_table(folder / f"{ITEMS_FILE}.parquet")
    if not items.schema.equals(INCREMENT_ITEMS_SCHEMA):
        raise ValueError(f"{folder / ITEMS_FILE}.parquet breaks the increment's contract (data_contracts.increment): "
                         f"{items.schema} != {INCREMENT_ITEMS_SCHEMA}")
    n = items.num_rows
    vectors, _ = _matrix(items["embedding"], n)
    content, has = _matrix(items["content"], n)
    width = int(meta.get("width", 0))
    return Increment(meta["day"], meta["window"], int(meta["start_us"]), int(meta["end_us"]),
                     np.asarray(items["entity_id"].to_pylist(), object),
                     np.asarray(items["entity_type"].to_pylist(), object),
                     items["first_seen_ts"].cast(pa.int64()).to_numpy(),
                     vectors if vectors is not None else np.zeros((0, width), np.float32),
                     content, has, pq.read_table(folder / f"{TOKENS_FILE}.parquet"), meta.get("content_version", ""),
                     int(meta.get("single_token", 0)))


MAX_WINDOW_DAYS = 7  # the longest window (weekly): window t's increments are among the days of the week after end(t)


def increment_days(store, end_us: int, until_us: int | None = None) -> list[str]:
    """Published increment partitions whose day starts in [end(t), until) (None: end(t) + MAX_WINDOW_DAYS days): the
    candidates of window t."""
    first = datetime.fromtimestamp(end_us / US, timezone.utc)
    last = (first + timedelta(days=MAX_WINDOW_DAYS) if until_us is None
            else datetime.fromtimestamp(until_us / US, timezone.utc))
    return [d for d in store.partitions(INCREMENT_ASSET) if first.strftime(KEY_FORMAT) <= d < last.strftime(KEY_FORMAT)]


def manifests(store, window: str, end_us: int, until_us: int | None = None) -> dict[str, dict]:
    """day -> increment.json of window `window`'s published increments whose day starts before `until_us` (what a server
    polls: a few small files)."""
    out = {}
    for d in increment_days(store, end_us, until_us):
        path = store.partition_dir(INCREMENT_ASSET, d) / MANIFEST_FILE
        if path.is_file():
            meta = json.loads(path.read_text())
            if meta.get("window") == window:
                out[d] = meta
    return out


def load_increments(store, window: str, end_us: int, until_us: int | None = None) -> list[Increment]:
    """Window `window`'s published increments (the days after its end whose increment was placed in its space) whose
    day starts before `until_us`, oldest day first."""
    return [read_increment(store.partition_dir(INCREMENT_ASSET, d)) for d in manifests(store, window, end_us, until_us)]


def increment_checks(inc: Increment, window_items: np.ndarray, width: int,
                     others: dict[str, np.ndarray] | None = None) -> list[tuple[str, bool, str, dict]]:
    """(check, passed, description, numeric metadata) of an increment before it is published. window_items: window t's
    items (sorted); width: its vectors' width; others: day -> item ids of the window's other published increments."""
    n = len(inc)
    vec = inc.vectors if n else np.zeros((0, width), np.float32)
    shape_ok = vec.ndim == 2 and vec.shape[1] == width
    finite = np.isfinite(vec).all(axis=1) if shape_ok else np.zeros(n, bool)
    norms = np.linalg.norm(np.where(np.isfinite(vec), vec, 0), axis=1) if shape_ok else np.zeros(n)
    bad = np.flatnonzero(~finite | (np.abs(norms - 1) > NORM_TOLERANCE)) if shape_ok else np.arange(n)
    ids = np.asarray(inc.item_ids, object)
    known = np.asarray(window_items, object)
    pos = np.minimum(np.searchsorted(known, ids), max(len(known) - 1, 0)) if len(known) else np.zeros(n, np.int64)
    in_window = ids[(known[pos] == ids)] if len(known) and n else ids[:0]
    repeated = sorted({str(e) for e, c in zip(*np.unique(ids.astype(str), return_counts=True)) if c > 1}) if n else []
    elsewhere = sorted({f"{e} ({d})" for d, other in (others or {}).items() if d != inc.day
                        for e in set(map(str, ids)) & set(map(str, other))})
    early = inc.first_seen_us < inc.start_us
    late = inc.first_seen_us >= inc.end_us
    outside = np.flatnonzero(early | late)
    stamp = lambda us: datetime.fromtimestamp(int(us) / US, timezone.utc).isoformat()  # noqa: E731
    sample = lambda rows: ", ".join(f"{ids[r]} (row {r})" for r in rows[:5])  # noqa: E731
    return [
        (UNIT_CHECK, shape_ok and not len(bad),
         f"{n} vectors of width {vec.shape[1] if vec.ndim == 2 else '?'} (window {inc.window}: {width}); "
         f"{len(bad)} not finite or not unit norm" + (f": {sample(bad)}" if len(bad) else ""),
         {"items": n, "bad_vectors": int(len(bad)) if shape_ok else n}),
        (NEW_IDS_CHECK, not len(in_window) and not repeated and not elsewhere,
         f"ids window {inc.window} already ranks: {len(in_window)} {list(map(str, in_window[:5]))}; "
         f"repeated: {repeated[:5]}; "
         f"in another day's increment: {elsewhere[:5]}",
         {"known_to_window": int(len(in_window)), "repeated": len(repeated), "in_other_increments": len(elsewhere)}),
        (WITHIN_DAY_CHECK, not len(outside),
         f"every item first seen inside [{stamp(inc.start_us)}, {stamp(inc.end_us)}): {len(outside)} rows outside "
         f"({int(late.sum())} dated at or after the increment's end, {int(early.sum())} before its start)"
         + (": " + ", ".join(f"{ids[r]} (row {r}, first seen {stamp(inc.first_seen_us[r])})" for r in outside[:5])
            if len(outside) else ""),
         {"after_end": int(late.sum()), "before_start": int(early.sum())}),
    ]
