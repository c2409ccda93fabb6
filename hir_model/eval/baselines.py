"""The baselines side by side: one config, one constructor (HIR joins as one more `Method`)."""

from __future__ import annotations

from dataclasses import dataclass

from hir_model.eval.als import ALSConfig, ImplicitALS
from hir_model.eval.content_knn import ContentKNN, ContentKNNConfig
from hir_model.eval.lightgcn import LightGCN, LightGCNConfig
from hir_model.eval.method import Method
from hir_model.eval.popularity import Popularity, PopularityConfig


@dataclass(frozen=True)
class BaselinesConfig:
    popularity: PopularityConfig = PopularityConfig()
    content: ContentKNNConfig = ContentKNNConfig()
    als: ALSConfig = ALSConfig()
    lightgcn: LightGCNConfig = LightGCNConfig()


def baselines(config: BaselinesConfig = BaselinesConfig()) -> list[Method]:
    """Fresh baseline instances (stateful ones warm-start window to window when reused in time order)."""
    return [Popularity(config.popularity), ContentKNN(config.content), ImplicitALS(config.als), LightGCN(config.lightgcn)]
