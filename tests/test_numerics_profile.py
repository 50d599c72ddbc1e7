"""NaN/Inf checking names the first task and op; one profiler capture holds every task."""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster.profiler import Capture, describe
from tfdist_nb.display.printer import failure_report

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_numerics_names_the_first_task_and_op_and_profile_traces_every_task(
        tmp_path: Path) -> None:
    with Cluster(workers=2) as c:
        said = c.numerics(True, dump_dir=tmp_path / "dbg")
        assert "NaN/Inf checking on on 2 task(s)" in said and "one root per task" in said
        # worker:1 takes the log of a negative number a little before worker:0 does
        result = c.run("import time, tensorflow as tf, tfdist_nb.worker as tw\n"
                       "time.sleep(0.0 if tw.task[1] == 1 else 0.5)\n"
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
    # profile plugin: the run, and one host per task
    hosts = tensorboard_profile_hosts(tmp_path / "prof")
    assert sorted(hosts) == sorted(t.name.removesuffix(".xplane.pb") for t in traces)


def tensorboard_profile_hosts(logdir: Path) -> list[str]:
    """Start ``tensorboard --logdir`` on loopback and read its profile plugin's HTTP API: it
    must be active and list exactly one run; returns that run's hosts."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/data"

    def get(path: str) -> object:
        with urllib.request.urlopen(base + path, timeout=30) as reply:
            body = reply.read()  # the profile plugin gzips its answers whatever was asked
            if reply.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return json.loads(body.decode())

    def answers() -> object:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with contextlib.suppress(OSError):
            return get("/plugins_listing")
        return None

    try:
        plugins = wait_for(answers, 90, "TensorBoard to answer")
        assert plugins["profile"]["enabled"], plugins  # type: ignore[index]
        runs = get("/plugin/profile/runs")
        assert isinstance(runs, list) and len(runs) == 1, runs
        found = get(f"/plugin/profile/hosts?run={runs[0]}&tag=trace_viewer")
        return [h["hostname"] for h in found]  # type: ignore[union-attr,index]
    finally:
        proc.kill()
        proc.wait(10)


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
