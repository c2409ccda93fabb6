"""The evaluation report: one markdown table of every metric per method (warm and cold users apart), PNG plots
(a metric per window per method; cold vs warm), and a self-contained HTML page with the plots inlined.

`write_source_report` is the per-source artefact (`make demo`, the `evaluation_report` asset): one page per source
under that source's storage (`report_path`), headed by what it shows (source, windows, commit, settings).

Numbers over several windows are means of the per-window means (each window counts once, as in "averaged
over the last 4 windows"); `windows` says in how many of them a slice had users to evaluate.
"""

from __future__ import annotations

import base64
import html
import io
import math
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hir_model.eval.run import WindowEvaluation, WindowSkipped  # noqa: E402
from hir_model.eval.split import TARGET_KINDS  # noqa: E402

SLICES = (("warm", "known"), ("cold", "known"), ("warm", "new"), ("cold", "new"))  # (users, items), report order
REPORT_DIR, REPORT_FILE = "_reports", "evaluation.html"  # under the source's storage root ("_": not an asset)
# A per-point interval for the plots: band(evaluation, method, users, items, target, metric) -> (low, high) or None
Band = Callable[["WindowEvaluation", str, str, str, str, str], "tuple[float, float] | None"]
SLICE_TITLES = {("warm", "known"): "warm users", ("cold", "known"): "cold users (inductive)",
                ("warm", "new"): "cold-start items, warm users", ("cold", "new"): "cold-start items, cold users"}


@dataclass(frozen=True)
class SummaryRow:
    target: str
    users: str
    items: str
    method: str
    windows: int  # windows where the slice had users
    users_per_window: float  # mean evaluated users
    candidates: float  # mean candidates ranked
    values: dict[str, float]  # metric -> mean over those windows


def evaluated(results: Sequence[WindowEvaluation | WindowSkipped]) -> list[WindowEvaluation]:
    return [r for r in results if isinstance(r, WindowEvaluation)]


def metric_names(results: Sequence[WindowEvaluation | WindowSkipped]) -> tuple[str, ...]:
    """The metrics the evaluations computed (recall@K..., ndcg@K...), in their order."""
    return tuple(dict.fromkeys(k for e in evaluated(results) for r in e.results for k in r.metrics.as_dict()))


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def summary(results: Sequence[WindowEvaluation | WindowSkipped], last: int | None = None) -> list[SummaryRow]:
    """Per (target, users, items, method): every metric averaged over the (last `last`) evaluated windows."""
    evals = evaluated(results)
    evals = evals[-last:] if last else evals
    methods = list(dict.fromkeys(m for e in evals for m in e.methods))
    names = metric_names(evals)
    rows = []
    for target in TARGET_KINDS:
        for users, items in SLICES:
            for method in methods:
                hits = [r for e in evals for r in e.results if (r.method, r.users, r.items, r.target) == (method, users, items, target)]
                if hits:
                    rows.append(SummaryRow(target, users, items, method, len(hits), _mean([h.metrics.n_users for h in hits]),
                                           _mean([h.candidates for h in hits]),
                                           {m: _mean([h.metrics.as_dict()[m] for h in hits]) for m in names}))
    return rows


def markdown_table(results: Sequence[WindowEvaluation | WindowSkipped], last: int | None = None) -> str:
    """One table: a row per (target, slice, method), a column per metric."""
    names = metric_names(results)
    head = "| target | users | items | method | windows | users/window | candidates | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (7 + len(names))]
    for r in summary(results, last):
        lines.append(f"| {r.target} | {r.users} | {r.items} | {r.method} | {r.windows} | {r.users_per_window:.1f} | "
                     f"{r.candidates:.0f} | " + " | ".join(f"{r.values[m]:.4f}" for m in names) + " |")
    return "\n".join(lines)


def timing_table(results: Sequence[WindowEvaluation | WindowSkipped]) -> str:
    evals = evaluated(results)
    methods = list(dict.fromkeys(t.method for e in evals for t in e.timings))
    lines = ["| method | fit s (total) | score s (total) | fit s (max window) |", "|---|---|---|---|"]
    for m in methods:
        ts = [t for e in evals for t in e.timings if t.method == m]
        lines.append(f"| {m} | {sum(t.fit_s for t in ts):.2f} | {sum(t.score_s for t in ts):.2f} | {max(t.fit_s for t in ts):.2f} |")
    return "\n".join(lines)


