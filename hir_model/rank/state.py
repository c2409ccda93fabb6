"""The ranking head's state for window t: everything `head_scores` needs that is known at end(t), fitted from window t's
published tables and written as plain files (the `ranking_head` asset), so serving and evaluation read the same state.

Files under `ranking_head/<t>/`:
- `items.parquet`: the items the head ranks (catalog(t)'s item types known by end(t), sorted by id): `entity_id`,
  `entity_type`, `embedding` (the vector the head scores with: the published row, or the encoder's single-token path for
  an item without one), `log_prior` (temp x log prior, weight 1), `cold_log_prior` (the new users' prior, null when cold
  users take the warm prior), `structure` (structural encodings; null when the encoder reads none).
- `history.parquet`: every engagement before end(t) on those items (`user_id`, `entity_id`, `ts`, `deep`): each warm
  user's recent-items state and what they already engaged with.
- `coengagement.parquet`: the item-to-item co-engagement of window t's history (hir_model.rank.coengagement), `item`,
  `neighbour` (rows of `items.parquet`), `similarity`; absent when the head has none.
- `ranker_hir.txt`, `ranker_base.txt`: the learned rankers (hir_model.rank.ranker), LightGBM's text dumps; absent while
  no earlier window's outcome can train one (the head's hand-set score is then the answer); `examples.parquet`: the
  examples of head(t-1) judged by window t (hir_model.rank.examples) the rankers of t and later train on.
- `head.json`: the head's settings, the rankers' features, importance and training data, the prior's weights (the head's and the published rows' alone), where they came
  from (the earlier heads' track records, hir_model.rank.track, or the held-out calibration), the co-engagement's
  weight, the checkpoint's temperature.
The items' unit content vectors (`content` in `items.parquet`) are what users' content profiles are read from when an
item first seen after end(t) is scored (the head's content term, hir_model.rank.head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from data_contracts.head import HEAD_COENGAGEMENT_SCHEMA, HEAD_HISTORY_SCHEMA, HEAD_ITEMS_SCHEMA
from hir_model.protocol.split import Interactions
from hir_model.rank.fit import WEIGHTS, PriorCalibration, fit_prior_weight, decayed_engagement, floored_log, new_user_engagement
from hir_model.rank.head import HeadConfig, ItemSide
from hir_model.rank.coengagement import coengagement_similarity, padded
from hir_model.rank.examples import check_examples
from hir_model.rank.features import FeatureItems, feature_items
from hir_model.rank.ranker import Ranker, RankerConfig
from hir_model.rank.track import TrackRecord, pooled_choice, pooled_weight
from hir_model.storage import require_files

HEAD_ASSET = "ranking_head"
ITEMS_FILE, HISTORY_FILE, COENGAGEMENT_FILE, HEAD_FILE = "items", "history", "coengagement", "head.json"
EXAMPLES_FILE = "examples"  # the ranker's training examples of head(t-1) judged by window t
RANKER_FILE = "ranker_{}.txt"  # a ranker's LightGBM text dump, per variant


@dataclass(frozen=True)
class HeadState:
    """One window's ranking-head state (module docstring); item rows are the history's item indices."""

    window: str  # key of window t
    end_us: int  # end(t)
    config: HeadConfig
    item_ids: np.ndarray  # (N,) object, sorted
    item_types: np.ndarray  # (N,) object
    vectors: np.ndarray  # (N, W) float32 unit rows
    log_prior: np.ndarray | None  # (N,) float32 temp x log prior (weight 1); None: no prior
    cold_log_prior: np.ndarray | None  # (N,) float32 temp x log new users' prior (weight 1); None: cold users take log_prior
    structure: np.ndarray | None  # (N, S) float32; None: no structural readout
    prior_weight: float  # what multiplies log_prior in the head's score (prior_source says how it was chosen)
    temp: float  # the checkpoint's engagement temperature (0: none recorded, no prior)
    history: Interactions  # engagements before end(t) on these items
    calibration: PriorCalibration | None = None
    prior_floor: float = 0.0  # log_prior of an item nobody engaged with (items first seen after t take it too)
    cold_prior_floor: float = 0.0  # the same for cold_log_prior
    embeddings_prior_weight: float | None = None  # the weight beside the published rows alone (None: prior_weight)
    prior_source: str = "config"  # "track" (earlier heads' track records), "fit" (held-out days) or "config"
    track: tuple[TrackRecord, ...] = ()  # the track records of the heads before this one, oldest first
    coengagement: sp.csr_matrix | None = None  # (N, N) float32 item-to-item co-engagement; None: the head has none
    coengagement_weight: float = 0.0  # what multiplies it in warm users' scores (chosen with prior_weight)
    rows_source: str = "head"  # the rows' weight: "track", "config" (rows_prior_weight) or "head" (prior_weight)
    content: np.ndarray | None = None  # (N, C) float32 unit content vectors, zero rows for items without; None: no content
    rankers: tuple[Ranker, ...] = ()  # the learned rankers of t, one per variant trained (none: the hand-set score)
    ranker_config: RankerConfig = RankerConfig()
    ranker_note: str = "no ranker"  # how the rankers came about, or why there are none
    examples: pa.Table | None = None  # head(t-1)'s examples judged by window t (hir_model.rank.examples)

    def ranker(self, variant: str = "hir") -> Ranker | None:
        """The learned ranker of `variant` ("hir" or "base"), None where none was trained."""
        return next((r for r in self.rankers if r.variant == variant), None)

    @property
    def base_co_weight(self) -> float:
        """Co-engagement's weight in the base first stage: the head's, or the configured one where the head's is 0."""
        return self.coengagement_weight or (self.config.coengagement_weight if self.coengagement is not None else 0.0)

    def feature_items(self, new_items: int = 0, new_content: np.ndarray | None = None) -> FeatureItems:
        """The items as the ranker's features read them (hir_model.rank.features), `new_items` first seen after end(t)
        appended (`new_content`: their content vectors, None: none)."""
        return feature_items(self.history, self.log_prior, self.cold_log_prior, self.coengagement, self.content,
                             self.config.deep_weight, new_items, new_content)

    @property
    def rows_prior_weight(self) -> float:
        """The prior's weight beside the published rows alone (the `hir_embeddings` row)."""
        return self.prior_weight if self.embeddings_prior_weight is None else self.embeddings_prior_weight

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def items(self, config: HeadConfig | None = None, new_vectors: np.ndarray | None = None,
              prior_weight: float | None = None, new_content: np.ndarray | None = None) -> ItemSide:
        """The item side `head_scores` reads, with this state's weights (config: e.g. `embeddings_only()`; None: own;
        prior_weight: None, the head's); `new_vectors` (M, W): items first seen after t appended (at the priors' floors,
        outside graph(t)), `new_content` (M, C) their content vectors (zero rows: none; None: no content term)."""
        c, m = config or self.config, 0 if new_vectors is None else len(new_vectors)
        extend = lambda x, fill: x if not m else np.concatenate([x, np.full((m,) + x.shape[1:], fill, x.dtype)])  # noqa: E731
        vectors = self.vectors if not m else np.concatenate([self.vectors, np.asarray(new_vectors, np.float32)])
        weight = self.prior_weight if prior_weight is None else prior_weight
        prior = None if self.log_prior is None else (weight * extend(self.log_prior, self.prior_floor)).astype(np.float32)
        cold = None
        if self.cold_log_prior is not None and self.prior_weight and c.cold_prior_days is not None and c.cold_structure_weight:
            cold = (c.cold_prior_weight * extend(self.cold_log_prior, self.cold_prior_floor)).astype(np.float32)
        elif self.log_prior is not None:
            # without the structural readout a cold user's score is an encoder vector's dot product, the rows' form: it
            # takes the rows' prior weight (the head's is chosen for the full warm score: kernel, co-engagement)
            cold = (self.rows_prior_weight * extend(self.log_prior, self.prior_floor)).astype(np.float32)
        structure = extend(self.structure, 0.0) if self.structure is not None and c.cold_structure_weight else None
        co = None
        if self.coengagement is not None and c.coengagement and self.coengagement_weight:
            co = (self.coengagement_weight * padded(self.coengagement, len(vectors))).astype(np.float32)
        content = fresh = None
        if self.content is not None and new_content is not None and c.content_weight and m:
            if new_content.shape != (m, self.content.shape[1]):
                raise ValueError(f"new items' content is {new_content.shape}, the head's items carry {self.content.shape[1]} dims")
            norm = np.linalg.norm(new_content, axis=1, keepdims=True)
            unit = np.divide(new_content, norm, out=np.zeros(new_content.shape, np.float32), where=norm > 0)
            content = np.concatenate([self.content, unit.astype(np.float32)])
            fresh = np.r_[np.zeros(self.n_items, bool), np.ones(m, bool)]
        return ItemSide(vectors, prior, cold, structure, co, content, fresh, c.content_weight if content is not None else 0.0)

    def summary(self) -> dict:
        """JSON-ready: what `head.json` holds."""
        return {"window": self.window, "end_us": self.end_us, "config": self.config.as_dict(), "prior_weight": self.prior_weight,
                "temp": self.temp, "prior_floor": self.prior_floor, "cold_prior_floor": self.cold_prior_floor, "items": self.n_items, "users": int(self.history.n_users),
                "events": int(len(self.history.user)), "prior": self.log_prior is not None,
                "cold_prior": self.cold_log_prior is not None, "structural_readout": self.structure is not None,
                "calibration": None if self.calibration is None else self.calibration.as_dict(),
                "weight_grid": list(WEIGHTS), "embeddings_prior_weight": self.rows_prior_weight,
                "prior_source": self.prior_source, "rows_source": self.rows_source, "coengagement_weight": self.coengagement_weight,
                "coengagement": self.coengagement is not None, "content": self.content is not None,
                "track": [r.as_dict() for r in self.track], "ranker_config": self.ranker_config.as_dict(),
                "ranker_note": self.ranker_note, "rankers": [r.summary() for r in self.rankers],
                "examples": 0 if self.examples is None else self.examples.num_rows}


