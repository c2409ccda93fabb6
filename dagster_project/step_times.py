"""Where a run's time went: seconds per asset step and window, read from the Dagster instance's event log.

    python -m dagster_project.step_times                       # every successful run of the window job
    python -m dagster_project.step_times --storage /path/store # only the demo's runs on that storage root (hir/storage)
    python -m dagster_project.step_times --job window_evaluation_job

Prints one `key=value` line per step (windows, mean_s, max_s, total_s), one per window (the run's steps summed and its
wall time), and a `total` line. A step's seconds run from its STEP_START to its STEP_SUCCESS event (retries included).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass

import dagster as dg

from dagster_project.jobs import WINDOW_JOB


@dataclass(frozen=True)
class RunSteps:
    partition: str
    wall_s: float
    steps: dict[str, float]  # step key -> seconds from its start to its success


def step_seconds(instance: dg.DagsterInstance, run_id: str) -> dict[str, float]:
    """Step key -> seconds from its first STEP_START to its STEP_SUCCESS (steps that did not succeed are left out)."""
    starts, out = {}, {}
    for entry in instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS}):
        if entry.dagster_event.event_type == dg.DagsterEventType.STEP_START:
            starts.setdefault(entry.step_key, entry.timestamp)
        elif entry.step_key in starts:
            out[entry.step_key] = entry.timestamp - starts[entry.step_key]
    return out


def run_steps(instance: dg.DagsterInstance, job: str, tags: dict[str, str] | None = None) -> list[RunSteps]:
    """The job's successful runs (carrying `tags`), oldest first, the latest run per partition."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job, statuses=[dg.DagsterRunStatus.SUCCESS], tags=tags or {}))
    latest = {}
    for r in sorted(records, key=lambda r: r.create_timestamp):
        latest[r.dagster_run.tags.get("dagster/partition", "")] = r
    return [RunSteps(p, (r.end_time or 0) - (r.start_time or 0), step_seconds(instance, r.dagster_run.run_id))
            for p, r in sorted(latest.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default=WINDOW_JOB, help=f"the job whose runs are read (default {WINDOW_JOB})")
    parser.add_argument("--storage", help="only runs tagged hir/storage=<this> (the demo's storage root)")
    args = parser.parse_args(argv)
    instance = dg.DagsterInstance.get()
    runs = run_steps(instance, args.job, {"hir/storage": args.storage} if args.storage else None)
    if not runs:
        print(f"no successful run of {args.job} on this instance{' with that storage tag' if args.storage else ''}",
              file=sys.stderr)
        return 1
    per_step: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for step, s in r.steps.items():
            per_step[step].append(s)
    for step, values in sorted(per_step.items(), key=lambda kv: -sum(kv[1])):
        print(f"step={step} windows={len(values)} mean_s={sum(values) / len(values):.1f} max_s={max(values):.1f} "
              f"total_s={sum(values):.1f}")
    for r in runs:
        print(f"window={r.partition} steps_s={sum(r.steps.values()):.1f} wall_s={r.wall_s:.1f}")
    print(f"total runs={len(runs)} steps_s={sum(sum(r.steps.values()) for r in runs):.1f} "
          f"wall_s={sum(r.wall_s for r in runs):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
