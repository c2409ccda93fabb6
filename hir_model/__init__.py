"""hir_model: the pure HIR library (PyTorch, NumPy, PyArrow). It never imports Dagster."""
