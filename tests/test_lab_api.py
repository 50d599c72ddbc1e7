"""The Jupyter server extension (tfdist_nb.lab) against a real server and a real cluster's run.

A ``jupyter server`` on loopback with a token, enabled by the config file the package installs,
serves the run directory of a real 2-worker ``Cluster(preload=())``: the listing, one cluster,
the websocket of new events (lines appended to the files and lines a cell prints), the state
going from live to finished, and 403 without the token. The tailing, the state file and the
discovery are also checked on their own, without a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jupyter_server import jupyter_server
from tests.support.processes import wait_for

pytestmark = pytest.mark.compat

TICKS = ("import time, tfdist_nb.worker as tw\n"
         "for i in range(10):\n"
         "    with tw.step():\n"
         "        time.sleep(0.05)\n"
         "    print('tick', i, flush=True)\n")


# ---------------------------------------------------------------------- a server and a cluster
@pytest.fixture(scope="module")
def run_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lab_runs")


@pytest.fixture(scope="module")
def cluster(run_base: Path) -> Iterator[Any]:
    from tfdist_nb import Cluster

    with Cluster(workers=2, preload=(), run_dir=run_base) as c:
        assert c.run(TICKS, timeout=60).ok
        yield c


@pytest.fixture(scope="module")
def server(run_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("lab_root")
    with jupyter_server(root, run_base) as found:
        yield found


def get(server: dict[str, str], path: str, token: str | None = "") -> Any:
    token = server["token"] if token == "" else token
    req = urllib.request.Request(f"{server['base']}/tfdist/api/clusters{path}")
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def ws_url(server: dict[str, str], cluster_id: str, token: str | None = "") -> str:
    token = server["token"] if token == "" else token
    url = server["base"].replace("http", "ws", 1) + f"/tfdist/api/clusters/{cluster_id}/stream"
    return url + (f"?token={token}" if token else "")


class Stream:
    """A websocket client that collects messages until a predicate holds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.messages: list[dict[str, Any]] = []
        self.conn: Any = None

    async def __aenter__(self) -> Stream:
        from tornado.websocket import websocket_connect

        self.conn = await asyncio.wait_for(websocket_connect(self.url), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.conn.close()

    async def until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        """The first message so far, or to come within ``timeout``, that satisfies
        ``predicate`` (one message can carry several things a test waits for)."""
        for msg in self.messages:
            if predicate(msg):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                raw = await asyncio.wait_for(self.conn.read_message(),
                                             max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            assert raw is not None, "the server closed the stream"
            msg = json.loads(raw)
            self.messages.append(msg)
            if predicate(msg):
                return msg
        raise AssertionError(f"no message with {what} within {timeout}s; got "
                             f"{[m.get('type') for m in self.messages]}")


def lines_of(msg: dict[str, Any]) -> list[str]:
    if msg["type"] == "snapshot":
        return [f"[{e['task']}] {e['text']}" for e in msg["cluster"]["logs"]]
    return [f"[{e['task']}] {e['text']}" for e in msg["events"]]


# ---------------------------------------------------------------------- the REST API
@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_listing_shows_the_live_cluster_with_its_tasks(cluster: Any,
                                                       server: dict[str, str]) -> None:
    def listed() -> dict[str, Any] | None:
        found = [c for c in get(server, "") if c["id"] == cluster.id]
        ok = found and all(t["step"] == 10 for t in found[0]["tasks"])
        return found[0] if ok else None

    summary = wait_for(listed, 15, "the cluster listed with 10 steps per task")
    assert summary["spec"] == "2 workers"
    assert summary["state"] == "live"
    assert summary["controller"]["pid"] == os.getpid()
    assert [t["task"] for t in summary["tasks"]] == ["worker:0", "worker:1"]
    assert {t["state"] for t in summary["tasks"]} == {"idle"}
    assert summary["alerts"] == 0
    assert summary["run_dir"] == str(cluster.run_dir)


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_one_cluster_has_log_tail_steps_and_resources(cluster: Any,
                                                      server: dict[str, str]) -> None:
    detail = get(server, f"/{cluster.id}")
    text = "\n".join(f"[{e['task']}] {e['text']}" for e in detail["logs"])
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] tick 9" in text
        series = detail["series"][task]
        assert [s[0] for s in series["steps"]] == list(range(1, 11))
        assert 40 < series["steps"][-1][2] < 1000  # ms of a 50 ms step
        assert series["samples"] and series["latest"]["rss_mb"] > 10
    assert detail["alert_list"] == []
    with pytest.raises(urllib.error.HTTPError) as err:
        get(server, "/20000101-000000-000000")
    assert err.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        get(server, "/..%2F..%2Fetc")
    assert err.value.code == 404


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_refused_without_the_token(cluster: Any, server: dict[str, str]) -> None:
    from tornado.httpclient import HTTPClientError

    for token in (None, "wrong"):
        for path in ("", f"/{cluster.id}"):
            with pytest.raises(urllib.error.HTTPError) as err:
                get(server, path, token=token)
            assert err.value.code == 403, (path, token)

        async def connect(token: str | None = token) -> None:
            async with Stream(ws_url(server, cluster.id, token=token)):
                pass

        with pytest.raises(HTTPClientError) as ws_err:
            asyncio.run(connect())
        assert ws_err.value.code == 403


# ---------------------------------------------------------------------- the websocket
@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_stream_sends_lines_appended_to_the_files_and_printed_by_a_cell(
        cluster: Any, server: dict[str, str]) -> None:
    marker = f"appended-{secrets.token_hex(4)}"

    async def scenario() -> None:
        async with Stream(ws_url(server, cluster.id)) as stream:
            snap = await stream.until(lambda m: m["type"] == "snapshot", 10, "a snapshot")
            assert "[worker:1] tick 9" in lines_of(snap)
            # a line appended to events.jsonl by another writer, and a telemetry record
            with open(cluster.run_dir / "events.jsonl", "a") as f:
                f.write(json.dumps({"time": time.time(), "task": "worker:1", "stream": "stdout",
                                    "text": marker, "cell": None, "kind": "output"}) + "\n")
            with open(cluster.run_dir / "telemetry.jsonl", "a") as f:
                f.write(json.dumps({"time": time.time(), "task": "worker:0", "kind": "telemetry",
                                    "data": {"cpu_percent": 12.5, "rss_mb": 77.0, "step": 10,
                                             "gpus": None, "steps": []}}) + "\n")
            await stream.until(lambda m: f"[worker:1] {marker}" in lines_of(m), 5,
                               "the appended line")
            await stream.until(lambda m: m["type"] == "update" and any(
                s["task"] == "worker:0" and s["cpu_percent"] == 12.5 for s in m["telemetry"]),
                5, "the appended sample")
            # a cell printing while the stream is open
            loop = asyncio.get_running_loop()
            run = loop.run_in_executor(None, lambda: cluster.run(
                "print('from the cell', flush=True)", timeout=30))
            await stream.until(lambda m: "[worker:0] from the cell" in lines_of(m), 15,
                               "the cell's line")
            assert (await run).ok
            # an alert: counted in the summary, its text in the stream's updates
            cluster.hub.note("worker:1", "an alert for the panes", "WARNING")
            msg = await stream.until(lambda m: m["type"] == "update"
                                     and m["cluster"]["alerts"] == 1, 5, "the alert")
            assert msg["cluster"]["alert_list"] == ["worker:1: an alert for the panes"]

    asyncio.run(scenario())


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_stream_says_when_a_cluster_finishes(run_base: Path, server: dict[str, str]) -> None:
    from tfdist_nb import Cluster

    other = Cluster(workers=1, preload=(), run_dir=run_base).start()
    try:
        wait_for(lambda: any(c["id"] == other.id and c["state"] == "live"
                             for c in get(server, "")), 15, "the second cluster listed live")

        async def scenario() -> dict[str, Any]:
            async with Stream(ws_url(server, other.id)) as stream:
                await stream.until(lambda m: m["type"] == "snapshot", 10, "a snapshot")
                await asyncio.get_running_loop().run_in_executor(None, other.stop)
                return await stream.until(
                    lambda m: m["type"] == "update" and m["cluster"]["state"] == "finished",
                    10, "the finished state")

        final = asyncio.run(scenario())
        assert [t["state"] for t in final["cluster"]["tasks"]] == ["stopped"]
        assert final["cluster"]["stopped"] is not None
    finally:
        other.stop()
    assert [c["state"] for c in get(server, "") if c["id"] == other.id] == ["finished"]


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_run_whose_controller_died_is_orphaned(run_base: Path, server: dict[str, str]) -> None:
    from tfdist_nb.store.state import StateFile

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = run_base / "20000101-000000-0rphan"
    run.mkdir(mode=0o700)
    (run / "events.jsonl").write_text("")
    state = StateFile(run, run.name, "1 worker", lambda: {"tasks": [
        {"task": "worker:0", "role": "worker", "state": "busy", "step": 3}]})
    state._doc["controller"]["pid"] = gone.pid  # as if that process had written it
    state.mark("running")
    found = wait_for(lambda: [c for c in get(server, "") if c["id"] == run.name], 10,
                     "the orphaned run listed")
    assert found[0]["state"] == "orphaned"
    assert found[0]["tasks"][0]["state"] == "busy"  # the last state it wrote


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_fifo_or_a_symlink_in_a_run_directory_hangs_nothing_and_leaks_nothing(
        run_base: Path, server: dict[str, str], tmp_path: Path) -> None:
    """A FIFO named state.json used to block every endpoint of the Jupyter server (its open()
    ran on the server's loop); a symlinked events.jsonl was followed and served."""
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_text(json.dumps({"kind": "output", "task": "worker:0", "stream": "stdout",
                                  "text": "SECRET-FROM-ELSEWHERE", "time": 1.0}) + "\n")
    fifo = run_base / "20000101-000000-f1f0f1"
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / "state.json")
    (fifo / "events.jsonl").write_text("")
    linked = run_base / "20000101-000000-11nked"
    linked.mkdir(mode=0o700)
    (linked / "events.jsonl").symlink_to(secret)
    (linked / "state.json").write_text(json.dumps({"cluster_id": linked.name}))

    # listed (each answer within get()'s 10 s; the listing is cached for 2 s)
    wait_for(lambda: {fifo.name, linked.name} <= {c["id"] for c in get(server, "")}, 15,
             "both run directories listed")
    with urllib.request.urlopen(f"{server['base']}/api/status?token={server['token']}",
                                timeout=10) as resp:
        assert resp.status == 200
    detail = get(server, f"/{linked.name}")
    assert "SECRET-FROM-ELSEWHERE" not in json.dumps(detail)
    assert get(server, f"/{fifo.name}")["id"] == fifo.name


