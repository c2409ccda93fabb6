"""One daemon-driven backfill of the ingest assets over several windows: P windows at a time vs one at a time.

Windows are independent partitions for ingest (entity_catalog, raw_events, rejected_events); in production the
run coordinator launches one run per window and a limit on concurrent runs decides how many run at once. This runs
that path for real: the synthetic data is generated once, then for each P of --parallel a fresh `dagster dev`
(webserver + daemon, 127.0.0.1) on a temporary DAGSTER_HOME whose QueuedRunCoordinator allows P concurrent runs and
on fresh storage gets the backfill through dagster_project.backfill's GraphQL mutation; the clock runs from the
launch to the end of the backfill's last run. The published tables of every P must equal those of the first.

    python benchmarks/backfill.py                 # medium preset, every window, P=1 and P=2
    python benchmarks/backfill.py --quick         # small preset, 4 windows (a few minutes)
    python benchmarks/backfill.py --parallel 1,2,4 --windows 6

Prints `key=value` lines: windows, preset, runs_p<P>, failures, seconds_p<P>, where the time went (first_run_s_p<P>:
launch to the first run's start; run_s_p<P>: the runs' wall time, summed; step_s_p<P>: the asset bodies within them,
summed, the rest being process starts), speedup_p<P> (seconds of the first P over seconds_p<P>), tables_compared and
tables_equal; progress goes to stderr. The backfill makes one run per window holding the three assets (their
BackfillPolicy.multi_run(1)); the default multiprocess executor starts a process per step besides the run's own, and
each imports the definitions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ASSETS = ("entity_catalog", "raw_events", "rejected_events")
QUICK_WINDOWS = 4
START_TIMEOUT_S = 300    # dagster dev imports the definitions (torch among them) before it answers
LAUNCH_TIMEOUT_S = 120   # the code location may still be loading when the webserver first answers


@dataclass(frozen=True)
class BackfillResult:
    parallel: int      # max_concurrent_runs of the run coordinator
    seconds: float     # launch of the backfill -> end of its last run
    runs: int          # runs the backfill launched
    failures: int      # runs that did not succeed (retries included)
    first_run_s: float  # launch -> the first run starts (the backfill daemon's tick and the queue's dequeue)
    run_s: float       # sum over runs of start -> end
    step_s: float      # sum over steps of step start -> success: the asset bodies, without any process start
    store: Path        # the published tables


def log(message: str) -> None:
    print(f"[backfill {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_home(home: Path, parallel: int) -> None:
    """The local instance's config (deploy/dagster.local.yaml) with a run queue: the daemon's QueuedRunCoordinator
    launches at most `parallel` runs at a time. The limit goes under `concurrency: runs:`, since Dagster refuses
    run_coordinator.config.max_concurrent_runs beside the `concurrency: pools:` block the local config has."""
    import yaml

    config = yaml.safe_load((REPO / "deploy" / "dagster.local.yaml").read_text())
    config["run_coordinator"] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    config.setdefault("concurrency", {})["runs"] = {"max_concurrent_runs": parallel}
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


class DagsterDev:
    """`dagster dev` in its own process group (webserver, daemon, code server and the runs they start)."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_path.open("w")
        self.log_path = log_path
        self.proc = subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(self.port), "-w", "workspace.yaml"],
                                     cwd=REPO, env=env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}")
            try:
                if urllib.request.urlopen(f"{self.url}/server_info", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"dagster dev did not answer within {START_TIMEOUT_S} s; see {self.log_path}:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)  # with runs in flight it can take longer; then the whole group is killed
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log_file.close()


def launch(url: str, keys: list[str]) -> tuple[str, float]:
    """dagster_project.backfill's mutation, retried while the webserver is still loading the code location; the
    backfill's id and when the accepted call was sent (the clock's start)."""
    from dagster_project.backfill import launch_backfill

    deadline = time.time() + LAUNCH_TIMEOUT_S
    while True:
        sent = time.time()
        try:
            return launch_backfill(url, list(ASSETS), keys), sent
        except (RuntimeError, OSError) as exc:
            if time.time() > deadline:
                raise
            log(f"launch not accepted yet ({str(exc)[:120]}); retrying")
            time.sleep(2)


def failure_message(instance, run_id: str) -> str:
    """The first step or run failure's message and error of a run, for the exception that stops the benchmark."""
    from dagster import DagsterEventType

    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE}):
        error = getattr(entry.dagster_event.event_specific_data, "error", None)
        return f"{entry.step_key or 'run'}: {entry.message}" + (f"\n{error.to_string()[-2000:]}" if error else "")
    return "no failure event logged"


