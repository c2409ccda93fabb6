"""Deep-hash ids (DHE): every node id maps to k integer codes, the same on every run and machine.

The encoder turns the codes into a dense vector with an MLP, so no table anywhere is sized by the
vocabulary: a new id needs no new row. Codes come from BLAKE2b (hashlib, part of every CPython): one
64-byte digest of the id's UTF-8 bytes gives 8 independent 64-bit words; k > 8 uses further digests
with a different `person` (BLAKE2's domain separation). Each word is read little-endian, then taken
modulo `buckets`. Nothing depends on the platform's byte order, PYTHONHASHSEED or numpy's RNG.

The graph computes the codes once per node (when the node first appears) and caches them in its node
table; the sampler copies them to each token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

WORDS_PER_DIGEST = 8  # a 64-byte BLAKE2b digest holds eight 64-bit words


@dataclass(frozen=True)
class HashConfig:
    k: int = 16  # codes per id (DHE uses many; 16 int64 per token keeps sampled batches small)
    buckets: int = 1_000_000  # each code lies in [0, buckets) (DHE's m = 10^6)

    def __post_init__(self) -> None:
        if self.k < 1 or not 2 <= self.buckets <= 2**62:
            raise ValueError(f"HashConfig needs k >= 1 and 2 <= buckets <= 2**62, got k={self.k}, buckets={self.buckets}")


def hash_codes(ids: Iterable[str] | pa.Array | pa.ChunkedArray, k: int, buckets: int) -> np.ndarray:
    """int64 [n, k]: the deep-hash codes of each id, each in [0, buckets). Null ids are an error."""
    HashConfig(k, buckets)  # validates
    values = ids.to_pylist() if isinstance(ids, (pa.Array, pa.ChunkedArray)) else list(ids)
    if any(v is None for v in values):
        raise ValueError(f"hash_codes: {sum(v is None for v in values)} null ids; every node needs an id")
    digests = -(-k // WORDS_PER_DIGEST)
    parts = []
    for g in range(digests):
        person = f"hir-dhe{g}".encode()  # <= 16 bytes: BLAKE2b's personalisation parameter
        blob = b"".join(hashlib.blake2b(v.encode("utf-8"), digest_size=64, person=person).digest() for v in values)
        parts.append(np.frombuffer(blob, dtype="<u8").reshape(len(values), WORDS_PER_DIGEST))
    words = np.concatenate(parts, axis=1)[:, :k] if parts else np.zeros((0, k), np.uint64)
    return (words % np.uint64(buckets)).astype(np.int64).reshape(len(values), k)  # (n, k)
