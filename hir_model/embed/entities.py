"""Embed every entity known by the window end with the window's `TrainedModel` (its teacher's view at cutoff = window end).

Warm entities (at least one edge of any type at the cutoff: an engagement, a parent, a relation) are embedded from their
sampled neighbourhood in the view the checkpoint's teacher was trained on (`trained_view`: the prototypes were fitted on
it; a larger view costs more and shifts the embeddings away from them). Warm users may instead be embedded on the
student's view (`EmbedConfig.users = "narrow"`, without its edge drop): the engagement term trains a user's vector on
that view against its entities' (MovieLens's setting, hir.toml [embed.movielens]: docs/decisions.md). Cold-start entities (no edge yet) are embedded from a
single-token sequence: their own token only, i.e. content vector + type (+ the id's deep-hash code, which for an id the
model never trained on is just a fixed offset), and flagged `cold_start`; cold-start products with content are then
placed among the warm products nearest in content instead (`new_items`, hir_model.embed.content_map). Inference runs under `torch.inference_mode` with the encoder's automatic
backend choice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace

import numpy as np
import pyarrow as pa
import torch

from hir_model.content import to_matrix
from hir_model.embed.content_map import check_path, fit_placer
from hir_model.graph.csr import IS_ENGAGEMENT, Graph
from hir_model.graph.sampler import ViewConfig, sample
from hir_model.graph.types import NODE_TYPES, SELF_EDGE, SampledBatch
from hir_model.nn import collate
from hir_model.train.checkpoint import TrainedModel
from hir_model.train.config import TRAIN_BROAD, TRAIN_NARROW

EMBEDDED_TYPES = ("user", "product", "advertiser", "campaign")
EMBEDDINGS_ASSET, EMBEDDINGS_FILE = "entity_embeddings", "embeddings"  # the asset and its published table


def embeddings_schema(dim: int) -> pa.Schema:
    """The published `entity_embeddings` table (DESIGN.md section 2, plus `cold_start`); move to data_contracts/schemas.py."""
    return pa.schema([
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32(), dim), nullable=False),  # unit L2 norm
        pa.field("cold_start", pa.bool_(), nullable=False),  # no edge by the window end: embedded from content + type only
    ])


USER_VIEWS = ("broad", "narrow")  # EmbedConfig.users: the views warm users can be embedded on
DEFAULT_VIEW = TRAIN_BROAD  # for checkpoints without a train_config: TrainConfig's default teacher view, <= 105 tokens


def trained_view(extra: dict, which: str = "broad") -> ViewConfig:
    """The view (`which`: "broad", the teacher's, or "narrow", the student's) a checkpoint was trained with: its
    `extra["train_config"][which]` (a ViewConfig as a dict); TrainConfig's default when the checkpoint carries no
    train_config (e.g. one written by `save_checkpoint` alone)."""
    if which not in USER_VIEWS:
        raise ValueError(f"a checkpoint's view is one of {USER_VIEWS}, got {which!r}")
    got = (extra or {}).get("train_config", {}).get(which)
    if not got:
        return DEFAULT_VIEW if which == "broad" else TRAIN_NARROW
    return ViewConfig(**{**got, "fanout": tuple(got["fanout"])})


def user_view(extra: dict) -> ViewConfig:
    """The student's view of a checkpoint as warm users are embedded on it (`users = "narrow"`): every edge of that
    view's horizon kept (its edge drop is training noise)."""
    return replace(trained_view(extra, "narrow"), edge_drop=0.0)


@dataclass(frozen=True)
class EmbedConfig:
    view: ViewConfig | None = None  # warm entities' neighbourhood view; None: the checkpoint's (embed_window), else DEFAULT_VIEW
    users: str = "broad"  # warm users' view: "broad" (`view`, as every entity) or "narrow" (the checkpoint's student view)
    user_view: ViewConfig | None = None  # with users = "narrow": that view (embed_window resolves it; None: `view`)
    batch_size: int = 256  # seeds per forward; the default view has up to 1 + 8 + 32 + 64 tokens per seed
    cold_batch_size: int = 4096  # single-token sequences per forward
    sort_chunk: int = 4096  # seeds sampled at once, then batched by sequence length (bounds the sampled tokens in memory)
    seed: int = 0  # the sampler's rng: the same inputs give the same embeddings
    entity_types: tuple[str, ...] = EMBEDDED_TYPES
    new_items: str = "neighbours"  # cold-start products with content: placed among the warm products nearest in content
    # ("neighbours"), through a ridge map ("content_map"; hir_model.embed.content_map) or by the single token ("encoder")

    def __post_init__(self) -> None:
        if self.users not in USER_VIEWS:
            raise ValueError(f"EmbedConfig.users must be one of {USER_VIEWS}, got {self.users!r}")
        check_path(self.new_items, "EmbedConfig")

    @property
    def warm_user_view(self) -> ViewConfig | None:
        """The view warm users are embedded on where it is not `view` (users = "narrow" with its view resolved)."""
        return self.user_view if self.users == "narrow" else None


