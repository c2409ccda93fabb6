"""`make ui`: `dagster dev` on the configured source's own instance, on 127.0.0.1, stopped within 10 s by Ctrl-C.

    python -m dagster_project.ui [--port 3000] [--reports-port 3001] [--host 127.0.0.1]

Beside the UI it serves the source's evaluation report over HTTP (read-only, the reports folder alone), so the
`evaluation_report` asset's `report_url` opens from the UI, and it tells `dagster dev` both addresses (alerts link runs
and checks on this webserver).

`dagster dev` alone can take 40 s to stop: on SIGINT its code server waits up to 30 s for the runs it launched, whose
workers hold interrupts back while they import the definitions (2 cores: 10-30 s). So this runs it in a process group
of its own, passes SIGINT, SIGTERM or SIGHUP on to that group (what Ctrl-C did to a bare `dagster dev`), SIGKILLs what
is still alive after a grace period (a second Ctrl-C: at once), and marks the runs whose workers it killed as canceled
(the operator stopped them: no alert, no automatic retry), so that none is left "Started", holding a run-queue or `gpu`
pool slot. It also stops when `make` does: a SIGTERM to make alone is not passed on to the recipe.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg

from dagster_project.instance import InstanceSourceError, prepare
from dagster_project.sensors import WEBSERVER_ENV
from hir_assets.report import REPORTS_URL_ENV
from hir_model.config import PROJECT_ROOT, ConfigError, HIRConfig, load_config
from hir_model.eval.pages import report_path

GRACE_S = 5.0  # SIGINT -> SIGKILL; 2 cores: webserver and daemon stop in 2-4 s, the stateless code servers in 5-9
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
ACTIVE = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs (macOS): the group exists while any member, zombie or not, does
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        state, _ppid, group = stat[stat.rindex(")") + 2:].split()[:3]  # after "pid (comm) "
        if int(group) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def stop_with_parent() -> None:
    """SIGTERM this launcher when its parent exits: GNU make, killed, leaves its recipe's process running."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent was gone before the call
            os.kill(os.getpid(), signal.SIGTERM)


def stop(proc: subprocess.Popen, grace_s: float, signals: list[int]) -> list[int]:
    """SIGINT to `proc`'s process group, SIGKILL to what is left after `grace_s` or at a second signal; returns the pids
    it killed."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        return []
    first, deadline = len(signals), time.monotonic() + grace_s
    while time.monotonic() < deadline and len(signals) == first:
        proc.poll()  # reaps dagster dev itself; the grandchildren it leaves are reaped by init
        if not group_members(pgid):
            proc.wait()
            return []
        time.sleep(0.1)
    killed = group_members(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    end = time.monotonic() + 2
    while group_members(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    return killed


def worker_pids(instance: dg.DagsterInstance, run_id: str) -> set[int]:
    """The processes a run's engine events name: its worker ("Started process for run (pid: N)") and step processes."""
    pids = set()
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records:
        event = record.event_log_entry.dagster_event
        pid = event.engine_event_data.metadata.get("pid") if event and event.engine_event_data else None
        if pid is not None and str(pid.value).isdigit():
            pids.add(int(pid.value))
    return pids


def cancel_killed_runs(instance: dg.DagsterInstance, killed: list[int], since: float) -> list[str]:
    """Runs still starting or started whose worker was killed, or still starting, launched after `since` (a timestamp)
    and stopped before their worker reported its pid, are marked canceled and their pool slots freed; their ids."""
    canceled = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=ACTIVE)):
        run = record.dagster_run
        pids = worker_pids(instance, run.run_id)
        launched_here = run.status == dg.DagsterRunStatus.STARTING and record.update_timestamp.timestamp() >= since
        ours = bool(pids & set(killed)) if pids else launched_here
        if ours:
            instance.report_run_canceled(run, "the UI (`make ui`) was stopped: its process was killed")
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            canceled.append(run.run_id)
    return canceled


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log on the terminal running the UI
        pass


def serve_reports(folder: Path, host: str, port: int) -> ThreadingHTTPServer:
    """The reports folder over HTTP on a daemon thread (static, read-only: GET and HEAD of files under it)."""
    folder.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((host, port), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, name="hir-reports", daemon=True).start()
    return server


def reports_folder(config: HIRConfig) -> Path | None:
    """Where the source's report is written on this machine; None for an S3 store (its report is its own upload)."""
    uri = config.storage_uri
    if uri.startswith("s3://"):
        return None
    root = Path(uri.removeprefix("file://"))
    return report_path(root if root.is_absolute() else PROJECT_ROOT / root).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only)")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--reports-port", type=int, help="where the evaluation report is served (default: --port + 1)")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds from Ctrl-C to killing what is left")
    args = parser.parse_args(argv)
    try:
        config = load_config()
        home = prepare(config)
    except (ConfigError, InstanceSourceError) as exc:
        print(f"hir ui: {exc}", file=sys.stderr)
        return 2
    ui_url = f"http://{args.host}:{args.port}"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.setdefault(WEBSERVER_ENV, ui_url)
    folder, reports = reports_folder(config), None
    if folder is not None:
        try:
            reports = serve_reports(folder, args.host, args.reports_port or args.port + 1)
            env.setdefault(REPORTS_URL_ENV, f"http://{args.host}:{reports.server_address[1]}")
        except OSError as exc:  # the port is taken: the UI still runs, the report stays a file
            print(f"hir ui: the report is not served ({exc}); open {folder} instead", file=sys.stderr, flush=True)
    print(f"hir ui: {config.label} on {ui_url}  instance {home}  alerts {home / 'alerts.jsonl'}"
          + (f"  report {env[REPORTS_URL_ENV]}/{report_path('.').name}" if reports else "") + "  (Ctrl-C stops it)", flush=True)

    signals: list[int] = []  # the stop signals received, in order
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: signals.append(signum))
    stop_with_parent()
    started = time.time()
    dagster = Path(sys.executable).with_name("dagster")
    # Opened first: its storage exists before dagster dev's processes would race to create it, and is ready to cancel
    # runs within the 10 s.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        proc = subprocess.Popen([str(dagster), "dev", "-h", args.host, "-p", str(args.port), "-w", "workspace.yaml"],
                                cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL,
                                process_group=0)  # its own group: Ctrl-C reaches this launcher alone, which passes it on
        while proc.poll() is None and not signals:
            time.sleep(0.2)
        stopping_at = time.monotonic()
        killed = stop(proc, args.grace, signals)  # also after dagster dev exited alone: its code servers may outlive it
        canceled = cancel_killed_runs(instance, killed, started) if killed else []
    if reports is not None:
        reports.shutdown()
    if signals:
        print(f"hir ui: stopped in {time.monotonic() - stopping_at:.1f}s"
              + (f"; killed {len(killed)} processes still running after {args.grace:g}s" if killed else "")
              + (f"; canceled runs {', '.join(canceled)}" if canceled else ""), file=sys.stderr, flush=True)
        return 128 + signals[0]
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