def lift_table(results: Sequence[WindowEvaluation | WindowSkipped]) -> str:
    lines = ["| window | pairs train/test | positives test | extra block | AUC base | AUC with | AUC lift | log-loss base | "
             "log-loss with | log-loss lift |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in evaluated(results):
        lf = e.lift
        if lf is None:
            continue
        ext = lf.extended
        lines.append(f"| {e.window} | {lf.n_train}/{lf.n_test} | {lf.positives_test} | {', '.join(lf.extra_names) or '-'} | "
                     f"{lf.base.auc:.4f} | {ext.auc if ext else float('nan'):.4f} | {lf.auc_lift:+.4f} | {lf.base.log_loss:.4f} | "
                     f"{ext.log_loss if ext else float('nan'):.4f} | {lf.log_loss_lift:+.2%} |")
    return "\n".join(lines)


def _png(fig, dpi: int = 110, tight: bool = True) -> bytes:
    """tight=False skips the extra draw `bbox_inches="tight"` makes (half the cost of a small plot)."""
    buf = io.BytesIO()
    if tight:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    else:
        fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def _line(ax, evals: list[WindowEvaluation], method: str, users: str, items: str, target: str, metric: str,
          band: Band | None, **style) -> None:
    """One method's `metric` per window on `ax`, with its (low, high) band shaded where `band` gives one."""
    x = list(range(len(evals)))
    (line,) = ax.plot(x, [e.value(method, users, items, target, metric) for e in evals], marker=".", **style)
    if band is not None:
        bounds = [band(e, method, users, items, target, metric) or (math.nan, math.nan) for e in evals]
        ax.fill_between(x, [b[0] for b in bounds], [b[1] for b in bounds], color=line.get_color(), alpha=0.15, linewidth=0)


def _window_axis(ax, evals: list[WindowEvaluation]) -> None:
    ax.set_xticks(range(len(evals)), [e.window for e in evals], rotation=90, fontsize=6)
    ax.grid(alpha=0.3)


def plot_per_window(results: Sequence[WindowEvaluation | WindowSkipped], metric: str = "recall@20",
                    target: str = "deep_funnel", slices: Sequence[tuple[str, str]] = SLICES, dpi: int = 110,
                    band: Band | None = None) -> bytes:
    """PNG: `metric` per window, one line per method, one panel per slice (warm, cold, cold-start items); with `band`,
    each point's interval shaded."""
    evals = evaluated(results)
    methods = list(dict.fromkeys(m for e in evals for m in e.methods))
    panels = [s for s in slices if any(r.users == s[0] and r.items == s[1] and r.target == target for e in evals for r in e.results)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.2 * max(len(panels), 1), 3.6), squeeze=False)
    for ax, (users, items) in zip(axes[0], panels):
        for method in methods:
            _line(ax, evals, method, users, items, target, metric, band, label=method)
        ax.set_title(f"{SLICE_TITLES[(users, items)]}: {target} {metric}", fontsize=9)
        _window_axis(ax, evals)
    axes[0][0].legend(fontsize=7)
    if dpi < 110:  # the cheap variant (the asset's metadata, redrawn every window): fixed margins, one draw
        fig.subplots_adjust(bottom=0.3, top=0.9, left=0.08, right=0.98, wspace=0.2)
        return _png(fig, dpi, tight=False)
    return _png(fig, dpi)


