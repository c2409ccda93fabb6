"""The figures an operator watches on a check are numbers (Dagster charts them across partitions), not text."""

from __future__ import annotations

import dagster as dg
import numpy as np

from hir_assets.checks import rejected_result
from hir_assets.graph import NO_FUTURE_EDGES_CHECK, check_results as graph_checks
from hir_assets.training import COLLAPSE_CHECK, LOSS_CHECK, REPRODUCE_CHECK, check_results as training_checks
from hir_model.data.ingest import IngestReport
from hir_model.graph.audit import GraphAudit

NUMBER = (dg.FloatMetadataValue, dg.IntMetadataValue)


def numeric(result: dg.AssetCheckResult, *names: str) -> dict[str, float]:
    """The named metadata entries, each required to be a float or int metadata value, as numbers."""
    entries = {k: result.metadata.get(k) for k in names}  # AssetCheckResult normalises plain numbers to these
    bad = {k: type(v).__name__ for k, v in entries.items() if not isinstance(v, NUMBER)}
    assert not bad, f"{result.check_name}: not numeric: {bad}"
    return {k: v.value for k, v in entries.items()}


def test_training_checks_carry_losses_entropies_and_the_probe_error_as_numbers():
    metrics = {"losses": [2.0, np.nan, 1.5], "usage_entropy": [0.9, 0.15, 0.6], "held_out_start": 2.2, "held_out_final": 1.9}
    results = {r.check_name: r for r in training_checks(metrics, probe_error=3e-5)}
    loss = numeric(results[LOSS_CHECK], "start_loss", "final_loss", "allowed_final", "loss_change", "nonfinite_steps")
    assert loss["nonfinite_steps"] == 1 and abs(loss["loss_change"] + 0.3) < 1e-9
    collapse = numeric(results[COLLAPSE_CHECK], "min_entropy", "entropy_L0", "entropy_L1", "entropy_L2", "threshold")
    assert collapse["min_entropy"] == collapse["entropy_L1"] == 0.15 and not results[COLLAPSE_CHECK].passed
    assert numeric(results[REPRODUCE_CHECK], "max_abs_error")["max_abs_error"] == 3e-5


def test_the_leak_guard_counts_are_numbers():
    audit = GraphAudit(nodes=10, edges=20, future_edges=2, future_nodes=1, latest_edge_us=None, bad_weights=0, untyped_nodes=0,
                       bad_edge_types=0, previous_nodes=None, prefix_changed=0, nodes_by_type={}, edges_by_type={}, density=0.2,
                       degree={})
    leak = next(r for r in graph_checks(audit, "2024-01-07", input_leaks=3) if r.check_name == NO_FUTURE_EDGES_CHECK)
    assert numeric(leak, "future_edges", "future_nodes", "input_rows_after_end", "latest_edge_us") == {
        "future_edges": 2, "future_nodes": 1, "input_rows_after_end": 3, "latest_edge_us": -1}


def test_rejected_rows_are_counted_and_shared_as_numbers():
    report = IngestReport(contract="events", rows_in=40, rejected=4)
    shares = numeric(rejected_result(report, "raw_events"), "rejected", "rows_in", "rejected_share")
    assert shares == {"rejected": 4, "rows_in": 40, "rejected_share": 0.1}
