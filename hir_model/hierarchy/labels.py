"""Human-readable primitive labels: the most distinctive words of member entities' text against the whole catalogue.

score(w, c) = p_c(w) * log(p_c(w) / p(w)), where p_c(w) is the share of cluster c's texts holding w and p(w) the share of
all texts holding it (a KL-style, TF-IDF-like lift): frequent in the cluster and rare elsewhere wins.
"""

from __future__ import annotations

import re

import numpy as np
from scipy import sparse

WORD = re.compile(r"(?<![a-z0-9])[a-z][a-z']{2,}(?![a-z0-9])")  # alphabetic words: no ids like m.0jvpb4
STOP = frozenset("""the and for with from that this its are was were has have had not but you your our his her their they them
into over under about than then when what who whom which while also more most very can will would should film movie
films movies product products directed starring year genre genres""".split())


def tokenize(text: str | None) -> list[str]:
    return [w for w in WORD.findall((text or "").lower()) if w not in STOP]


def distinctive_words(texts: list[str | None], cluster: np.ndarray, num_clusters: int, top: int = 3,
                      min_count: int = 2) -> list[list[str]]:
    """Per cluster (0..num_clusters-1), up to `top` words, most distinctive first. `cluster[i]` is text i's cluster
    (-1: none). A word must occur in at least min(min_count, cluster size) of the cluster's texts."""
    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, text in enumerate(texts):
        for w in set(tokenize(text)):
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
    labels: list[list[str]] = [[] for _ in range(num_clusters)]
    cluster = np.asarray(cluster, np.int64)
    has_text = np.zeros(len(texts), bool)
    has_text[rows] = True
    n_docs = int(has_text.sum())
    if not vocab or n_docs == 0:
        return labels
    x = sparse.csr_matrix((np.ones(len(rows), np.float64), (rows, cols)), shape=(len(texts), len(vocab)))  # (N, V) binary
    member = (cluster >= 0) & has_text
    m = sparse.csr_matrix((np.ones(member.sum()), (cluster[member], np.nonzero(member)[0])), shape=(num_clusters, len(texts)))
    counts = (m @ x).tocsr()  # (C, V): texts of cluster c holding word v
    sizes = np.asarray(m.sum(axis=1)).ravel()  # (C,)
    p_all = np.asarray(x[has_text].sum(axis=0)).ravel() / n_docs  # (V,)
    words = np.array(sorted(vocab, key=vocab.get), object)
    for c in range(num_clusters):
        lo, hi = counts.indptr[c], counts.indptr[c + 1]
        v, dfc = counts.indices[lo:hi], counts.data[lo:hi]
        keep = dfc >= min(min_count, sizes[c])
        if not keep.any():
            continue
        v, pc = v[keep], dfc[keep] / sizes[c]
        score = pc * np.log(pc / p_all[v])
        order = np.lexsort((words[v], -score))[:top]  # best score first, ties alphabetical
        labels[c] = [str(words[v[i]]) for i in order if score[i] > 0]
    return labels
