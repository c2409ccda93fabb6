"""`hir serve` as an operator runs it: the real server process (`python -m hir_model.cli serve`) on a free loopback port,
over a store with two materialised windows (tests/hir_model/eval/hir_store.py plus interest_hierarchy and bom_index),
asked with a real HTTP client; every answer is compared with `Recommender.load(store, window).recommend(...)`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from hir_model.cli import main
from hir_model.graph.window import to_us
from hir_model.hierarchy.build import HIERARCHY_ASSET
from hir_model.hierarchy.interest_hierarchy import hierarchy_window
from hir_model.rank.bom_index import build_window_index
from hir_model.rank.recommender import ContextEvent, Recommender, UnknownUser
from hir_model.rank.serve import ServeConfig, WindowSwitcher
from hir_model.retrieval import IndexConfig
from hir_model.retrieval.index import BOM_ASSET
from hir_model.storage import PartitionStore
from hir_model.train.checkpoint import checkpoint_path
from tests.hir_model.eval.hir_store import KEYS, SPEC, hir_store

REPO = Path(__file__).resolve().parents[3]
OLD, NEW = KEYS[0], KEYS[1]
CONTEXT = [{"entity_id": "p1"}, {"entity_id": "p3", "event_type": "purchase"}, {"entity_id": "not-an-item"}]
CONTEXT_EVENTS = [ContextEvent("p1"), ContextEvent("p3", deep=True), ContextEvent("not-an-item")]


@pytest.fixture(scope="module")
def full_store(tmp_path_factory) -> Path:
    """W0 and W1 with everything `Recommender.load` reads: ranking_head, entity_embeddings, hir_encoder, bom_index."""
    root = tmp_path_factory.mktemp("serve") / "store"
    store = hir_store(root)
    previous = None
    for window in SPEC.windows()[:2]:
        h = hierarchy_window(store, window.key, previous, to_us(window.end))
        with store.writing() as staging:  # as the interest_hierarchy asset writes them
            for name, table in h.tables.items():
                staging.write_table(HIERARCHY_ASSET, window.key, name, table)
        with store.writing() as staging:
            build_window_index(store, window.key, staging.path(BOM_ASSET, window.key), IndexConfig(max_posting_share=1.0))
        previous = window.key
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(root: Path, log: Path, *args: str):
    """`hir serve` over `root` until the block ends (then SIGTERM); yields (process, base url)."""
    port = free_port()
    env = dict(os.environ, HIR_STORAGE_URI=str(root))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hir_model.cli", "serve", "--port", str(port), *args], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"hir serve exited with {proc.returncode}:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"hir serve did not answer within 90 s:\n{log.read_text()}"
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def items(rec: Recommender, user=None, context=None, k=20, exact=False, include_seen=False) -> list[tuple[str, str]]:
    return [(h.entity_id, h.entity_type) for h in rec.recommend(user, context, k, exact, include_seen)]


def served(body: dict) -> list[tuple[str, str]]:
    return [(i["entity_id"], i["entity_type"]) for i in body["items"]]


@pytest.mark.slow  # a server process importing torch: 4-8 s
def test_health_recommend_context_unknown_users_and_bad_input(full_store, tmp_path):
    log = tmp_path / "serve.log"
    rec = Recommender.load(PartitionStore(full_store), NEW)
    with server(full_store, log) as (proc, url), httpx.Client(base_url=url, timeout=30) as client:
        health = client.get("/health").json()
        assert health["window"] == NEW and health["items"] == rec.state.n_items == 6 and health["users"] == 4
        assert health["uptime_seconds"] >= 0 and health["switches"] == 0 and not health["pinned"]

        # a known user, as the library answers it, with and without exact / include_seen
        for params, kwargs in (({}, {}), ({"k": "3", "exact": "1"}, {"k": 3, "exact": True}),
                               ({"include_seen": "true"}, {"include_seen": True})):
            r = client.get("/recommend", params={"user": "u1", **params})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["window"] == NEW and body["user"] == "u1" and body["items"]
            assert served(body) == items(rec, "u1", **kwargs)
            expected = rec.recommend("u1", **kwargs)
            assert [i["score"] for i in body["items"]] == pytest.approx([h.score for h in expected], rel=1e-6)
        seen = {i["entity_id"] for i in client.get("/recommend", params={"user": "u1", "include_seen": 1}).json()["items"]}
        assert seen > {i["entity_id"] for i in client.get("/recommend", params={"user": "u1"}).json()["items"]}

        # a user the window does not know, without a context: 404 naming the window
        r = client.get("/recommend", params={"user": "stranger"})
        assert r.status_code == 404 and r.json()["window"] == NEW
        assert f"window {NEW}" in r.json()["error"] and "stranger" in r.json()["error"]
        assert client.post("/recommend", json={"user": "stranger", "context": []}).status_code == 404

        # the same stranger served from a context (POST and GET say the same), unknown items named
        r = client.post("/recommend", json={"user": "stranger", "context": CONTEXT, "k": 4})
        assert r.status_code == 200, r.text
        assert served(r.json()) == items(rec, "stranger", CONTEXT_EVENTS, k=4) and len(r.json()["items"]) == 4
        assert r.json()["unknown_items"] == ["not-an-item"]
        by_get = client.get("/recommend", params={"user": "stranger", "context": "p1,p3:purchase,not-an-item", "k": 4})
        assert by_get.json()["items"] == r.json()["items"]

        # bad input: 400 with a message saying what is wrong
        bad = [client.get("/recommend", params={"user": "u1", "k": k}) for k in ("0", "-1", "abc", "1001")]
        bad += [client.get("/recommend", params={"user": "u1", "exact": "maybe"}),
                client.get("/recommend", params={"user": "u1", "kk": "3"}),
                client.get("/recommend", params={"context": "p1:like"}),
                client.post("/recommend", content=b'{"user": "u1",', headers={"content-type": "application/json"}),
                client.post("/recommend", json=["u1"]),
                client.post("/recommend", json={"user": "u1", "k": 2.5}),
                client.post("/recommend", json={"user": "u1", "topk": 3}),
                client.post("/recommend", json={"context": [{"entity_id": "p1", "event_type": "like"}]}),
                client.post("/recommend", json={"context": [{"entity_id": "p1", "ts": "yesterday-ish"}]}),
                client.post("/recommend", json={"context": "p1,p2"}),
                client.post("/recommend", json={"context": [{"entity_id": 7}]})]
        assert [r.status_code for r in bad] == [400] * len(bad), [r.text for r in bad if r.status_code != 400]
        messages = [r.json()["error"] for r in bad]
        assert "k must be an integer" in messages[0] and "'abc'" in messages[2] and "exact" in messages[4]
        assert "kk" in messages[5] and "'like'" in messages[6] and "not JSON" in messages[7]
        assert "'like'" in messages[11] and "yesterday-ish" in messages[12] and "context[0]" in messages[14]
        assert client.get("/health").json()["window"] == NEW  # still serving
    assert proc.returncode == 0, log.read_text()  # SIGTERM: a clean shutdown
    assert "stopped (last window served: " in log.read_text()


def test_nothing_to_serve_exits_2_before_listening(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HIR_STORAGE_URI", str(tmp_path / "empty"))
    assert main(["serve", "--port", str(free_port())]) == 2
    assert f"no window under {tmp_path / 'empty'} has both ranking_head and bom_index" in capsys.readouterr().err
    assert main(["serve", "--port", str(free_port()), "--window", OLD]) == 2
    assert f"window {OLD} was never materialised" in capsys.readouterr().err


@pytest.mark.slow  # a server process importing torch: 4-8 s
def test_a_newer_window_is_switched_to_without_dropping_a_request(full_store, tmp_path):
    """Clients fire requests continuously while W1's bom_index lands: every answer succeeds and is W0's or W1's own
    answer (naming it), no client sees W0 after W1, and W1 is served at the end."""
    root, landing = tmp_path / "store", tmp_path / "landing"
    shutil.copytree(full_store, root)
    shutil.move(root / BOM_ASSET / NEW, landing)  # W1 has everything but its index: W0 is the newest materialised
    store = PartitionStore(root)
    log = tmp_path / "serve.log"
    queries = {"u1": ("GET", {"user": "u1"}), "u3": ("GET", {"user": "u3", "k": 3}),  # u3: unknown to W0, known to W1
               "ctx": ("POST", {"user": "newcomer", "context": CONTEXT, "k": 5})}
    with server(root, log, "--poll-seconds", "0.2") as (proc, url):
        assert httpx.get(f"{url}/health").json()["window"] == OLD
        stop, results, errors = threading.Event(), [[] for _ in range(3)], []

        def fire(out: list):
            with httpx.Client(base_url=url, timeout=30) as client:
                while not stop.is_set():
                    for name, (method, q) in queries.items():
                        try:
                            r = client.get("/recommend", params=q) if method == "GET" else client.post("/recommend", json=q)
                            out.append((name, r.status_code, r.json()))
                        except Exception as exc:  # a dropped connection is a failure of the test, not of the thread
                            errors.append(repr(exc))

        clients = [threading.Thread(target=fire, args=(out,)) for out in results]
        for t in clients:
            t.start()
        time.sleep(1.0)
        with store.writing() as staging:  # as the bom_index asset commits W1
            for f in landing.iterdir():
                shutil.copy2(f, staging.path(BOM_ASSET, NEW) / f.name)
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["window"] != NEW:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        for t in clients:
            t.join(timeout=60)
        health = httpx.get(f"{url}/health").json()
    assert not errors, errors[:3]
    assert health["window"] == NEW and health["switches"] == 1
    expected = {}
    for window in (OLD, NEW):
        rec = Recommender.load(store, window)
        for name, (_, q) in queries.items():
            try:
                context = CONTEXT_EVENTS if "context" in q else None
                expected[window, name] = (200, items(rec, q["user"], context, q.get("k", 20)))
            except UnknownUser:
                expected[window, name] = (404, None)
    assert expected[OLD, "u3"][0] == 404 and expected[NEW, "u3"][0] == 200
    assert all(expected[OLD, n] != expected[NEW, n] for n in queries)  # so an answer from the wrong window would show
    for out in results:
        windows = [body["window"] for _, _, body in out]
        assert set(windows) <= {OLD, NEW} and windows[0] == OLD and windows[-1] == NEW
        assert windows == sorted(windows)  # once a client saw W1, never W0 again
        for name, status, body in out:
            want_status, want_items = expected[body["window"], name]
            assert status == want_status, body
            assert status == 404 or served(body) == want_items, (name, body)
    text = log.read_text()
    assert f"switched from window {OLD} to {NEW}" in text
    assert proc.returncode == 0 and "stopped (last window served: " + NEW in text
    print(f"{sum(map(len, results))} requests across the switch")


def test_a_newer_window_that_cannot_be_loaded_completely_is_not_swapped_in(full_store, tmp_path, caplog, monkeypatch,
                                                                           capsys):
    """In process: W1's index lands but its encoder (needed for context queries) is missing: W0 stays, one warning
    (and `hir serve` started now refuses W1 before listening); once the encoder is there, the next poll switches."""
    root, landing = tmp_path / "store", tmp_path / "landing"
    shutil.copytree(full_store, root)
    shutil.move(root / BOM_ASSET / NEW, landing / BOM_ASSET)
    store = PartitionStore(root)
    encoder = checkpoint_path(store, NEW)
    shutil.move(encoder, landing / encoder.name)
    switcher = WindowSwitcher(store, ServeConfig(poll_seconds=3600))
    assert switcher.served.rec.window == OLD
    with store.writing() as staging:
        shutil.copytree(landing / BOM_ASSET, staging.path(BOM_ASSET, NEW), dirs_exist_ok=True)
    with caplog.at_level("WARNING", logger="hir.serve"):
        assert not switcher.poll() and not switcher.poll()
    assert switcher.served.rec.window == OLD and switcher.switches == 0
    assert len(caplog.records) == 1 and f"window {NEW} could not be loaded (still serving {OLD})" in caplog.text
    monkeypatch.setenv("HIR_STORAGE_URI", str(root))
    assert main(["serve", "--port", str(free_port())]) == 2
    assert f"{encoder} does not exist" in capsys.readouterr().err
    shutil.move(landing / encoder.name, encoder)
    assert switcher.poll() and switcher.served.rec.window == NEW and switcher.switches == 1
    assert not switcher.poll()  # nothing newer
