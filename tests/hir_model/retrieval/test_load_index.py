"""Windows that were never materialised are refused with an error that names what is missing."""

from __future__ import annotations

import pytest

from hir_model.embed.entity_embeddings import embed_window, load_embeddings
from hir_model.hierarchy.interest_hierarchy import hierarchy_window
from hir_model.rank.bom_index import build_window_index
from hir_model.retrieval.load_index import load_window_index
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import CheckpointError


def test_unmaterialised_window_is_refused(tmp_path):
    store = PartitionStore(tmp_path / "store")
    with pytest.raises(FileNotFoundError, match=r"window 2030-01-06 was never materialised.*materialised windows: none"):
        load_window_index(store, "2030-01-06")
    with pytest.raises(FileNotFoundError, match="entity_embeddings for window 2030-01-06 was never materialised"):
        load_embeddings(store, "2030-01-06")
    with pytest.raises(FileNotFoundError, match="interest_hierarchy for window 2030-01-06 was never materialised"):
        build_window_index(store, "2030-01-06", tmp_path / "staging")
    with pytest.raises(CheckpointError, match=r"hir_encoder/2030-01-06/checkpoint.pt does not exist"):
        embed_window(store, "2030-01-06", 0)
    with pytest.raises(FileNotFoundError, match="entity_embeddings for window 2030-01-06 was never materialised"):
        hierarchy_window(store, "2030-01-06", None, 0)


def test_refusal_lists_the_windows_that_exist(tmp_path):
    store = PartitionStore(tmp_path / "store")
    (store.partition_dir("bom_index", "2024-01-07")).mkdir(parents=True)
    (store.partition_dir("bom_index", "2024-01-07") / "tokens.parquet").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="materialised windows: 2024-01-07"):
        load_window_index(store, "2024-01-14")
