"""The baselines side by side: one config, one constructor (HIR joins as one more `Method`).

item2item_recent is the sequence-aware peer of HIR's recent-items head (hir_model.eval.sequence)."""

from __future__ import annotations

from dataclasses import dataclass

from hir_model.eval.als import ALSConfig, ImplicitALS
from hir_model.eval.content_knn import ContentKNN, ContentKNNConfig
from hir_model.eval.lightgcn import LightGCN, LightGCNConfig
from hir_model.eval.method import Method
from hir_model.eval.popularity import Popularity, PopularityConfig
from hir_model.eval.sequence import Item2ItemConfig, Item2ItemRecent


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
