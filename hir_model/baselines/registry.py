"""The baselines side by side: one config, one constructor (HIR joins as one more `Method`).

item2item_recent is the sequence-aware peer of HIR's recent-items head (hir_model.baselines.sequence)."""

from __future__ import annotations

from dataclasses import dataclass

from hir_model.baselines.als import ALSConfig, ImplicitALS
from hir_model.baselines.content_knn import ContentKNN, ContentKNNConfig
from hir_model.baselines.lightgcn import LightGCN, LightGCNConfig
from hir_model.baselines.popularity import Popularity, PopularityConfig
from hir_model.baselines.sequence import Item2ItemConfig, Item2ItemRecent
from hir_model.protocol.method import Method


@dataclass(frozen=True)
class BaselinesConfig:
    popularity: PopularityConfig = PopularityConfig()
    content: ContentKNNConfig = ContentKNNConfig()
    als: ALSConfig = ALSConfig()
    lightgcn: LightGCNConfig = LightGCNConfig()
    item2item: Item2ItemConfig = Item2ItemConfig()


def baselines(config: BaselinesConfig = BaselinesConfig()) -> list[Method]:
    """Fresh baseline instances (stateful ones warm-start window to window when reused in time order)."""
    return [Popularity(config.popularity), ContentKNN(config.content), ImplicitALS(config.als), LightGCN(config.lightgcn),
            Item2ItemRecent(config.item2item)]
