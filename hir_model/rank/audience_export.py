"""The `audiences` table ad systems ingest: for every advertiser and campaign of window t (optionally every product), its
top users and its primitives, scored by the served audience path (hir_model.rank.audience.Audiences.many).

Files under `audiences/<t>/`:
- `members`: window, entity_id, entity_type, rank (1 = most likely to convert), user_id, score;
- `segments`: one row per entity asked for: window, entity_id, entity_type, size (users that qualify), exported (users in
  `members`), excluded (converted with it before end(t)), items (items scored), source, refused (why not exported, null
  when exported);
- `primitives`: window, entity_id, level, primitive, weight, size (the audience restricted to that primitive).
No segment smaller than the floor is exported: an entity below it has a `segments` row with its size and the reason, and
no `members` rows. Window t's own items only (increments arrive after the table is published; `hir audience` and
`GET /audience` serve them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hir_model.rank.audience import Audience, Audiences

AUDIENCES_ASSET = "audiences"
MEMBERS_FILE, SEGMENTS_FILE, PRIMITIVES_FILE = "members", "segments", "primitives"
EXPORTED_TYPES = ("advertiser", "campaign")  # entity types every window exports (products on request)


@dataclass(frozen=True)
class AudienceExport:
    window: str
    members: pa.Table
    segments: pa.Table
    primitives: pa.Table
    active: tuple[str, ...]  # advertisers with at least one served item: each must have a segment
    floor: int  # min_audience
    seconds: float


def export_audiences(audiences: Audiences, k: int = 1000, products: bool = False) -> AudienceExport:
    """Every advertiser and campaign (and product when `products`) of the window with a served item, as the three
    tables (module docstring)."""
    import time

    start = time.perf_counter()
    rec, linker = audiences.rec, audiences.linker
    types = EXPORTED_TYPES + (("product", "service") if products else ())
    wanted = sorted(e for e, t in linker.types.items() if t in types and linker.items_of(e, rec.item_row))
    active = tuple(e for e in wanted if linker.types[e] == "advertiser")
    results = audiences.many(wanted, k) if wanted else []
    members, segments, primitives = [], [], []
    for e, r in zip(wanted, results):
        if isinstance(r, Audience):
            n = len(r.user_ids)
            members.append((np.full(n, e, object), np.full(n, r.entity_type, object), np.arange(1, n + 1),
                            r.user_ids.astype(object), r.scores))
            segments.append((e, r.entity_type, r.size, n, r.excluded, len(r.items), r.source, None))
            primitives += [(e, lv["level"], lv["primitive"], lv["weight"], lv["size"]) for lv in r.levels]
        else:
            size = None
            segments.append((e, linker.types[e], size, 0, None, len(linker.items_of(e, rec.item_row)), None,
                             str(r.args[0] if r.args else r)))
    w = audiences.window
    cat = (lambda i, dtype: np.concatenate([m[i] for m in members]).astype(dtype) if members else np.zeros(0, dtype))  # noqa: E731
    n = sum(len(m[0]) for m in members)
    member_table = pa.table({"window": pa.array([w] * n, pa.string()), "entity_id": pa.array(cat(0, object), pa.string()),
                             "entity_type": pa.array(cat(1, object), pa.string()),
                             "rank": pa.array(cat(2, np.int32), pa.int32()),
                             "user_id": pa.array(cat(3, object), pa.string()),
                             "score": pa.array(cat(4, np.float32), pa.float32())})
    col = lambda rows, i: [r[i] for r in rows]  # noqa: E731
    segment_table = pa.table({"window": pa.array([w] * len(segments), pa.string()),
                              "entity_id": pa.array(col(segments, 0), pa.string()),
                              "entity_type": pa.array(col(segments, 1), pa.string()),
                              "size": pa.array(col(segments, 2), pa.int64()), "exported": pa.array(col(segments, 3), pa.int64()),
                              "excluded": pa.array(col(segments, 4), pa.int64()), "items": pa.array(col(segments, 5), pa.int64()),
                              "source": pa.array(col(segments, 6), pa.string()),
                              "refused": pa.array(col(segments, 7), pa.string())})
    primitive_table = pa.table({"window": pa.array([w] * len(primitives), pa.string()),
                                "entity_id": pa.array(col(primitives, 0), pa.string()),
                                "level": pa.array(col(primitives, 1), pa.int32()),
                                "primitive": pa.array(col(primitives, 2), pa.int64()),
                                "weight": pa.array(col(primitives, 3), pa.float64()),
                                "size": pa.array(col(primitives, 4), pa.int64())})
    return AudienceExport(w, member_table, segment_table, primitive_table, active, audiences.config.min_audience,
                          time.perf_counter() - start)


def export_checks(export: AudienceExport) -> list[tuple[str, bool, str, dict]]:
    """(check, passed, description, numeric metadata) of an export before it is published."""
    seg = export.segments.to_pydict()
    exported = {e for e, x in zip(seg["entity_id"], seg["exported"]) if x}
    refused = {e: why for e, why in zip(seg["entity_id"], seg["refused"]) if why}
    missing = [e for e in export.active if e not in exported and e not in refused]
    scores = export.members.column("score").to_numpy()
    bad_scores = int((~np.isfinite(scores)).sum())
    sizes = [(e, s, x) for e, s, x in zip(seg["entity_id"], seg["size"], seg["exported"]) if x]
    unrecorded = [e for e, s, x in sizes if s is None or s < x]
    small = [e for e, s, x in sizes if s is not None and (s < export.floor or x < min(export.floor, s))]
    return [
        ("audience_per_active_advertiser", not missing,
         f"{len(export.active) - len(missing)} of {len(export.active)} advertisers with a served item have an audience or "
         f"a recorded refusal; missing: {missing[:5]}", {"active": len(export.active), "missing": len(missing),
                                                          "refused": len(refused)}),
        ("audience_scores_finite", bad_scores == 0, f"{bad_scores} of {len(scores)} scores are not finite",
         {"not_finite": bad_scores}),
        ("audience_sizes_recorded", not unrecorded, f"{len(unrecorded)} exported segments without a size at least their "
         f"users: {unrecorded[:5]}", {"unrecorded": len(unrecorded)}),
        ("audience_min_size", not small, f"{len(small)} exported segments below the floor of {export.floor} users: "
         f"{small[:5]}", {"below_floor": len(small), "floor": export.floor}),
    ]


def write_export(staging, export: AudienceExport) -> None:
    """The three tables into `staging` (a `store.writing()` area) under audiences/<t>."""
    for name, table in ((MEMBERS_FILE, export.members), (SEGMENTS_FILE, export.segments),
                        (PRIMITIVES_FILE, export.primitives)):
        staging.write_table(AUDIENCES_ASSET, export.window, name, table)


__all__ = ["AUDIENCES_ASSET", "AudienceExport", "EXPORTED_TYPES", "MEMBERS_FILE", "PRIMITIVES_FILE", "SEGMENTS_FILE",
           "export_audiences", "export_checks", "write_export"]