def embed_defaults(overrides: dict | None = None) -> EmbedConfig:
    """EmbedConfig with hir.toml's [embed] / [embed.<source>] fields over its defaults (HIRConfig.embed)."""
    own = {f.name for f in fields(EmbedConfig)} - {"view", "user_view"}
    bad = sorted(set(overrides or {}) - own)
    if bad:
        raise ValueError(f"hir.toml [embed]: unknown fields {bad}; EmbedConfig has {sorted(own)}")
    return EmbedConfig(**dict(overrides or {}))


@dataclass(frozen=True)
class EntityEmbeddings:
    entity_id: np.ndarray  # object [N] str
    entity_type: np.ndarray  # object [N] str
    vectors: np.ndarray  # float32 [N, W], unit rows
    cold_start: np.ndarray  # bool [N]
    node: np.ndarray  # int64 [N], the graph's node index
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.entity_id)

    def rows(self, ids) -> np.ndarray:
        """int64 [n]: the row of each id, -1 where it has none."""
        lookup = {e: i for i, e in enumerate(self.entity_id)}
        return np.array([lookup.get(e, -1) for e in ids], np.int64)


def visible_degree(graph: Graph, cutoff_us: int, engagement_only: bool = False) -> np.ndarray:
    """int64 [N]: edges of each node with last_ts <= cutoff (every type, or engagement edges only)."""
    visible = np.asarray(graph.last_ts) <= cutoff_us
    if engagement_only:
        visible &= IS_ENGAGEMENT[np.asarray(graph.edge_type, np.int64)]
    return np.bincount(graph.src()[visible], minlength=graph.num_nodes)