# ---------------------------------------------------------------------- the parts on their own
def test_tail_reads_only_what_was_appended(tmp_path: Path) -> None:
    from tfdist_nb.lab.tail import JsonlTail

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(1000)))
    tail = JsonlTail(path)
    assert [r["i"] for r in tail.read_new()] == list(range(1000))
    size = path.stat().st_size
    assert tail.bytes_read == size
    assert tail.read_new() == [] and tail.bytes_read == size  # nothing new: nothing read
    with open(path, "a") as f:
        f.write('{"i": 1000}\n{"i": 10')  # a writer in the middle of a line
    assert [r["i"] for r in tail.read_new()] == [1000]
    with open(path, "a") as f:
        f.write('01}\n')
    assert [r["i"] for r in tail.read_new()] == [1001]
    assert tail.bytes_read == path.stat().st_size  # every byte read once


def test_tail_of_a_big_file_starts_near_its_end(tmp_path: Path) -> None:
    from tfdist_nb.lab.tail import JsonlTail

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"i": i, "pad": "x" * 80}) + "\n" for i in range(50000)))
    tail = JsonlTail(path, initial_bytes=64 * 1024)
    got = tail.read_new()
    assert got[-1]["i"] == 49999 and 500 < len(got) < 800  # whole lines of the last 64 KiB
    assert tail.bytes_read <= 64 * 1024


