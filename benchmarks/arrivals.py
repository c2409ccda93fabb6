r"""From a catalogue file landing to its items being served: the arrival path timed end to end, as it runs.

A window W is materialised (the demo's synthetic store, or with --quick a small synthetic world materialised here by
the real window job); its world is exported as a bring-your-own folder (catalog/ holding every entity first seen by
end(W), events/W/), the days after W are published as they stood before any arrival, and then, with a real
`dagster-daemon` running the definitions (the arrival sensor ticking every --interval seconds, 30 as deployed, launching
runs through the instance's queued run coordinator) and a real `hir serve` polling the store every --poll seconds (30,
its default), the next day's
catalogue file lands (written under a hidden name, renamed). The clock runs from the rename until `hir serve` answers a
user with the new items (`scope=new`, and `/health` names the day). The wait for each stage comes from the instance's
run record: the sensor's tick to the run's creation, the queue, the run (a process that imports the definitions, then
the increment: content embedded, placed, checked, committed) and the server's next poll.

    python benchmarks/arrivals.py                        # the demo's store (.hir/storage/synthetic): window before the
                                                         # last, the first day after it with arrivals
    python benchmarks/arrivals.py --store S --window W   # another materialised synthetic store / window
    python benchmarks/arrivals.py --quick                # a small world materialised here first (a few minutes)

Prints key=value lines: case, window, day, catalog_entities, landed_items, interval_s, poll_s, the stages
(land_to_run_created_s, queued_s, run_s, run_end_to_served_s), land_to_served_s, target_s (120) and under_target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's packages, whatever the working directory

BIN = Path(sys.executable).parent
TARGET_S = 120.0
WINDOW_ASSETS = ("ranking_head", "bom_index", "entity_embeddings", "hir_encoder", "content_embeddings", "catalog_clip",
                 "engagement_graph", "interest_hierarchy")
QUICK = dict(n_users=300, n_products=300, n_advertisers=12, new_products_per_window=60, new_users_per_window=20,
             new_advertisers_per_window=2, events_per_window=4000, n_windows=2)


def log(message: str) -> None:
    print(f"[arrivals {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def export(source, window, byo: Path, store_events) -> int:
    """The world as of end(window) as a bring-your-own folder: catalog/base.parquet, events/<window>/; its entities."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_contracts.schemas import CATALOG_SCHEMA

    (byo / "catalog").mkdir(parents=True)
    table = pa.concat_tables([b.table.cast(CATALOG_SCHEMA) for b in source.catalog(window.end)])
    pq.write_table(table, byo / "catalog" / "base.parquet")
    (byo / "events" / window.key).mkdir(parents=True)
    pq.write_table(store_events, byo / "events" / window.key / "part-0.parquet")
    return table.num_rows


