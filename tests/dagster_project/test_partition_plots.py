"""An asset page's "Plots -> Partitions" in the Dagster UI: each window's numeric metadata as a series by partition,
read through the two GraphQL queries the UI sends (against `dagster dev`) and seen in headless Chromium."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from tests.dagster_project.test_ui import CHROMIUM, CHROMIUM_ARGS, keep_screenshot, webserver  # noqa: F401  (dagster dev, per module)

pytestmark = pytest.mark.slow

WINDOWS = ("1997-09-21", "1997-09-28")
PATCH = "patches/dagster-paginated-partition-keys-end.patch"
# The UI's two queries (dagster-webserver 1.13.27, ui-core/src/assets/useRecentAssetEvents.tsx), trimmed to what the
# plots read: the newest `limit` partition keys, then each one's latest materialisation.
LATEST_PARTITIONS = """query LatestAssetPartitionsQuery($assetKey: AssetKeyInput!, $limit: Int!) {
  assetNodeOrError(assetKey: $assetKey) { ... on AssetNode { id partitionKeyConnection(limit: $limit, ascending: false) {
    results } } } }"""
PARTITION_EVENTS = """query AssetPartitionEventsQuery($assetKey: AssetKeyInput!, $partitions: [String!]!) {
  assetNodeOrError(assetKey: $assetKey) { ... on AssetNode { id latestMaterializationByPartition(partitions: $partitions) {
    partition runId metadataEntries { __typename label ... on IntMetadataEntry { intValue }
    ... on FloatMetadataEntry { floatValue } } } } } }"""
PLOT_LIMIT = 120  # AssetEventMetadataEntriesTable renders <AssetPartitionMetadataPlots limit={120}>
NUMERIC = ("IntMetadataEntry", "FloatMetadataEntry")  # the only entry types AssetMaterializationGraphs plots


def graphql(url: str, query: str, variables: dict) -> dict:
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.load(response)
    assert not body.get("errors"), body["errors"]
    return body["data"]


def plotted(url: str, asset: str) -> tuple[list[str], dict[str, dict[str, float]]]:
    """(the keys the UI asks for, newest first; label -> {window: value}): what Plots -> Partitions draws for `asset`."""
    node = graphql(url, LATEST_PARTITIONS, {"assetKey": {"path": [asset]}, "limit": PLOT_LIMIT})["assetNodeOrError"]
    keys = node["partitionKeyConnection"]["results"]
    events = graphql(url, PARTITION_EVENTS, {"assetKey": {"path": [asset]}, "partitions": keys[::-1]})
    series: dict[str, dict[str, float]] = {}
    for key, event in zip(keys[::-1], events["assetNodeOrError"]["latestMaterializationByPartition"]):
        for entry in (event or {"metadataEntries": []})["metadataEntries"]:
            if entry["__typename"] in NUMERIC:
                assert event["partition"] == key
                series.setdefault(entry["label"], {})[key] = entry.get("intValue", entry.get("floatValue"))
    return keys, series


@pytest.fixture(scope="module")
def materialised(webserver):  # noqa: F811
    """entity_catalog and raw_events for WINDOWS on the webserver's instance; the definitions it serves."""
    url, home, env, tmp_path = webserver
    with pytest.MonkeyPatch.context() as mp:
        for key in ("DAGSTER_HOME", "HIR_STORAGE_URI", "HIR_SOURCE", "HIR_WINDOW"):
            mp.setenv(key, env[key])
        from dagster_project.definitions import build_definitions
        from hir_model.config import load_config

        defs = build_definitions(load_config())
        job = defs.resolve_job_def("hir_window").get_subset(
            asset_selection={dg.AssetKey("entity_catalog"), dg.AssetKey("raw_events")})
        with dg.DagsterInstance.from_config(str(home)) as instance:
            for window in WINDOWS:
                assert job.execute_in_process(partition_key=window, instance=instance).success
    return defs


def test_plots_by_partition_get_each_windows_figures_through_the_uis_graphql(webserver, materialised):  # noqa: F811
    url, home, env, tmp_path = webserver
    windows = materialised.resolve_job_def("hir_window").partitions_def.get_partition_keys()
    for asset in ("raw_events", "bom_index"):  # every window asset shares the partitions; bom_index is not run here
        keys, _ = plotted(url, asset)
        assert keys == windows[::-1][:PLOT_LIMIT], f"{asset}: newest {keys[:2]} instead of {windows[-1]}: apply {PATCH}"
    keys, series = plotted(url, "raw_events")
    rows = {w: pq.read_metadata(tmp_path / "store" / "raw_events" / w / "events.parquet").num_rows for w in WINDOWS}
    assert series["dagster/row_count"] == rows and all(n > 0 for n in rows.values())
    assert set(series["rejected_fraction"]) == set(WINDOWS) and all(0 <= v <= 1 for v in series["rejected_fraction"].values())
    assert set(series["users"]) == set(series["conversions"]) == set(WINDOWS)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_partitions_plots_show_in_chromium(webserver, materialised):  # noqa: F811
    playwright = pytest.importorskip("playwright.sync_api")
    url, home, env, tmp_path = webserver
    answers = {}

    def keep(response):  # the UI's own GraphQL answers, by operation
        operation = (response.request.post_data_json or {}).get("operationName") if response.request.method == "POST" else None
        if operation in ("LatestAssetPartitionsQuery", "AssetPartitionEventsQuery"):
            answers[operation] = response.json()["data"]["assetNodeOrError"]

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_locator_handler(page.get_by_text("Join the Dagster community"), lambda: page.get_by_role("button", name="Skip").click())
        page.on("response", keep)
        page.goto(f"{url}/assets/raw_events", wait_until="networkidle")
        page.get_by_role("button", name="Plots").first.click()  # the metadata section's Plots, Partitions by default
        page.get_by_text("When graphing values by partition", exact=False).wait_for(timeout=30_000)  # only under plots
        for label in ("dagster/row_count", "rejected_fraction"):
            page.get_by_text(label, exact=True).first.wait_for(timeout=10_000)
        keep_screenshot(page, tmp_path / "ui_raw_events_partition_plots.png")
        browser.close()
    keys = answers["LatestAssetPartitionsQuery"]["partitionKeyConnection"]["results"]
    assert set(WINDOWS) <= set(keys), f"the UI asked for {keys[:2]}...: apply {PATCH}"
    events = [e for e in answers["AssetPartitionEventsQuery"]["latestMaterializationByPartition"] if e]
    assert sorted(e["partition"] for e in events) == list(WINDOWS)
