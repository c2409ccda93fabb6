"""End to end on the tiny store: every baseline through evaluate_windows, then the report."""

from __future__ import annotations

import numpy as np
import torch

from hir_model.baselines.als import ALSConfig
from hir_model.baselines.lightgcn import LightGCNConfig
from hir_model.baselines.registry import BaselinesConfig, baselines
from hir_model.eval.pages import write_report
from hir_model.eval.report import markdown_table, summary
from hir_model.eval.run import WindowEvaluation, WindowSkipped, evaluate_windows
from hir_model.eval.scoring import EvalConfig
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

torch.set_num_threads(1)
SMALL = BaselinesConfig(als=ALSConfig(factors=4, iterations=3), lightgcn=LightGCNConfig(dim=4, steps=5, warm_steps=2))


def test_every_baseline_on_every_window_then_the_report(tmp_path):
    results = evaluate_windows(tiny_store(tmp_path / "store"), SPEC, KEYS, baselines(SMALL), EvalConfig(recall_ks=(1, 3, 20), ndcg_ks=(3,)))
    assert [type(r) for r in results] == [WindowEvaluation, WindowEvaluation, WindowSkipped]
    first = results[0]
    assert first.content_source == "text" and first.methods == ("popularity", "content", "mf_als", "lightgcn", "item2item_recent")
    slices = {(r.users, r.items, r.target) for r in first.results}
    assert slices == {("warm", "known", "deep_funnel"), ("warm", "known", "engagement"), ("warm", "new", "engagement"),
                      ("cold", "known", "deep_funnel"), ("cold", "known", "engagement"),
                      ("audience", "known", "product"), ("audience", "known", "advertiser")}  # p3, p5; a2 (p3's)
    for r in first.results:
        if r.users == "audience":
            continue
        assert r.candidates == (5 if r.items == "known" else 1) and 0 <= r.metrics.recall[3] <= 1
    # u1's only new-item target is p6, the only new candidate: found at rank 1 by everyone
    assert all(first.value(m, "warm", "new", "engagement", "recall@1") == 1.0 for m in first.methods)
    assert np.isnan(first.value("popularity", "cold", "new", "engagement", "recall@1"))
    assert {t.method for t in first.timings} == set(first.methods)

    table = markdown_table(results)
    assert table.count("| deep_funnel | warm | known |") == 5 and "recall@20" in table
    assert {r.windows for r in summary(results) if (r.users, r.items) == ("warm", "known")} == {2}
    assert {r.windows for r in summary(results) if r.users == "cold"} == {1}  # W2 brings no new user
    files = write_report(results, tmp_path / "report", title="tiny")
    page = files.html.read_text()
    assert page.count("data:image/png;base64,") == 3 and "no successor" in page
    assert files.per_window_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files.markdown.read_text().startswith("# tiny")


def test_metrics_table_has_a_row_per_method_slice_and_metric(tmp_path):
    from hir_model.baselines.popularity import Popularity
    from hir_model.eval.run import evaluate_window

    result = evaluate_window(tiny_store(tmp_path), SPEC, KEYS[0], [Popularity()], EvalConfig(lift_method=None))
    table = result.to_table()
    ranking = [r for r in result.results if r.users != "audience"]  # 5 metrics each; the audience slice's 4
    assert table.num_rows == len(ranking) * 5 + (len(result.results) - len(ranking)) * 4
    assert set(table.column("method").to_pylist()) == {"popularity"}
    row = [r for r in table.to_pylist() if r["metric"] == "recall@20"][0]
    assert row["value"] == result.value("popularity", row["users"], row["items"], row["target"], "recall@20")


def test_content_vectors_come_from_the_content_asset_when_published(tmp_path):
    import pyarrow as pa

    from hir_model.content import CONTENT_ASSET, CONTENT_FILE
    from hir_model.eval.run import TableReader, item_content, load_split

    store = tiny_store(tmp_path)
    vec = {"p1": [1.0, 0.0], "p2": [0.0, 1.0], "p3": None, "p6": [0.5, 0.5]}  # p3 without content, p4/p5 missing
    with store.writing() as staging:
        for key in KEYS[:2]:
            ids = [i for i in vec if key == KEYS[1] or i != "p6"]
            staging.write_table(CONTENT_ASSET, key, CONTENT_FILE, pa.table(
                {"entity_id": ids, "embedding": pa.array([vec[i] for i in ids], pa.list_(pa.float32(), 2))}))
    window = SPEC.window(KEYS[0])
    reader = TableReader(store)
    split, _ = load_split(reader, SPEC, window, SPEC.next(window), EvalConfig())
    items, source = item_content(reader, split.items, window, SPEC.next(window), EvalConfig())
    assert source == "asset" and items.ids.tolist() == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert items.has_content.tolist() == [True, True, False, False, False, True]
    np.testing.assert_array_equal(items.content[[0, 1, 5]], [[1, 0], [0, 1], [0.5, 0.5]])
    # the asset partition of t+1 is read only for the items first seen in t+1
    assert (CONTENT_ASSET, KEYS[1]) in reader.opened and (CONTENT_ASSET, KEYS[2]) not in reader.opened


def test_each_slice_keeps_its_users_and_the_user_table_averages_to_the_metrics(tmp_path):
    from hir_model.baselines.popularity import Popularity
    from hir_model.eval.run import USER_COLUMNS, evaluate_window

    result = evaluate_window(tiny_store(tmp_path), SPEC, KEYS[0], [Popularity()], EvalConfig(lift_method=None))
    warm = [r for r in result.results if (r.users, r.items, r.target) == ("warm", "known", "engagement")][0]
    assert list(warm.user_ids) == ["u1", "u2"]  # test_split: u1 and u2 come back in W1 with new items
    cold = [r for r in result.results if (r.users, r.items, r.target) == ("cold", "known", "engagement")][0]
    assert list(cold.user_ids) == ["u3"]
    table = result.to_user_table()
    assert table.column_names == USER_COLUMNS
    assert set(table.column("metric").to_pylist()) == {"recall@20", "ndcg@20", "recall@1pct", "auc"}
    assert table.num_rows == 2 * sum(r.metrics.n_users for r in result.results)  # two each: an audience's per entity
    frame = table.to_pandas()
    for r in result.results:
        for metric in (("recall@1pct", "auc") if r.users == "audience" else ("recall@20", "ndcg@20")):
            rows = frame[(frame.users == r.users) & (frame["items"] == r.items) & (frame.target == r.target)
                         & (frame.metric == metric)]
            assert list(rows.user_id) == list(r.user_ids) and rows.value.mean() == result.value("popularity", r.users, r.items,
                                                                                                r.target, metric)
    assert result.to_user_table(None).num_rows == sum(len(r.metrics.as_dict()) * r.metrics.n_users for r in result.results)
