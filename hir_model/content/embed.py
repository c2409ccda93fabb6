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


def _vectors(mat: np.ndarray, valid: np.ndarray) -> pa.Array:
    if mat.shape[1] == 0:  # no image tower: a zero-width column, all null
        return pa.nulls(len(mat), pa.list_(pa.float32(), 0))
    flat = pa.array(np.where(valid[:, None], mat, 0).astype(np.float32).reshape(-1))  # hidden behind the null bitmap
    return pa.FixedSizeListArray.from_arrays(flat, mat.shape[1], mask=pa.array(~valid))


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
    """Per-row vectors being assembled, and what still has to be encoded."""

    text: np.ndarray  # (N, Dt) float32, NaN where not (yet) known
    image: np.ndarray  # (N, Di)
    text_ok: np.ndarray  # (N,) bool
    image_ok: np.ndarray  # (N,) bool
    need_text: np.ndarray  # (N,) bool: encode this row's text
    need_image: np.ndarray  # (N,) bool: encode this row's image / video
    status: np.ndarray  # (N,) int8: 0 new, 1 changed, 2 an encoder version changed (or forced), 3 reused


def _reuse(slots: _Slots, previous: pa.Table, ids: list, hashes: list, versions: dict[str, str], tower: bool) -> None:
    """Take every vector the previous table holds for the same content and the same encoder version."""
    where = {e: j for j, e in enumerate(previous.column("entity_id").to_pylist())}
    prev_hash = previous.column("content_hash").to_pylist()
    prev_version = [parse_version(v) for v in previous.column("encoder_version").to_pylist()]
    p_text, p_text_ok = to_matrix(previous.column("text_embedding"))
    p_image, p_image_ok = to_matrix(previous.column("image_embedding"))
    text_fits, image_fits = p_text.shape[1] == slots.text.shape[1], tower and p_image.shape[1] == slots.image.shape[1]
    for i, eid in enumerate(ids):
        j = where.get(eid)
        if j is None:
            continue
        if prev_hash[j] != hashes[i]:
            slots.status[i] = 1
            continue
        if text_fits and prev_version[j].get("text") == versions["text"] and slots.need_text[i] and p_text_ok[j]:
            slots.text[i], slots.text_ok[i], slots.need_text[i] = p_text[j], True, False
        if image_fits and prev_version[j].get("image") == versions["image"]:  # the row's outcome, image or none
            slots.image[i], slots.image_ok[i], slots.need_image[i] = p_image[j], p_image_ok[j], False
        slots.status[i] = 2 if slots.need_text[i] or slots.need_image[i] else 3


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
    slots = _Slots(np.full((n, dt), np.nan, np.float32), np.full((n, di), np.nan, np.float32), np.zeros(n, bool),
                   np.zeros(n, bool), np.array([t is not None for t in texts], bool), visual & tower, np.zeros(n, np.int8))
    if previous is not None and force:
        slots.status[np.isin(np.asarray(ids, object), np.asarray(previous.column("entity_id").to_pylist(), object))] = 2
    elif previous is not None:
        _reuse(slots, previous, ids, hashes, encoders.versions, tower)

    rows = np.flatnonzero(slots.need_text)
    if len(rows):
        progress = (lambda done, total: on_progress("text", done, total)) if on_progress else None
        slots.text[rows], slots.text_ok[rows] = encoders.text.encode([texts[r] for r in rows], progress), True
    rows = np.flatnonzero(slots.need_image)
    if len(rows):
        _encode_visuals(rows, image_uris, video_uris, ids, encoders.image, cfg.image.max_frames, slots.image, slots.image_ok,
                        problems, on_progress)
    fused, valid = fuse(slots.text, slots.text_ok, slots.image, slots.image_ok, cfg.fusion)

    table = pa.Table.from_arrays([
        catalog.column("entity_id"), catalog.column("entity_type"), _vectors(fused, valid), _vectors(slots.text, slots.text_ok),
        _vectors(slots.image, slots.image_ok), pa.array(slots.text_ok), pa.array(slots.image_ok), pa.array(hashes, pa.string()),
        pa.array([encoders.version] * n, pa.string()),
    ], schema=content_schema(dt, di, encoders.fused_dim))
    new, changed, version_changed, reused = (int(c) for c in np.bincount(slots.status, minlength=4))
    return ContentBuild(table, encoders.version, encoders.weights, new, changed, version_changed, reused,
                        int(slots.need_text.sum()), int(slots.need_image.sum()), int((~valid).sum()),
                        int((visual & ~tower).sum()),
                        {"embedding": encoders.fused_dim, "text_embedding": dt, "image_embedding": di},
                        problems[:MAX_PROBLEMS], len(problems), time.perf_counter() - t0)


def embed_window(catalog: pa.Table, config: ContentConfig, clip_checkpoint: Path | None = None,
                 previous: pa.Table | None = None, on_progress: Progress | None = None, force: bool = False) -> ContentBuild:
    """Load the configured encoders and embed a window's catalogue (what the content_embeddings asset runs)."""
    return embed_catalog(catalog, load_encoders(config, clip_checkpoint), previous, on_progress, force)
