"""entity_embeddings, interest_hierarchy, ranking_head and bom_index materialised with Dagster on the bring-your-own
fixture, and `hir retrieve` on the result.

`hir_encoder` (training) lands separately, so these tests fabricate its partition: a randomly initialised Encoder and
random unit prototypes written with `save_checkpoint` into `hir_encoder/<key>/checkpoint.pt`. They test the wiring, the
checks and the files, not the quality of the embeddings.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import torch

from hir_assets.events import build_ingest_assets
from hir_assets.graph import build_graph_assets
from hir_assets.hierarchy import ASSIGNED_CHECK, COLD_START_CHECK, FINITE_UNIT_CHECK, build_hierarchy_assets
from hir_assets.index import (HEAD_COVERAGE_CHECK, HEAD_FINITE_CHECK, HEAD_RANKER_CHECK, HEAD_WEIGHTS_CHECK, POSTING_SHARE_CHECK, RECALL_CHECK,
                              TOKENS_PER_LEVEL_CHECK, build_index_assets)
from hir_assets.partitions import window_partitions
from hir_assets.resources import LocalPartitionStorage, SourceResource
from hir_model import cli
from hir_model.config import HIRConfig
from hir_model.embed import EMBEDDINGS_ASSET
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.nn import Encoder, EncoderConfig
from hir_model.rank.recommender import Recommender
from hir_model.rank.state import HEAD_ASSET
from hir_model.retrieval.index import BOM_ASSET
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import checkpoint_path, save_checkpoint

KEYS = ["2024-01-07", "2024-01-14"]
MINE = [EMBEDDINGS_ASSET, HIERARCHY_ASSET, HEAD_ASSET, BOM_ASSET]
RUN_CONFIG = {"ops": {BOM_ASSET: {"config": {"max_posting_share": 1.0}}}}  # 4 items: a 5% cap would keep 1 per token


PERMS = [[1, 0], [2, 0, 1]]  # window 2's prototype rows: window 1's, reordered


def fake_checkpoint(store: PartitionStore, key: str, permute: bool = False) -> None:
    """Random weights in the hir_encoder partition folder (training is another issue: this tests wiring, not quality);
    `permute`: the same prototypes in another row order (what a retrained checkpoint may well do)."""
    torch.manual_seed(0)
    enc = Encoder(EncoderConfig(layers=1, heads=2, width=16, hash_hidden=16, compile_dense_bias=False))
    protos = [torch.nn.functional.normalize(torch.randn(k, 16), dim=-1) for k in (2, 3)]
    protos = [p[perm] for p, perm in zip(protos, PERMS)] if permute else protos
    path = checkpoint_path(store, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, enc, protos, step=0, window=key)


@pytest.fixture
def materialised(byo: Path, tmp_path: Path):
    config = HIRConfig(source="parquet", window="weekly", parquet_path=str(byo), storage_uri=str(tmp_path / "store"),
                       data_dir=tmp_path / "data")
    partitions = window_partitions(config.window_spec())
    assets = build_ingest_assets(partitions) + build_graph_assets(partitions) + build_hierarchy_assets(partitions) + \
        build_index_assets(partitions)
    job = dg.Definitions(assets=assets, resources={"storage": LocalPartitionStorage(root=config.storage_uri),
                                                   "source": SourceResource.from_config(config)}).resolve_implicit_global_asset_job_def()
    store, instance = PartitionStore(config.storage_uri), dg.DagsterInstance.ephemeral()
    results = []
    for i, key in enumerate(KEYS):
        fake_checkpoint(store, key, permute=i > 0)
        results.append(job.execute_in_process(partition_key=key, instance=instance, run_config=RUN_CONFIG, raise_on_error=False))
    return config, store, results


def metadata(result, asset: str) -> dict:
    (mat,) = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
              if e.asset_key.to_user_string() == asset]
    return {k: v.value for k, v in mat.metadata.items()}


def test_assets_materialise_and_pass_checks(materialised):
    _, store, results = materialised
    for r in results:
        assert r.success
        evals = {e.check_name: e for e in r.get_asset_check_evaluations() if e.asset_key.to_user_string() in MINE}
        assert set(evals) == {FINITE_UNIT_CHECK, COLD_START_CHECK, ASSIGNED_CHECK, TOKENS_PER_LEVEL_CHECK, POSTING_SHARE_CHECK,
                              RECALL_CHECK, HEAD_FINITE_CHECK, HEAD_COVERAGE_CHECK, HEAD_WEIGHTS_CHECK,
                              HEAD_RANKER_CHECK}
        assert all(e.passed for e in evals.values()), {k: e.description for k, e in evals.items() if not e.passed}
    first, second = (metadata(r, EMBEDDINGS_ASSET) for r in results)
    assert first["by_type"] == {"advertiser": 1, "campaign": 1, "product": 2, "user": 2}
    assert second["by_type"]["product"] == 3 and second["cold_start"] >= 1  # p3 arrives in window 2 with no events: cold start
    h1, h2 = (metadata(r, HIERARCHY_ASSET) for r in results)
    assert h1["previous_partition"].startswith("none") and h2["previous_partition"] == KEYS[0]
    assert h2["share_matched"] == {"L0": 1.0, "L1": 1.0}  # same prototypes, reordered: every id carried over
    prims = store.read(HIERARCHY_ASSET, KEYS[1], "primitives").to_pandas()
    for lvl, perm in enumerate(PERMS):  # row r of window 2 is row perm[r] of window 1, whose id was perm[r]
        assert prims[prims.level == lvl].sort_values("row").primitive.tolist() == perm
    assert "| level | primitive |" in h1["top_primitives"]
    assert metadata(results[1], BOM_ASSET)["recall_at_100"] == 1.0
    assert {p.name for p in store.files(BOM_ASSET, KEYS[1])} == {"tokens.parquet", "postings.parquet", "items.parquet",
                                                                   "items.faiss", "codebook.parquet", "probe.json"}


def test_cli_retrieve_prints_items_tokens_and_labels(materialised, monkeypatch, capsys, tmp_path):
    config, store, _ = materialised
    monkeypatch.setenv("HIR_STORAGE_URI", config.storage_uri)
    rec = Recommender.load(store, KEYS[1])
    engaged = set(rec.state.item_ids[rec.state.history.item[rec.state.history.user == rec.user_index["u1"]]])
    assert engaged and len(engaged) < rec.state.n_items
    assert cli.main(["retrieve", "--window", KEYS[1], "--user", "u1", "--k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("for user u1 [L0:") and "BoM" in out[0] and "engaged items left out" in out[0]
    listed = [line.split()[3] for line in out[1:]]
    assert len(out) == 1 + rec.state.n_items - len(engaged) and not engaged & set(listed)  # never an engaged item
    assert listed == [h.entity_id for h in rec.recommend("u1", k=3)]  # the CLI is the Python API
    assert all(" L0:" in line and " L1:" in line for line in out[1:])
    assert cli.main(["retrieve", "--window", KEYS[1], "--user", "u1", "--k", "3", "--include-seen"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + rec.state.n_items and engaged <= {line.split()[3] for line in out[1:]}
    assert cli.main(["retrieve", "--window", KEYS[1], "--user", "stranger"]) == 2
    assert "has no history in window " + KEYS[1] in capsys.readouterr().err
    item = sorted(engaged)[0]
    assert cli.main(["retrieve", "--window", KEYS[1], "--user", "stranger", "--context", f"{item}:purchase,nope"]) == 0
    captured = capsys.readouterr()
    assert "a context of 1 events" in captured.out and "nope" in captured.err and item not in captured.out.split()
    (tmp_path / "ctx.csv").write_text(f"entity_id,event_type\n{item},purchase\n")
    assert cli.main(["retrieve", "--window", KEYS[1], "--user", "stranger", "--context-file", str(tmp_path / "ctx.csv")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == captured.out.splitlines()[1:]  # the same context, the same answer
    assert cli.main(["retrieve", "--window", KEYS[1], "--context", f"{item}:bought"]) == 2
    assert "event_type 'bought'" in capsys.readouterr().err
    assert cli.main(["retrieve", "--window", KEYS[1], "--entity", "p1", "--k", "2", "--exact"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "exact faiss" in out[0] and all("p1 " not in line for line in out[1:])
    assert cli.main(["retrieve", "--window", "2030-01-06", "--user", "u1"]) == 2
    assert "never materialised" in capsys.readouterr().err


def test_hir_toml_embed_settings_reach_the_asset_and_the_run_config_wins(materialised):
    config, store, _ = materialised
    partitions = window_partitions(config.window_spec())
    resources = {"storage": LocalPartitionStorage(root=config.storage_uri), "source": SourceResource.from_config(config)}
    with pytest.raises(ValueError, match=r"unknown fields \['user'\]"):  # a typo in hir.toml fails when definitions load
        build_hierarchy_assets(partitions, {"user": "narrow"})

    def view_of(overrides: dict, run_config: dict | None = None) -> str:
        (embeddings,) = [a for a in build_hierarchy_assets(partitions, overrides) if EMBEDDINGS_ASSET in {k.path[-1] for k in a.keys}]
        result = dg.materialize([embeddings], partition_key=KEYS[1], resources=resources, run_config=run_config,
                                instance=dg.DagsterInstance.ephemeral())
        assert result.success
        return metadata(result, EMBEDDINGS_ASSET)["view"]

    assert "users:" not in view_of({})  # every entity on the checkpoint's broad view
    narrow = view_of({"users": "narrow"})
    assert "users: narrow" in narrow and "max_age_days=14.0" in narrow  # TrainConfig's student view (a bare checkpoint)
    assert "users:" not in view_of({"users": "narrow"}, {"ops": {EMBEDDINGS_ASSET: {"config": {"users": "broad"}}}})
