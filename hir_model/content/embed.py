"""Content vectors for every catalogue entity, incremental across windows.

Per entity: a content hash of its text and its image/video bytes. An entity whose hash and encoder
versions match the previous window's row reuses that row's vectors; a new or changed entity is embedded;
a modality whose encoder version changed is re-embedded for everyone (the other modality is reused).
The fused vector is always recomputed from the per-modality vectors (a matrix product).

The published table (`content_schema`): entity_id, entity_type, embedding (fused, null when the entity has
neither text nor image), text_embedding, image_embedding (null where that modality is missing), has_text,
has_image, content_hash, encoder_version (`text=<v>;image=<v>;fusion=<v>`: the weights behind the row).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.content.entity_text import entity_texts
from hir_model.content.fusion import FusionConfig, fuse
from hir_model.content.image import ImageEncoder, ImageEncoderConfig, load_image_encoder
from hir_model.content.media import MediaError, decode_image, read_media, video_frames
from hir_model.content.text import TextEncoder, TextEncoderConfig
from hir_model.content.vectors import to_matrix  # noqa: F401  (re-exported: the package's public API)

Progress = Callable[[str, int, int], None]  # (stage "text" | "image", done, total)
MAX_PROBLEMS = 50  # problems kept verbatim (the count is always exact)


@dataclass(frozen=True)
class ContentConfig:
    text: TextEncoderConfig = TextEncoderConfig()
    image: ImageEncoderConfig = ImageEncoderConfig()
    fusion: FusionConfig = FusionConfig()
    listed_products: int = 10  # advertisers' text lists this many of their first products' titles
    # Entity types whose text is embedded. Users and KG entities are known by their edges (the graph carries
    # them); MovieLens has 32k KG nodes whose only text is "actor fb:m.x. Films: ...", which cost 20x the
    # embedding time of the ad entities and tell the encoder nothing the relations do not.
    text_types: tuple[str, ...] = ("advertiser", "product", "service", "campaign")


def content_schema(text_dim: int, image_dim: int, fused_dim: int) -> pa.Schema:
    vec = lambda d: pa.list_(pa.float32(), d)  # noqa: E731
    return pa.schema([
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("entity_type", pa.string(), nullable=False),
        pa.field("embedding", vec(fused_dim)),  # null: the entity has neither text nor image
        pa.field("text_embedding", vec(text_dim)),  # null: no text
        pa.field("image_embedding", vec(image_dim)),  # null: no readable image/video, or no image tower
        pa.field("has_text", pa.bool_(), nullable=False),
        pa.field("has_image", pa.bool_(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("encoder_version", pa.string(), nullable=False),
    ])


@dataclass
class Encoders:
    """The loaded towers and the fusion: together they define the version of every vector."""

    config: ContentConfig
    text: TextEncoder
    image: ImageEncoder | None  # None: no image tower (no images in the catalogue, or configured off)

    @property
    def image_dim(self) -> int:
        return self.image.dim if self.image else 0

    @property
    def fused_dim(self) -> int:
        return self.config.fusion.width(self.text.dim, self.image_dim)

    @property
    def versions(self) -> dict[str, str]:
        return {"text": self.text.version, "image": self.image.version if self.image else "none",
                "fusion": self.config.fusion.version(self.text.dim, self.image_dim)}

    @property
    def version(self) -> str:
        return ";".join(f"{k}={v}" for k, v in self.versions.items())

    @property
    def weights(self) -> dict[str, str]:
        return {"text": self.text.weights, "image": self.image.weights if self.image else "none (no image tower)",
                "fusion": f"fixed orthogonal projections {self.versions['fusion']}"}


def load_encoders(config: ContentConfig, clip_checkpoint: Path | None = None) -> Encoders:
    return Encoders(config, TextEncoder(config.text), load_image_encoder(config.image, clip_checkpoint))


def parse_version(version: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in version.split(";") if "=" in part)


@dataclass(frozen=True)
class ContentBuild:
    table: pa.Table  # content_schema rows, in catalogue order
    version: str  # the encoder version of every row
    weights: dict[str, str]  # modality -> the weights that produced its vectors
    new: int  # entities absent from the previous table: embedded
    changed: int  # content hash differs from the previous row: re-embedded
    version_changed: int  # same content, an encoder version changed: that modality re-embedded
    reused: int  # every vector taken from the previous table
    texts_encoded: int
    visuals_encoded: int  # entities whose image / video frames went through the image tower
    no_content: int  # entities with neither text nor image: no vector (null), by design
    visual_without_tower: int  # entities with images while no image tower is loaded
    dims: dict[str, int]  # vector column -> the width the encoders produce
    problems: list[str] = field(default_factory=list)  # unreadable media, skipped videos (first MAX_PROBLEMS)
    n_problems: int = 0
    seconds: float = 0.0

    @property
    def embedded(self) -> int:
        return self.new + self.changed + self.version_changed

    @property
    def entities_per_s(self) -> float:
        return self.embedded / max(self.seconds, 1e-9)


def _content_hash(text: str | None, media_digest: str) -> str:
    return hashlib.sha256(f"{text if text is not None else chr(0)}\x1f{media_digest}".encode()).hexdigest()[:32]


def _encode_visuals(rows: np.ndarray, image_uris: list, video_uris: list, ids: list, encoder: ImageEncoder,
                    max_frames: int, out: np.ndarray, ok: np.ndarray, problems: list[str],
                    on_progress: Progress | None) -> None:
    """Embed the rows' images and videos into out[rows] (unit), ok[row] where at least one decoded; batched."""
    chunk = max(encoder.batch_size, 1)
    for start in range(0, len(rows), chunk):
        owners, items, pictures = [], [], []  # per picture: entity row, item (0 image, 1 video), PIL image
        for r in rows[start:start + chunk]:
            media = read_media(ids[r], image_uris[r], video_uris[r], max_frames)  # (its read problems: the hash pass's)
            if media.image:
                try:
                    pictures.append(decode_image(media.image))
                    owners.append(r), items.append(0)
                except MediaError as exc:
                    problems.append(f"{ids[r]}: image {image_uris[r]} {exc}; image skipped")
            try:
                for frame in video_frames(media, max_frames):
                    pictures.append(frame), owners.append(r), items.append(1)
            except (MediaError, OSError, ImportError) as exc:
                problems.append(f"{ids[r]}: video {video_uris[r]} could not be decoded ({exc}); video skipped")
        if pictures:
            vecs = encoder.encode(pictures)  # (P, Di)
            owners_a, items_a = np.asarray(owners), np.asarray(items)
            for r in np.unique(owners_a):
                groups = [(owners_a == r) & (items_a == k) for k in (0, 1)]  # its image, its video frames
                parts = [vecs[g].mean(0) for g in groups if g.any()]
                pooled = np.mean([p / np.linalg.norm(p) for p in parts], axis=0)  # image and video count equally
                out[r], ok[r] = pooled / np.linalg.norm(pooled), True
        if on_progress:
            on_progress("image", min(start + chunk, len(rows)), len(rows))