def plot_per_method(results: Sequence[WindowEvaluation | WindowSkipped], metric: str = "recall@20",
                    target: str = "deep_funnel", slices: Sequence[tuple[str, str]] = (("warm", "known"), ("cold", "known")),
                    band: Band | None = None, columns: int = 3) -> bytes:
    """PNG: one panel per method (shared y axis), `metric` per window with a line per user slice; with `band`, each
    point's interval shaded. What a reader compares window by window: is a method's lead steady or one window's luck."""
    evals = evaluated(results)
    methods = list(dict.fromkeys(m for e in evals for m in e.methods))
    cols = max(1, min(columns, len(methods)))
    rows = max(1, math.ceil(len(methods) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False, sharey=True)
    for i, ax in enumerate(axes.flat):
        if i >= len(methods):
            ax.set_visible(False)
            continue
        for users, items in slices:
            _line(ax, evals, methods[i], users, items, target, metric, band, label=SLICE_TITLES[(users, items)])
        ax.set_title(f"{methods[i]}: {target} {metric}", fontsize=9)
        _window_axis(ax, evals)
    if methods:
        axes[0][0].legend(fontsize=7)
    return _png(fig)


def plot_cold_vs_warm(results: Sequence[WindowEvaluation | WindowSkipped], metric: str = "recall@20",
                      target: str = "deep_funnel", last: int | None = None) -> bytes:
    """PNG: per method, `metric` averaged over windows for warm users, cold users and cold-start items, side by side."""
    rows = [r for r in summary(results, last) if r.target == target]
    methods = list(dict.fromkeys(r.method for r in rows))
    slices = [s for s in SLICES if any((r.users, r.items) == s for r in rows)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(methods), 3.6))
    width = 0.8 / max(len(slices), 1)
    for k, s in enumerate(slices):
        vals = [next((r.values[metric] for r in rows if (r.users, r.items, r.method) == (*s, m)), float("nan")) for m in methods]
        ax.bar([i + k * width for i in range(len(methods))], vals, width, label=SLICE_TITLES[s])
    ax.set_xticks([i + width * (len(slices) - 1) / 2 for i in range(len(methods))], methods)
    ax.set_ylabel(f"{target} {metric}")
    ax.set_title(f"cold vs warm ({'last %d windows' % last if last else 'all windows'})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def extras_table(extras: dict[str, dict]) -> str:
    """Per window: HIR's own numbers (cold users embedded, the item prior's scale in its scores, BoM vs exact top-k,
    agreement with planted interests)."""
    lines = ["| window | HIR | cold users embedded | item prior (x log) | BoM vs exact | "
             "planted agreement (NMI / ARI, level l vs planted l) | warm-started from |",
             "|---|---|---|---|---|---|---|"]
    for key, x in sorted(extras.items()):
        hir = x.get("hir", {})
        bom = x.get("bom_vs_exact")
        agree = " ".join(f"L{a['level']}: {a['nmi']:.3f} / {a['ari']:.3f}" for a in x.get("agreement", [])
                         if a["level"] == a["planted_level"]) or "-"
        warm = ", ".join(sorted(set((x.get("warm_started_from") or {}).values()))) or "-"
        lines.append(f"| {key} | {'yes' if hir.get('evaluated') else 'no: ' + str(hir.get('reason', ''))} | "
                     f"{hir.get('cold_users_encoded', '-')} | {_prior(hir)} | "
                     f"{'recall@%d %.3f (%d users)' % (bom['k'], bom['recall'], bom['queries']) if bom else '-'} | {agree} | {warm} |")
    return "\n".join(lines)


def _prior(hir: dict) -> str:
    """The item prior's scale in HIR's scores and its weight (hir_model.eval.hir, readout): 'none' without one, '-' when
    not recorded."""
    scale = hir.get("prior_scale")
    if scale is None:
        return "-"
    if scale == 0:
        return "none"
    fitted = hir.get("prior_calibration")
    how = f"weight {fitted['weight']:g} fitted on {fitted['users']} users" if fitted else f"weight {hir.get('prior_weight', 1):g}"
    return f"{scale:g} ({how})"


COMPARED = (("warm", "deep_funnel"), ("cold", "deep_funnel"))  # the slices every comparison table shows (known items)
HIR_PAIRS = (("hir", "hir_exact"), ("hir_exact", "hir_embeddings"))  # the index's cost; what the head adds


def user_band(e: WindowEvaluation, method: str, users: str, items: str, target: str, metric: str) -> tuple[float, float] | None:
    """A plotted value's 95% bootstrap interval over the window's users (None without per-user values)."""
    from hir_model.eval.stats import bootstrap_mean

    for r in e.results:
        if (r.method, r.users, r.items, r.target) == (method, users, items, target) and metric in r.metrics.per_user:
            ci = bootstrap_mean(r.metrics.per_user[metric])
            return ci.low, ci.high
    return None


def comparison_table(results: Sequence[WindowEvaluation | WindowSkipped], last: int | None = 4) -> str:
    """Every method against HIR as served (or the head, without a served row) and HIR's own pairs, deep-funnel
    Recall@20 of warm and cold users on known items, pooled over all windows and the last `last`: paired bootstrap
    95% CIs over users (hir_model.eval.compare); a lead only where the interval excludes 0."""
    from hir_model.eval.compare import compare, comparison_markdown

    methods = {r.method for e in evaluated(results) for r in e.results if r.metrics.per_user}
    if not methods:
        return "no per-user values published: no comparison"
    reference = next((m for m in ("hir", "hir_exact", "popularity") if m in methods), sorted(methods)[0])
    rows = []
    for users, target in COMPARED:
        rows += compare(results, reference=reference, pairs=[p for p in HIR_PAIRS if set(p) <= methods], users=users,
                        items="known", target=target, metric="recall@20", last=last, per_window=False)
    return comparison_markdown(rows)


def html_report(results: Sequence[WindowEvaluation | WindowSkipped], title: str = "HIR window evaluation",
                last: int | None = 4, extras: dict[str, dict] | None = None, header: Mapping[str, str] | None = None,
                per_method: bool = False, band: Band | None = None) -> str:
    """A self-contained page: tables (all windows and the last `last`), plots inlined as base64 PNGs, skips; with
    `extras` ({window: published extras}) a table of HIR's own numbers per window; `header` ({name: value}) is shown
    under the title (what the page shows: source, windows, commit, settings); `per_method` adds a panel per method;
    `band` shades each plotted point's interval."""
    def img(png: bytes) -> str:
        return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'

    def table(md: str) -> str:
        rows = [line.strip("|").split("|") for line in md.splitlines() if not line.startswith("|---")]
        cells = lambda row, tag: "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in row)  # noqa: E731
        return "<table><tr>" + cells(rows[0], "th") + "</tr>" + "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows[1:]) + "</table>"

    skipped = [r for r in results if isinstance(r, WindowSkipped)]
    head = ("<table class='head'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                                             for k, v in header.items()) + "</table>") if header else ""
    parts = [f"<h1>{html.escape(title)}</h1>", head,
             f"<h2>Last {last} windows</h2>" + table(markdown_table(results, last)) if last else "",
             "<h2>All windows</h2>" + table(markdown_table(results)),
             "<h2>Comparisons: paired bootstrap 95% CI over users</h2>" + _comparisons(results, last, table),
             "<h2>Deep-funnel Recall@20 per window</h2>" + img(plot_per_window(results, band=band)),
             "<h2>Deep-funnel Recall@20 per window, by method</h2>" + img(plot_per_method(results, band=band)) if per_method else "",
             "<h2>All engagements Recall@20 per window</h2>" + img(plot_per_window(results, target="engagement", band=band)),
             "<h2>Cold vs warm</h2>" + img(plot_cold_vs_warm(results, last=last)),
             "<h2>Downstream conversion model</h2>" + table(lift_table(results)),
             "<h2>Cost</h2>" + table(timing_table(results)),
             "<h2>HIR per window</h2>" + table(extras_table(extras)) if extras else "",
             "<h2>Skipped</h2><ul>" + "".join(f"<li>{html.escape(s.window)}: {html.escape(s.reason)}</li>" for s in skipped) + "</ul>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
             "table.head th,table.head td{text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head>" \
           f"<body>{''.join(parts)}</body></html>"


def _comparisons(results, last, table) -> str:
    md = comparison_table(results, last)
    return table(md) if md.startswith("|") else f"<p>{html.escape(md)}</p>"


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    per_window_png: Path
    cold_vs_warm_png: Path


def write_report(results: Sequence[WindowEvaluation | WindowSkipped], folder: str | Path, title: str = "HIR window evaluation",
                 last: int | None = 4) -> ReportFiles:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(folder / "evaluation.md", folder / "evaluation.html", folder / "recall20_per_window.png",
                        folder / "cold_vs_warm.png")
    files.markdown.write_text(f"# {title}\n\n## Last {last} windows\n\n{markdown_table(results, last)}\n\n## All windows\n\n"
                              f"{markdown_table(results)}\n\n## Downstream conversion model\n\n{lift_table(results)}\n\n"
                              f"## Cost\n\n{timing_table(results)}\n")
    files.html.write_text(html_report(results, title, last))
    files.per_window_png.write_bytes(plot_per_window(results))
    files.cold_vs_warm_png.write_bytes(plot_cold_vs_warm(results, last=last))
    return files


def write_html_report(store, keys: Sequence[str], path: str | Path, title: str = "HIR window evaluation", last: int | None = 4) -> Path:
    """One self-contained HTML page over every published `window_evaluation` among `keys` (the others listed as skipped)."""
    from hir_model.eval.publish import collect, extras_of

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_report(collect(store, keys), title, last, extras_of(store, keys)))
    return path


def print_last_window(store, keys: Sequence[str], html: str | Path | None = None, out=None) -> str | None:
    """Print the latest evaluated window's table (and where the HTML report is); returns that window's key."""
    import sys

    from hir_model.eval.publish import collect

    out = out or sys.stdout
    evals = evaluated(collect(store, keys))
    if not evals:
        print("no window evaluated yet (window_evaluation needs the next window's events)", file=out)
        return None
    e = evals[-1]
    print(f"\nEvaluation of window {e.window} on {e.next_window} ({e.counts.warm_users} warm, {e.counts.cold_users} cold users; "
          f"{len(evals)} windows evaluated):\n", file=out)
    print(markdown_table([e]), file=out)
    if len(evals) > 1:
        n = min(len(evals), 4)
        print(f"\nAveraged over the last {n} evaluated windows:\n", file=out)
        print(markdown_table(evals, n), file=out)
        print(f"\nDeep-funnel Recall@20 on known items, method minus reference, paired bootstrap 95% CI over users "
              f"(all {len(evals)} windows and the last {n}; a lead only where the CI excludes 0):\n", file=out)
        print(comparison_table(evals, n), file=out)
    if html is not None:
        print(f"\nHTML report: {html}", file=out)
    return e.window


def report_windows(store, keys: Sequence[str], path: str | Path, title: str = "HIR window evaluation", out=None) -> Path:
    """What `make demo` ends with: write the HTML report over `keys`, print the last evaluated window's table and the path."""
    html = write_html_report(store, keys, path, title)
    print_last_window(store, keys, html, out)
    return html


def report_path(storage_root: str | Path) -> Path:
    """Where a source's report lives: beside its partitions, under its own storage root (on S3: the local cache)."""
    return Path(storage_root) / REPORT_DIR / REPORT_FILE


def git_commit(repo: str | Path) -> str:
    """The checkout's commit (`+dirty` with uncommitted changes to tracked files), or 'unknown' without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class SourceReport:
    path: Path
    title: str
    header: dict[str, str]  # what the page names under its title
    evaluated: int  # windows with a published evaluation
    first: str | None  # first and last evaluated window (t; each judged on t+1)
    last: str | None


def write_source_report(store, keys: Sequence[str], path: str | Path, source: str, settings: Mapping[str, str],
                        commit: str, last: int | None = 4, band: Band | None = user_band) -> SourceReport:
    """The per-source HTML page over every published `window_evaluation` among `keys`, titled with the source and the
    window range and headed by the commit and `settings` (written to a temporary name, then renamed: never half a page)."""
    from datetime import datetime, timezone

    from hir_model.eval.publish import collect, extras_of

    results = collect(store, keys)
    evals = evaluated(results)
    first, final = (evals[0], evals[-1]) if evals else (None, None)
    span = f"windows {first.window} .. {final.window} (each on its next window, to {final.next_window})" if evals else "no window evaluated yet"
    title = f"HIR evaluation: {source}, {span}"
    header = {"source": source, "evaluated windows": f"{len(evals)} of {len(keys)}"
              + (f": {first.window} .. {final.window}" if evals else ""), "commit": commit, **settings,
              "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(html_report(results, title, last, extras_of(store, keys), header=header, per_method=True, band=band))
    tmp.replace(path)
    return SourceReport(path, title, header, len(evals), first.window if first else None, final.window if final else None)
