"""The evaluation report as pages and files: the comparisons with paired bootstrap CIs, a self-contained HTML page,
the markdown / PNG files of a benchmark run, the summary `make demo` prints, and the per-source page.

`write_source_report` is the per-source artefact (`make demo`, the `evaluation_report` asset): one page per source
under that source's storage (`report_path`), headed by what it shows (source, windows, commit, settings).
"""

from __future__ import annotations

import base64
import html
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hir_model.eval.report import (Band, audience_table, evaluated, extras_table, lift_table, markdown_table, plot_cold_vs_warm,
                                   plot_per_method, plot_per_window, timing_table)
from hir_model.eval.run import WindowEvaluation, WindowSkipped

REPORT_DIR, REPORT_FILE = "_reports", "evaluation.html"  # under the source's storage root ("_": not an asset)


COMPARED = (("warm", "deep_funnel"), ("cold", "deep_funnel"))  # the slices every comparison table shows (known items)
HIR_PAIRS = (("hir", "hir_exact"), ("hir_exact", "hir_embeddings"), ("hir", "ranker_base"))  # the index's cost; what
# the head adds to the representation; what HIR adds to a deep-funnel ranker (its lift)


def user_band(e: WindowEvaluation, method: str, users: str, items: str, target: str, metric: str) -> tuple[float, float] | None:
    """A plotted value's 95% bootstrap interval over the window's users (None without per-user values)."""
    from hir_model.protocol.stats import bootstrap_mean

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


AUDIENCE_METRICS = ("recall@1pct", "auc")  # the audience slice's compared metrics (hir_model.eval.audience)


def _audience_slices(results: Sequence[WindowEvaluation | WindowSkipped]) -> tuple[set, list[str]]:
    """The audience slice's (group, entity kind) pairs with per-entity `hir` values, and the methods beside `hir`."""
    from hir_model.eval.audience import AUDIENCE_USERS

    have = {(r.items, r.target) for e in evaluated(results) for r in e.results
            if r.users == AUDIENCE_USERS and r.method == "hir" and r.metrics.per_user}
    others = list(dict.fromkeys(r.method for e in evaluated(results) for r in e.results
                                if r.users == AUDIENCE_USERS and r.method != "hir"))
    return have, others


def audience_comparison_table(results: Sequence[WindowEvaluation | WindowSkipped], last: int | None = 4) -> str:
    """The audience slice: `hir` minus every other method, per entity kind and group, Recall@1% of users and AUC, pooled
    over all windows and the last `last`: paired bootstrap 95% CIs over entities; "" without the slice."""
    from hir_model.eval.audience import AUDIENCE_USERS, KINDS
    from hir_model.eval.compare import compare, comparison_markdown

    have, others = _audience_slices(results)
    rows = [c for group in ("known", "new") for kind in KINDS if (group, kind) in have for metric in AUDIENCE_METRICS
            for c in compare(results, reference="hir", methods=[], pairs=[("hir", m) for m in others],
                             users=AUDIENCE_USERS, items=group, target=kind, metric=metric, last=last, per_window=False)]
    return comparison_markdown(rows) if rows else ""


def audience_summary(results: Sequence[WindowEvaluation | WindowSkipped]) -> str:
    """The audience slice on one screen: a row per (entity group, kind, metric), `hir`'s mean and, per other method,
    hir minus it with its paired bootstrap 95% CI over entities, pooled over every window; "" without the slice."""
    from hir_model.eval.audience import AUDIENCE_USERS, KINDS
    from hir_model.eval.compare import compare

    have, others = _audience_slices(results)
    lines = []
    for group in ("known", "new"):
        for kind in KINDS:
            if (group, kind) not in have:
                continue
            for metric in AUDIENCE_METRICS:
                rows = {c.reference: c for c in compare(results, reference="hir", methods=[], pairs=[("hir", m) for m in others],
                                                     users=AUDIENCE_USERS, items=group, target=kind, metric=metric,
                                                     last=None, per_window=False) if c.scope == "all"}
                if not rows:
                    continue
                first = next(iter(rows.values()))
                cells = [f"{rows[m].diff:+.3f} ({rows[m].low:+.3f}..{rows[m].high:+.3f}) {rows[m].verdict}" if m in rows
                         else "" for m in others]
                lines.append(f"| {group} {kind} | {metric} | {first.windows} | {first.method_value:.3f} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = ["entities", "metric", "windows", "hir"] + [f"hir - {m}" for m in others]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines)


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
             _audiences(results, last, table),
             "<h2>Cost</h2>" + table(timing_table(results)),
             "<h2>HIR per window</h2>" + table(extras_table(extras)) if extras else "",
             "<h2>Skipped</h2><ul>" + "".join(f"<li>{html.escape(s.window)}: {html.escape(s.reason)}</li>" for s in skipped) + "</ul>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
             "table.head th,table.head td{text-align:left}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head>" \
           f"<body>{''.join(parts)}</body></html>"


def _audiences(results, last, table) -> str:
    """The audience slice's section: its table over all windows and its comparisons with CIs over entities."""
    md = audience_table(results)
    if not md:
        return ""
    versus = audience_comparison_table(results, last)
    return ("<h2>Audiences: window t's audiences judged on t+1's conversions, per entity</h2>" + table(md)
            + ("<h3>Against hir: paired bootstrap 95% CI over entities</h3>" + table(versus) if versus else ""))


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
                              + (f"## Audiences\n\n{audience_table(results)}\n\n{audience_comparison_table(results, last)}\n\n"
                                 if audience_table(results) else "") +
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
        versus = audience_summary(evals)
        if versus:
            print(f"\nAudiences (window t's on t+1's conversions, all {len(evals)} windows): hir minus each method, paired "
                  f"bootstrap 95% CI over entities (every row and the last {n} windows: the HTML report):\n", file=out)
            print(versus, file=out)
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
