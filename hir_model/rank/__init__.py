"""HIR's one ranking head and what serves it (no Dagster here): docs/ranking.md.

head.py         head_scores: the one function that scores items for a user state (warm: row + recent items + interest
                kernel + item prior + co-engagement; cold: the encoder's vector + structural readout + new users' prior)
ranker.py       the learned ranker (LightGBM LambdaRank): ranked_scores, the one scoring path (head first, ranker second)
features.py     its features of (user, item) pairs: HIR's and collaborative / counting ones
examples.py     its training data: head(t-1)'s candidates graded by window t, and the rankers trained on them
fit.py          the state's fitted parts at end(t): item priors, the prior's weight on window t's last days
coengagement.py the head's item-to-item co-engagement term (the similarity item2item_recent reads)
track.py        the weights from earlier heads' track records (head(t-1) judged on window t)
state.py        HeadState, published per window as the `ranking_head` asset (items, history, head.json)
ranking_head.py build_head_state from window t's published tables (what the `ranking_head` asset computes)
artefacts.py    what HIR publishes for window t (embeddings, checkpoint, graph, content), loaded from the store
inductive.py    the frozen encoder on what it never embedded: cold users from a context, items without a row
cold_tokens.py  a cold user's token arrays while inductive.py assembles its sequence
increment.py    a day's arrivals after end(t) placed in window t's space (what the `catalog_increment` asset computes)
candidates.py   the served path's candidates per query: index probes, co-engagement, priors, arrivals
recommender.py  Recommender: BoM candidates -> ranked_scores -> engaged items removed (hir retrieve, hir serve, evaluation);
                with_increments appends the arrivals
context.py      a served user's context from the command line or a file
tune.py         served top-k vs the head's exact top-k, and the candidate budget that reaches a target
bom_index.py    the window's BoM index over the head's items with that budget (what the `bom_index` asset computes)
audience.py     Audiences: the head transposed, the users most likely to convert with an entity (hir audience, GET
                /audience, the `audiences` asset, the evaluation's audience slice)
audience_export.py  every advertiser's and campaign's audience as the `audiences` asset's tables, and their checks
audience_scores.py  how an audience scores users (the head's pair scores, content, propensity, combined) and its settings
audience_links.py   which items and primitives stand for an entity (catalogue links, hierarchy assignments)
serve.py        `hir serve`: the Recommender over HTTP, switching to a newer window when it lands, appending increments
serve_windows.py    its snapshots: the newest window with its increments, loaded and switched in the background
serve_queries.py    its requests: /recommend and /audience parameters checked, answers as JSON-ready dicts
"""