def test_state_file_is_owner_only_and_replaced_whole(tmp_path: Path) -> None:
    from tfdist_nb.store.state import StateFile, cluster_status, read_state

    snapshots = iter(range(10**6))
    state = StateFile(tmp_path, "c1", "2 workers",
                      lambda: {"tasks": [{"task": "worker:0", "step": next(snapshots)}]},
                      interval=0.01).start()
    try:
        for _ in range(200):  # a reader never sees a half-written file
            data = read_state(tmp_path)
            assert data is not None and data["id"] == "c1"
        assert cluster_status(read_state(tmp_path)) == "live"
    finally:
        state.close()
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp files left
    final = read_state(tmp_path)
    assert final is not None and final["state"] == "stopped" and final["stopped"]
    assert cluster_status(final) == "finished"


def test_status_from_the_controller_record() -> None:
    import socket

    from tfdist_nb.store.state import cluster_status

    me = {"pid": os.getpid(), "host": socket.gethostname()}
    now = time.time()
    assert cluster_status(None) == "unknown"
    assert cluster_status({"state": "running", "controller": me}) == "live"
    reused = {**me, "create_time": 1.0}  # same pid, another process start: not our controller
    assert cluster_status({"state": "running", "controller": reused}) == "orphaned"
    remote = {"pid": 1, "host": "another-host.invalid"}
    assert cluster_status({"state": "running", "controller": remote, "updated": now}) == "live"
    assert cluster_status({"state": "running", "controller": remote,
                           "updated": now - 120}) == "orphaned"
    assert cluster_status({"state": "stopped", "controller": remote}) == "finished"