def wait_backfill(home: Path, backfill_id: str, expected_runs: int, dev: DagsterDev) -> tuple[list, float]:
    """Poll the instance until the backfill is no longer requested and none of its runs is in flight; the run records
    and the end of the last run. Raises with the failing run's id."""
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus  # not re-exported by dagster

    last_line, last_print = "", 0.0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while True:
            if dev.proc.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {dev.proc.returncode} during the backfill:\n{dev.tail()}")
            backfill = instance.get_backfill(backfill_id)
            records = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            failed = [r.dagster_run for r in records if r.dagster_run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)]
            if failed:
                run = failed[0]
                window = run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")
                raise RuntimeError(f"run {run.run_id} of backfill {backfill_id} (window {window}) ended {run.status.value}: "
                                   f"{failure_message(instance, run.run_id)}\n(--keep keeps {home} and {dev.log_path})")
            counts: dict[str, int] = {}
            for r in records:
                counts[r.dagster_run.status.value] = counts.get(r.dagster_run.status.value, 0) + 1
            line = f"{backfill.status.value}; runs {dict(sorted(counts.items()))} (at least {expected_runs} expected)"
            if line != last_line or time.time() - last_print > 30:
                log(line)
                last_line, last_print = line, time.time()
            if backfill.status not in (BulkActionStatus.REQUESTED,) and all(r.dagster_run.is_finished for r in records):
                if backfill.status != BulkActionStatus.COMPLETED_SUCCESS:
                    raise RuntimeError(f"backfill {backfill_id} ended {backfill.status.value}: {backfill.error}")
                return records, max(r.end_time for r in records)
            time.sleep(1)


def step_seconds(instance, run_id: str) -> float:
    """Seconds a run spent inside its steps (STEP_START is logged once the step's process has imported the code)."""
    from dagster import DagsterEventType

    starts, total = {}, 0.0
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
        if entry.dagster_event.event_type == DagsterEventType.STEP_START:
            starts[entry.step_key] = entry.timestamp
        elif entry.step_key in starts:
            total += entry.timestamp - starts.pop(entry.step_key)
    return total


def run_backfill(parallel: int, keys: list[str], base_env: dict[str, str], workdir: Path) -> BackfillResult:
    import dagster as dg

    home, store = workdir / "dagster_home", workdir / "store"
    write_home(home, parallel)
    env = {**base_env, "DAGSTER_HOME": str(home), "HIR_STORAGE_URI": str(store)}
    log(f"P={parallel}: starting dagster dev (DAGSTER_HOME={home})")
    dev = DagsterDev(env, workdir / "dagster_dev.log")
    try:
        dev.wait_ready()
        backfill_id, launched = launch(dev.url, keys)
        log(f"P={parallel}: backfill {backfill_id} of {len(keys)} windows launched ({dev.url}/overview/backfills/{backfill_id})")
        records, end = wait_backfill(home, backfill_id, len(keys), dev)
        seconds = end - launched
        failures = sum(r.dagster_run.status != dg.DagsterRunStatus.SUCCESS for r in records)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            step_s = sum(step_seconds(instance, r.dagster_run.run_id) for r in records)
        log(f"P={parallel}: {len(records)} runs done in {seconds:.1f} s")
        return BackfillResult(parallel, seconds, len(records), failures,
                              first_run_s=min(r.start_time for r in records) - launched,
                              run_s=sum(r.end_time - r.start_time for r in records), step_s=step_s, store=store)
    finally:
        log(f"P={parallel}: stopping dagster dev")
        dev.stop()


