"""The served `hir` row on items first seen in t+1, answered from window t's published increments as they stood at each
judged engagement: on the tiny store, p6 arrives at W1 + 3 h and u1 first clicks it at W1 + 4 h."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.content import ContentConfig
from hir_model.eval.window_evaluation import WindowEvalConfig, evaluate_published_window, future_reads
from hir_model.rank.increment import INCREMENT_ASSET, build_increment, day_of, write_increment
from hir_model.storage import PartitionStore
from tests.hir_model.eval.tiny import KEYS, SPEC
from tests.hir_model.rank.test_increment import DAY, source  # noqa: F401  (fixture)
from tests.hir_model.rank.test_serve import full_store  # noqa: F401  (fixture)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def store(full_store, source):  # noqa: F811
    store = PartitionStore(full_store)
    for day in (DAY, day_of("2024-01-16")):  # p6's day, and a day without arrivals
        build = build_increment(store, source, SPEC.window(KEYS[0]), day, ContentConfig())
        with store.writing() as staging:
            write_increment(staging.path(INCREMENT_ASSET, day.key), build.increment)
    return store


def _evaluate(store, **config):
    return evaluate_published_window(store, SPEC, KEYS[0], WindowEvalConfig(methods=("hir", "hir_exact"), **config))


@pytest.mark.parametrize("cadence, lag_s, served", [("arrival", 120.0, True),  # published 2 min after it arrived
                                                    ("arrival", 2 * 3600.0, False),  # 2 h after: after u1's click
                                                    ("day_end", 0.0, False)])  # at midnight: after u1's click
def test_a_new_item_is_served_only_from_the_moment_its_increment_existed(store, cadence, lag_s, served):
    outcome = _evaluate(store, arrival_cadence=cadence, arrival_lag_s=lag_s)
    ev = outcome.evaluation
    assert ev.counts.new_items == 1  # p6 alone: unserved, it would still rank first by the tie order
    assert ev.value("hir", "warm", "new", "engagement", "recall@20") == (1.0 if served else 0.0)
    assert ev.value("hir_exact", "warm", "new", "engagement", "recall@20") == 1.0  # every new item, whenever
    assert outcome.hir.increments == {"days": [DAY.key, "2024-01-16"], "items": 1, "cadence": cadence, "lag_s": lag_s}
    assert (INCREMENT_ASSET, DAY.key) in outcome.opened
    assert future_reads(outcome.opened, KEYS[0], KEYS[1], KEYS[2]) == []  # t+1's days: allowed
    assert future_reads(outcome.opened, KEYS[0], KEYS[1], KEYS[1]) == [(INCREMENT_ASSET, DAY.key), (INCREMENT_ASSET, "2024-01-16")]


def test_known_items_are_judged_as_without_increments(store):
    with_inc, without = _evaluate(store).evaluation, _evaluate(store, increments=False).evaluation
    known = [(r.method, r.users, r.target, r.metrics.as_dict()) for r in with_inc.results if r.items == "known"]
    assert known == [(r.method, r.users, r.target, r.metrics.as_dict()) for r in without.results if r.items == "known"]
    assert np.isfinite([m["recall@20"] for _, users, _, m in known if users != "audience"]).all() and known
    assert without.value("hir", "warm", "new", "engagement", "recall@20") == 1.0  # no increment: p6 ranks alone by ties
