"""HIR's interest structure against ground truth and as features: agreement with planted interests (synthetic source)
and per-level primitive affinities of (user, item) pairs for the downstream conversion model.

Agreement: each entity's top primitive (rank 0) at every hierarchy level l against its planted interest at every
planted level m (`interest_l0` coarse .. `interest_l2` fine; the two hierarchies need not have as many levels, so
every pair is reported and the diagonal is the natural match), as NMI (arithmetic normalisation) and ARI over the
entities present in both tables. Items only by default: a product has one planted interest, a user a drifting mixture.

Affinity: with a_e,l the sparse vector of entity e's top-k primitive weights at level l (the BoM tokens `L<l>:<p>`),
the pair feature at level l is a_u,l . a_i,l (0 when the two share no token at that level).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score


@dataclass(frozen=True)
class LevelAgreement:
    level: int  # hierarchy level (0 = coarsest)
    planted_level: int  # planted interest level (0 = coarsest)
    entities: int  # entities with both an assignment and a planted interest
    primitives: int  # distinct top primitives among them
    planted: int  # distinct planted interests among them
    nmi: float
    ari: float


def planted_agreement(assignments: pa.Table, truth: pa.Table, entity_types: tuple[str, ...] = ("product",)) -> list[LevelAgreement]:
    """Per (hierarchy level, planted level): NMI and ARI of top primitives vs planted interests of `entity_types`."""
    truth = truth.filter(pc.is_in(truth["entity_type"], pa.array(entity_types, pa.string())))
    top = assignments.filter(pc.equal(assignments["rank"], 0)).select(["entity_id", "level", "primitive"]).to_pandas()
    planted = truth.to_pandas().set_index("entity_id")
    planted_levels = sorted(int(c.removeprefix("interest_l")) for c in planted.columns if c.startswith("interest_l"))
    out = []
    for level in sorted(top.level.unique()):
        rows = top[top.level == level].drop_duplicates("entity_id").set_index("entity_id")
        for m in planted_levels:
            joined = rows.join(planted[[f"interest_l{m}"]], how="inner")
            if len(joined) < 2:
                continue
            a, b = joined.primitive.to_numpy(), joined[f"interest_l{m}"].to_numpy()
            out.append(LevelAgreement(int(level), m, len(joined), int(len(np.unique(a))), int(len(np.unique(b))),
                                      float(normalized_mutual_info_score(b, a)), float(adjusted_rand_score(b, a))))
    return out


def agreement_markdown(rows: list[LevelAgreement]) -> str:
    lines = ["| level | planted level | entities | primitives | planted interests | NMI | ARI |", "|---|---|---|---|---|---|---|"]
    lines += [f"| L{r.level} | {r.planted_level} | {r.entities} | {r.primitives} | {r.planted} | {r.nmi:.4f} | {r.ari:.4f} |"
              for r in rows]
    return "\n".join(lines)


def primitive_affinity(assignments: pa.Table, user_ids: np.ndarray, item_ids: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """((P, L) per-level token affinity of each (user, item) pair, names `bom_affinity_L<l>`)."""
    a = assignments.select(["entity_id", "level", "primitive", "weight"]).to_pandas()
    levels = sorted(a.level.unique())
    out = np.zeros((len(user_ids), len(levels)))
    pairs = pd.DataFrame({"u": np.asarray(user_ids, object), "i": np.asarray(item_ids, object), "row": np.arange(len(user_ids))})
    for col, level in enumerate(levels):
        lv = a[a.level == level][["entity_id", "primitive", "weight"]]
        left = pairs.merge(lv.rename(columns={"entity_id": "u", "weight": "wu"}), on="u")
        both = left.merge(lv.rename(columns={"entity_id": "i", "weight": "wi"}), on=["i", "primitive"])
        if len(both):
            np.add.at(out[:, col], both.row.to_numpy(), (both.wu * both.wi).to_numpy())
    return out, tuple(f"bom_affinity_L{level}" for level in levels)