def parquet_files(store: Path) -> list[Path]:
    return sorted(p.relative_to(store) for asset in ASSETS for p in (store / asset).rglob("*.parquet"))


def compare_stores(reference: Path, other: Path) -> int:
    """Every published Parquet table of `other` equals `reference`'s (schema and rows); the number of tables."""
    import pyarrow.parquet as pq

    files = parquet_files(reference)
    if not files:
        raise RuntimeError(f"no tables published under {reference}")
    if files != parquet_files(other):
        raise RuntimeError(f"{other} published {parquet_files(other)}, {reference} published {files}")
    for rel in files:
        if not pq.read_table(reference / rel).equals(pq.read_table(other / rel)):
            raise RuntimeError(f"{rel} differs between {reference} and {other}")
    return len(files)


def window_keys(env: dict[str, str], windows: int | None) -> list[str]:
    from hir_model.config import load_config

    keys = [w.key for w in load_config(env=env).window_spec().windows()]
    return keys[:windows] if windows else keys


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default=None, help="synthetic scale preset (default medium; small with --quick)")
    parser.add_argument("--windows", type=int, default=None, help=f"windows to backfill (default all; {QUICK_WINDOWS} with --quick)")
    parser.add_argument("--parallel", default="1,2", help="comma-separated concurrent-run limits; the first is the reference")
    parser.add_argument("--quick", action="store_true", help=f"small preset, {QUICK_WINDOWS} windows")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, instances, tables)")
    args = parser.parse_args(argv)
    preset = args.preset or ("small" if args.quick else "medium")
    windows = args.windows or (QUICK_WINDOWS if args.quick else None)
    parallels = [int(p) for p in args.parallel.split(",")]
    if len(parallels) < 2 or len(set(parallels)) != len(parallels) or min(parallels) < 1:
        parser.error("--parallel needs at least two distinct limits >= 1, e.g. 1,2")

    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the servers and remove the folder
    signal.signal(signal.SIGTERM, interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="hir-backfill-"))
    try:
        env = {**os.environ, "HIR_SOURCE": "synthetic", "HIR_SYNTHETIC_SCALE": preset, "HIR_DATA_DIR": str(tmp / "data"),
               "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}
        t0 = time.time()
        log(f"generating the {preset} synthetic data into {tmp / 'data'} (hir prepare)")
        subprocess.run([str(BIN / "hir"), "prepare"], cwd=REPO, env=env, check=True, stdout=sys.stderr)
        keys = window_keys(env, windows)
        log(f"data ready in {time.time() - t0:.1f} s; windows {keys[0]} .. {keys[-1]} ({len(keys)})")
        results = [run_backfill(p, keys, env, tmp / f"p{p}") for p in parallels]
        reference = results[0]
        tables = [compare_stores(reference.store, r.store) for r in results[1:]]
        print(f"windows={len(keys)}")
        print(f"preset={preset}")
        for r in results:
            print(f"runs_p{r.parallel}={r.runs}")
        print(f"failures={sum(r.failures for r in results)}")
        for r in results:
            print(f"seconds_p{r.parallel}={r.seconds:.1f}")
        for r in results:  # where the time goes: the daemon's first launch, runs' wall time, the asset bodies within it
            print(f"first_run_s_p{r.parallel}={r.first_run_s:.1f}")
            print(f"run_s_p{r.parallel}={r.run_s:.1f}")
            print(f"step_s_p{r.parallel}={r.step_s:.1f}")
        for r in results[1:]:
            print(f"speedup_p{r.parallel}={reference.seconds / r.seconds:.2f}")
        print(f"tables_compared={tables[0]}")
        print("tables_equal=true")
        return 0
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted: servers stopped, temporary folder removed")
        sys.exit(130)
