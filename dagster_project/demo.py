"""`make demo`: materialise every window's assets on the local instance, then print a summary table.

Runs go through the Dagster instance at DAGSTER_HOME, so they appear in the UI (`make ui`) afterwards. Pipelined (the
default): this process runs the window chain while a second one, a window behind, publishes each window's daily
increments, evaluates the window before it and fits its objective adapters; `--serial` runs everything here in turn.
"""

from __future__ import annotations

import os
import sys

# Pipelined, each process computes in one thread (one job a core): a torch pool of 2 beside a busy process waits on
# itself (training 17x slower, docs/results.md). Set before numpy and torch are imported.
if "--serial" not in sys.argv:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from dagster_project.definitions import defs
from dagster_project.jobs import ADAPTER_JOB, EVALUATION_JOB, INCREMENT_JOB, REPORT_JOB, WINDOW_JOB
from hir_assets.report import REPORT_ASSET
from hir_model.eval.pages import print_last_window
from hir_model.adapter.fit import OBJECTIVES
from data_contracts import CONVERSION_EVENT
from hir_model.config import load_config
from hir_model.data.tables import CATALOG_ASSET, ENTITIES_FILE, EVENTS_ASSET, EVENTS_FILE
from hir_model.data.windows import KEY_FORMAT, utc
from hir_model.rank.increment import day_of
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import ENCODER_ASSET



def summary_rows(store: PartitionStore, keys: list[str]) -> list[tuple[str, int, int, int, int]]:
    """(window, events, conversions, new entities, catalog size) per materialised window."""
    rows = []
    for key in keys:
        events = store.read(EVENTS_ASSET, key, EVENTS_FILE, columns=["event_type"]).column("event_type")
        conversions = pc.sum(pc.equal(events, CONVERSION_EVENT)).as_py() or 0
        ent = store.read(CATALOG_ASSET, key, ENTITIES_FILE, columns=["first_seen_ts"]).column("first_seen_ts")
        start = utc(datetime.strptime(key, KEY_FORMAT))
        new = pc.sum(pc.greater_equal(ent, pa.scalar(start, ent.type))).as_py() or 0
        rows.append((key, len(events), conversions, new, len(ent)))
    return rows


def close_interrupted_runs(instance: dg.DagsterInstance) -> list[str]:
    """Earlier demo runs still marked started (a demo killed mid-run) are marked failed, and their `gpu` pool slots
    freed: a leaked slot would hold every later training step."""
    runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
                                           tags={"hir/demo": "true"}))
    for r in runs:
        instance.report_run_failed(r, "interrupted: the demo that ran it was stopped")
        instance.event_log_storage.free_concurrency_slots_for_run(r.run_id)
    return [r.run_id for r in runs]


def succeeded(instance: dg.DagsterInstance, job_name: str, run_tag: dict[str, str]) -> set[str]:
    """Partition keys of `job_name` with a successful run carrying `run_tag` (the demo's runs of one storage root): what
    `--resume` leaves alone."""
    runs = instance.get_runs(dg.RunsFilter(job_name=job_name, statuses=[dg.DagsterRunStatus.SUCCESS], tags=run_tag))
    return {r.tags["dagster/partition"] for r in runs if "dagster/partition" in r.tags}


def report_of(instance: dg.DagsterInstance) -> str:
    """The path the latest evaluation_report materialisation names."""
    event = instance.get_latest_materialization_event(dg.AssetKey(REPORT_ASSET))
    return event.asset_materialization.metadata["report"].value


QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def launch(instance: dg.DagsterInstance, job_def, partition_key, label: str, run_tag: dict[str, str],
           config: dict | None = None) -> bool:
    """Run one partition of `job_def` in this process on `instance`; a failure is printed with its run id."""
    result = job_def.execute_in_process(partition_key=partition_key, instance=instance, raise_on_error=False,
                                        tags=run_tag, run_config=QUIET | (config or {}))
    if not result.success:
        print(f"{label} failed (run id {result.run_id}); see `make ui` for the logs", file=sys.stderr, flush=True)
    return result.success


@dataclass(frozen=True)
class Follow:
    """What follows window `key`'s run: its daily increments, the evaluation of the window before it (judged on `key`'s
    events) and `key`'s objective adapters; the parts an earlier demo ran to success are left out (--resume)."""

    key: str
    days: list[str]
    evaluate: str | None
    adapters: list[dict[str, str]] = field(default_factory=list)  # {"window": key, "objective": o} (a MultiPartitionKey
    # does not survive pickling)


