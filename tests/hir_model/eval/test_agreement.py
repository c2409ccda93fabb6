"""Agreement with planted interests and per-level primitive affinities, on hand-made tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hir_model.eval.agreement import agreement_markdown, planted_agreement, primitive_affinity


def assignments(rows: list[tuple]) -> pa.Table:
    ent, level, rank, prim, weight = zip(*rows)
    return pa.table({"entity_id": list(ent), "level": pa.array(level, pa.int32()), "rank": pa.array(rank, pa.int32()),
                     "primitive": pa.array(prim, pa.int64()), "weight": pa.array(weight, pa.float32())})


TRUTH = pa.table({"entity_id": ["p1", "p2", "p3", "p4", "u1"], "entity_type": ["product"] * 4 + ["user"],
                  "interest_l0": pa.array([0, 0, 1, 1, 0], pa.int32()), "interest_l1": pa.array([0, 1, 2, 3, 0], pa.int32())})


def test_top_primitives_against_planted_interests_every_level_pair():
    # L0 recovers the coarse split exactly (with other labels); L1 merges two fine interests; rank-1 rows are ignored
    a = assignments([("p1", 0, 0, 7, .9), ("p2", 0, 0, 7, .8), ("p3", 0, 0, 5, .9), ("p4", 0, 0, 5, .7), ("p4", 0, 1, 7, .2),
                     ("p1", 1, 0, 1, .9), ("p2", 1, 0, 1, .9), ("p3", 1, 0, 2, .9), ("p4", 1, 0, 3, .9), ("u1", 0, 0, 5, 1.)])
    got = {(r.level, r.planted_level): r for r in planted_agreement(a, TRUTH)}
    assert set(got) == {(0, 0), (0, 1), (1, 0), (1, 1)} and got[0, 0].entities == 4  # the user is not an item
    assert got[0, 0].nmi == pytest.approx(1.0) and got[0, 0].ari == pytest.approx(1.0)
    # L1 {p1,p2},{p3},{p4} vs planted fine {p1},{p2},{p3},{p4}: ARI 0 by hand (no pair agrees beyond chance), NMI < 1
    assert got[1, 1].ari == pytest.approx(0.0) and 0 < got[1, 1].nmi < 1
    assert got[1, 1].primitives == 3 and got[1, 1].planted == 4
    assert "| L0 | 0 | 4 | 2 | 2 | 1.0000 | 1.0000 |" in agreement_markdown(list(got.values()))


def test_affinity_is_the_dot_product_of_shared_tokens_per_level():
    a = assignments([("u1", 0, 0, 1, .6), ("u1", 0, 1, 2, .4), ("p1", 0, 0, 2, .5), ("p1", 0, 1, 3, .5),
                     ("u1", 1, 0, 9, 1.), ("p1", 1, 0, 8, 1.), ("p2", 0, 0, 1, 1.)])
    x, names = primitive_affinity(a, np.array(["u1", "u1", "u9"], object), np.array(["p1", "p2", "p1"], object))
    assert names == ("bom_affinity_L0", "bom_affinity_L1")
    np.testing.assert_allclose(x, [[0.4 * 0.5, 0.0], [0.6, 0.0], [0.0, 0.0]])  # u9 has no tokens
