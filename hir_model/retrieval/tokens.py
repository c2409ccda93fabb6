"""Bag-of-Meaning tokens (`L<level>:<primitive>` with weights) and the inverted index token -> items by weight."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TOKENS_FILE, POSTINGS_FILE = "tokens", "postings"

# The published `bom_index` tokens table (DESIGN.md section 2); move to data_contracts/schemas.py.
TOKENS_SCHEMA = pa.schema([
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("level", pa.int32(), nullable=False),
    pa.field("token", pa.string(), nullable=False),  # L<level>:<stable primitive id>
    pa.field("weight", pa.float32(), nullable=False),  # the soft assignment weight; an entity's weights per level sum to 1
])
POSTINGS_SCHEMA = pa.schema([
    pa.field("token", pa.string(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("weight", pa.float32(), nullable=False),
])  # sorted by token, then weight descending, then entity_id


def token_name(level, primitive) -> str:
    return f"L{int(level)}:{int(primitive)}"


def bom_tokens(assignments: pa.Table) -> pa.Table:
    """Assignments (entity_id, level, rank, primitive, weight) -> the tokens table in TOKENS_SCHEMA."""
    levels = np.asarray(assignments["level"].to_numpy(), np.int64)
    prims = np.asarray(assignments["primitive"].to_numpy(), np.int64)
    tokens = [token_name(lv, p) for lv, p in zip(levels, prims)]
    return pa.table([assignments["entity_id"], assignments["level"].cast(pa.int32()), pa.array(tokens, pa.string()),
                     assignments["weight"].cast(pa.float32())], schema=TOKENS_SCHEMA)


@dataclass(frozen=True)
class PostingStats:
    tokens: int
    truncated: int  # tokens whose list was cut to the cap
    cap: int  # the longest list allowed
    longest: int  # the longest list written
    items: int


def posting_cap(items: int, max_share: float) -> int:
    return max(1, int(np.floor(max_share * items)))


def build_postings(tokens: pa.Table, item_ids, max_share: float = 0.05) -> tuple[pa.Table, PostingStats]:
    """Inverted index over the items (e.g. products and advertisers): token -> items by weight, descending, each list
    cut to the `max_share` x items heaviest (coarse primitives hold far more than that share of the catalogue)."""
    items = pa.array(list(item_ids), pa.string())
    rows = tokens.filter(pc.is_in(tokens["entity_id"], value_set=items)).select(["token", "entity_id", "weight"])
    rows = rows.sort_by([("token", "ascending"), ("weight", "descending"), ("entity_id", "ascending")])
    tok = rows["token"].to_numpy(zero_copy_only=False)
    cap = posting_cap(len(items), max_share)
    if len(tok):
        starts = np.r_[0, np.nonzero(tok[1:] != tok[:-1])[0] + 1]
        lengths = np.diff(np.r_[starts, len(tok)])
        rank = np.arange(len(tok)) - np.repeat(starts, lengths)
        rows = rows.filter(pa.array(rank < cap))
        stats = PostingStats(len(starts), int((lengths > cap).sum()), cap, int(min(lengths.max(), cap)), len(items))
    else:
        stats = PostingStats(0, 0, cap, 0, len(items))
    return rows.cast(POSTINGS_SCHEMA), stats


def read_postings(postings: pa.Table, row_of: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """token -> (item rows int64 [n], weights float32 [n]) in stored order (weight descending)."""
    tok = postings["token"].to_numpy(zero_copy_only=False)
    rows = np.array([row_of[e] for e in postings["entity_id"].to_pylist()], np.int64)
    w = np.asarray(postings["weight"].to_numpy(), np.float32)
    if not len(tok):
        return {}
    starts = np.r_[0, np.nonzero(tok[1:] != tok[:-1])[0] + 1, len(tok)]
    return {str(tok[s]): (rows[s:e], w[s:e]) for s, e in zip(starts[:-1], starts[1:])}
