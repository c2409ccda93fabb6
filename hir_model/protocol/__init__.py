"""The evaluation protocol every ranked method shares (no Dagster here): below train, so that the ranking head, the
objective adapter and the baselines score on the same split with the same metrics.

split.py     window t's train set (everything before end(t)) and t+1's warm / cold users, targets, item groups
metrics.py   Recall@K and NDCG@K over full rankings
method.py    the `Method` protocol every ranked method implements (HIR plugs in as one more)
stats.py     paired bootstrap CIs over users
"""
