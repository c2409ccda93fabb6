"""Dagster instances on each event-log storage the project runs on, for tests: run-sharded SQLite (what `dagster dev`
uses with an on-disk DAGSTER_HOME), consolidated SQLite, and Postgres (a throwaway cluster from Debian's
`postgresql` package, started with initdb / pg_ctl on a temporary folder and a 127.0.0.1 port)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parents[2]
STORAGES = ("run_sharded_sqlite", "consolidated_sqlite", "postgres")
TELEMETRY = "telemetry:\n  enabled: false\n"


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin folder (Debian keeps it off PATH), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresCluster:
    """initdb + pg_ctl on a temporary folder, trust auth on 127.0.0.1 only; as root, run as the `postgres` user
    (the server refuses root)."""

    def __init__(self, bin_dir: Path):
        self.bin, self.port = bin_dir, free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="hir-pg-"))
        self.data = self.dir / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        proc = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")

    def start(self) -> PostgresCluster:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir} -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "server.log"), "-w",
                  "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def new_database(self) -> str:
        """A fresh, empty database; its name."""
        import psycopg2

        name = f"hir_{uuid.uuid4().hex[:10]}"
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()
        return name


@contextmanager
def postgres_cluster():
    cluster = PostgresCluster(pg_bin()).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def write_home(home: Path, storage: str, postgres_port: int | None = None) -> Path:
    """A DAGSTER_HOME whose dagster.yaml selects `storage`; for Postgres, the shipped deploy/dagster.postgres.yaml
    (credentials from DAGSTER_PG_* in the environment) with the test cluster's port."""
    home.mkdir(parents=True, exist_ok=True)
    config = TELEMETRY
    if storage == "consolidated_sqlite":
        config += ("event_log_storage:\n  module: dagster.core.storage.event_log\n  class: ConsolidatedSqliteEventLogStorage\n"
                   f"  config:\n    base_dir: {home / 'history'}\n")
    elif storage == "postgres":
        shipped = (REPO / "deploy" / "dagster.postgres.yaml").read_text()
        assert "port: 5432\n" in shipped, "deploy/dagster.postgres.yaml changed: update this test's port substitution"
        config = shipped.replace("port: 5432\n", f"port: {postgres_port}\n")
    elif storage != "run_sharded_sqlite":
        raise ValueError(f"unknown storage {storage!r}; one of {STORAGES}")
    (home / "dagster.yaml").write_text(config)
    return home
