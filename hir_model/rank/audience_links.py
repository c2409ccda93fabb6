"""Which items and primitives stand for an entity: the catalogue's links (Linker) and the interest hierarchy's
assignments (Membership), what an audience is scored over and restricted to."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


class Linker:
    """Which items stand for an entity: itself when it is an item, else the items the catalogue links to it."""

    def __init__(self, catalog: pa.Table, relations: pa.Table | None = None):
        """catalog: entity_id, entity_type, parent_id rows (window t's, plus the arrivals' own rows); relations: src_id,
        dst_id (either way links the two)."""
        ids = catalog.column("entity_id").to_pylist()
        self.types = dict(zip(ids, catalog.column("entity_type").to_pylist()))
        self.links: dict[str, set[str]] = {}
        for child, parent in zip(ids, catalog.column("parent_id").to_pylist()):
            if parent is not None:
                self.links.setdefault(parent, set()).add(child)
        if relations is not None and relations.num_rows:
            for a, b in zip(relations.column("src_id").to_pylist(), relations.column("dst_id").to_pylist()):
                self.links.setdefault(a, set()).add(b)
                self.links.setdefault(b, set()).add(a)

    def items_of(self, entity: str, item_row: dict[str, int]) -> list[str]:
        """The entity itself when it is a served item, else its linked served items, sorted."""
        if entity in item_row:
            return [entity]
        return sorted(e for e in self.links.get(entity, ()) if e in item_row)


class Membership:
    """The interest hierarchy's soft top-k assignments of window t: which primitives each entity is assigned to."""

    def __init__(self, assignments: pa.Table | None, tokens: pa.Table | None = None):
        """assignments: entity_id, level, rank, primitive, weight (interest_hierarchy); tokens: the arrivals' BoM tokens
        (entity_id, level, token `L<level>:<primitive>`, weight), their assignments."""
        parts = []
        if assignments is not None:
            parts.append(assignments.select(["entity_id", "level", "primitive", "weight"]).cast(
                pa.schema([("entity_id", pa.string()), ("level", pa.int64()), ("primitive", pa.int64()), ("weight", pa.float64())])))
        if tokens is not None and tokens.num_rows:
            prim = pc.cast(pc.list_element(pc.split_pattern(tokens.column("token"), ":"), 1), pa.int64())
            parts.append(pa.table({"entity_id": tokens.column("entity_id").cast(pa.string()),
                                   "level": tokens.column("level").cast(pa.int64()), "primitive": prim,
                                   "weight": tokens.column("weight").cast(pa.float64())}))
        self.table = pa.concat_tables(parts) if parts else None
        self.levels = sorted(set(self.table.column("level").to_pylist())) if self.table is not None else []
        self._members: dict[tuple[int, int], set[str]] = {}
        if self.table is not None:
            for e, lv, p in zip(*(self.table.column(c).to_pylist() for c in ("entity_id", "level", "primitive"))):
                self._members.setdefault((lv, p), set()).add(e)

    def members(self, level: int, primitive: int) -> set[str]:
        return self._members.get((level, primitive), set())

    def top_primitives(self, entities: list[str]) -> dict[int, tuple[int, float]]:
        """level -> (primitive, weight): the primitive the entities' assignments weigh most at each level."""
        if self.table is None or not entities:
            return {}
        rows = self.table.filter(pc.is_in(self.table.column("entity_id"), pa.array(entities, pa.string())))
        if not rows.num_rows:
            return {}
        grouped = rows.group_by(["level", "primitive"]).aggregate([("weight", "sum")]).to_pydict()
        out: dict[int, tuple[int, float]] = {}
        for lv, p, w in sorted(zip(grouped["level"], grouped["primitive"], grouped["weight_sum"]), key=lambda r: (r[0], -r[2], r[1])):
            out.setdefault(lv, (p, w / len(entities)))
        return out
