"""The evaluation report's parts: markdown tables of every metric per method (warm and cold users apart), HIR's own
numbers per window, and PNG plots (a metric per window per method, with optional bands; cold vs warm). The pages and
files made of them, and the comparisons with their CIs, are in hir_model.eval.pages.

Numbers over several windows are means of the per-window means (each window counts once, as in "averaged
over the last 4 windows"); `windows` says in how many of them a slice had users to evaluate.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hir_model.eval.audience import AUDIENCE_USERS  # noqa: E402
from hir_model.eval.run import WindowEvaluation, WindowSkipped  # noqa: E402
from hir_model.protocol.split import TARGET_KINDS  # noqa: E402

SLICES = (("warm", "known"), ("cold", "known"), ("warm", "new"), ("cold", "new"))  # (users, items), report order
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
    """The metrics the evaluations computed (recall@K..., ndcg@K...), in their order (the audience slice's apart)."""
    return tuple(dict.fromkeys(k for e in evaluated(results) for r in e.results if r.users != AUDIENCE_USERS
                               for k in r.metrics.as_dict()))


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


def audience_table(results: Sequence[WindowEvaluation | WindowSkipped], last: int | None = None) -> str:
    """The audience slice (hir_model.eval.audience): a row per (entity kind, group, method), its metrics averaged over
    the (last `last`) windows where it judged entities; empty when no window has the slice."""
    evals = evaluated(results)
    evals = evals[-last:] if last else evals
    rows = [r for e in evals for r in e.results if r.users == AUDIENCE_USERS]
    if not rows:
        return ""
    names = list(dict.fromkeys(k for r in rows for k in r.metrics.as_dict()))
    lines = ["| entities | group | method | windows | entities/window | users | " + " | ".join(names) + " |",
             "|" + "---|" * (6 + len(names))]
    for kind, group, method in dict.fromkeys((r.target, r.items, r.method) for r in rows):
        hits = [r for r in rows if (r.target, r.items, r.method) == (kind, group, method)]
        lines.append(f"| {kind} | {group} | {method} | {len(hits)} | {_mean([h.metrics.n_users for h in hits]):.1f} | "
                     f"{_mean([h.candidates for h in hits]):.0f} | "
                     + " | ".join(f"{_mean([h.metrics.as_dict().get(m, math.nan) for h in hits]):.4f}" for m in names) + " |")
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
    return _png(per_method_figure(results, metric, target, slices, band, columns))


def per_method_figure(results: Sequence[WindowEvaluation | WindowSkipped], metric: str = "recall@20",
                      target: str = "deep_funnel", slices: Sequence[tuple[str, str]] = (("warm", "known"), ("cold", "known")),
                      band: Band | None = None, columns: int = 3) -> plt.Figure:
    """The figure `plot_per_method` renders (the caller closes it)."""
    evals = evaluated(results)
    methods = list(dict.fromkeys(m for e in evals for m in e.methods))
    cols = max(1, min(columns, len(methods)))
    rows = max(1, math.ceil(len(methods) / cols))
    # constrained layout makes room for each row's vertical dates before the next row's titles
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False, sharey=True, layout="constrained")
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
    return fig


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
