"""Comparison rows from per-user values: verdicts, scopes, and the same rows from the published table."""

from __future__ import annotations

import numpy as np
import pytest

from hir_model.eval.compare import BootstrapConfig, compare, compare_runs, comparison_markdown, user_values
from hir_model.eval.run import WindowEvaluation, WindowSkipped
from hir_model.eval.scoring import SliceResult
from hir_model.protocol.metrics import RankingMetrics
from hir_model.protocol.split import SplitCounts

COUNTS = SplitCounts(0, 0, 0, 0, 0, 0, 0, 0, 0)
WINDOWS = ["2024-01-07", "2024-01-14", "2024-01-21", "2024-01-28", "2024-02-04", "2024-02-11"]


def _slice(method, users, values, user_ids) -> SliceResult:
    m = RankingMetrics(len(values), len(values), {20: float(np.mean(values))}, {20: float(np.mean(values))},
                       {"recall@20": values, "ndcg@20": values}, np.arange(len(values)))
    return SliceResult(method, users, "known", "deep_funnel", 100, m, np.asarray(user_ids, object))


def _evaluations(seed=0, n=300):
    """ref; better = ref + 0.1 for everyone in the last two windows only (a late lead), + noise elsewhere; same = ref;
    noisy = ref + zero-mean noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i, w in enumerate(WINDOWS):
        ids = [f"u{j}" for j in rng.choice(1000, n, replace=False)]
        ref = rng.uniform(0, 1, n)
        better = ref + (0.1 if i >= len(WINDOWS) - 2 else 0.0) + rng.normal(0, 0.01, n)
        noisy = ref + rng.normal(0, 0.3, n)
        results = [_slice("ref", "warm", ref, ids), _slice("better", "warm", better, ids),
                   _slice("same", "warm", ref.copy(), ids), _slice("noisy", "warm", noisy, ids)]
        if i == 0:  # a method that only has users in the first window
            results.append(_slice("early", "warm", ref[:10] + 1.0, ids[:10]))
        out.append(WindowEvaluation(w, w + "+1", COUNTS, "none", tuple(results), (), None, ("ref", "better", "same", "noisy")))
    return out


def _row(rows, method, scope, reference="ref"):
    return next(r for r in rows if (r.method, r.reference, r.scope) == (method, reference, scope))


def test_verdicts_follow_the_interval():
    evs = _evaluations() + [WindowSkipped("2024-02-18", "no successor")]
    rows = compare(evs, "ref", last=2, config=BootstrapConfig(n_boot=500))
    assert {r.method for r in rows} == {"better", "same", "noisy", "early"}
    late = _row(rows, "better", "last2")
    assert late.verdict == "lead" and late.diff == pytest.approx(0.1, abs=0.005) and late.n_users == (300, 300)
    assert late.low > 0 and late.method_value - late.reference_value == pytest.approx(late.diff)
    assert _row(rows, "better", WINDOWS[0]).verdict == "tie"  # no lead in an early window: its noise only
    assert _row(rows, "better", "all").windows == len(WINDOWS)
    same = _row(rows, "same", "all")
    assert same.verdict == "tie" and (same.diff, same.low, same.high) == (0.0, 0.0, 0.0)
    assert _row(rows, "noisy", "all").verdict == "tie"
    early = _row(rows, "early", "all")
    assert early.n_users == (10,) and early.verdict == "lead"  # pooled over the one window where it has users
    assert _row(rows, "early", "last2").verdict == "n/a" and np.isnan(_row(rows, "early", "last2").diff)


def test_pairs_and_method_subsets_and_behind():
    rows = compare(_evaluations(), "better", methods=["ref"], pairs=[("same", "noisy")], per_window=False, last=None,
                   config=BootstrapConfig(n_boot=300))
    assert [(r.method, r.reference, r.scope) for r in rows] == [("ref", "better", "all"), ("same", "noisy", "all")]
    assert rows[0].verdict == "behind" and rows[0].high < 0


def test_a_run_against_a_saved_run_pairs_each_method_over_the_users_both_judged():
    current = _evaluations()
    saved = user_values(current)
    saved = saved[saved.method != "noisy"]  # a method the saved run did not have: not compared
    lower = saved.method == "ref"
    saved.loc[lower, "value"] -= 0.2  # the saved run's ref was worse for everyone
    kept = saved[(saved.method != "same") | (saved.user_id.str[1:].astype(int) % 2 == 0)]  # half of same's users
    rows = compare_runs(current, kept, last=2, config=BootstrapConfig(n_boot=300))
    got = {(r.method, r.scope): r for r in rows}
    assert {m for m, _ in got} == {"ref", "better", "same", "early"} and all(r.reference == r.method + "@saved" for r in rows)
    assert got["ref", "all"].verdict == "lead" and got["ref", "all"].diff == pytest.approx(0.2)
    same = got["same", "all"]
    full = _row(compare(current, "ref", per_window=False, last=None), "same", "all")
    assert same.verdict == "tie" and same.diff == 0.0 and sum(same.n_users) < sum(full.n_users) / 2 + 200
    assert compare_runs(current, kept, methods=["better"], last=None)[0].method == "better"


def test_the_published_table_gives_the_same_rows_as_the_evaluations():
    evs = _evaluations(1)
    table = user_values(evs)
    assert set(table.metric) == {"recall@20", "ndcg@20"}
    cfg = BootstrapConfig(n_boot=200, seed=3)
    from_table, from_evs = compare(table, "ref", metric="ndcg@20", config=cfg), compare(evs, "ref", metric="ndcg@20", config=cfg)
    key = lambda rows: [(r.method, r.scope, r.verdict) for r in rows]  # noqa: E731
    assert key(from_table) == key(from_evs) and len(from_evs) == 4 * (len(WINDOWS) + 2) - (len(WINDOWS) - 1)
    assert [r for r in from_table if r.verdict != "n/a"] == [r for r in from_evs if r.verdict != "n/a"]
    assert compare(evs, "ref", users="cold", config=cfg) == []  # no such slice: nothing to compare
    assert {r.verdict for r in compare(evs, "ref", methods=["better"], users="cold", config=cfg)} == {"n/a"}
    with pytest.raises(ValueError, match="missing"):
        user_values(table.drop(columns=["user_id"]))


def test_markdown_has_a_row_per_comparison():
    rows = compare(_evaluations(), "ref", methods=["better"], last=2, config=BootstrapConfig(n_boot=200))
    text = comparison_markdown(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows) and "95% CI" in lines[0]
    assert "| better | ref | last2 | 2 | 300.0 (300-300) |" in text and text.count("| lead |") >= 1
