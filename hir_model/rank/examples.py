"""The learned ranker's training data: what earlier windows' candidates became.

At end(t), head(s) for s < t is judged by window s+1 (s+1 ended by end(t)): for users head(s) knew (with a published
row of s) who engaged in s+1 with an item they had not engaged with before, each first stage (the head's score, and the
base stage without HIR, hir_model.rank.ranker) picks its `depth` best items among those the user had not engaged
with, exactly as the served path does; each picked (user, item) is an example with every feature of head(s)'s state
(hir_model.rank.features) and a grade from window s+1: 2 for a deep-funnel event, 1 for another engagement, 0 for
none. `ranking_head(t)` computes the examples of (t-1, t) and publishes them beside its state (`examples.parquet`);
the rankers of t train on those and the examples the heads before it published (`RankerConfig.windows` judged windows
at most). Nothing after end(t) is read: window s+1 <= t.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import pyarrow as pa

from hir_model.protocol.split import warm_group
from hir_model.rank.features import ALL_FEATURES, pair_features
from hir_model.rank.ranker import VARIANTS, Ranker, RankerConfig, first_stage, fit_ranker, top_pairs, variant_features

KEY_COLUMNS = ("window", "user_id", "item", "label", "in_hir", "in_base")
EXAMPLES_SCHEMA = pa.schema([pa.field("window", pa.string(), nullable=False),  # s: the head whose candidates these are
                             pa.field("user_id", pa.string(), nullable=False),
                             pa.field("item", pa.int32(), nullable=False),  # a row of head(s)'s items
                             pa.field("label", pa.int8(), nullable=False),  # 2 deep funnel in s+1, 1 engaged, 0 none
                             pa.field("in_hir", pa.bool_(), nullable=False),  # among the head's depth best
                             pa.field("in_base", pa.bool_(), nullable=False)]  # among the base stage's depth best
                            + [pa.field(n, pa.float32()) for n in ALL_FEATURES])  # NaN: the feature does not exist
EXAMPLE_BLOCK_CELLS = 1 << 23  # users x items of first-stage scores at once


def window_examples(state, rows: np.ndarray, has_row: np.ndarray, later: pd.DataFrame,
                    config: RankerConfig) -> pa.Table | None:
    """Head(s)'s examples judged by window s+1 (module docstring). `state`: head(s)'s HeadState; `rows`, `has_row`: the
    published rows of state.history.user_ids; `later`: window s+1's engagements (user_id, item: a row of head(s)'s
    items, deep). None when no user qualifies."""
    history = state.history
    known = pd.Index(history.user_ids).get_indexer(later.user_id)
    later = later[(known >= 0) & has_row[np.maximum(known, 0)]]
    if not len(later):
        return None
    group = warm_group(history, later)
    judged = np.flatnonzero(group.engagement.sizes > 0)
    if not len(judged):
        return None
    if len(judged) > config.max_users:
        rng = np.random.default_rng([config.seed, zlib.crc32(state.window.encode())])
        judged = np.sort(rng.choice(judged, config.max_users, replace=False))
    items, feats = state.items(), state.feature_items()
    n = len(items)
    parts = []
    step = max(1, EXAMPLE_BLOCK_CELLS // max(n, 1))
    for lo in range(0, len(judged), step):
        sel = judged[lo:lo + step]
        queries = group.queries.take(sel)
        user_rows, warm = rows[queries.user_index], np.ones(len(sel), bool)
        seen = [np.unique(queries.context.row(q)) for q in range(len(sel))]
        firsts = {v: first_stage(v, queries, items, feats, state.base_co_weight, state.config, user_rows, warm, None)
                  for v in VARIANTS}
        picked = {v: top_pairs(firsts[v], config.depth, seen) for v in VARIANTS}
        keys = {v: q * n + j for v, (q, j) in picked.items()}
        union = np.unique(np.concatenate(list(keys.values())))
        q, j = union // n, union % n
        x = pair_features(ALL_FEATURES, queries, items, feats, state.config, user_rows, warm, None, q, j,
                          firsts["hir"][q, j])
        label = np.zeros(len(union), np.int8)
        for grade, targets in ((1, group.engagement), (2, group.deep_funnel)):
            ptr, pos = targets.gather(sel)
            tq = np.repeat(np.arange(len(sel)), np.diff(ptr))
            tkey = np.unique(tq * n + targets.idx[pos])
            label[np.isin(union, tkey)] = grade
        columns = {"window": pa.array([state.window] * len(union), pa.string()),
                   "user_id": pa.array(queries.user_ids[q].astype(str), pa.string()),
                   "item": pa.array(j.astype(np.int32)), "label": pa.array(label),
                   "in_hir": pa.array(np.isin(union, keys["hir"])), "in_base": pa.array(np.isin(union, keys["base"]))}
        columns |= {name: pa.array(x[:, i], pa.float32()) for i, name in enumerate(ALL_FEATURES)}
        parts.append(pa.table(columns, schema=EXAMPLES_SCHEMA))
    return pa.concat_tables(parts).combine_chunks()


def check_examples(table: pa.Table, where: str) -> None:
    """ValueError naming `where` and the rule when a table breaks EXAMPLES_SCHEMA or holds an infinite feature."""
    if not table.schema.equals(EXAMPLES_SCHEMA):
        raise ValueError(f"{where} breaks the ranker examples' contract (hir_model.rank.examples.EXAMPLES_SCHEMA): "
                         f"{table.schema} != {EXAMPLES_SCHEMA}")
    for name in ALL_FEATURES:
        values = table[name].to_numpy(zero_copy_only=False)
        if np.isinf(values).any():
            bad = np.flatnonzero(np.isinf(values))
            raise ValueError(f"{where}: feature {name} is infinite in rows {bad[:5].tolist()} ({len(bad)} rows)")
    labels = table["label"].to_numpy()
    if len(labels) and (labels.min() < 0 or labels.max() > 2):
        raise ValueError(f"{where}: labels must be 0, 1 or 2, rows {np.flatnonzero((labels < 0) | (labels > 2))[:5].tolist()}")


def train_rankers(examples: list[pa.Table], config: RankerConfig) -> tuple[dict[str, Ranker | None], str]:
    """Per variant, a ranker trained on the examples (the candidates ranked_scores gives it: the base stage's picks,
    with the head's too for hir; queries with at least one engaged item), or None with the reason (too few queries, no examples)."""
    tables = [t for t in examples if t is not None and t.num_rows]
    if not tables:
        return {v: None for v in VARIANTS}, "no earlier window's outcome yet: the head's hand-set score"
    frame = pa.concat_tables(tables).to_pandas()
    out, notes = {}, []
    for variant in VARIANTS:
        picked = frame.in_base | frame.in_hir if variant == "hir" else frame.in_base  # as ranked_scores picks them
        part = frame[picked]
        best = part.groupby(["window", "user_id"], sort=False).label.transform("max")
        part = part[best > 0].sort_values(["window", "user_id", "item"], kind="stable")
        sizes = part.groupby(["window", "user_id"], sort=False).size().to_numpy()
        if len(sizes) < config.min_queries:
            out[variant] = None
            notes.append(f"{variant}: {len(sizes)} training queries < {config.min_queries}, the first stage's score")
            continue
        names = variant_features(variant)
        trained = {"windows": sorted(part.window.unique().tolist()), "queries": int(len(sizes)), "rows": int(len(part)),
                   "deep_funnel": int((part.label == 2).sum()), "engaged": int((part.label == 1).sum())}
        out[variant] = fit_ranker(variant, part[list(names)].to_numpy(np.float32), part.label.to_numpy(np.int32), sizes,
                                  config, trained)
        notes.append(f"{variant}: trained on {len(sizes)} queries of {len(trained['windows'])} windows")
    return out, "; ".join(notes)


def ranker_problems(rankers: tuple[Ranker, ...], examples: pa.Table | None, sample: int = 2000) -> list[str]:
    """What is wrong with a head's rankers (empty: nothing): features other than their variant's, importance not
    recorded for every feature or all zero, an infinite example feature, a non-finite score of the examples."""
    problems = []
    if examples is not None:
        try:
            check_examples(examples, "examples")
        except ValueError as exc:
            problems.append(str(exc))
    for r in rankers:
        if r.features != variant_features(r.variant):
            problems.append(f"{r.variant} ranker reads {list(r.features)}, not its variant's features")
        gains = np.array([r.importance.get(n, np.nan) for n in r.features])
        if not np.isfinite(gains).all() or gains.sum() <= 0:
            problems.append(f"{r.variant} ranker's importance is not recorded for every feature: {r.importance}")
        if examples is not None and examples.num_rows:
            rows = examples.slice(0, sample)
            x = np.column_stack([rows[n].to_numpy(zero_copy_only=False) for n in r.features]).astype(np.float32)
            scores = r.predict(x)
            if not np.isfinite(scores).all():
                problems.append(f"{r.variant} ranker scores {int((~np.isfinite(scores)).sum())} of {len(x)} examples "
                                f"non-finite")
    return problems
