"""Write, audit, publish: an asset stages its window, judges the staged files with its checks, and commits only when
no blocking check failed; every check result is recorded with its window.

An asset body calls `audit(context, results)` inside `store.writing()`: a failed blocking check (ERROR severity)
raises there, so the staging area is discarded and the previous partition stays byte for byte. `@publishes` turns
the body's outcome into Dagster events: the materialisation and then each check evaluation tagged with the window
(also for runs launched over a one-window partition range, where Dagster's own `AssetCheckResult` records none), or,
when the audit blocked, the evaluations alone and a `PublicationBlocked` failure, so the run and the partition show
failed and nothing new is readable.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Iterator, Sequence

import dagster as dg
# AssetCheckEvaluation is public; the type of its `target_materialization_data` is not exported.
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData


# Transient faults (an S3 blip) are retried whatever launched the step (the window job, an asset page, a backfill); a
# withheld publication and a contract error fail with allow_retries=False.
STEP_RETRY = dg.RetryPolicy(max_retries=2, delay=10, backoff=dg.Backoff.EXPONENTIAL)


class BlockingChecksFailed(Exception):
    """Raised inside `store.writing()`: the staged files are discarded. Carries every result of the audit."""

    def __init__(self, results: Sequence[dg.AssetCheckResult], failed: Sequence[str]):
        super().__init__(f"blocking checks failed: {', '.join(failed)}")
        self.results, self.failed = list(results), list(failed)


class PublicationBlocked(dg.Failure):
    """The step's failure when a blocking check failed: the window was not published (not retried: the same inputs
    fail the same check)."""


def blocking_failures(context: dg.AssetExecutionContext, results: Sequence[dg.AssetCheckResult]) -> list[str]:
    """Names of the results that fail a blocking check of the asset at ERROR severity."""
    blocking = {spec.key for spec in context.assets_def.check_specs if spec.blocking}
    return [r.check_name for r in results
            if not r.passed and r.severity == dg.AssetCheckSeverity.ERROR and _check_key(context, r) in blocking]


def audit(context: dg.AssetExecutionContext, results: Sequence[dg.AssetCheckResult]) -> list[dg.AssetCheckResult]:
    """The results, or `BlockingChecksFailed` when a blocking one failed: call it inside `store.writing()`."""
    failed = blocking_failures(context, results)
    if failed:
        raise BlockingChecksFailed(results, failed)
    return list(results)


def publishes(fn):
    """Decorate an asset body (returning or yielding `MaterializeResult`s) that audits inside its writes."""

    @functools.wraps(fn)
    def asset(context: dg.AssetExecutionContext, *args, **kwargs):
        partition = str(context.partition_key) if context.has_partition_key or context.has_partition_key_range else None
        try:
            out = fn(context, *args, **kwargs)
            events = list(out) if inspect.isgenerator(out) else [out]
        except BlockingChecksFailed as blocked:
            yield from evaluations(context, blocked.results, partition, materialized=False)
            where = f"{context.assets_def.key.to_user_string()} [{partition or 'unpartitioned'}]"
            raise PublicationBlocked(
                description=f"{where} was not published: blocking checks failed ({', '.join(blocked.failed)}); "
                            "the previous files are unchanged", allow_retries=False,
                metadata={"failed_checks": ", ".join(blocked.failed), "partition": partition or ""}) from None
        for event in events:
            if not isinstance(event, dg.MaterializeResult) or not event.check_results:
                yield event
                continue
            unguarded = blocking_failures(context, event.check_results)
            if unguarded:  # a body that committed without audit(): a programming error, never a silent publication
                raise dg.Failure(description=f"{context.assets_def.key.to_user_string()} committed {partition} with failed "
                                             f"blocking checks {unguarded}: call audit() inside store.writing()",
                                 allow_retries=False)
            yield dg.MaterializeResult(asset_key=event.asset_key, metadata=event.metadata, data_version=event.data_version,
                                       tags=event.tags)
            yield from evaluations(context, event.check_results, partition, materialized=True)

    return asset


def evaluations(context: dg.AssetExecutionContext, results: Sequence[dg.AssetCheckResult], partition: str | None,
                materialized: bool) -> Iterator[dg.Output | dg.AssetCheckEvaluation]:
    """Each result as the check's output (when selected) and an evaluation on `partition`, targeting the
    materialisation just recorded (none when the window was not published)."""
    selected = context.selected_asset_check_keys
    specs = {spec.key: spec for spec in context.assets_def.check_specs}
    targets = {}  # asset key -> its materialisation on the partition: one look-up per asset, not per check
    for result in results:
        key = _check_key(context, result)
        spec = specs[key]
        if materialized and key.asset_key not in targets:
            targets[key.asset_key] = _target(context, key.asset_key, partition)
        if key in selected:
            yield dg.Output(None, output_name=context.assets_def.get_output_name_for_asset_check_key(key))
        yield dg.AssetCheckEvaluation(
            asset_key=key.asset_key, check_name=key.name, passed=bool(result.passed), metadata=result.metadata,
            severity=result.severity, description=result.description, blocking=spec.blocking,
            partition=partition if spec.partitions_def is not None else None,
            target_materialization_data=targets.get(key.asset_key))


def _check_key(context: dg.AssetExecutionContext, result: dg.AssetCheckResult) -> dg.AssetCheckKey:
    asset_key = result.asset_key or context.assets_def.key
    return dg.AssetCheckKey(asset_key, result.check_name)


def _target(context: dg.AssetExecutionContext, asset_key: dg.AssetKey,
            partition: str | None) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The materialisation the evaluation judges: the partition's latest, which this step has just recorded."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition] if partition else None), limit=1).records
    if not records:
        return None
    return AssetCheckEvaluationTargetMaterializationData(storage_id=records[0].storage_id, run_id=records[0].run_id,
                                                         timestamp=records[0].timestamp)


def partitioned(specs: Sequence[dg.AssetCheckSpec], partitions: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """The specs partitioned like their asset, so each evaluation belongs to a window (the Partitions tab and the
    check's history show it per window)."""
    with warnings.catch_warnings():  # partitioned checks are a preview in Dagster 1.13: the supported way, not yet GA
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [dg.AssetCheckSpec(s.name, asset=s.asset_key, description=s.description, additional_deps=s.additional_deps,
                                  blocking=s.blocking, metadata=s.metadata, partitions_def=partitions) for s in specs]


class Gate:
    """The audit a library-style publish function runs inside its write: `gate(built)` judges the staged build with
    `judge` and raises if a blocking check failed; `results` keeps what it found for the materialisation."""

    def __init__(self, context: dg.AssetExecutionContext, judge):
        self.context, self.judge, self.results = context, judge, []

    def __call__(self, built) -> None:
        self.results = audit(self.context, self.judge(built))