def follow(task: Follow, run_tag: dict[str, str]) -> tuple[bool, list[str]]:
    """Run `task` (in the follower process, or here with --serial): (success, progress lines)."""
    instance = dg.DagsterInstance.get()  # DAGSTER_HOME's, as the process that launched this one
    lines, t0 = [], time.time()
    if task.days:
        increments = defs.resolve_job_def(INCREMENT_JOB)
        for day in task.days:
            if not launch(instance, increments, day, f"increment of {day}", run_tag):
                return False, lines
        lines.append(f"increments {task.days[0]}..{task.days[-1]} published")
    if task.evaluate:
        if not launch(instance, defs.resolve_job_def(EVALUATION_JOB), task.evaluate, f"evaluation of window {task.evaluate}",
                      run_tag):
            return False, lines
        lines.append(f"window {task.evaluate} evaluated on {task.key}'s events")
    for keys in task.adapters:
        partition = dg.MultiPartitionKey(keys)
        if not launch(instance, defs.resolve_job_def(ADAPTER_JOB), partition, f"adapter {partition}", run_tag):
            return False, lines
    if task.adapters:
        lines.append(f"{len(task.adapters)} objective adapters of {task.key} trained")
    return True, [f"{line} ({time.time() - t0:.0f}s)" for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", help="comma-separated window keys (default: all)")
    parser.add_argument("--skip-evaluation", action="store_true", help="do not evaluate windows on their successors")
    parser.add_argument("--skip-adapters", action="store_true", help="do not train the objective adapters")
    parser.add_argument("--skip-increments", action="store_true",
                        help="do not publish the daily increments (the items that arrive after each window's end)")
    parser.add_argument("--serial", action="store_true",
                        help="run every job in this process in turn (default: a second process follows a window behind "
                             "with the increments, evaluations and adapters)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the windows, evaluations and adapters that an earlier demo on the same storage already "
                             "ran to success (a long run stopped midway goes on where it stopped)")
    args = parser.parse_args(argv)
    config = load_config()
    job = defs.resolve_job_def(WINDOW_JOB)
    keys = job.partitions_def.get_partition_keys()
    if args.partitions:
        keys = [k for k in args.partitions.split(",") if k]
    instance = dg.DagsterInstance.get()
    for run_id in close_interrupted_runs(instance):
        print(f"marked run {run_id} failed: an earlier demo was stopped while it ran", flush=True)
    print(f"hir demo: source={config.source} window={config.window} windows={len(keys)} "
          f"storage={config.storage_uri} DAGSTER_HOME={os.environ.get('DAGSTER_HOME')}", flush=True)
    t0 = time.time()
    # The demo trains each window in its own process's step (HirEncoderRun.launch): no process to start, about 3 s a
    # window on 2 cores; runs launched from the UI or a schedule keep the Pipes subprocess.
    in_process = {"ops": {ENCODER_ASSET: {"config": {"launch": "in_process"}}}}

    # Runs carry the storage root they wrote to: the instance may hold other sources' runs of the same partition keys.
    run_tag = {"hir/demo": "true", "hir/storage": config.storage_uri}
    days = defs.resolve_job_def(INCREMENT_JOB).partitions_def.get_partition_keys()
    done: dict[str, set[str]] = {name: succeeded(instance, name, run_tag) if args.resume else set()
                                 for name in (WINDOW_JOB, EVALUATION_JOB, ADAPTER_JOB, INCREMENT_JOB)}
    if args.resume:
        print(f"resuming: {len(done[WINDOW_JOB] & set(keys))} of {len(keys)} windows already materialised", flush=True)

    def task_after(i: int, key: str) -> Follow:
        tw = job.partitions_def.time_window_for_partition_key(key)
        start, end = utc(tw.start), utc(tw.end)
        after = [] if args.skip_increments else \
            [d for d in days if end <= day_of(d).start < end + (end - start) and d not in done[INCREMENT_JOB]]
        judged = keys[i - 1] if i > 0 and not args.skip_evaluation and keys[i - 1] not in done[EVALUATION_JOB] else None
        adapters = [] if args.skip_adapters else [
            {"window": key, "objective": o} for o in OBJECTIVES
            if dg.MultiPartitionKey({"window": key, "objective": o}) not in done[ADAPTER_JOB]]
        return Follow(key, after, judged, adapters)

    # the follower: one process a window behind (spawned: a forked copy of a process running torch can hang)
    pool = None if args.serial else ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    pending: list[tuple[str, Future]] = []

    def report(wait: bool) -> bool:
        """Print the follower's finished tasks in order (waiting for all when `wait`); False once one failed."""
        while pending and (wait or pending[0][1].done()):
            key, fut = pending.pop(0)
            ok, lines = fut.result()
            for line in lines:
                print(f"    {line}; {time.time() - t0:.0f}s in", flush=True)
            if not ok:
                return False
        return True

    try:
        for i, key in enumerate(keys):
            if key in done[WINDOW_JOB]:
                print(f"[{i + 1}/{len(keys)}] {key} already materialised (--resume)", flush=True)
            elif not launch(instance, job, key, f"run for window {key}", run_tag, in_process):
                return 1
            else:
                print(f"[{i + 1}/{len(keys)}] {key} materialised ({time.time() - t0:.0f}s)", flush=True)
            # the days after window t placed in its space (what hir serve adds to it and evaluating t serves), window
            # t-1 judged on t's events, t's adapters
            task = task_after(i, key)
            if pool is None:
                ok, lines = follow(task, run_tag)
                for line in lines:
                    print(f"    {line}", flush=True)
                if not ok:
                    return 1
            else:
                pending.append((key, pool.submit(follow, task, run_tag)))
                if not report(wait=False):
                    return 1
        if not report(wait=True):
            return 1
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    print(f"every window's increments, evaluation and adapters done ({time.time() - t0:.0f}s)", flush=True)
    store = defs.resources["storage"].store()
    print(f"\n{'window':<12}{'events':>10}{'conversions':>13}{'new entities':>14}{'catalog':>10}")
    for key, n, conv, new, size in summary_rows(store, keys):
        print(f"{key:<12}{n:>10,}{conv:>13,}{new:>14,}{size:>10,}")
    if not args.skip_evaluation and len(keys) > 1:
        if not launch(instance, defs.resolve_job_def(REPORT_JOB), None, "the evaluation report", run_tag):
            return 1
        report = report_of(instance)
        print_last_window(store, keys, out=sys.stdout)
        print(f"\nEvaluation report ({config.source}): {report}")
    print(f"\nDone in {time.time() - t0:.0f}s. Open the UI on this result with `make ui` (http://127.0.0.1:3000).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
