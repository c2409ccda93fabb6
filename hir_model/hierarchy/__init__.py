"""Interest hierarchy: soft top-k assignments to each level's prototypes (primitives), the super-graph of primitives,
stable primitive ids across windows (Hungarian matching), the adjusted Rand index, and labels from distinctive words.

Public API: `AssignConfig`, `LevelAssignment`, `soft_assign`; `Matching`, `match_prototypes`, `adjusted_rand_index`;
`SuperGraph`, `engagement_pairs`, `super_graph`; `distinctive_words`; `HierarchyConfig`, `Hierarchy`, `build_hierarchy`,
`catalog_texts`, the asset name `HIERARCHY_ASSET` and its file names `ASSIGNMENTS_FILE`, `PRIMITIVES_FILE`,
`SUPER_GRAPH_FILE`. One window's hierarchy from the store: hir_model.hierarchy.interest_hierarchy.
"""

from hir_model.hierarchy.assign import AssignConfig, LevelAssignment, soft_assign
from hir_model.hierarchy.build import (ASSIGNMENTS_FILE, HIERARCHY_ASSET, PRIMITIVES_FILE, SUPER_GRAPH_FILE, Hierarchy,
                                       HierarchyConfig, build_hierarchy, catalog_texts)
from hir_model.hierarchy.labels import distinctive_words
from hir_model.hierarchy.stable_ids import Matching, adjusted_rand_index, match_prototypes
from hir_model.hierarchy.supergraph import SuperGraph, engagement_pairs, super_graph

__all__ = ["ASSIGNMENTS_FILE", "HIERARCHY_ASSET", "PRIMITIVES_FILE", "SUPER_GRAPH_FILE", "AssignConfig", "Hierarchy",
           "HierarchyConfig", "LevelAssignment", "Matching", "SuperGraph", "adjusted_rand_index", "build_hierarchy",
           "catalog_texts", "distinctive_words", "engagement_pairs", "match_prototypes", "soft_assign", "super_graph"]
