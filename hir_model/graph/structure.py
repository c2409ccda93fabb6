"""Structural encodings: a fixed vector per node that places it in the engagement graph's collaborative structure.

Graph transformers give their tokens positional encodings of where a node sits in the whole graph (GraphGPS's
LapPE / RWSE; EGT's SVD encodings), because attention over a sampled neighbourhood sees only a few dozen nodes.
Here the encoding is FastRP (Chen et al. 2019): a random projection of the normalised engagement adjacency's
powers, E = sum_k alpha_k * rownorm(A^k G), with A = D^-1/2 W D^-1/2 over engagement edges (their time-decayed
weights, so recent engagement counts more) and G a random sign matrix. Two users who engaged with the same films get
nearby encodings after one hop, two films engaged by the same users after two, and so on, for the cost of a few
sparse products: no training, no id table.

Why not learned ids: the deep-hash id embedding (hir_model.nn.embedding) is an MLP from hashed floats, which
learns nothing id-specific in the few steps a window trains (README, Evaluation), so without these the encoder
knew each node by its content, type and popularity only.

Stable across windows: G's row of a node is a function of its id (its deep-hash codes, splitmix64'd), not of
its position, so window t+1's encodings live in the same random basis as window t's and a warm-started encoder's
projection of them stays meaningful. Causal: the graph (hir_model.graph.csr.Graph.structure_until) passes only the
engagement edges whose last event is at or before the cutoff.

This module works on arrays and knows nothing of the graph type, so that the graph can offer its encodings (csr imports
this module, never the reverse).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

ALPHAS = (1.0, 1.0, 1.0, 1.0)  # weights of hops 1..4 (FastRP's alpha_k; each hop's rows normalised first)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """uint64 -> uint64, a bijective mixer (Steele et al.'s SplitMix64 finaliser)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def random_signs(hash_codes: np.ndarray, dim: int) -> np.ndarray:
    """float32 [N, dim] of +-1/sqrt(dim): row i a function of node i's hash codes only (so of its id). Every code is
    mixed in: one code lies in [0, 10^6), where 100k nodes would share ~5,000 rows by chance."""
    codes = np.asarray(hash_codes, np.int64).astype(np.uint64)
    key = np.zeros(len(codes), np.uint64)
    for column in codes.T:
        key = _splitmix64(key ^ column)
    with np.errstate(over="ignore"):
        words = _splitmix64(key[:, None] + np.arange(1, dim + 1, dtype=np.uint64)[None, :] * _GOLDEN)
    sign = ((words >> np.uint64(63)) & np.uint64(1)).astype(np.float32) * 2.0 - 1.0
    return sign / np.float32(np.sqrt(dim))


def engagement_adjacency(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, num_nodes: int) -> sp.csr_matrix:
    """[N, N] symmetric D^-1/2 W D^-1/2 of the given engagement edges (both directions of each; W: their summed
    decayed weights)."""
    n = num_nodes
    w = sp.csr_matrix((np.asarray(weight, np.float64), (np.asarray(src, np.int64), np.asarray(dst, np.int64))),
                      shape=(n, n))  # duplicate (src, dst) pairs of different edge types are summed
    degree = np.asarray(w.sum(axis=1)).ravel()
    inv = np.divide(1.0, np.sqrt(degree), out=np.zeros_like(degree), where=degree > 0)
    return (sp.diags(inv) @ w @ sp.diags(inv)).tocsr()


def _rownorm(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def structural_encoding(adjacency: sp.csr_matrix, hash_codes: np.ndarray, dim: int,
                        alphas: tuple[float, ...] = ALPHAS) -> np.ndarray:
    """float32 [N, dim]: each node's FastRP encoding (module docstring) over `adjacency` (engagement_adjacency), unit-norm;
    zeros for a node without an engagement edge (knowledge-graph nodes, never-engaged entities: they have no place in it).
    `hash_codes` [N, K]: the nodes' deep-hash codes, which seed their random rows."""
    if dim < 1 or not alphas:
        raise ValueError(f"a structural encoding needs dim >= 1 and at least one hop, got dim={dim}, alphas={alphas}")
    hop = random_signs(np.asarray(hash_codes), dim).astype(np.float64)
    out = np.zeros((adjacency.shape[0], dim))
    for alpha in alphas:
        hop = _rownorm(adjacency @ hop)
        out += alpha * hop
    return _rownorm(out).astype(np.float32)