def fit_head(train: Interactions, item_ids: np.ndarray, item_types: np.ndarray, vectors: np.ndarray,
             strength_at, temp: float, structure: np.ndarray | None, config: HeadConfig = HeadConfig(),
             track: tuple[TrackRecord, ...] = (), content: np.ndarray | None = None) -> HeadState:
    """The state at end(t) from window t and the earlier heads' `track` records. `strength_at(cutoff_us)`: (N,) each
    item's decayed engagement in graph(t) as of a cutoff <= end(t) (None: no graph, no prior; unused where
    `config.prior_half_life_days` takes the prior from `train`); `temp`: the checkpoint's
    engagement temperature (0: no prior); `structure`: the items' structural encodings when the encoder reads them.
    The prior's and the co-engagement's weights: from the track once it holds `config.track_min_users` judged users,
    else the held-out fit (the head's prior weight) and the config's (`prior_weight`, `coengagement_weight`). The rows'
    own weight: from the track once it holds `config.rows_track_min_users`, else `rows_prior_weight` or the head's.
    `content`: (N, C) the items' content vectors (zero rows: none), kept unit for the content term; None: no term."""
    if len(item_ids) != train.n_items or len(vectors) != train.n_items:
        raise ValueError(f"{len(item_ids)} item ids and {len(vectors)} vectors for {train.n_items} items of the history")

    def prior_at(cutoff_us: int) -> tuple[np.ndarray, float] | None:
        if not temp:
            return None
        if config.prior_half_life_days is not None:
            return floored_log(decayed_engagement(train, cutoff_us, config.prior_half_life_days, config.deep_weight), temp)
        if strength_at is None:
            return None
        return floored_log(np.asarray(strength_at(cutoff_us), np.float64), temp)

    prior = prior_at(train.end_us)
    calibration = None
    if prior is not None and config.calibrate_days is not None and config.prior_weight:
        calibration = fit_prior_weight(train, vectors, lambda cut: (p := prior_at(cut)) and p[0], config)
    cold = None
    if prior is not None and structure is not None and config.cold_prior_days is not None and config.cold_structure_weight:
        cold = floored_log(new_user_engagement(train, config.cold_prior_days, config.cold_prior_half_life_days,
                                               config.deep_weight), temp)
    similarity = coengagement_similarity(train, config.deep_weight) if config.coengagement else None
    weight, source = config.prior_weight, "config"
    rows_weight, rows_source = ((config.rows_prior_weight, "config") if config.rows_prior_weight is not None and config.prior_weight
                                else (None, "head"))  # None: the rows take the head's weight
    co_weight = config.coengagement_weight if similarity is not None else 0.0
    if calibration is not None:
        weight, source = calibration.weight, "fit"
    if prior is not None and config.track_min_users is not None and config.prior_weight:
        choice = pooled_choice(list(track), config.track_min_users, with_coengagement=similarity is not None)
        if choice is not None:
            (co_weight, weight), source = choice, "track"
        rows_min = config.track_min_users if config.rows_track_min_users is None else config.rows_track_min_users
        if (rows_track := pooled_weight(list(track), "embeddings", rows_min)) is not None:
            rows_weight, rows_source = rows_track, "track"
    return HeadState(train.window, train.end_us, config, np.asarray(item_ids, object), np.asarray(item_types, object),
                     np.asarray(vectors, np.float32), None if prior is None else prior[0], None if cold is None else cold[0],
                     None if structure is None else np.asarray(structure, np.float32), float(weight), float(temp), train,
                     calibration, 0.0 if prior is None else prior[1], 0.0 if cold is None else cold[1],
                     None if rows_weight is None else float(rows_weight), source, tuple(track), similarity, float(co_weight),
                     rows_source, _unit_rows(content))


