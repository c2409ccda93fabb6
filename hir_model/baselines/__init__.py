"""The baselines HIR is compared with, each a `Method` of hir_model.protocol (no Dagster here).

popularity.py   most engaged items
content_knn.py  items nearest a user's history by content vector
als.py          implicit matrix factorisation (ALS)
lightgcn.py     LightGCN over the engagement graph
sequence.py     item2item_recent: recency-weighted item-to-item co-engagement
registry.py     one config and one constructor for them all
"""
