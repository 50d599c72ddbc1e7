"""A console on a task's kernel through the Jupyter server (tfdist_nb/lab/consoles.py).

A real ``jupyter lab`` on loopback with a token serves the run directory of a real 2-worker
``Cluster(preload=())`` run by this process. Through the server alone, as JupyterLab does it:
the task's kernel is registered, a client on the server's kernel websocket runs code in
``worker:1``, recorded in the run directory as the task's and marked as from a console, while
the cluster's own cells still run; the debugger (ipykernel's debugpy, the DAP messages
JupyterLab's debugger sends) stops at a breakpoint in a function run there and shows its
variable; interrupt and restart are refused and forgetting the kernel leaves the task running.
What is refused, and why. The same in Chromium: from the tfdist pane, a console on worker:1, its
debugger and a breakpoint. A restarted task is a new kernel, and the old one is forgotten.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jupyter_server import CHROMIUM_ARGS, ensure_chromium, jupyter_server
from tests.support.processes import wait_for
from tfdist_nb.display.printer import LivePrinter

pytestmark = pytest.mark.cluster
FUNCTION = "def double(x):\n    y = x * 2\n    return y\n"


@pytest.fixture(scope="module")
def run_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console_runs")


@pytest.fixture(scope="module")
def cluster(run_base: Path) -> Iterator[Any]:
    from tfdist_nb import Cluster

    with Cluster(workers=2, preload=(), run_dir=run_base) as c:
        yield c


@pytest.fixture(scope="module")
def lab(run_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("console_root")
    with jupyter_server(root, run_base, app="lab",
                        extra_args=["--LabApp.expose_app_in_browser=True"]) as found:
        yield found


def call(server: dict[str, str], path: str, body: Any = None, method: str = "GET",
         token: str | None = "") -> Any:
    req = urllib.request.Request(f"{server['base']}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    token = server["token"] if token == "" else token
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def refused(server: dict[str, str], path: str, body: Any,
            token: str | None = "") -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as info:
        call(server, path, body, "POST", token)
    return info.value.code, info.value.read().decode()


class KernelSocket:
    """A client of the server's kernel websocket, speaking as JupyterLab's console does."""

    def __init__(self, server: dict[str, str], kernel_id: str) -> None:
        self.url = (server["base"].replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
                    f"?session_id={uuid.uuid4().hex}&token={server['token']}")
        self.session = uuid.uuid4().hex
        self.seq = 0
        self.iopub: list[dict[str, Any]] = []
        self.conn: Any = None

    async def __aenter__(self) -> KernelSocket:
        from tornado.websocket import websocket_connect

        self.conn = await asyncio.wait_for(websocket_connect(self.url), 20)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.conn.close()

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        self.conn.write_message(json.dumps({
            "channel": channel, "content": content, "metadata": {}, "parent_header": {},
            "buffers": [], "header": {"msg_id": msg_id, "msg_type": msg_type, "version": "5.3",
                                      "session": self.session, "username": "test",
                                      "date": "2026-01-01T00:00:00.000Z"}}))
        return msg_id

    async def until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        for msg in self.iopub:
            if predicate(msg):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(self.conn.read_message(),
                                         max(0.05, deadline - time.monotonic()))
            assert raw is not None, "the server closed the kernel websocket"
            msg = json.loads(raw)
            if msg["channel"] == "iopub":
                self.iopub.append(msg)
            if predicate(msg):
                return msg
        raise AssertionError(f"no {what} within {timeout}s")

    async def execute(self, code: str, timeout: float = 30) -> dict[str, Any]:
        """Run ``code``; its reply and what it wrote (stdout, the result's text)."""
        msg_id = self.send("shell", "execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True})
        reply = await self.until(lambda m: m["channel"] == "shell" and
                                 m["parent_header"].get("msg_id") == msg_id, timeout, code)
        await self.idle(msg_id)
        return {"reply": reply["content"], "text": self.said(msg_id)}

    async def idle(self, msg_id: str) -> None:
        """Until the request's output is all in (iopub's idle status: a reply on the shell
        channel can overtake it)."""
        await self.until(lambda m: m["channel"] == "iopub" and
                         m["parent_header"].get("msg_id") == msg_id and
                         m["content"].get("execution_state") == "idle", 30, "idle")

    def said(self, msg_id: str) -> str:
        out = []
        for m in self.iopub:
            if m["parent_header"].get("msg_id") == msg_id:
                c = m["content"]
                out.append(c.get("text") or c.get("data", {}).get("text/plain", ""))
        return "".join(out)

    async def dap(self, command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """One debug request on the control channel, as JupyterLab's debugger sends it."""
        self.seq += 1
        msg_id = self.send("control", "debug_request", {
            "type": "request", "seq": self.seq, "command": command,
            "arguments": arguments or {}})
        reply = await self.until(lambda m: m["channel"] == "control" and
                                 m["parent_header"].get("msg_id") == msg_id, 30, command)
        assert reply["content"].get("success"), reply["content"]
        return reply["content"]


def console_records(cluster: Any) -> list[dict[str, Any]]:
    return [r for r in cluster.rundir.iter_events() if r.get("kind") == "output"
            and r.get("task") == "worker:1" and r.get("origin") == "console"]


@pytest.mark.timeout(240)
def test_a_console_on_worker_1_runs_there_is_recorded_and_its_debugger_stops(
        cluster: Any, lab: dict[str, str]) -> None:
    path = f"/tfdist/api/clusters/{cluster.id}/console"
    wait_for(lambda: any(t["console"] for t in call(lab, f"/tfdist/api/clusters/{cluster.id}")
                         ["tasks"]), 30, "the panes to offer a console")
    kernel_id = call(lab, path, {"task": "worker:1"}, "POST")["kernel_id"]
    assert call(lab, path, {"task": "worker:1"}, "POST")["kernel_id"] == kernel_id  # one each
    assert kernel_id in {k["id"] for k in call(lab, "/api/kernels")}

    async def session() -> None:
        async with KernelSocket(lab, kernel_id) as ks:
            ran = await ks.execute("import os\nprint('here', os.getpid())\n"
                                   "os.environ['TFDIST_TASK']")
            assert ran["reply"]["status"] == "ok", ran
            pid = cluster.snapshot().task("worker:1").pid
            assert "'worker:1'" in ran["text"] and f"here {pid}" in ran["text"], ran
            # the cluster's own cells run while the console is attached
            result = await asyncio.to_thread(
                cluster.run, "import os; print('cluster cell on', os.environ['TFDIST_TASK'])",
                timeout=30)
            assert result.ok and "cluster cell on worker:1" in result.tasks["worker:1"].stdout
            # what the console prints while a notebook cell runs stays out of that cell
            out = io.StringIO()
            printer = LivePrinter(stdout=out, stderr=out, colour=False)
            running = asyncio.ensure_future(asyncio.to_thread(
                cluster.run, "import time; time.sleep(2); print('the cell')", on="worker:0",
                on_event=printer, timeout=30))
            await asyncio.sleep(0.5)
            assert "from the console" in (await ks.execute("print('from the console')"))["text"]
            assert (await running).ok
            assert "[worker:0] the cell" in out.getvalue()
            assert "from the console" not in out.getvalue()

            # JupyterLab's debugger: its DAP sequence on the control channel
            await ks.dap("initialize", {"clientID": "test", "adapterID": "python",
                                        "pathFormat": "path", "linesStartAt1": True,
                                        "columnsStartAt1": True})
            await ks.dap("attach")
            source = (await ks.dap("dumpCell", {"code": FUNCTION}))["body"]["sourcePath"]
            bps = await ks.dap("setBreakpoints", {"source": {"path": source},
                                                  "breakpoints": [{"line": 2}],
                                                  "sourceModified": False})
            assert bps["body"]["breakpoints"][0]["verified"]
            await ks.dap("configurationDone")
            assert (await ks.execute(FUNCTION))["reply"]["status"] == "ok"
            call_id = ks.send("shell", "execute_request", {
                "code": "print('double', double(21))", "silent": False, "store_history": True,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
            stopped = await ks.until(lambda m: m["header"]["msg_type"] == "debug_event" and
                                     m["content"].get("event") == "stopped", 60, "a stop")
            thread = stopped["content"]["body"]["threadId"]
            frame = (await ks.dap("stackTrace", {"threadId": thread}))["body"]["stackFrames"][0]
            assert (frame["name"], frame["line"]) == ("double", 2)
            scope = (await ks.dap("scopes", {"frameId": frame["id"]}))["body"]["scopes"][0]
            found = (await ks.dap("variables", {"variablesReference": scope[
                "variablesReference"]}))["body"]["variables"]
            assert {v["name"]: v["value"] for v in found}.get("x") == "21", found
            # held at the breakpoint, worker:1 is shown at a prompt (a person is at it)
            shown = lambda: {r["task"]: r["state"] for r in  # noqa: E731
                             cluster.status().to_dict("records")}
            await asyncio.to_thread(wait_for, lambda: shown()["worker:1"] == "prompt", 10,
                                    "worker:1 shown at a prompt")
            assert cluster.snapshot().task("worker:1").state == "prompt"
            assert shown()["worker:0"] == "idle"
            # a cluster cell sent to it meanwhile waits past the stall timeout, unjudged
            cluster.stall_timeout, alerts = 2.0, len(cluster.alerts())
            waiting = asyncio.ensure_future(asyncio.to_thread(
                cluster.run, "print('after the breakpoint')", on="worker:1", timeout=60))
            done, _ = await asyncio.wait({waiting}, timeout=5.0)  # 2.5 stall timeouts
            assert not done and cluster.alerts()[alerts:] == []
            await ks.dap("continue", {"threadId": thread})
            await ks.idle(call_id)
            assert "double 42" in ks.said(call_id)
            after = await waiting
            assert after.ok and "after the breakpoint" in after.tasks["worker:1"].stdout
            await asyncio.to_thread(wait_for, lambda: shown()["worker:1"] == "idle", 10,
                                    "worker:1 idle again")
            await ks.dap("disconnect", {"restart": False, "terminateDebuggee": False})

    asyncio.run(session())
    # recorded in the run directory as worker:1's, marked as from a console: the code and its
    # output; the cluster's own cell is not marked
    try:
        wait_for(lambda: any(r["text"] == "double 42" for r in console_records(cluster)), 10,
                 "the console's output in the run directory")
    except pytest.fail.Exception:  # say what was recorded instead (seen once under CI's load)
        seen = [r for r in cluster.rundir.iter_events()
                if r.get("task") == "worker:1" and r.get("kind") == "output"]
        pytest.fail(f"no console record 'double 42'; worker:1's last records: {seen[-12:]}")
    records = console_records(cluster)
    assert {"os.environ['TFDIST_TASK']", "print('double', double(21))"} <= {
        r["text"] for r in records if r["stream"] == "input"}
    assert any(r["stream"] == "stdout" and r["text"].startswith("here ") for r in records)
    assert not any("cluster cell on" in r["text"] for r in records)
    assert any(r.get("origin") is None and r["text"] == "cluster cell on worker:1"
               for r in cluster.rundir.iter_events())

    # interrupt and restart are not the console's to do; forgetting the kernel (a shutdown from
    # JupyterLab) leaves the task running
    for action in ("interrupt", "restart"):
        assert refused(lab, f"/api/kernels/{kernel_id}/{action}", {})[0] >= 500, action
    call(lab, f"/api/kernels/{kernel_id}", method="DELETE")
    assert kernel_id not in {k["id"] for k in call(lab, "/api/kernels")}
    assert cluster.run("print('still here')", on="worker:1", timeout=30).ok


@pytest.mark.timeout(120)
def test_what_is_refused_and_why(cluster: Any, lab: dict[str, str], run_base: Path) -> None:
    path = f"/tfdist/api/clusters/{cluster.id}/console"
    assert refused(lab, path, {"task": "worker:1"}, token=None)[0] == 403
    assert refused(lab, path, {"task": "worker:1'; rm"})[0] == 400
    code, said = refused(lab, path, {"task": "worker:7"})
    assert code == 404 and "has no task worker:7" in said
    assert refused(lab, "/tfdist/api/clusters/nope-1/console", {"task": "worker:0"})[0] == 404
    # a connection file another user could read is not used
    conn = Path(cluster.snapshot().task("worker:0").connection_file)
    os.chmod(conn, 0o640)
    try:
        code, said = refused(lab, path, {"task": "worker:0"})
        assert code == 403 and "readable by others" in said
    finally:
        os.chmod(conn, 0o600)
    # a finished cluster has no console
    old = run_base / "20200101-000000-aaaaaa"
    old.mkdir(mode=0o700)
    (old / "state.json").write_text(json.dumps({
        "id": old.name, "state": "stopped", "stopped": 1.0, "updated": 1.0,
        "tasks": [{"task": "worker:0", "state": "stopped", "connection_file": str(conn)}]}))
    code, said = refused(lab, f"/tfdist/api/clusters/{old.name}/console", {"task": "worker:0"})
    assert code == 409 and "is finished" in said


@pytest.mark.timeout(300)
def test_from_the_pane_a_console_on_worker_1_and_its_debugger_in_jupyterlab(
        cluster: Any, lab: dict[str, str], tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = ensure_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        try:
            page.goto(f"{lab['base']}/lab?token={lab['token']}")
            page.locator(".jp-LabShell").wait_for(timeout=60_000)
            page.locator("[data-id='tfdist-sidebar']").click()
            page.locator(f".tfdist-lab-cluster[data-cluster='{cluster.id}']").click()
            pane = page.locator(f".tfdist-lab-panel[data-cluster='{cluster.id}']")
            button = pane.locator("tr[data-task='worker:1'] .tfdist-lab-console-button")
            button.click(timeout=60_000)
            console = page.locator(".jp-CodeConsole").last
            console.wait_for(timeout=60_000)
            expect(page.locator(".lm-TabBar-tab", has_text="tfdist worker:1")).to_be_visible()
            session = f"tfdist/{cluster.id}/worker:1"  # the console's session path
            run_in_console(page, session, "import os; os.environ['TFDIST_TASK']")
            expect(console.locator(".jp-OutputArea-output").last).to_contain_text(
                "'worker:1'", timeout=60_000)
            # the debugger is available on it: its toggle in the console's toolbar
            toggle = page.locator(".jp-DebuggerBugButton").last
            expect(toggle).to_be_enabled(timeout=60_000)
            toggle.click()
            expect(toggle).to_have_attribute("aria-pressed", "true", timeout=30_000)
            run_in_console(page, session, FUNCTION)
            cell = console.locator(".jp-CodeConsole-content .jp-Cell").last
            expect(cell).to_contain_text("y = x * 2", timeout=30_000)
            cell.locator(".cm-gutters .cm-gutter").first.locator(
                ".cm-gutterElement").nth(2).click()  # line 2 (the first element is a spacer)
            expect(page.locator(".jp-DebuggerBreakpoints-body")).to_contain_text(
                "2", timeout=30_000)
            run_in_console(page, session, "print('double', double(21))")
            expect(page.locator(".jp-DebuggerVariables")).to_contain_text(
                re.compile(r"\bx\W*21\b"), timeout=60_000)  # x: 21
            expect(page.locator(".jp-DebuggerCallstack")).to_contain_text("double")
            page.screenshot(path=str(tmp_path / "console-debugger.png"))
            page.locator("[title^='Continue']:visible").first.click()  # the call stack's toolbar
            expect(console.locator(".jp-OutputArea-output").last).to_contain_text(
                "double 42", timeout=60_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()


def run_in_console(page: Any, path: str, code: str) -> None:
    """Run ``code`` in the console of session ``path``, as JupyterLab's ``console:inject``
    (what a "run in console" of an editor uses) does."""
    page.evaluate("""([path, code]) => window.jupyterapp.commands.execute(
        'console:inject', {path, code, activate: false})""", [path, code])


@pytest.mark.timeout(180)
def test_a_restarted_task_is_a_new_kernel_and_the_old_one_is_forgotten(
        cluster: Any, lab: dict[str, str]) -> None:
    path = f"/tfdist/api/clusters/{cluster.id}/console"
    old = call(lab, path, {"task": "worker:0"}, "POST")["kernel_id"]
    cluster.restart(on="worker:0")
    # the server drops the registration of the process that is gone ...
    wait_for(lambda: old not in {k["id"] for k in call(lab, "/api/kernels")}, 30,
             "the old kernel to be forgotten")
    # ... and, once the pane offers a console on it again (its state.json says it is up), a
    # console reaches the new one
    wait_for(lambda: next(t for t in call(lab, f"/tfdist/api/clusters/{cluster.id}")["tasks"]
                          if t["task"] == "worker:0")["console"], 30, "the console offered again")
    new = call(lab, path, {"task": "worker:0"}, "POST")["kernel_id"]
    assert new != old

    async def ask() -> str:
        async with KernelSocket(lab, new) as ks:
            return (await ks.execute("import os; os.getpid()"))["text"]

    assert asyncio.run(ask()) == str(cluster.snapshot().task("worker:0").pid)
