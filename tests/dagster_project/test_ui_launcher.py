"""`make ui`'s launcher (dagster_project.ui) stops everything it started within 10 s of Ctrl-C, even with a run in
flight, and leaves no run "Started". The browser tests of the UI itself are in test_ui.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.ui import cancel_killed_runs, group_members, stop, worker_pids

REPO = Path(__file__).resolve().parents[2]
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  }
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_members(sid: int) -> list[int]:
    """Live processes (zombies left out) of session `sid`: the launcher, `dagster dev` and all they started."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:
            state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2:].split()[:4]
            if int(session) == sid and state != "Z":
                members.append(int(entry.name))
    return members


def graphql(url: str, query: str, variables: dict) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


IGNORES_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(flush=True); time.sleep(60)"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_stop_interrupts_the_group_and_kills_what_ignores_it_after_the_grace_period():
    # SIGINT's default handler set in the child: a suite launched in the background (`make test &`) hands its children
    # SIGINT ignored, and an ignored disposition survives exec
    polite = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                               "signal.default_int_handler); print(flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, process_group=0)
    polite.stdout.readline()  # started, its SIGINT handler in place (a loaded machine can take seconds to unwind it)
    assert stop(polite, 20.0, []) == [] and polite.returncode != 0 and not group_members(polite.pid)
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGINT], stdout=subprocess.PIPE, process_group=0)
    stubborn.stdout.readline()
    start = time.monotonic()
    assert stop(stubborn, 0.5, []) == [stubborn.pid]
    assert stubborn.returncode == -signal.SIGKILL and not group_members(stubborn.pid) and time.monotonic() - start < 3


def test_runs_whose_workers_were_killed_are_canceled_and_others_left_alone(tmp_path):
    from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.test_utils import create_run_for_test

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("hir"), "__repository__"), "hir_window")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        def run(status: dg.DagsterRunStatus, pid: int | None = None) -> str:
            created = create_run_for_test(instance, job_name="hir_window", status=status, remote_job_origin=origin)
            if pid:
                message = f"Started process for run (pid: {pid})."  # as the code server's run worker reports it
                instance.report_engine_event(message, created, EngineEventData.in_process(pid))
            return created.run_id

        before = run(dg.DagsterRunStatus.STARTING)  # launched before this UI started: not ours to judge
        since = time.time()
        killed, elsewhere = run(dg.DagsterRunStatus.STARTED, 4242), run(dg.DagsterRunStatus.STARTED, 4343)  # 4343: a demo
        starting, queued = run(dg.DagsterRunStatus.QUEUED), run(dg.DagsterRunStatus.QUEUED)
        dequeued = DagsterEvent(event_type_value=DagsterEventType.PIPELINE_STARTING.value, job_name="hir_window")
        instance.report_dagster_event(dequeued, run_id=starting)  # what the daemon's dequeuer reports
        assert worker_pids(instance, killed) == {4242}
        assert sorted(cancel_killed_runs(instance, [4242, 99], since)) == sorted([killed, starting])
        status = {r: instance.get_run_by_id(r).status for r in (before, killed, elsewhere, starting, queued)}
        assert status == {before: dg.DagsterRunStatus.STARTING, killed: dg.DagsterRunStatus.CANCELED,
                          elsewhere: dg.DagsterRunStatus.STARTED, starting: dg.DagsterRunStatus.CANCELED,
                          queued: dg.DagsterRunStatus.QUEUED}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_ctrl_c_stops_make_ui_within_10_s_with_a_run_in_flight(tmp_path):
    home = tmp_path / "dagster_home"
    env = {**os.environ, "DAGSTER_HOME": str(home), "HIR_SOURCE": "movielens", "HIR_WINDOW": "weekly",
           "HIR_STORAGE_URI": str(tmp_path / "store"), "DAGSTER_DISABLE_TELEMETRY": "1"}
    port, reports_port, log = free_port(), free_port(), tmp_path / "ui.log"
    report = tmp_path / "store" / "_reports" / "evaluation.html"  # what evaluation_report writes
    report.parent.mkdir(parents=True)
    report.write_text("<html><title>hir evaluation: movielens</title></html>")
    # What `make ui` runs, as the leader of its own session: SIGINT to its group is a terminal's Ctrl-C.
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dagster_project.ui", "--port", str(port), "--reports-port",
                                 str(reports_port)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            try:
                if urllib.request.urlopen(f"{url}/server_info", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"the UI did not come up: {log.read_text()[-3000:]}")
        assert log.read_text().startswith(f"hir ui: movielens on {url}  instance {home}  alerts {home / 'alerts.jsonl'}")
        assert (home / "hir_source").read_text() == "movielens\n" and (home / "dagster.yaml").exists()
        # the report opens over HTTP beside the UI, at the address the report asset's metadata links
        report_url = f"http://127.0.0.1:{reports_port}/evaluation.html"
        assert f"report {report_url}" in log.read_text().splitlines()[0]
        assert urllib.request.urlopen(report_url, timeout=10).read() == report.read_bytes()

        # A run whose worker is still importing the definitions: what kept a bare `dagster dev` alive for 40 s.
        selector = {"repositoryLocationName": "hir", "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                    "assetSelection": [{"path": ["entity_catalog"]}]}
        tags = [{"key": "dagster/partition", "value": "1997-09-14"}]
        params = {"selector": selector, "executionMetadata": {"tags": tags}}
        deadline = time.time() + 60
        while True:  # the code location may still be loading when the webserver first answers
            result = graphql(url, LAUNCH, {"params": params})["data"]["launchRun"]
            if result["__typename"] == "LaunchRunSuccess" or time.time() > deadline:
                break
            time.sleep(2)
        assert result["__typename"] == "LaunchRunSuccess", result
        run_id = result["run"]["runId"]
        with dg.DagsterInstance.from_config(str(home)) as instance:  # dequeued, and its worker process is up
            deadline = time.time() + 90
            while not worker_pids(instance, run_id) and time.time() < deadline:
                time.sleep(0.5)
            assert worker_pids(instance, run_id), instance.get_run_by_id(run_id).status

        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        while session_members(proc.pid) and time.monotonic() - start < 15:
            time.sleep(0.1)
        took = time.monotonic() - start
        assert not session_members(proc.pid), f"still running after {took:.1f}s: {session_members(proc.pid)}"
        print(f"Ctrl-C to every process gone: {took:.1f}s")
        assert took < 10, f"stopped in {took:.1f}s"
        assert proc.wait(timeout=1) == 128 + signal.SIGINT
        assert "hir ui: stopped in" in log.read_text()
        with dg.DagsterInstance.from_config(str(home)) as instance:
            ended = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)  # interrupted, or killed and canceled
            assert instance.get_run_by_id(run_id).status in ended
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
