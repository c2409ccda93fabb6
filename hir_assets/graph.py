"""Graph stage: the cumulative typed, time-decayed engagement graph as of each window end (CSR on disk)."""

import dagster as dg

from hir_assets.partitions import window_of
from hir_assets.publication import STEP_RETRY, audit, partitioned, publishes
from hir_assets.resources import PartitionStorage
from hir_model.data.tables import CATALOG_ASSET, EVENTS_ASSET
from hir_model.graph.audit import GraphAudit, audit_graph
from hir_model.graph.window import GRAPH_ASSET, build_window_graph, has_graph, to_us

GROUP = "graph"
NO_FUTURE_EDGES_CHECK = "no_future_edges"
WEIGHTS_CHECK = "weights_finite_positive"
NODES_TYPED_CHECK = "nodes_typed"
NODE_COUNT_CHECK = "node_count_non_decreasing"

CHECK_SPECS = [
    dg.AssetCheckSpec(NO_FUTURE_EDGES_CHECK, asset=GRAPH_ASSET, blocking=True,
                      description="leak guard: no edge timestamp and no node first-seen at or after the window end"),
    dg.AssetCheckSpec(WEIGHTS_CHECK, asset=GRAPH_ASSET, blocking=True, description="every edge weight is finite and > 0"),
    dg.AssetCheckSpec(NODES_TYPED_CHECK, asset=GRAPH_ASSET, blocking=True,
                      description="every node has an id and a type in NODE_TYPES; every edge a type in EDGE_TYPES"),
    dg.AssetCheckSpec(NODE_COUNT_CHECK, asset=GRAPH_ASSET, blocking=False,
                      description="the node count never falls, and graph(t-1)'s nodes keep their indices in graph(t)"),
]


def check_results(audit: GraphAudit, end_key: str, input_leaks: int = 0) -> list[dg.AssetCheckResult]:
    """The asset's check results from a graph's audit (a pure mapping, tested on crafted graphs).

    `input_leaks` counts input rows (events, catalog, relations) stamped at or after the window end. The build
    keeps them out of the graph, but their presence means an upstream table broke causality, so the leak
    guard fails and blocks everything downstream until someone looks.
    """
    def result(name: str, passed: bool, description: str, severity=dg.AssetCheckSeverity.ERROR, **metadata) -> dg.AssetCheckResult:
        return dg.AssetCheckResult(asset_key=GRAPH_ASSET, check_name=name, passed=bool(passed), severity=severity,
                                   description=description, metadata=metadata)

    latest = -1 if audit.latest_edge_us is None else int(audit.latest_edge_us)  # -1: no edges (a number, so it charts)
    return [
        result(NO_FUTURE_EDGES_CHECK, audit.leaks == 0 and input_leaks == 0,
               f"{audit.future_edges} edges and {audit.future_nodes} nodes at or after the end of {end_key}; "
               f"{input_leaks} input rows stamped after it",
               future_edges=audit.future_edges, future_nodes=audit.future_nodes, input_rows_after_end=input_leaks,
               latest_edge_us=latest),
        result(WEIGHTS_CHECK, audit.bad_weights == 0, f"{audit.bad_weights} of {audit.edges} weights not finite and positive",
               bad_weights=audit.bad_weights, edges=audit.edges),
        result(NODES_TYPED_CHECK, audit.untyped_nodes == 0 and audit.bad_edge_types == 0,
               f"{audit.untyped_nodes} untyped nodes, {audit.bad_edge_types} edges of unknown type",
               untyped_nodes=audit.untyped_nodes, bad_edge_types=audit.bad_edge_types, nodes=audit.nodes, edges=audit.edges),
        result(NODE_COUNT_CHECK, audit.node_count_ok,
               f"{audit.previous_nodes if audit.previous_nodes is not None else 'no'} nodes before, {audit.nodes} now; "
               f"{audit.prefix_changed} earlier nodes changed index or type", severity=dg.AssetCheckSeverity.WARN,
               nodes=audit.nodes, previous_nodes=-1 if audit.previous_nodes is None else audit.previous_nodes,
               prefix_changed=audit.prefix_changed),
    ]


def build_graph_assets(partitions: dg.TimeWindowPartitionsDefinition) -> list[dg.AssetsDefinition]:
    previous_window = dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)

    @dg.asset(name=GRAPH_ASSET, partitions_def=partitions, group_name=GROUP, kinds={"numpy", "parquet"}, check_specs=partitioned(CHECK_SPECS, partitions),
              deps=[dg.AssetDep(EVENTS_ASSET), dg.AssetDep(CATALOG_ASSET), dg.AssetDep(GRAPH_ASSET, partition_mapping=previous_window)],
              backfill_policy=dg.BackfillPolicy.multi_run(1), retry_policy=STEP_RETRY)  # one run per window, in order: graph(t) reads graph(t-1)
    @publishes
    def engagement_graph(context: dg.AssetExecutionContext, storage: PartitionStorage) -> dg.MaterializeResult:
        """Cumulative typed, time-decayed engagement graph as of the window end (CSR), built from graph(t-1) + the window's events."""
        window, store = window_of(context), storage.store()
        prev_window = partitions.get_prev_partition_window(window.start)
        prev_key = prev_window.start.strftime(partitions.fmt) if prev_window else None
        if prev_key is not None and not has_graph(store, prev_key):
            raise dg.Failure(f"{GRAPH_ASSET} for {window.key} needs graph(t-1): materialise {GRAPH_ASSET} for {prev_key} first "
                             f"(windows build in order, from the first one {partitions.get_first_partition_key()})",
                             allow_retries=False)  # a missing predecessor does not come back on a retry
        with store.writing() as staging:  # committed only if the blocking checks pass on the staged graph
            built = build_window_graph(store, window, prev_key, staging)
            graph_audit = audit_graph(built.graph, to_us(window.end), built.previous.nodes if built.previous is not None else None)
            report = built.report
            context.log.info(f"graph {window.key}: {graph_audit.nodes:,} nodes ({report.new_nodes:,} new), {graph_audit.edges:,} "
                             f"edges, {report.events_used:,} events in {report.seconds:.1f}s; excluded {dict(report.excluded) or 'none'}")
            input_leaks = sum(n for reason, n in report.excluded.items() if reason.endswith(".after_window_end"))
            checks = audit(context, check_results(graph_audit, window.key, input_leaks))
        return dg.MaterializeResult(check_results=checks, metadata={
            "nodes": graph_audit.nodes,
            "new_nodes": report.new_nodes,
            "edges": graph_audit.edges,
            "nodes_by_type": graph_audit.nodes_by_type,
            "edges_by_type": graph_audit.edges_by_type,
            "density": graph_audit.density,
            "degree": graph_audit.degree,
            "events_used": report.events_used,
            "excluded": sum(report.excluded.values()),
            "excluded_by_reason": dict(sorted(report.excluded.items())),
            "expired_edges": report.expired,
            "previous_partition": prev_key or "none (first window)",
            "build_seconds": round(report.seconds, 3),
            "path": dg.MetadataValue.path(store.uri(GRAPH_ASSET, window.key)),
        })

    return [engagement_graph]