def _hash_pass(ids: list, texts: list, image_uris: list, video_uris: list, max_frames: int) -> tuple[list, np.ndarray, list]:
    """(content hash per row, (N,) bool readable image/video, media problems). Reads media bytes, keeps none."""
    hashes, visual, problems = [], np.zeros(len(ids), bool), []
    for i, eid in enumerate(ids):
        digest = ""
        if image_uris[i] or video_uris[i]:
            media = read_media(eid, image_uris[i], video_uris[i], max_frames, keep_bytes=False)
            digest, visual[i] = media.digest, media.has_visual
            problems += media.problems
        hashes.append(_content_hash(texts[i], digest))
    return hashes, visual, problems


@dataclass
class _Slots:
    """Vectors being assembled for the content rows (rows with text or a readable image/video), and what to encode.

    Only content rows get vector slots: at the `large` synthetic preset 300k of 550k entities are users without text
    or images, whose vectors are null; the published columns are filled once, at the end (`_scatter`)."""

    rows: np.ndarray  # (C,) int64 catalogue row of each content row
    text: np.ndarray  # (C, Dt) float32, NaN where not (yet) known
    image: np.ndarray  # (C, Di)
    text_ok: np.ndarray  # (C,) bool
    image_ok: np.ndarray  # (C,) bool
    need_text: np.ndarray  # (C,) bool: encode this row's text
    need_image: np.ndarray  # (C,) bool: encode this row's image / video
    status: np.ndarray  # (N,) int8 over every catalogue row: 0 new, 1 changed, 2 an encoder version changed (or forced), 3 reused