def _unit_rows(x: np.ndarray | None) -> np.ndarray | None:
    """float32 rows scaled to unit norm (zero rows stay zero); None stays None."""
    if x is None:
        return None
    x = np.nan_to_num(np.asarray(x, np.float32))
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _matrix_column(x: np.ndarray | None, n: int) -> pa.Array:
    if x is None:
        return pa.nulls(n, pa.list_(pa.float32()))
    return pa.array(list(np.asarray(x, np.float32)), pa.list_(pa.float32()))


def write_head(folder: Path, state: HeadState) -> None:
    """The state's three files into `folder` (a staging folder)."""
    folder, n = Path(folder), state.n_items
    pq.write_table(pa.table({
        "entity_id": pa.array(list(state.item_ids), pa.string()), "entity_type": pa.array(list(state.item_types), pa.string()),
        "embedding": _matrix_column(state.vectors, n),
        "log_prior": pa.array(state.log_prior, pa.float32()) if state.log_prior is not None else pa.nulls(n, pa.float32()),
        "cold_log_prior": (pa.array(state.cold_log_prior, pa.float32()) if state.cold_log_prior is not None
                           else pa.nulls(n, pa.float32())),
        "structure": _matrix_column(state.structure, n), "content": _matrix_column(state.content, n)},
        schema=HEAD_ITEMS_SCHEMA), folder / f"{ITEMS_FILE}.parquet")
    h = state.history
    pq.write_table(pa.table({"user_id": pa.array(list(h.user_ids[h.user]), pa.string()),
                             "entity_id": pa.array(list(state.item_ids[h.item]), pa.string()),
                             "ts": pa.array(h.ts, pa.timestamp("us", tz="UTC")), "deep": pa.array(h.deep, pa.bool_())},
                            schema=HEAD_HISTORY_SCHEMA),
                   folder / f"{HISTORY_FILE}.parquet")
    if state.coengagement is not None:
        co = state.coengagement.tocoo()
        pq.write_table(pa.table({"item": pa.array(co.row.astype(np.int32)), "neighbour": pa.array(co.col.astype(np.int32)),
                                 "similarity": pa.array(co.data.astype(np.float32))}, schema=HEAD_COENGAGEMENT_SCHEMA),
                       folder / f"{COENGAGEMENT_FILE}.parquet")
    for ranker in state.rankers:
        (folder / RANKER_FILE.format(ranker.variant)).write_text(ranker.model)
    if state.examples is not None:
        pq.write_table(state.examples, folder / f"{EXAMPLES_FILE}.parquet")
    (folder / HEAD_FILE).write_text(json.dumps(state.summary(), indent=1) + "\n")


