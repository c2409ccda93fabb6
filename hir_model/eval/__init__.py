"""Causal next-window evaluation: split, ranking metrics, baselines, downstream lift, report (no Dagster here).

split.py     window t's train set (everything before end(t)) and t+1's warm / cold users, targets, item groups
metrics.py   Recall@K and NDCG@K over full rankings
method.py    the `Method` protocol every ranked method implements (HIR plugs in as one more)
popularity.py, content_knn.py, als.py, lightgcn.py, baselines.py   the baselines
text_vectors.py  a hashed TF-IDF stand-in for content vectors when `content_embeddings` is not materialised
lift.py      the downstream conversion model with and without an extra feature block
run.py       evaluate_window(store, spec, key, methods) from the published tables
report.py    markdown table, PNG plots, self-contained HTML
"""
