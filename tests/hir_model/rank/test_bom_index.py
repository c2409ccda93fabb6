"""build_window_index over the tiny store's first window: the faiss index it writes on either side of
IndexConfig.exact_max, what probe.json keeps for serving, and that the served path over an IVF index answers."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from hir_model.graph.window import to_us
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.hierarchy.interest_hierarchy import hierarchy_window
from hir_model.rank.bom_index import build_window_index
from hir_model.rank.recommender import Recommender
from hir_model.retrieval import FAISS_FILE, PROBE_FILE, IndexConfig
from hir_model.retrieval.index import BOM_ASSET
from tests.hir_model.eval.hir_store import KEYS, SPEC, hir_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = hir_store(tmp_path_factory.mktemp("bom") / "store", windows=1)
    window = SPEC.windows()[0]
    h = hierarchy_window(store, window.key, None, to_us(window.end))
    with store.writing() as staging:
        for name, table in h.tables.items():
            staging.write_table(HIERARCHY_ASSET, window.key, name, table)
    return store


@pytest.mark.parametrize("exact_max", [IndexConfig().exact_max, 3])
def test_index_kind_and_probe_file_on_either_side_of_exact_max(store, exact_max):
    config = IndexConfig(max_posting_share=1.0, exact_max=exact_max, ivf_scan=2.0)
    with store.writing() as staging:
        build = build_window_index(store, KEYS[0], staging.path(BOM_ASSET, KEYS[0]), config)
    folder = store.partition_dir(BOM_ASSET, KEYS[0])
    index, probe = faiss.read_index(str(folder / FAISS_FILE)), json.loads((folder / PROBE_FILE).read_text())
    ivf = build.items > exact_max
    assert isinstance(index, faiss.IndexIVFFlat if ivf else faiss.IndexFlatIP) and index.ntotal == build.items == 5
    assert probe.get("ivf_scan") == (2.0 if ivf else None)  # what serving probes the IVF lists with
    assert build.recall.recall == 1.0  # five items: every budget covers the catalogue
    rec = Recommender.load(store, KEYS[0])
    assert (rec.retriever.ivf is not None) == ivf and rec.retriever.ivf_scan == probe.get("ivf_scan", IndexConfig.ivf_scan)
    np.testing.assert_allclose(rec.retriever.item_vectors, index.reconstruct_n(0, index.ntotal))
    user = next(u for u, i in rec.user_index.items() if rec.has_row[i])
    served, exact = rec.recommend(user, k=3), rec.recommend(user, k=3, exact=True)
    assert [h.entity_id for h in served] == [h.entity_id for h in exact]
    assert [h.score for h in served] == pytest.approx([h.score for h in exact], rel=1e-5)