def test_a_later_controller_writes_down_the_runs_a_killed_one_left_running(
        tmp_path: Path) -> None:
    """A notebook kernel killed with SIGKILL leaves state.json saying 'running': the next
    cluster started under the same root marks it 'orphaned'; a live one, a stopped one and
    another host's are left as they are."""
    import json
    import socket
    import subprocess
    import sys

    from tfdist_nb.store.state import mark_orphans, read_state

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = socket.gethostname()
    docs = {
        "killed": {"state": "running", "controller": {"pid": gone.pid, "host": here},
                   "updated": 5.0},
        "live": {"state": "running", "controller": {"pid": os.getpid(), "host": here}},
        "stopped": {"state": "stopped", "controller": {"pid": gone.pid, "host": here}},
        "remote": {"state": "running", "controller": {"pid": 1, "host": "elsewhere.invalid"},
                   "updated": time.time()},
    }
    for name, doc in docs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text(json.dumps(doc))
    assert mark_orphans(tmp_path) == [tmp_path / "killed"]
    after = {name: read_state(tmp_path / name) for name in docs}
    assert after["killed"] is not None and after["killed"]["state"] == "orphaned"
    assert after["killed"]["stopped"] == 5.0
    assert [after[n]["state"] for n in ("live", "stopped", "remote")] == [  # type: ignore[index]
        "running", "stopped", "running"]


def test_discovery_finds_runs_under_the_root_its_folders_and_the_env(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb.lab.discovery import bases, find_clusters

    def run(base: Path, name: str) -> Path:
        path = base / name
        path.mkdir(parents=True)
        (path / "events.jsonl").write_text("")
        return path

    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    a = run(root / "tfdist_runs", "20260101-000000-aaaaaa")
    b = run(root / "examples" / "tfdist_runs", "20260102-000000-bbbbbb")
    c = run(elsewhere, "20260103-000000-cccccc")
    run(root / ".hidden" / "tfdist_runs", "20260104-000000-dddddd")
    (root / "tfdist_runs" / "not-a-run").mkdir()
    (root / "tfdist_runs" / "20260105-000000-eeeeee").symlink_to(c)  # links are not followed
    monkeypatch.setenv("TFDIST_RUNS_DIR", str(elsewhere))
    found = find_clusters(bases(root))
    assert found == {c.name: c.resolve(), b.name: b.resolve(), a.name: a.resolve()}
    assert list(found) == sorted(found, reverse=True)  # newest first
    monkeypatch.delenv("TFDIST_RUNS_DIR")
    assert set(find_clusters(bases(root, scan_subdirs=False))) == {a.name}
