"""One window's interest hierarchy from its entity embeddings and trained prototypes: assignments (stable ids), the
super-graph, labels, the cross-window matching report, and the published tables.

Files under `interest_hierarchy/<window>/`: `assignments` (entity_id, level, rank, primitive, weight), `primitives`
(level, row, primitive, label, size, mass, matched, similarity, prototype, centroid), `super_graph` (level, src, dst,
weight). `primitive` is the stable id; `row` the prototype's row in this window's checkpoint; entities are assigned to
the `centroid`s (see hir_model.hierarchy.assign), ids are matched on the `prototype`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hir_model.content import to_matrix
from hir_model.embed import EntityEmbeddings
from hir_model.graph.csr import Graph
from hir_model.hierarchy.assign import AssignConfig, LevelAssignment, soft_assign
from hir_model.hierarchy.labels import distinctive_words
from hir_model.hierarchy.stable_ids import Matching, adjusted_rand_index, match_prototypes
from hir_model.hierarchy.supergraph import SuperGraph, engagement_pairs, super_graph
from hir_model.train.centroids import primitive_centroids

HIERARCHY_ASSET = "interest_hierarchy"
ASSIGNMENTS_FILE, PRIMITIVES_FILE, SUPER_GRAPH_FILE = "assignments", "primitives", "super_graph"


@dataclass(frozen=True)
class HierarchyConfig:
    assign: AssignConfig = AssignConfig()
    min_similarity: float = 0.5  # a prototype keeps its predecessor's id only when at least this similar
    centroid_steps: int = 10  # spherical k-means steps from the prototypes to the primitives' centroids (0: prototypes)
    reseed_dead: bool = True  # a primitive nobody is nearest to is re-seeded among the entities (k-means++)
    label_words: int = 3
    table_rows: int = 8  # top primitives per level in the markdown table


@dataclass(frozen=True)
class Hierarchy:
    levels: list[LevelAssignment]  # coarse to fine; primitive = prototype row
    centroids: list[np.ndarray]  # per level, float32 [K_l, W]: what entities are assigned to
    prototypes_used: list[int]  # per level: prototypes nearest to at least one entity (the model's own usage)
    ids: list[Matching]  # per level: stable id of each row
    labels: list[list[str]]  # per level, per row
    super_graphs: list[SuperGraph]
    ari: list[float | None]  # per level, vs the previous window on entities in both (None: no previous)
    common_entities: int
    tables: dict[str, pa.Table] = field(default_factory=dict)

    def markdown(self, rows: int = 8) -> str:
        lines = ["| level | primitive | label | size | mass |", "| --- | --- | --- | --- | --- |"]
        for lvl, a in enumerate(self.levels):
            sizes, mass = a.sizes(), a.mass()
            for r in np.argsort(-mass, kind="stable")[:rows]:
                lines.append(f"| {lvl} | L{lvl}:{self.ids[lvl].ids[r]} | {' '.join(self.labels[lvl][r]) or '-'} | "
                             f"{int(sizes[r])} | {mass[r]:.1f} |")
        return "\n".join(lines)


def previous_state(primitives: pa.Table | None, assignments: pa.Table | None, level: int):
    """(prototypes [K', W], ids [K'], {entity_id: top primitive id}) of one level of the previous window, or Nones."""
    if primitives is None:
        return None, None, {}
    rows = primitives.filter(pc.equal(primitives["level"], level))
    protos, _ = to_matrix(rows["prototype"])
    top = {}
    if assignments is not None:
        a = assignments.filter(pc.and_(pc.equal(assignments["level"], level), pc.equal(assignments["rank"], 0)))
        top = dict(zip(a["entity_id"].to_pylist(), a["primitive"].to_pylist()))
    return protos, np.asarray(rows["primitive"].to_pylist(), np.int64), top


def build_hierarchy(emb: EntityEmbeddings, prototypes, graph: Graph, cutoff_us: int, texts: dict[str, str],
                    previous_primitives: pa.Table | None = None, previous_assignments: pa.Table | None = None,
                    config: HierarchyConfig = HierarchyConfig()) -> Hierarchy:
    """`prototypes`: per level, coarse to fine, [K_l, W]; `texts`: entity_id -> title + description (catalogue)."""
    row_of_node = np.full(graph.num_nodes, -1, np.int64)
    row_of_node[emb.node[emb.node >= 0]] = np.nonzero(emb.node >= 0)[0]
    users, items, weight = engagement_pairs(graph, row_of_node, cutoff_us)
    is_user = emb.entity_type == "user"
    member_texts = [texts.get(e) for e in emb.entity_id]
    levels, centroids, used, ids, labels, supers, aris = [], [], [], [], [], [], []
    common = 0
    for lvl, protos in enumerate(prototypes):
        protos = np.asarray(protos, np.float32)
        centroids.append(primitive_centroids(emb.vectors, protos, config.centroid_steps, config.reseed_dead, seed=lvl))
        used.append(len(np.unique(np.argmax(emb.vectors @ protos.T, axis=1))) if len(emb) else 0)
        a = soft_assign(emb.vectors, centroids[-1], config.assign)
        prev_protos, prev_ids, prev_top = previous_state(previous_primitives, previous_assignments, lvl)
        m = match_prototypes(protos, prev_protos, prev_ids, config.min_similarity)
        levels.append(a), ids.append(m), supers.append(super_graph(a, users, items, weight, is_user))
        labels.append(distinctive_words(member_texts, a.top, a.num_primitives, config.label_words))
        both = [i for i, e in enumerate(emb.entity_id) if e in prev_top]
        common = len(both)
        aris.append(adjusted_rand_index(m.ids[a.top[both]], [prev_top[emb.entity_id[i]] for i in both]) if prev_top else None)
    h = Hierarchy(levels, centroids, used, ids, labels, supers, aris, common)
    h.tables.update(assignments=assignments_table(emb, h), primitives=primitives_table(h, prototypes),
                    super_graph=super_graph_table(h))
    return h


def assignments_table(emb: EntityEmbeddings, h: Hierarchy) -> pa.Table:
    parts = []
    for lvl, (a, m) in enumerate(zip(h.levels, h.ids)):
        n, k = a.primitive.shape
        parts.append(pa.table({
            "entity_id": pa.array(np.repeat(emb.entity_id, k).tolist(), pa.string()),
            "level": pa.array(np.full(n * k, lvl, np.int32)), "rank": pa.array(np.tile(np.arange(k, dtype=np.int32), n)),
            "primitive": pa.array(m.ids[a.primitive].reshape(-1)), "weight": pa.array(a.weight.reshape(-1), pa.float32())}))
    return pa.concat_tables(parts)


def primitives_table(h: Hierarchy, prototypes) -> pa.Table:
    parts = []
    for lvl, (a, m) in enumerate(zip(h.levels, h.ids)):
        protos = np.ascontiguousarray(np.asarray(prototypes[lvl], np.float32))
        centres = np.ascontiguousarray(h.centroids[lvl], np.float32)
        k, w = protos.shape
        parts.append(pa.table({
            "level": pa.array(np.full(k, lvl, np.int32)), "row": pa.array(np.arange(k, dtype=np.int64)), "primitive": pa.array(m.ids),
            "label": pa.array([" ".join(x) for x in h.labels[lvl]], pa.string()), "size": pa.array(a.sizes()),
            "mass": pa.array(a.mass()), "matched": pa.array(m.matched), "similarity": pa.array(m.similarity, pa.float32()),
            "prototype": pa.FixedSizeListArray.from_arrays(pa.array(protos.reshape(-1)), w),
            "centroid": pa.FixedSizeListArray.from_arrays(pa.array(centres.reshape(-1)), w)}))
    return pa.concat_tables(parts)


def super_graph_table(h: Hierarchy) -> pa.Table:
    return pa.concat_tables([pa.table({
        "level": pa.array(np.full(len(s.src), lvl, np.int32)), "src": pa.array(m.ids[s.src]), "dst": pa.array(m.ids[s.dst]),
        "weight": pa.array(s.weight)}) for lvl, (s, m) in enumerate(zip(h.super_graphs, h.ids))])


def catalog_texts(catalog: pa.Table) -> dict[str, str]:
    """entity_id -> title + description (catalogue rows)."""
    ids = catalog["entity_id"].to_pylist()
    titles, descs = catalog["title"].to_pylist(), catalog["description"].to_pylist()
    return {e: " ".join(x for x in (t, d) if x) for e, t, d in zip(ids, titles, descs) if t or d}
