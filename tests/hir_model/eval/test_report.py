"""The per-source evaluation report: one page per source under its own storage, headed by what it shows."""

from __future__ import annotations

import re

import pytest
import torch

from hir_model.baselines.als import ALSConfig
from hir_model.baselines.registry import BaselinesConfig, baselines
from hir_model.baselines.lightgcn import LightGCNConfig
from hir_model.eval.publish import EVALUATION_ASSET, METRICS_FILE, SUMMARY_FILE, summary_table
from hir_model.eval.pages import (comparison_table, git_commit, print_last_window, report_path, user_band,
                                  write_source_report)
from hir_model.eval.report import evaluated, per_method_figure, plot_per_method
from hir_model.eval.run import evaluate_windows
from hir_model.eval.scoring import EvalConfig
from hir_model.storage import PartitionStore
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store

torch.set_num_threads(1)
SMALL = BaselinesConfig(als=ALSConfig(factors=4, iterations=3), lightgcn=LightGCNConfig(dim=4, steps=5, warm_steps=2))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    store = tiny_store(tmp_path_factory.mktemp("tiny") / "store")
    return evaluate_windows(store, SPEC, KEYS, baselines(SMALL), EvalConfig(recall_ks=(1, 20), ndcg_ks=(3,)))


def publish(root, results) -> PartitionStore:
    """A store holding the published window_evaluation partitions of `results` (what the asset writes)."""
    store = PartitionStore(root)
    with store.writing() as staging:
        for ev in evaluated(results):
            staging.write_table(EVALUATION_ASSET, ev.window, METRICS_FILE, ev.to_table())
            staging.write_table(EVALUATION_ASSET, ev.window, SUMMARY_FILE, summary_table(ev, {}))
    return store


def test_two_sources_keep_two_reports_each_naming_its_source_windows_and_commit(results, tmp_path):
    pages = {}
    for source in ("movielens", "synthetic"):
        store = publish(tmp_path / "storage" / source, results)
        report = write_source_report(store, KEYS, report_path(store.root), source, {"window": "weekly", "steps": "12"},
                                     commit="abc123def456")
        pages[source] = report.path.read_text()
        assert report.path == tmp_path / "storage" / source / "_reports" / "evaluation.html"
        assert (report.evaluated, report.first, report.last) == (2, KEYS[0], KEYS[1])
        assert not list(report.path.parent.glob(".*.tmp"))  # written whole, then renamed
    assert len({p for p in pages.values()}) == 2
    for source, page in pages.items():
        other = "synthetic" if source == "movielens" else "movielens"
        title = re.search(r"<title>(.*?)</title>", page).group(1)
        assert source in title and other not in page and f"{KEYS[0]} .. {KEYS[1]}" in title
        assert "abc123def456" in page and "<th>steps</th><td>12</td>" in page and "2 of 3" in page
        assert page.count("data:image/png;base64,") == 4  # per window, per method, engagements, cold vs warm
        assert "by method" in page and f"{KEYS[2]}" in page  # the skipped window is listed


def test_comparisons_carry_paired_cis_and_the_bands_come_from_the_users(results, tmp_path, capsys):
    import numpy as np

    from hir_model.eval.publish import write_evaluation
    from hir_model.protocol.stats import bootstrap_mean

    evals = evaluated(results)
    md = comparison_table(evals, last=1)
    assert md.startswith("| users |") and "95% CI" in md and "| popularity |" in md.splitlines()[2]
    assert {line.split("|")[7].strip() for line in md.splitlines()[2:]} == {"all", "last1"}  # pooled scopes only
    assert all(line.split("|")[-2].strip() in {"lead", "behind", "tie", "n/a"} for line in md.splitlines()[2:])
    r = next(r for r in evals[0].results if r.method == "lightgcn" and r.target == "deep_funnel" and r.metrics.per_user)
    ci = bootstrap_mean(r.metrics.per_user["recall@20"])
    assert user_band(evals[0], "lightgcn", r.users, r.items, r.target, "recall@20") == (ci.low, ci.high)
    assert ci.low <= r.metrics.recall[20] <= ci.high and user_band(evals[0], "nobody", "warm", "known", "deep_funnel", "recall@20") is None
    store = PartitionStore(tmp_path / "store")
    with store.writing() as staging:  # the asset's files, per-user values included: the demo's summary reads them back
        for ev in evals:
            write_evaluation(staging, ev.window, ev, {}, [])
    assert print_last_window(store, KEYS) == KEYS[1]
    out = capsys.readouterr().out
    assert "paired bootstrap 95% CI over users" in out and "| lightgcn | popularity | all |" in out.replace("  ", " ")
    assert np.isfinite(ci.low)


def test_the_per_method_plot_shades_a_band_where_one_is_given(results):
    plain = plot_per_method(results)
    banded = plot_per_method(results, band=lambda e, m, u, i, t, metric: (0.0, 1.0))
    assert plain[:8] == banded[:8] == b"\x89PNG\r\n\x1a\n" and plain != banded


def test_the_per_method_titles_and_frames_clear_the_dates_of_the_panel_above(results):
    import matplotlib.pyplot as plt

    fig = per_method_figure(results, columns=2)
    try:
        fig.draw_without_rendering()  # the layout engine places the panels as savefig does (sizes in inches: any dpi)
        renderer = fig.canvas.get_renderer()
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len({round(ax.get_position().y0, 3) for ax in panels}) >= 2  # two rows at least: a panel above another
        for upper in panels:
            dates = [t.get_window_extent(renderer) for t in upper.get_xticklabels() if t.get_text()]
            assert len(dates) == len(evaluated(results))
            for lower in (ax for ax in panels if ax is not upper):
                title, frame = lower.title.get_window_extent(renderer), lower.get_window_extent(renderer)
                assert not any(d.overlaps(title) or d.overlaps(frame) for d in dates), \
                    f"{upper.get_title()!r}'s dates run into {lower.get_title()!r}"
    finally:
        plt.close(fig)


def test_the_commit_names_the_checkout_marks_local_changes_or_says_unknown(tmp_path):
    import subprocess

    assert git_commit(tmp_path) == "unknown"  # not a checkout
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *args: subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout  # noqa: E731
    git("init", "-q")
    (repo / "a.txt").write_text("1")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = git("rev-parse", "--short=12", "HEAD").strip()
    assert git_commit(repo) == head and re.fullmatch(r"[0-9a-f]{12}", head)
    (repo / "a.txt").write_text("2")
    assert git_commit(repo) == f"{head}+dirty"
