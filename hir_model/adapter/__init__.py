"""Objective adapters over the published embeddings (no Dagster here): a small map fitted per objective (click,
add_to_cart, purchase) on top of `entity_embeddings`, and its gain on the next window.

fit.py               the adapter, its fit on an objective's (user, item) pairs and the next-window gain
objective_adapter.py one (window, objective) adapter from the published tables (what the `objective_adapter` asset computes)
"""