def _matrix(col: pa.ChunkedArray) -> np.ndarray:
    """(N, d) float32 of a list<float32> column whose rows all have d values."""
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float32)
    return np.ascontiguousarray(flat.reshape(len(col), -1)) if len(col) else np.zeros((0, 0), np.float32)


def _optional_matrix(col: pa.ChunkedArray) -> np.ndarray | None:
    return None if col.null_count == len(col) else _matrix(col)


def _optional_vector(col: pa.ChunkedArray) -> np.ndarray | None:
    return None if col.null_count == len(col) else col.to_numpy().astype(np.float32)


def read_head(folder: Path) -> HeadState:
    """The state `write_head` wrote; FileNotFoundError naming what is missing."""
    folder = Path(folder)
    require_files(folder, (f"{ITEMS_FILE}.parquet", f"{HISTORY_FILE}.parquet", HEAD_FILE), "ranking head")
    meta = json.loads((folder / HEAD_FILE).read_text())
    items = pq.read_table(folder / f"{ITEMS_FILE}.parquet")
    hist = pq.read_table(folder / f"{HISTORY_FILE}.parquet")
    for table, schema, name in ((items, HEAD_ITEMS_SCHEMA, ITEMS_FILE), (hist, HEAD_HISTORY_SCHEMA, HISTORY_FILE)):
        if not table.schema.equals(schema):
            raise ValueError(f"{folder / name}.parquet breaks the ranking head's contract (data_contracts.head): "
                             f"{table.schema} != {schema}")
    ids = np.asarray(items["entity_id"].to_pylist(), object)
    vectors = _matrix(items["embedding"])
    user_col = np.asarray(hist["user_id"].to_pylist(), object)
    user_ids, user = np.unique(user_col, return_inverse=True)
    item = np.searchsorted(ids, np.asarray(hist["entity_id"].to_pylist(), object))
    history = Interactions(meta["window"], int(meta["end_us"]), user_ids.astype(object), user.astype(np.int64), item.astype(np.int64),
                           hist["ts"].cast(pa.int64()).to_numpy(), hist["deep"].to_numpy(zero_copy_only=False).astype(bool),
                           len(ids))
    similarity = None
    if (folder / f"{COENGAGEMENT_FILE}.parquet").is_file():
        co = pq.read_table(folder / f"{COENGAGEMENT_FILE}.parquet")
        if not co.schema.equals(HEAD_COENGAGEMENT_SCHEMA):
            raise ValueError(f"{folder / COENGAGEMENT_FILE}.parquet breaks the ranking head's contract (data_contracts.head): "
                             f"{co.schema} != {HEAD_COENGAGEMENT_SCHEMA}")
        similarity = sp.csr_matrix((co["similarity"].to_numpy(), (co["item"].to_numpy(), co["neighbour"].to_numpy())),
                                   shape=(len(ids), len(ids)), dtype=np.float32)
    rankers = []
    for summary in meta.get("rankers", ()):
        path = folder / RANKER_FILE.format(summary["variant"])
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {folder / HEAD_FILE} names a {summary['variant']} ranker")
        rankers.append(Ranker.from_summary(summary, path.read_text()))
    cal = meta.get("calibration")
    calibration = None if cal is None else PriorCalibration(
        cal["weight"], {float(w): r for w, r in cal["recall"].items()}, cal["users"], cal["cut_us"])
    return HeadState(meta["window"], int(meta["end_us"]), HeadConfig.from_dict(meta["config"]), ids,
                     np.asarray(items["entity_type"].to_pylist(), object), np.ascontiguousarray(vectors, np.float32),
                     _optional_vector(items["log_prior"]), _optional_vector(items["cold_log_prior"]),
                     _optional_matrix(items["structure"]), float(meta["prior_weight"]), float(meta["temp"]), history, calibration,
                     float(meta["prior_floor"]), float(meta["cold_prior_floor"]), meta.get("embeddings_prior_weight"),
                     meta.get("prior_source", "fit" if calibration is not None else "config"),
                     tuple(TrackRecord.from_dict(r) for r in meta.get("track", ())), similarity,
                     float(meta.get("coengagement_weight", 0.0)),
                     meta.get("rows_source", "track" if meta.get("prior_source") == "track" else "head"),
                     _optional_matrix(items["content"]), tuple(rankers),
                     RankerConfig.from_dict(meta.get("ranker_config", {})), meta.get("ranker_note", "no ranker"),
                     read_examples(folder))


def read_examples(folder: Path) -> pa.Table | None:
    """The ranker examples a head published (None: none), checked against their contract."""
    path = Path(folder) / f"{EXAMPLES_FILE}.parquet"
    if not path.is_file():
        return None
    table = pq.read_table(path)
    check_examples(table, str(path))
    return table

