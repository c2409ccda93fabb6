"""Publishing a window's evaluation with its per-user values, and reading them back over windows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from hir_model.baselines.als import ALSConfig
from hir_model.baselines.lightgcn import LightGCNConfig
from hir_model.baselines.registry import BaselinesConfig, baselines
from hir_model.eval.publish import (EVALUATION_ASSET, METRICS_FILE, STATE_FILE, USERS_FILE, collect, collect_users, from_tables,
                                    read_evaluation, summary_table, with_user_values, write_evaluation)
from hir_model.eval.run import WindowEvaluation, evaluate_windows
from hir_model.eval.scoring import EvalConfig
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

torch.set_num_threads(1)
SMALL = BaselinesConfig(als=ALSConfig(factors=4, iterations=3), lightgcn=LightGCNConfig(dim=4, steps=5, warm_steps=2))


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    store = tiny_store(tmp_path_factory.mktemp("store"))
    methods = baselines(SMALL)
    results = [r for r in evaluate_windows(store, SPEC, KEYS, methods, EvalConfig(lift_method=None))
               if isinstance(r, WindowEvaluation)]
    for ev in results:
        with store.writing() as staging:
            write_evaluation(staging, ev.window, ev, {"note": 1}, methods)
    return store, results


def test_every_file_is_written_and_the_metrics_table_is_the_one_published_before(published):
    store, results = published
    for ev in results:
        assert store.read(EVALUATION_ASSET, ev.window, METRICS_FILE).equals(ev.to_table())
        assert (store.partition_dir(EVALUATION_ASSET, ev.window) / STATE_FILE).is_file()
        assert store.read(EVALUATION_ASSET, ev.window, USERS_FILE).equals(ev.to_user_table())


def test_read_back_with_each_slices_users_and_values(published):
    store, results = published
    back, extras = read_evaluation(store, results[0].window)
    assert extras == {"note": 1} and back.to_table().equals(results[0].to_table())
    for a, b in zip(results[0].results, back.results):
        published = {"recall@1pct", "auc"} if a.users == "audience" else {"recall@20", "ndcg@20"}  # per entity / user
        assert list(a.user_ids) == list(b.user_ids) and set(b.metrics.per_user) == published
        assert all(np.array_equal(a.metrics.per_user[m], b.metrics.per_user[m]) for m in published)
    assert back.to_user_table().equals(results[0].to_user_table())
    assert [e.window for e in collect(store, KEYS)[:2]] == KEYS[:2]


def test_collect_users_concatenates_the_windows_that_have_them(published):
    store, results = published
    table = collect_users(store, KEYS)
    assert table.num_rows == sum(ev.to_user_table().num_rows for ev in results)
    assert sorted(set(table.column("window").to_pylist())) == [ev.window for ev in results]
    assert collect_users(store, []).num_rows == 0


def test_a_users_table_that_does_not_match_the_metrics_is_refused(published):
    _, results = published
    table = results[0].to_user_table()
    with pytest.raises(ValueError, match="users in metrics"):
        with_user_values(results[0], table.slice(1))
    bare, _ = from_tables(results[0].to_table(), summary_table(results[0]))
    assert bare.results[0].user_ids is None and bare.results[0].metrics.per_user == {}
    assert with_user_values(bare, table.slice(0, 0)).results[0].user_ids is None  # no rows: no values, no error
    frame = table.to_pandas()
    assert with_user_values(results[0], pa.Table.from_pandas(frame, preserve_index=False)).to_user_table().equals(table)
