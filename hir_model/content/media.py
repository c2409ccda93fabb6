"""An entity's images and video: read them, hash them, decode them. No model code here.

`image_uri` and `video_uri` are local paths or `file://` URIs. A video is either a folder of frame images
(sorted by name) or a video file, which is decoded only where PyAV (`av`) is installed. Whatever cannot be
read becomes a `problem` (a message naming the entity) and that modality is skipped for the entity; it
never fails the window and never becomes a zero vector.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
from PIL import Image

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")


class MediaError(OSError):
    """A media URI that cannot be read here (missing file, unsupported scheme, undecodable bytes)."""


def local_path(uri: str) -> Path:
    """The local path a `file://` URI or a plain path names; other schemes raise MediaError."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise MediaError(f"{uri}: scheme {parsed.scheme!r} is not readable here (local paths and file:// only)")
    return Path(uri)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def _frames_of(folder: Path, max_frames: int) -> list[Path]:
    """Up to max_frames frame files of a folder, evenly spaced over its sorted listing."""
    frames = sorted(p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
    if len(frames) > max_frames:
        frames = [frames[i] for i in np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
    return frames


def has_pyav() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Media:
    """What one entity shows: its image bytes and its video frames (decoded lazily), with a content digest."""

    entity_id: str
    digest: str  # sha256 of everything below that is readable, or of the URIs where not: a fix re-embeds
    image: bytes | None = None
    frame_files: list[Path] = field(default_factory=list)  # a folder video's sampled frames
    video_file: Path | None = None  # a video file (decoded with PyAV)
    problems: list[str] = field(default_factory=list)

    @property
    def has_visual(self) -> bool:
        return self.image is not None or bool(self.frame_files) or self.video_file is not None


def read_media(entity_id: str, image_uri: str | None, video_uri: str | None, max_frames: int = 16,
               keep_bytes: bool = True) -> Media:
    """Read (and hash) an entity's image and video. `keep_bytes=False` hashes without holding the image."""
    parts: list[bytes] = []
    media = Media(entity_id, "")
    if image_uri:
        try:
            data = local_path(image_uri).read_bytes()
            parts += [b"image", data]
            media.image = data if keep_bytes else b""
        except OSError as exc:
            parts += [b"image-unreadable", image_uri.encode()]
            media.problems.append(f"{entity_id}: image {image_uri} unreadable ({exc}); image skipped")
    if video_uri:
        try:
            path = local_path(video_uri)
            if path.is_dir():
                media.frame_files = _frames_of(path, max_frames)
                parts += [b"frames"] + [p.name.encode() + p.read_bytes() for p in media.frame_files]
                if not media.frame_files:
                    media.problems.append(f"{entity_id}: video folder {video_uri} holds no frame images; video skipped")
            elif path.is_file():
                h = hashlib.sha256()
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                parts += [b"video-file", h.digest()]
                if has_pyav():
                    media.video_file = path
                else:
                    media.problems.append(f"{entity_id}: video file {video_uri} needs PyAV (`pip install av`) to be "
                                          "decoded; video skipped (image and text still used)")
            else:
                raise FileNotFoundError(f"no such file or folder: {path}")
        except OSError as exc:
            parts += [b"video-unreadable", video_uri.encode()]
            media.problems.append(f"{entity_id}: video {video_uri} unreadable ({exc}); video skipped")
    media.digest = _digest(*parts) if parts else ""
    return media


def decode_image(data: bytes) -> Image.Image:
    """RGB image from encoded bytes (PNG, JPEG, ...); MediaError when the bytes do not decode."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except Exception as exc:  # PIL raises many types for bad bytes
        raise MediaError(f"not a decodable image ({exc})") from exc


def video_frames(media: Media, max_frames: int = 16) -> Iterator[Image.Image]:
    """The sampled frames of the entity's video as RGB images."""
    for path in media.frame_files:
        yield decode_image(path.read_bytes())
    if media.video_file is not None:
        import av

        with av.open(str(media.video_file)) as container:
            total = container.streams.video[0].frames  # 0 when the container does not say
            keep = set(np.linspace(0, total - 1, max_frames).round().astype(int).tolist()) if total > max_frames else None
            frames = [f.to_image().convert("RGB") for i, f in enumerate(container.decode(video=0)) if keep is None or i in keep]
        if len(frames) > max_frames:
            frames = [frames[i] for i in np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
        yield from frames
