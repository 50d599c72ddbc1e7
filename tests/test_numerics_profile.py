"""NaN/Inf checking names the first task and op; one profiler capture holds every task."""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import free_port, wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster.profiler import Capture, describe
from tfdist_nb.display.printer import failure_report

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_numerics_names_the_first_task_and_op_and_profile_traces_every_task(
        tmp_path: Path) -> None:
    with Cluster(workers=2) as c:
        said = c.numerics(True, dump_dir=tmp_path / "dbg")
        assert "NaN/Inf checking on on 2 task(s)" in said and "one root per task" in said
        # worker:1 takes the log of a negative number first; worker:0 does the same once
        # worker:1's error was published (IPython's post_run_cell comes after the traceback)
        flag = tmp_path / "worker1-raised"
        result = c.run("import os, time, tensorflow as tf, tfdist_nb.worker as tw\n"
                       "if tw.task[1] == 1:\n"
                       "    def mark(_):\n"
                       "        get_ipython().events.unregister('post_run_cell', mark)\n"
                       f"        open({str(flag)!r}, 'w').close()\n"
                       "    get_ipython().events.register('post_run_cell', mark)\n"
                       "else:\n"
                       "    t = time.monotonic()\n"
                       f"    while not os.path.exists({str(flag)!r}) and "
                       "time.monotonic() - t < 60:\n"
                       "        time.sleep(0.01)\n"
                       "y = tf.math.log(tf.constant(-1.0))\n")
        assert not result.ok
        assert {r.status for r in result.tasks.values()} == {"error"}
        report = failure_report(result, colour=False)
        first = report.splitlines()[0]
        assert first.startswith("tfdist_nb: NaN/Inf first produced on worker:1 by op Log")
        assert "then worker:0" in first
        assert any("NaN/Inf first produced on worker:1" in a for a in c.alerts())
        # Debugger V2 dumps: one root per task
        assert sorted(p.name for p in (tmp_path / "dbg").iterdir()) == ["worker-0", "worker-1"]
        assert c.numerics(False) == "NaN/Inf checking off on 2 task(s)"
        assert c.run("y = tf.math.log(tf.constant(-1.0))").ok  # NaN no longer raises

        # an armed capture starts with the next cell and holds one trace per task
        armed = c.profile(duration_ms=1500, logdir=tmp_path / "prof")
        assert "armed" in armed
        busy = c.run("import time\na = tf.random.normal((384, 384))\nt = time.time()\n"
                     "while time.time() - t < 2.5:\n    x = tf.matmul(a, a)")
        assert busy.ok, busy.summary()
        assert busy.profile is not None and "profile of 2 task(s)" in busy.profile
        assert f"%tensorboard --logdir {tmp_path / 'prof'}" in busy.profile
        traces = sorted((tmp_path / "prof").glob("plugins/profile/*/*.xplane.pb"))
        ports = {rt.address.rpartition(":")[0] for rt in c.tasks.values()}
        assert len(traces) == 2 and all(t.stat().st_size > 0 for t in traces)
        assert ports == {"localhost"}
        assert "MatMul" in busy.profile  # the busiest host ops, per task
        for task in ("worker:0", "worker:1"):  # each trace named by its task
            assert f"  {task} (localhost_" in busy.profile, busy.profile
    # the line's TensorBoard, as the README's install gives it, lists the capture in its
    # profile plugin: the run, and one host per task, through its HTTP API and in a browser
    with tensorboard(tmp_path / "prof") as base:
        run, hosts = profile_run_and_hosts(base)
        assert sorted(hosts) == sorted(t.name.removesuffix(".xplane.pb") for t in traces)
        shown = profile_tab_in_chromium(base, run, tmp_path / "tensorboard-profile.png")
        assert "Sessions (1)" in shown and "Overview Page" in shown, shown[:2000]


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[str]:
    """``tensorboard --logdir`` on loopback, once it answers; its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with contextlib.suppress(OSError):
            return _get(base, "/data/plugins_listing") is not None
        return False

    try:
        wait_for(answers, 90, "TensorBoard to answer")
        yield base
    finally:
        proc.kill()
        proc.wait(10)


def _get(base: str, path: str) -> object:
    with urllib.request.urlopen(base + path, timeout=30) as reply:
        body = reply.read()  # the profile plugin gzips its answers whatever was asked
        if reply.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body.decode())


def profile_run_and_hosts(base: str) -> tuple[str, list[str]]:
    """The profile plugin, active, lists exactly one run: it and its hosts."""
    plugins = _get(base, "/data/plugins_listing")
    assert plugins["profile"]["enabled"], plugins  # type: ignore[index]
    runs = _get(base, "/data/plugin/profile/runs")
    assert isinstance(runs, list) and len(runs) == 1, runs
    found = _get(base, f"/data/plugin/profile/hosts?run={runs[0]}&tag=trace_viewer")
    return runs[0], [h["hostname"] for h in found]  # type: ignore[union-attr,index]


def profile_tab_in_chromium(base: str, run: str, screenshot: Path) -> str:
    """TensorBoard's Profile tab in headless Chromium, as a user opens it: the page's text
    once it shows the capture's session ``run``."""
    from playwright.sync_api import sync_playwright

    from tests.support.jupyter_server import CHROMIUM_ARGS, ensure_chromium

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=ensure_chromium(), headless=True,
                                    args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/#profile", timeout=60_000)

            def shown() -> str | None:
                # TensorBoard draws each plugin's page in a frame of its own
                texts = []
                for frame in page.frames:
                    with contextlib.suppress(Exception):  # a frame replaced meanwhile
                        texts.append(frame.locator("body").inner_text(timeout=5_000))
                text = "\n".join(texts)
                return text if run in text and "Sessions" in text else None

            text = wait_for(shown, 60, f"the Profile tab to show session {run}", interval=0.5)
            page.screenshot(path=str(screenshot))
            return text
        finally:
            browser.close()


def test_a_task_missing_from_the_capture_is_named() -> None:
    """A task whose process ended during the capture leaves no trace file: the summary says
    which task, not just a smaller count."""
    capture = Capture(Path("/runs/profile"), 1500, 0,
                      traced={"localhost_4001.xplane.pb": "worker:0",
                              "localhost_4002.xplane.pb": "worker:1"})
    text = describe({"run": "/runs/profile/plugins/profile/x",
                     "files": {"localhost_4001.xplane.pb": {"events": 10,
                                                            "top_ms": [["MatMul", 5.0]]}}},
                    capture)
    assert text.splitlines()[0] == "profile of 1 of 2 task(s), 1500 ms, in /runs/profile"
    assert "  worker:0 (localhost_4001.xplane.pb): 10 events; busiest: MatMul 5 ms" in text
    assert "  worker:1: no trace (it ended or its profiler failed" in text