def day_file(source, day):
    """Every entity first seen inside the day (its products, and the advertisers and campaigns they belong to)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from data_contracts.schemas import CATALOG_SCHEMA

    table = pa.concat_tables([b.table.cast(CATALOG_SCHEMA) for b in source.catalog(day.end)])
    ts = table["first_seen_ts"]
    return table.filter(pc.greater_equal(ts, pa.scalar(day.start, ts.type)))


def materialise_quick(tmp: Path) -> tuple[Path, object, object]:
    """A small synthetic world, its first window materialised by the real window job (in process): (store, source, W)."""
    import json

    import dagster as dg

    from dagster_project.definitions import build_definitions
    from dagster_project.jobs import WINDOW_JOB
    from hir_model.config import HIRConfig

    config = HIRConfig(source="synthetic", storage_uri=str(tmp / "world-store"), data_dir=tmp / "world-data",
                       synthetic=dict(QUICK))
    source = config.make_source()
    source.prepare()
    window = config.window_spec(source).windows()[0]
    log(f"--quick: materialising window {window.key} of a small world ({json.dumps(QUICK)}) with the window job")
    run_config = {"ops": {"hir_encoder": {"config": {"launch": "in_process", "steps": 12}}}}
    with dg.DagsterInstance.ephemeral() as instance:
        result = build_definitions(config).resolve_job_def(WINDOW_JOB).execute_in_process(
            partition_key=window.key, instance=instance, run_config=run_config)
    if not result.success:
        raise RuntimeError("the window job failed on the quick world")
    return tmp / "world-store", source, window


def pick_day(source, window, spec_days: int = 7):
    """The first day after the window with item arrivals."""
    from hir_model.rank.increment import ITEM_TYPES, day_of

    for i in range(spec_days):
        day = day_of((window.end + timedelta(days=i)).strftime("%Y-%m-%d"))
        rows = day_file(source, day)
        if sum(t in ITEM_TYPES for t in rows["entity_type"].to_pylist()):
            return day
    raise RuntimeError(f"no item arrives in the week after window {window.key}")


def prepublish(byo: Path, store: Path, window) -> list[str]:
    """The days after the window as they stood before any arrival (empty increments), through the increment job."""
    import dagster as dg

    from dagster_project.definitions import build_definitions
    from dagster_project.jobs import INCREMENT_JOB
    from hir_model.config import HIRConfig

    defs = build_definitions(HIRConfig(source="parquet", parquet_path=str(byo), storage_uri=str(store), data_dir=byo.parent))
    job = defs.resolve_job_def(INCREMENT_JOB)
    days = [(window.end + timedelta(days=i)).strftime("%Y-%m-%d") for i in range(7)]
    with dg.DagsterInstance.ephemeral() as instance:
        for d in days:
            if not job.execute_in_process(partition_key=d, instance=instance).success:
                raise RuntimeError(f"the increment of {d} failed before any arrival")
    return days


def write_home(home: Path) -> None:
    """The local instance `make ui` uses (deploy/dagster.local.yaml: a queued run coordinator, 2 runs at a time)."""
    home.mkdir(parents=True)
    shutil.copy(REPO / "deploy" / "dagster.local.yaml", home / "dagster.yaml")


def sensor_ticked(home: Path) -> bool:
    """Whether the arrival sensor has a cursor yet (its first tick, which remembers the catalogue's files, ran)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        for state in instance.all_instigator_state():
            if state.name == "hir_catalog_arrivals" and state.instigator_data and state.instigator_data.cursor:
                return True
    return False


def run_record(home: Path, day: str):
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records(dg.RunsFilter(job_name="catalog_increment_job", tags={"dagster/partition": day}))
    return records[0] if records else None


def start(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    out = log_path.open("w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small world materialised here first")
    parser.add_argument("--store", default=str(REPO / ".hir" / "storage" / "synthetic"),
                        help="a materialised synthetic store (the demo's by default)")
    parser.add_argument("--window", help="the window whose next day lands (default: the store's window before its last)")
    parser.add_argument("--interval", type=int, default=30, help="the arrival sensor's tick (HIR_ARRIVALS_INTERVAL_S; "
                                                                  "default: the sensor's own)")
    parser.add_argument("--poll", type=float, default=30.0, help="hir serve --poll-seconds (default: hir serve's own)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds from the landing")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, store, instance)")
    args = parser.parse_args(argv)

    import httpx
    import pyarrow.parquet as pq

    from hir_model.config import load_config
    from hir_model.data.tables import EVENTS_ASSET, EVENTS_FILE
    from hir_model.rank.state import HEAD_ASSET, read_head
    from hir_model.storage import PartitionStore

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = Path(tempfile.mkdtemp(prefix="hir-arrivals-"))
    daemon = serve = None
    env = {**os.environ, "DAGSTER_DISABLE_TELEMETRY": "1", "GX_ANALYTICS_ENABLED": "false", "PYTHONUNBUFFERED": "1",
           "HIR_TEXT_DTYPE": os.environ.get("HIR_TEXT_DTYPE", "auto")}  # as `make demo` embedded the window's content
    env.pop("DAGSTER_HOME", None)
    try:
        if args.quick:
            world, source, window = materialise_quick(tmp)
            case = "quick"
        else:
            world = Path(args.store)
            if not (world / "bom_index").is_dir():
                parser.error(f"{world} holds no materialised window: run `HIR_SOURCE=synthetic make demo` first, pass "
                             f"--store, or use --quick")
            config = load_config(env={**env, "HIR_SOURCE": "synthetic"})
            source = config.make_source()
            spec = config.window_spec(source)
            keys = sorted(set(PartitionStore(world).partitions("bom_index")) & {w.key for w in spec.windows()[:-1]})
            window = spec.window(args.window or keys[-1])
            case = "demo"
        store, byo, home = tmp / "store", tmp / "byo", tmp / "dagster_home"
        for asset in WINDOW_ASSETS:  # window W's published tables, as the demo left them
            if (world / asset / window.key).is_dir():
                shutil.copytree(world / asset / window.key, store / asset / window.key)
        entities = export(source, window, byo, PartitionStore(world).read(EVENTS_ASSET, window.key, EVENTS_FILE))
        day = pick_day(source, window)
        landing = day_file(source, day)
        items = [e for e, t in zip(landing["entity_id"].to_pylist(), landing["entity_type"].to_pylist()) if t == "product"]
        log(f"{case}: window {window.key} ({entities} entities); day {day.key} lands {landing.num_rows} entities, "
            f"{len(items)} products")
        prepublish(byo, store, window)
        run_env = {**env, "HIR_SOURCE": "parquet", "HIR_PARQUET_PATH": str(byo), "HIR_STORAGE_URI": str(store),
                   "HIR_DATA_DIR": str(tmp / "data"), "DAGSTER_HOME": str(home), "HIR_ARRIVALS_INTERVAL_S": str(args.interval)}
        write_home(home)
        daemon = start([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], run_env, tmp / "daemon.log")
        port = free_port()
        serve = start([sys.executable, "-m", "hir_model.cli", "serve", "--port", str(port), "--poll-seconds", str(args.poll)],
                      run_env, tmp / "serve.log")
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while True:  # both up: the server answers, the sensor has ticked once (it remembers the catalogue's files)
            for proc, name in ((daemon, "daemon"), (serve, "serve")):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {(tmp / f'{name}.log').read_text()[-3000:]}")
            try:
                up = httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                up = False
            if up and sensor_ticked(home):
                break
            if time.time() > deadline:
                raise TimeoutError("the daemon or hir serve did not come up within 600 s")
            time.sleep(1)
        user = str(read_head(store / HEAD_ASSET / window.key).history.user_ids[0])  # a warm user of the window
        pq.write_table(landing, byo / "catalog" / f"_{day.key}.parquet")
        landed = time.time()
        (byo / "catalog" / f"_{day.key}.parquet").rename(byo / "catalog" / f"arrivals-{day.key}.parquet")
        log(f"landed catalog/arrivals-{day.key}.parquet; waiting for hir serve to answer with its items")
        served_at, answer = None, []
        while served_at is None:
            if time.time() - landed > args.timeout:
                raise TimeoutError(f"not served within {args.timeout} s; see {tmp} (--keep)")
            health = httpx.get(f"{url}/health", timeout=5).json()
            if any(i["day"] == day.key and i["items"] for i in health["increments"]):
                answer = httpx.get(f"{url}/recommend", params={"user": user, "scope": "new", "k": 20}, timeout=30).json()["items"]
                if answer:
                    served_at = time.time()
                    break
            time.sleep(0.25)
        record = run_record(home, day.key)
        if record is None or not set(i["entity_id"] for i in answer) <= set(items):
            raise RuntimeError(f"served {answer} for {user}, but the run record is {record} or not the landed items")
        created, started, ended = record.create_timestamp.timestamp(), record.start_time, record.end_time
        print(f"case={case}")
        print(f"window={window.key}")
        print(f"day={day.key}")
        print(f"catalog_entities={entities}")
        print(f"landed_entities={landing.num_rows}")
        print(f"landed_items={len(items)}")
        print(f"served_new_items={len(answer)}")
        print(f"interval_s={args.interval}")
        print(f"poll_s={args.poll}")
        print(f"land_to_run_created_s={created - landed:.1f}")
        print(f"queued_s={started - created:.1f}")
        print(f"run_s={ended - started:.1f}")
        print(f"run_end_to_served_s={served_at - ended:.1f}")
        print(f"land_to_served_s={served_at - landed:.1f}")
        print(f"target_s={TARGET_S:.0f}")
        print(f"under_target={'true' if served_at - landed < TARGET_S else 'false'}")
        return 0
    finally:
        stop(serve)
        stop(daemon)
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted: daemon and server stopped, temporary folder removed")
        sys.exit(130)
