"""Run config as optional overrides of the library's dataclasses (hir_assets.overrides): an unset run config is the
library's default object, a set field reaches the library, a library default change flows through, and every
override names a field of its dataclass."""

from dataclasses import dataclass, fields
from pathlib import Path

import dagster as dg
import pytest

from hir_assets.adapter import ObjectiveAdapterRun
from hir_assets.evaluation import WindowEvaluationRun
from hir_assets.hierarchy import EntityEmbeddingsRun, InterestHierarchyRun
from hir_assets.index import BomIndexRun, RankingHeadRun
from hir_assets.overrides import Overrides
from hir_assets.training import HirEncoderRun, entry_args
from hir_model.adapter.fit import AdapterConfig
from hir_model.embed import EmbedConfig
from hir_model.eval.window_evaluation import WindowEvalConfig
from hir_model.hierarchy import AssignConfig, HierarchyConfig
from hir_model.rank.head import HeadConfig
from hir_model.rank.ranker import RankerConfig
from hir_model.retrieval import IndexConfig
from hir_model.storage import PartitionStore

# run config -> (its method giving the library config, the dataclasses its overrides land on)
RUNS = {
    RankingHeadRun: ("head_config", (HeadConfig, RankerConfig)),
    BomIndexRun: ("index_config", (IndexConfig,)),
    EntityEmbeddingsRun: ("embed_config", (EmbedConfig,)),
    InterestHierarchyRun: ("hierarchy_config", (HierarchyConfig, AssignConfig)),
    ObjectiveAdapterRun: ("adapter_config", (AdapterConfig,)),
    WindowEvaluationRun: ("eval_config", (WindowEvalConfig,)),
}
OWN = {BomIndexRun: {"recall_threshold"}}  # the asset's own settings (no library dataclass has them)


def optional_fields(run: type[Overrides]) -> set[str]:
    return set(run.model_fields) - OWN.get(run, set())


@pytest.mark.parametrize("run", list(RUNS), ids=lambda r: r.__name__)
def test_an_unset_run_config_is_the_library_default(run):
    method, (target, *_) = RUNS[run]
    assert getattr(run(), method)() == target()
    assert all(run.model_fields[name].default is None for name in optional_fields(run))


@pytest.mark.parametrize("run", list(RUNS), ids=lambda r: r.__name__)
def test_every_override_names_a_library_field(run):
    _, targets = RUNS[run]
    known = {f.name for t in targets for f in fields(t)}
    assert optional_fields(run) <= known, f"{run.__name__} overrides fields its dataclasses lack: {optional_fields(run) - known}"
    assert not run.zero_means_none - optional_fields(run)


def test_a_library_default_change_flows_through():
    @dataclass(frozen=True)
    class Changed(HeadConfig):
        kernel_weight: float = 0.2  # as if HeadConfig's default changed

    assert RankingHeadRun().head_config(Changed()).kernel_weight == 0.2
    assert RankingHeadRun(kernel_weight=0.5).head_config(Changed()).kernel_weight == 0.5


def test_set_fields_reach_the_library():
    head = RankingHeadRun(recent_weight=0.0, calibrate_days=0, cold_prior_days=3).head_config()
    assert head == HeadConfig(recent_weight=0.0, calibrate_days=None, cold_prior_days=3.0)  # 0 days: off
    assert RankingHeadRun(rows_track_min_users=0).head_config().rows_track_min_users is None  # 0: the head's threshold
    assert RankingHeadRun(rows_track_min_users=50).head_config().rows_track_min_users == 50
    assert BomIndexRun(probe_factor=0).index_config().probe_factor is None  # 0: tuned, as the default
    assert BomIndexRun(probe_factor=2, exact_max=10).index_config() == IndexConfig(probe_factor=2.0, exact_max=10)
    hierarchy = InterestHierarchyRun(top_k=2, centroid_steps=0, reseed_dead=False).hierarchy_config()
    assert hierarchy == HierarchyConfig(AssignConfig(top_k=2), centroid_steps=0, reseed_dead=False)
    assert ObjectiveAdapterRun(steps=20, batch_size=8).adapter_config() == AdapterConfig(steps=20, batch_size=8)
    assert WindowEvaluationRun(warm_start=False).eval_config() == WindowEvalConfig(warm_start=False)
    assert EntityEmbeddingsRun(batch_size=32).embed_config() == EmbedConfig(batch_size=32)
    with pytest.raises(ValueError):  # the dataclass's own checks still run
        RankingHeadRun(kernel_weight=2.0).head_config()


def test_run_config_from_the_launchpad_reaches_the_library():
    seen = []

    @dg.asset
    def head(config: RankingHeadRun) -> None:
        seen.append(config.head_config())

    assert dg.materialize([head]).success
    run_config = {"ops": {"head": {"config": {"prior_weight": 0, "calibrate_days": 0, "kernel_weight": 0.25}}}}
    assert dg.materialize([head], run_config=run_config).success
    assert seen == [HeadConfig(), HeadConfig(prior_weight=0.0, calibrate_days=None, kernel_weight=0.25)]


def test_hir_encoder_passes_only_what_the_run_sets(tmp_path: Path):
    store = PartitionStore(tmp_path / "store")
    out = tmp_path / "ckpt.pt"
    plain = entry_args(store, "2024-01-07", out, None, {}, HirEncoderRun())
    assert "--steps" not in plain and "--levels" not in plain and "--threads" not in plain and "--init" not in plain
    assert "--content" not in plain and "--overrides" not in plain  # no content published, no hir.toml overrides
    args = entry_args(store, "2024-01-14", out, "2024-01-07", {"steps": 12}, HirEncoderRun(steps=4, levels="2,4"))
    assert args[args.index("--steps") + 1] == "4" and args[args.index("--levels") + 1] == "2,4"
    assert args[args.index("--overrides") + 1] == '{"steps": 12}' and args[args.index("--init") + 1].endswith("checkpoint.pt")


def test_the_ranking_heads_run_config_reaches_the_ranker():
    assert RankingHeadRun().ranker_config() == RankerConfig()
    ranker = RankingHeadRun(enabled=False, rounds=30).ranker_config()
    assert not ranker.enabled and ranker.rounds == 30 and ranker.num_leaves == RankerConfig().num_leaves
