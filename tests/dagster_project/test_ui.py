"""The Dagster UI in a real browser: the webserver on 127.0.0.1 serving the demo's definitions, driven by
headless Chromium (Debian's `chromium` package) through Playwright."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PARTITION = "1997-09-28"
# Flags for a closed network: no background calls home, no sandbox as root, no GPU.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium); .ci/run installs it"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ui")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "HIR_STORAGE_URI": str(tmp_path / "store"), "HIR_SOURCE": "movielens",
           "HIR_WINDOW": "weekly", "DAGSTER_DISABLE_TELEMETRY": "1"}
    port = free_port()
    # `dagster dev` (what `make ui` runs): the webserver plus the daemon that dequeues launched runs.
    proc = subprocess.Popen([str(Path(sys.executable).with_name("dagster")), "dev", "-h", "127.0.0.1", "-p", str(port),
                             "-w", "workspace.yaml"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/server_info", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(1)
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {proc.returncode}")
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise TimeoutError("dagster dev did not come up within 180 s")
    yield url, home, env, tmp_path
    os.killpg(proc.pid, signal.SIGTERM)  # dagster dev and its webserver, daemon and code server
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def keep_screenshot(page, shot: Path) -> None:
    """The whole page to `shot`, and a copy under .hir/test-artifacts/ to look at after the run."""
    page.screenshot(path=str(shot), full_page=True)
    artifacts = REPO / ".hir" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, artifacts / shot.name)


def test_asset_graph_checks_and_a_launch_from_the_ui(webserver, monkeypatch):
    playwright = pytest.importorskip("playwright.sync_api")
    url, home, env, tmp_path = webserver
    for key in ("DAGSTER_HOME", "HIR_STORAGE_URI", "HIR_SOURCE"):
        monkeypatch.setenv(key, env[key])
    from dagster_project.definitions import build_definitions
    from hir_model.config import load_config

    defs = build_definitions(load_config())
    assets = sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())
    checks = {a: sorted(c.name for c in defs.resolve_asset_graph().get_check_keys_for_assets({dg.AssetKey(a)})) for a in assets}
    with dg.DagsterInstance.from_config(str(home)) as instance:  # the upstream window, so raw_events can run
        job = defs.resolve_job_def("hir_window")
        assert job.get_subset(asset_selection={dg.AssetKey("entity_catalog")}).execute_in_process(
            partition_key=PARTITION, instance=instance).success

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        # The community newsletter pop-up can open at any moment: dismiss it whenever it blocks an action.
        page.add_locator_handler(page.get_by_text("Join the Dagster community"), lambda: page.get_by_role("button", name="Skip").click())
        page.goto(f"{url}/assets", wait_until="networkidle")
        for asset in assets:
            page.get_by_text(asset, exact=True).first.wait_for(timeout=30_000)
        for asset, names in checks.items():
            if names:
                page.goto(f"{url}/assets/{asset}?view=checks", wait_until="networkidle")
                for name in names:
                    page.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
        page.goto(f"{url}/assets/raw_events", wait_until="networkidle")
        page.get_by_role("button", name="Materialize…").click()
        field = page.get_by_placeholder("ex: ", exact=False)
        field.fill(PARTITION)
        field.press("Enter")
        page.get_by_role("dialog").get_by_role("button", name="Launch 1 run").click()
        page.get_by_text("Launched run", exact=False).first.wait_for(timeout=60_000)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            run = next(r for r in instance.get_runs() if dg.AssetKey("raw_events") in (r.asset_selection or set()))
        page.goto(f"{url}/runs/{run.run_id}", wait_until="networkidle")
        page.get_by_text("Success", exact=True).first.wait_for(timeout=240_000)
        keep_screenshot(page, tmp_path / "ui_raw_events_run.png")
        browser.close()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = [r for r in instance.get_runs() if r.tags.get("dagster/partition") == PARTITION
                and dg.AssetKey("raw_events") in (r.asset_selection or set())]
        assert runs and runs[0].status == dg.DagsterRunStatus.SUCCESS
    assert (tmp_path / "store" / "raw_events" / PARTITION / "events.parquet").exists()


def test_cli_backfill_of_a_range_through_graphql(webserver, monkeypatch):
    from dagster._core.execution.backfill import BulkActionStatus  # not re-exported by dagster

    from dagster_project.backfill import main

    url, home, env, tmp_path = webserver
    for key in ("DAGSTER_HOME", "HIR_STORAGE_URI", "HIR_SOURCE"):
        monkeypatch.setenv(key, env[key])
    assert main(["--assets", "entity_catalog", "--from", "1997-09-14", "--to", "1997-09-21", "--url", url]) == 0
    deadline = time.time() + 300
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.time() < deadline:
            backfill = instance.get_backfills()[0]
            if backfill.status != BulkActionStatus.REQUESTED:
                break
            time.sleep(2)
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status
        runs = [r for r in instance.get_runs() if r.tags.get("dagster/backfill") == backfill.backfill_id]
        # one window per run (BackfillPolicy.multi_run(1)): a run's range starts and ends at its window
        windows = sorted(r.tags.get("dagster/partition") or r.tags["dagster/asset_partition_range_start"] for r in runs)
        assert windows == ["1997-09-14", "1997-09-21"]
    assert (tmp_path / "store" / "entity_catalog" / "1997-09-21" / "entities.parquet").exists()
