"""Causal next-window evaluation: HIR's rows and the baselines on window t+1, downstream lift, report (no Dagster here).
The protocol and metrics are hir_model.protocol; the baselines hir_model.baselines.

hir.py       HIR's three rows (hir: as served, hir_exact, hir_embeddings) through hir_model.rank's head
compare.py   method-vs-method rows with paired CIs (hir_model.protocol.stats) and a verdict
agreement.py NMI / ARI of the hierarchy against planted interests; per-level primitive affinities (lift features)
text_vectors.py  a hashed TF-IDF stand-in for content vectors when `content_embeddings` is not materialised
lift.py      the downstream conversion model with and without an extra feature block
audience.py  the audience slice: window t's audiences judged per entity on t+1's conversions, the baselines transposed
scoring.py   evaluate_split: every method's slice metrics over the judged users (seeded samples, query blocks)
run.py       evaluate_window(store, spec, key, methods) from the published tables
window_evaluation.py  one window as the `window_evaluation` asset computes it: HIR's rows + baselines, lift, agreement, warm starts
publish.py   the asset's files (metrics, per-user values, summary, baseline state) and reading them back over windows
report.py    markdown tables and PNG plots over the evaluated windows
pages.py     the comparisons with CIs, the HTML page, the demo summary, the per-source report
"""
