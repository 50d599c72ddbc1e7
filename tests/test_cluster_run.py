"""Real 2-worker cluster runs: attribution, errors, targets, timeouts, run directory."""

from __future__ import annotations

import json
import stat
import time
from typing import Any

import pytest

from tests.conftest import wait_for
from tfdist_nb.cluster.cluster import STATUS_COLUMNS

pytestmark = pytest.mark.cluster

ATTRIBUTION = """
import os, sys, tensorflow as tf, tfdist_nb.worker as tw
me = f"{tw.task[0]}{tw.task[1]}"
print(f"py-print from {me}")
os.write(2, f"c-level write from {me}\\n".encode())
@tf.function
def f(x):
    tf.print("tf.print from", me, x)
    tf.print("tf.print to stdout from", me, output_stream=sys.stdout)
    return x
f(tf.constant(7))
"""


def lines(cluster: Any, **kw: Any) -> list[tuple[str, str, str]]:
    df = cluster.logs(**kw)
    return list(zip(df["task"], df["stream"], df["text"], strict=True))


def test_every_kind_of_output_lands_in_its_own_task(cluster2: Any) -> None:
    result = cluster2.run(ATTRIBUTION, timeout=60)
    assert result.ok, result.summary()
    log = lines(cluster2)
    for task, me in (("worker:0", "worker0"), ("worker:1", "worker1")):
        other = "worker1" if me == "worker0" else "worker0"
        mine = [text for t, _, text in log if t == task]
        assert f"py-print from {me}" in mine
        assert f"c-level write from {me}" in mine
        assert f"tf.print from {me} 7" in mine
        assert f"tf.print to stdout from {me}" in mine
        assert not [text for text in mine if other in text], "a line went to the wrong task"
    assert "py-print from worker1" in result.tasks["worker:1"].stdout
    assert "c-level write from worker1" in result.tasks["worker:1"].stderr


def test_output_from_a_background_thread_after_the_cell_is_kept(cluster2: Any) -> None:
    code = ("import threading, time, tfdist_nb.worker as tw\n"
            "threading.Timer(0.5, lambda: print('late line from', tw.task[1], flush=True))"
            ".start()\n")
    assert cluster2.run(code, timeout=30).ok
    found = wait_for(lambda: [t for t, _, text in lines(cluster2, grep="late line from")],
                     10, "the late lines")
    wait_for(lambda: len(lines(cluster2, grep="late line from")) == 2, 10, "both late lines")
    log = lines(cluster2, grep="late line from")
    assert sorted(log) == [("worker:0", "stdout", "late line from 0"),
                           ("worker:1", "stdout", "late line from 1")], found


def test_error_in_one_task_keeps_cell_line_numbers(cluster2: Any) -> None:
    code = "import tfdist_nb.worker as tw\nx = 1\nif tw.task[1] == 1:\n    1 / 0\n"
    result = cluster2.run(code, timeout=30)
    assert not result.ok
    assert result.tasks["worker:0"].status == "ok"
    bad = result.tasks["worker:1"]
    assert bad.status == "error"
    assert (bad.error.ename, bad.error.evalue) == ("ZeroDivisionError", "division by zero")
    tb = "\n".join(bad.error.traceback)
    assert "line 4" in tb
    assert "worker:1 error (ZeroDivisionError: division by zero)" in result.summary()
    assert cluster2.status().set_index("task").loc["worker:1", "state"] == "idle"


def test_on_runs_on_the_chosen_task_only(cluster2: Any) -> None:
    result = cluster2.run("import tfdist_nb.worker as tw; print('only on', tw.task)", on=1)
    assert list(result.tasks) == ["worker:1"]
    assert "only on ('worker', 1)" in result.tasks["worker:1"].stdout
    result = cluster2.run("y = 2", on="worker:0")
    assert list(result.tasks) == ["worker:0"]


def test_live_events_reach_the_caller_in_order(cluster2: Any) -> None:
    seen: list[Any] = []
    code = "for i in range(5): print('tick', i, flush=True)"
    assert cluster2.run(code, on=0, on_event=seen.append).ok
    ticks = [e.text for e in seen if getattr(e, "stream", None) == "stdout"]
    assert ticks == [f"tick {i}" for i in range(5)]


def test_timeout_interrupts_and_the_tasks_come_back(cluster2: Any) -> None:
    result = cluster2.run("import time; time.sleep(60)", timeout=2)
    assert {r.status for r in result.tasks.values()} == {"timeout"}
    assert all(r.duration_s < 20 for r in result.tasks.values())
    assert cluster2.run("z = 3").ok  # the kernels answered the interrupt and are idle again


def test_status_has_every_spec_column(cluster2: Any) -> None:
    df = cluster2.status()
    assert list(df.columns) == STATUS_COLUMNS
    assert list(df["task"]) == ["worker:0", "worker:1"]
    assert set(df["state"]) == {"idle"}
    assert all(df["pid"] > 0) and set(df["host"]) == {"localhost"}
    assert df["gpu_util_percent"].isna().all()  # no GPU reads as empty, not 0


def test_run_directory_keeps_everything_owner_only(cluster2: Any) -> None:
    marker = f"marker-{time.time()}"
    cluster2.run(f"print({marker!r})")
    root = cluster2.run_dir
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is readable by others ({oct(mode)})"
    cells = [json.loads(x) for x in (root / "cells.jsonl").read_text().splitlines()]
    assert any(marker in c["code"] for c in cells)
    events = (root / "events.jsonl").read_text()
    assert events.count(marker) == 2  # one printed line per task; the code is in cells.jsonl
    for task in ("worker-0", "worker-1"):
        cfg = json.loads((root / "tasks" / task / "tf_config.json").read_text())
        assert cfg["task"] == {"type": "worker", "index": int(task[-1])}
        assert len(cfg["cluster"]["worker"]) == 2


def test_env_reports_each_task(cluster2: Any) -> None:
    env = cluster2.env()
    assert list(env.columns) == ["worker:0", "worker:1", "mismatch"]
    assert not env["mismatch"].any()
    assert env.loc["tensorflow", "worker:0"].startswith("2.")