REUSED_COLUMNS = ["entity_id", "content_hash", "encoder_version", "text_embedding", "image_embedding"]  # what _reuse reads


def _take_matrix(column: pa.ChunkedArray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """to_matrix of only `rows` of a vector column: ((R, D) float32, (R,) valid), without converting the other rows."""
    return to_matrix(column.take(pa.array(rows, pa.int64())))


def _reuse(slots: _Slots, previous: pa.Table, ids: pa.ChunkedArray, hashes: list, versions: dict[str, str], tower: bool) -> None:
    """Take every vector the previous table holds for the same content and the same encoder version."""
    where = pc.index_in(ids, value_set=previous.column("entity_id")).to_numpy(zero_copy_only=False)  # (N,) float, NaN: absent
    known = ~np.isnan(where)
    j = np.where(known, where, 0).astype(np.int64)  # (N,) previous row
    prev_hash = np.asarray(previous.column("content_hash").to_pylist(), object)
    same = known & (prev_hash[j] == np.asarray(hashes, object))  # (N,)
    slots.status[known & ~same] = 1
    versions_of = pc.dictionary_encode(previous.column("encoder_version").combine_chunks())  # usually one for every row
    code = versions_of.indices.to_numpy(zero_copy_only=False)
    parsed = [parse_version(v) for v in versions_of.dictionary.to_pylist()]
    text_dim = previous.schema.field("text_embedding").type.list_size
    image_dim = previous.schema.field("image_embedding").type.list_size
    text_fits, image_fits = text_dim == slots.text.shape[1], tower and image_dim == slots.image.shape[1]
    reusable = same[slots.rows]  # (C,)
    at = j[slots.rows]  # (C,) previous row of each content row
    same_text = np.array([p.get("text") == versions["text"] for p in parsed], bool)[code[at]]  # (C,)
    same_image = np.array([p.get("image") == versions["image"] for p in parsed], bool)[code[at]]
    take = np.flatnonzero(reusable & same_text & slots.need_text) if text_fits else np.zeros(0, np.int64)
    if len(take):
        vec, ok = _take_matrix(previous.column("text_embedding"), at[take])
        take, vec = take[ok], vec[ok]  # a previous row without a text vector is encoded again
        slots.text[take], slots.text_ok[take], slots.need_text[take] = vec, True, False
    take = np.flatnonzero(reusable & same_image) if image_fits else np.zeros(0, np.int64)
    if len(take):  # the row's outcome, image or none
        slots.image[take], slots.image_ok[take] = _take_matrix(previous.column("image_embedding"), at[take])
        slots.need_image[take] = False
    slots.status[same] = 3
    redo = slots.rows[reusable & (slots.need_text | slots.need_image)]
    slots.status[redo] = 2


def _scatter(n: int, rows: np.ndarray, mat: np.ndarray, ok: np.ndarray) -> pa.Array:
    """A vector column over all n catalogue rows from the content rows' (C, D) vectors; null elsewhere and where not ok."""
    if mat.shape[1] == 0:  # no image tower: a zero-width column, all null
        return pa.nulls(n, pa.list_(pa.float32(), 0))
    full = np.zeros((n, mat.shape[1]), np.float32)  # (N, D): zeros hidden behind the null bitmap; Arrow wraps it, no copy
    full[rows[ok]] = mat[ok]
    return pa.FixedSizeListArray.from_arrays(pa.array(full.reshape(-1)), mat.shape[1], mask=pa.array(~_spread(n, rows, ok)))


def embed_catalog(catalog: pa.Table, encoders: Encoders, previous: pa.Table | None = None,
                  on_progress: Progress | None = None, force: bool = False) -> ContentBuild:
    """Content vectors for every catalogue row; vectors of unchanged entities come from `previous`."""
    t0 = time.perf_counter()
    cfg, n, dt, di = encoders.config, catalog.num_rows, encoders.text.dim, encoders.image_dim
    ids = catalog.column("entity_id").to_pylist()
    image_uris, video_uris = catalog.column("image_uri").to_pylist(), catalog.column("video_uri").to_pylist()
    types = catalog.column("entity_type").to_pylist()
    texts = [t if kind in cfg.text_types else None for t, kind in zip(entity_texts(catalog, cfg.listed_products), types)]
    hashes, visual, problems = _hash_pass(ids, texts, image_uris, video_uris, cfg.image.max_frames)
    tower = encoders.image is not None
    has_text = np.array([t is not None for t in texts], bool)
    rows = np.flatnonzero(has_text | (visual & tower))  # (C,) the rows that can get a vector
    c = len(rows)
    slots = _Slots(rows, np.full((c, dt), np.nan, np.float32), np.full((c, di), np.nan, np.float32), np.zeros(c, bool),
                   np.zeros(c, bool), has_text[rows], (visual & tower)[rows], np.zeros(n, np.int8))
    if previous is not None and force:
        slots.status[pc.is_in(catalog.column("entity_id"), value_set=previous.column("entity_id")).to_numpy(zero_copy_only=False)] = 2
    elif previous is not None:
        _reuse(slots, previous, catalog.column("entity_id"), hashes, encoders.versions, tower)

    todo = np.flatnonzero(slots.need_text)
    if len(todo):
        progress = (lambda done, total: on_progress("text", done, total)) if on_progress else None
        slots.text[todo], slots.text_ok[todo] = encoders.text.encode([texts[r] for r in rows[todo]], progress), True
    todo = np.flatnonzero(slots.need_image)
    if len(todo):
        _encode_visuals(todo, [image_uris[r] for r in rows], [video_uris[r] for r in rows], [ids[r] for r in rows],
                        encoders.image, cfg.image.max_frames, slots.image, slots.image_ok, problems, on_progress)
    fused, valid = fuse(slots.text, slots.text_ok, slots.image, slots.image_ok, cfg.fusion)  # (C, D), (C,)

    table = pa.Table.from_arrays([
        catalog.column("entity_id"), catalog.column("entity_type"), _scatter(n, rows, fused, valid),
        _scatter(n, rows, slots.text, slots.text_ok), _scatter(n, rows, slots.image, slots.image_ok),
        pa.array(_spread(n, rows, slots.text_ok)), pa.array(_spread(n, rows, slots.image_ok)), pa.array(hashes, pa.string()),
        pa.array([encoders.version] * n, pa.string()),
    ], schema=content_schema(dt, di, encoders.fused_dim))
    new, changed, version_changed, reused = (int(k) for k in np.bincount(slots.status, minlength=4))
    return ContentBuild(table, encoders.version, encoders.weights, new, changed, version_changed, reused,
                        int(slots.need_text.sum()), int(slots.need_image.sum()), n - int(valid.sum()),
                        int((visual & ~tower).sum()),
                        {"embedding": encoders.fused_dim, "text_embedding": dt, "image_embedding": di},
                        problems[:MAX_PROBLEMS], len(problems), time.perf_counter() - t0)


def _spread(n: int, rows: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """(N,) bool: the content rows' flags, False on every other row."""
    out = np.zeros(n, bool)
    out[rows] = flags
    return out


def embed_window(catalog: pa.Table, config: ContentConfig, clip_checkpoint: Path | None = None,
                 previous: pa.Table | None = None, on_progress: Progress | None = None, force: bool = False) -> ContentBuild:
    """Load the configured encoders and embed a window's catalogue (what the content_embeddings asset runs)."""
    return embed_catalog(catalog, load_encoders(config, clip_checkpoint), previous, on_progress, force)