def _content_lookup(graph: Graph, content: pa.Table | None, dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(matrix [M, C] float32, row [N] int64 node -> matrix row or -1) when the encoder reads content, else None."""
    if dim == 0 or content is None:
        return None
    matrix, valid = to_matrix(content.column("embedding"))
    if matrix.shape[1] != dim:
        raise ValueError(f"content vectors have {matrix.shape[1]} dims, the encoder expects {dim}")
    rows = graph.nodes.index_of(content.column("entity_id"))  # (M,) node of each content row
    node_row = np.full(graph.num_nodes, -1, np.int64)
    keep = (rows >= 0) & valid
    node_row[rows[keep]] = np.nonzero(keep)[0]
    return np.nan_to_num(matrix, copy=False), node_row  # in place: at 550k entities a copy is another GB


def _with_content(batch: SampledBatch, lookup: tuple[np.ndarray, np.ndarray] | None, graph: Graph | None = None,
                  structure_dim: int = 0) -> SampledBatch:
    """`batch` with its tokens' content (`lookup`) and, when the encoder reads them, structural encodings of `graph`."""
    if structure_dim and graph is not None:
        batch = replace(batch, structure=graph.structure_at(batch.node, batch.cutoff_us, structure_dim))
    if lookup is None:
        return batch
    matrix, node_row = lookup
    row = node_row[batch.node]  # (T,)
    has = row >= 0
    return replace(batch, content=matrix[np.where(has, row, 0)], has_content=has)


def single_token_batch(graph: Graph, seeds: np.ndarray, cutoff_us: int) -> SampledBatch:
    """One sequence per seed holding only the seed's token (depth 0, no edges): content + type + id code."""
    b = len(seeds)
    return SampledBatch(
        offsets=np.arange(b + 1, dtype=np.int64), seeds=seeds, node=seeds, hash_codes=np.asarray(graph.nodes.hash_codes)[seeds],
        node_type=np.asarray(graph.nodes.node_type, np.int64)[seeds], depth=np.zeros(b, np.int64),
        ancestors=np.zeros((b, 1), np.int64), edge_type=np.full(b, SELF_EDGE, np.int64), edge_age=np.zeros(b, np.float32),
        cutoff_us=int(cutoff_us))  # no strength: the cold-start path knows an entity's id, type and content only


def take_sequences(batch: SampledBatch, idx: np.ndarray) -> SampledBatch:
    """The sequences `idx` of `batch`, in that order (ancestors are local to a sequence, so they stay valid)."""
    lengths = batch.lengths[idx]  # (b,)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)  # (b+1,)
    tok = np.arange(offsets[-1]) + np.repeat(batch.offsets[:-1][idx] - offsets[:-1], lengths)  # (T',) source token of each
    return batch.take_tokens(tok, offsets=offsets, seeds=batch.seeds[idx])


def length_sorted_batches(graph: Graph, seeds: np.ndarray, cutoff_us: int, view: ViewConfig, config: EmbedConfig,
                          rng: np.random.Generator):
    """Yield (positions in `seeds` [b], batch): `config.sort_chunk` seeds sampled at a time, each chunk's sequences sorted
    by length and cut into batches of `config.batch_size`. A batch pads to its longest sequence and attention costs
    ~B x N x (N + globals), so batching similar lengths together saves most of the padding (2048 MovieLens seeds, one
    thread: 13.4 s of encoding in seed order, 6.0 s sorted)."""
    for lo in range(0, len(seeds), config.sort_chunk):
        chunk = sample(graph, seeds[lo:lo + config.sort_chunk], cutoff_us, view, rng)
        order = np.argsort(chunk.lengths, kind="stable")
        for i in range(0, len(order), config.batch_size):
            idx = order[i:i + config.batch_size]
            yield lo + idx, take_sequences(chunk, idx)


@torch.inference_mode()
def _encode(model: TrainedModel, batches, lookup, out: np.ndarray, graph: Graph | None = None) -> None:
    """Write each batch's seed embeddings into `out` [n, W] at its positions; `batches` yields (positions [b], batch)."""
    glob = getattr(model, "global_tokens", None)  # (G, W) prototypes as global tokens, as in training (None: none)
    dim = model.encoder.cfg.structure_dim
    for pos, b in batches:
        out[pos] = model.encoder(collate(_with_content(b, lookup, graph, dim)), glob).float().cpu().numpy()  # (b, W)


def embed_entities(model: TrainedModel, graph: Graph, cutoff_us: int, content: pa.Table | None = None,
                   config: EmbedConfig = EmbedConfig()) -> EntityEmbeddings:
    """Embed every node of an embedded type first seen before `cutoff_us` (the window end)."""
    start = time.perf_counter()
    types = np.asarray(graph.nodes.node_type, np.int64)
    wanted = np.isin(types, [NODE_TYPES.index(t) for t in config.entity_types])
    nodes = np.nonzero(wanted & (np.asarray(graph.nodes.first_seen_us) < cutoff_us))[0].astype(np.int64)
    cold = visible_degree(graph, cutoff_us)[nodes] == 0
    lookup = _content_lookup(graph, content, model.encoder.cfg.content_dim)
    vectors = np.zeros((len(nodes), model.encoder.cfg.width), np.float32)
    view = config.view or DEFAULT_VIEW
    users = config.warm_user_view or view
    is_user = types[nodes] == NODE_TYPES.index("user")
    groups = [(~cold, view)] if users == view else [(~cold & ~is_user, view), (~cold & is_user, users)]
    for mask, seen in groups:  # warm entities, one sampler pass per view
        rows = np.nonzero(mask)[0]
        warm = length_sorted_batches(graph, nodes[rows], cutoff_us, seen, config, np.random.default_rng(config.seed))
        _encode(model, ((rows[pos], b) for pos, b in warm), lookup, vectors, graph)
    cold_rows = np.nonzero(cold)[0]
    chunks = [cold_rows[i:i + config.cold_batch_size] for i in range(0, len(cold_rows), config.cold_batch_size)]
    _encode(model, ((rows, single_token_batch(graph, nodes[rows], cutoff_us)) for rows in chunks), lookup, vectors)
    ids = np.asarray(graph.nodes.entity_id.take(pa.array(nodes)).to_numpy(zero_copy_only=False), object)
    emb = EntityEmbeddings(ids, np.array([NODE_TYPES[t] for t in types[nodes]], object), vectors, cold, nodes, 0.0)
    if config.new_items != "encoder" and lookup is not None:
        _place_cold_products(emb, content, lookup, config.new_items)
    return replace(emb, seconds=time.perf_counter() - start)


def _place_cold_products(emb: EntityEmbeddings, content: pa.Table, lookup: tuple[np.ndarray, np.ndarray], new_items: str) -> None:
    """Cold-start products with content take their content's place in the window's space (hir_model.embed.content_map),
    in place; without a fit (too few warm products with content) they keep the single token."""
    matrix, node_row = lookup
    row = node_row[emb.node]  # (N,) content row of each entity, -1 for none
    target = np.flatnonzero(emb.cold_start & (emb.entity_type == "product") & (row >= 0))
    placer = fit_placer(new_items, emb, content) if len(target) else None
    if placer is not None:
        emb.vectors[target] = placer(matrix[row[target]])


def embeddings_table(emb: EntityEmbeddings) -> pa.Table:
    dim = emb.vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(emb.vectors, np.float32).reshape(-1))
    return pa.table([pa.array(list(emb.entity_id), pa.string()), pa.array(list(emb.entity_type), pa.string()),
                     pa.FixedSizeListArray.from_arrays(flat, dim), pa.array(emb.cold_start, pa.bool_())],
                    schema=embeddings_schema(dim))


def read_embeddings(table: pa.Table) -> EntityEmbeddings:
    """The published table back as arrays (node indices are not published: -1)."""
    vectors, _ = to_matrix(table.column("embedding"))
    n = table.num_rows
    return EntityEmbeddings(np.asarray(table.column("entity_id").to_pylist(), object),
                            np.asarray(table.column("entity_type").to_pylist(), object), vectors,
                            np.asarray(table.column("cold_start").to_pylist(), bool), np.full(n, -1, np.int64))
