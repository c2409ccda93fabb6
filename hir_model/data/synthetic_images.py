"""Procedural product images for the synthetic source: the picture carries the planted interest.

Shape follows the coarse interest, colour the mid one, the fill pattern the fine one; position, size,
background, hue and pixel noise are random per product, and one image in ten gets a random pattern, so
the mapping is learnable but not exact.
"""

from __future__ import annotations

import colorsys
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "hexagon", "ring", "star")
PATTERNS = ("solid", "hstripes", "vstripes", "diagonal", "dots", "checker", "grid", "rings")
_IMAGE_TAG = 5


def _shape_mask(shape: str, size: int, cx: float, cy: float, r: float) -> np.ndarray:
    """(size, size) bool mask of the shape centred at (cx, cy) with radius r."""
    img = Image.new("L", (size, size), 0)
    d = ImageDraw.Draw(img)

    def poly(n: int, rot: float, radii: tuple[float, ...] = (1.0,)) -> list[tuple[float, float]]:
        a = rot + np.arange(n) * 2 * np.pi / n
        rr = np.resize(np.asarray(radii) * r, n)
        return list(zip(cx + rr * np.cos(a), cy + rr * np.sin(a)))

    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        d.ellipse(box, fill=255)
    elif shape == "square":
        d.rectangle((cx - 0.8 * r, cy - 0.8 * r, cx + 0.8 * r, cy + 0.8 * r), fill=255)
    elif shape == "triangle":
        d.polygon(poly(3, -np.pi / 2), fill=255)
    elif shape == "diamond":
        d.polygon(poly(4, 0.0), fill=255)
    elif shape == "cross":
        d.rectangle((cx - r, cy - 0.35 * r, cx + r, cy + 0.35 * r), fill=255)
        d.rectangle((cx - 0.35 * r, cy - r, cx + 0.35 * r, cy + r), fill=255)
    elif shape == "hexagon":
        d.polygon(poly(6, 0.0), fill=255)
    elif shape == "ring":
        d.ellipse(box, fill=255)
        d.ellipse((cx - 0.5 * r, cy - 0.5 * r, cx + 0.5 * r, cy + 0.5 * r), fill=0)
    else:  # star
        d.polygon(poly(10, -np.pi / 2, (1.0, 0.45)), fill=255)
    return np.asarray(img) > 127


def _pattern_mask(pattern: str, size: int, period: int, cx: float, cy: float) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size]
    half = max(1, period // 2)
    if pattern == "solid":
        return np.zeros((size, size), bool)
    if pattern == "hstripes":
        return (y % period) < half
    if pattern == "vstripes":
        return (x % period) < half
    if pattern == "diagonal":
        return ((x + y) % period) < half
    if pattern == "dots":
        return ((x % period) < half) & ((y % period) < half)
    if pattern == "checker":
        return ((x // half + y // half) % 2) == 0
    if pattern == "grid":
        return (x % period == 0) | (y % period == 0)
    return (np.hypot(x - cx, y - cy).astype(int) // half) % 2 == 0  # rings


def draw(seed: int, index: int, size: int, path: tuple[int, int, int], branching: tuple[int, int, int]) -> Image.Image:
    """The image of product `index` whose planted interest is path = (coarse, mid, fine) ids."""
    coarse, mid, fine = path
    rng = np.random.default_rng([seed, _IMAGE_TAG, index])
    n_mid = branching[0] * branching[1]
    fine_local = fine % branching[2]
    shape = SHAPES[coarse % len(SHAPES)]
    pattern = PATTERNS[fine_local % len(PATTERNS)] if rng.random() > 0.1 else PATTERNS[rng.integers(len(PATTERNS))]  # 10%: noise
    period = max(2, size // 8) * (1 + fine_local // len(PATTERNS))  # more fine interests than patterns: vary period

    hue = (mid / n_mid + rng.normal(0, 0.15 / n_mid)) % 1.0
    colour = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.65, 0.95), rng.uniform(0.7, 0.95))) * 255
    background = rng.uniform(200, 255, 3) * (1 - rng.uniform(0, 0.25))
    r = size * rng.uniform(0.28, 0.4)
    cx, cy = (size / 2 + rng.uniform(-0.12, 0.12, 2) * size)

    inside = _shape_mask(shape, size, cx, cy, r)
    stripes = inside & _pattern_mask(pattern, size, period, cx, cy)
    img = np.broadcast_to(background, (size, size, 3)).copy()  # (H, W, 3)
    img[inside] = colour
    img[stripes] = colour * 0.45
    img += rng.normal(0, 10, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def ensure(path: Path, seed: int, index: int, size: int, interest: tuple[int, int, int], branching: tuple[int, int, int]) -> bool:
    """Write the product's PNG at `path` unless it is already there (atomic). True when written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    draw(seed, index, size, interest, branching).save(tmp, format="PNG")
    os.replace(tmp, path)
    return True
