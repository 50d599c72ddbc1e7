"""Real 2-worker cluster runs: attribution, errors, targets, timeouts, run directory."""

from __future__ import annotations

import json
import stat
import time
from typing import Any

import pytest

from tests.gpu_here import visible_nvml_gpus
from tests.support.processes import wait_for
from tfdist_nb.cluster.views import STATUS_COLUMNS

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
    for r in result.tasks.values():  # the main-thread stack at the timeout, and where it was
        assert "time.sleep(60)" in r.stack
        assert "main thread running Python code at " in r.explanation
        assert "time.sleep(60)" in r.stack  # the cell's own frame, wherever TMPDIR points
    assert cluster2.run("z = 3").ok  # the kernels answered the interrupt and are idle again


def test_status_has_every_spec_column(cluster2: Any) -> None:
    # the telemetry columns come with each task's first sample (a fresh cluster may have none)
    wait_for(lambda: cluster2.status()["net_scope"].notna().all(), 30,
             "a telemetry sample from every task")
    df = cluster2.status()
    assert list(df.columns) == STATUS_COLUMNS
    assert STATUS_COLUMNS[:15] == ["task", "host", "pid", "state", "step", "step_time_ms",
                                   "input_wait_ms", "cpu_percent", "rss_mb", "gpus",
                                   "gpu_util_percent", "gpu_mem_mb", "net_rx_mb_s",
                                   "net_tx_mb_s", "last_output_s_ago"]  # docs/reference.md
    assert set(df["flags"]) == {""}
    # local tasks share their cluster's private network, else the host's interfaces
    assert set(df["net_scope"]) == {"cluster-netns" if cluster2.launcher.confined else "host"}
    assert list(df["task"]) == ["worker:0", "worker:1"]
    assert set(df["state"]) == {"idle"}
    assert all(df["pid"] > 0) and set(df["host"]) == {"localhost"}
    if visible_nvml_gpus():  # a GPU host: each task reads its GPUs
        assert df["gpu_mem_mb"].notna().all()
    else:
        assert df["gpu_util_percent"].isna().all()  # no GPU reads as empty, not 0
        assert set(df["gpus"]) == {""}  # nothing was placed: no GPU given


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


def test_logs_magic_filters_and_saves(cluster2: Any, tmp_path: Any) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    cluster2.run("for i in range(3): print('needle', i)")
    saved = tmp_path / "logs.jsonl"
    df = ip.run_line_magic("tfdist_logs", f"--on 1 --grep 'needle [12]' --tail 1 --save {saved}")
    assert list(df["text"]) == ["needle 2"] and list(df["task"]) == ["worker:1"]
    rows = [json.loads(x) for x in saved.read_text().splitlines()]
    assert [(r["task"], r["stream"], r["text"]) for r in rows] == [("worker:1", "stdout",
                                                                    "needle 2")]


def test_log_records_carry_their_task(cluster2: Any) -> None:
    code = """
import logging, tensorflow as tf
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.task)
for name in ("", "tensorflow"):
    logging.getLogger(name).addHandler(Keep())
logging.getLogger("mine").warning("from python logging")
tf.get_logger().warning("from tf.get_logger")
print("tasks on records:", sorted(set(seen)), len(seen))
"""
    result = cluster2.run(code)
    assert result.ok, result.summary()
    assert "tasks on records: ['worker:0'] 3" in result.tasks["worker:0"].stdout
    assert "tasks on records: ['worker:1'] 3" in result.tasks["worker:1"].stdout


def test_dashboard_is_a_widget_that_shows_itself(cluster2: Any) -> None:
    import ipywidgets

    dashboard = cluster2.dashboard(start=False)
    assert isinstance(dashboard, ipywidgets.DOMWidget)
    # what a cell's last expression shows: the widget view, not "<Dashboard at 0x...>"
    bundle = dashboard._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == dashboard.model_id
    assert set(dashboard.panels) == {"worker:0", "worker:1"}
    dashboard.stop()


def test_dashboard_panels_filter_by_stream_and_regex(cluster2: Any) -> None:
    cluster2.run("import sys\nfor i in range(5):\n    print('out', i)\n"
                 "    print('err', i, file=sys.stderr)")
    dashboard = cluster2.dashboard(start=False)
    panel = dashboard.panels["worker:1"]
    panel.grep.value = "^(out|err) [34]$"
    dashboard.refresh()
    assert [x for x in ("out 3", "out 4", "err 3", "err 4") if x in panel.log.value] == [
        "out 3", "out 4", "err 3", "err 4"]
    assert "out 2" not in panel.log.value
    panel.stream.value = "stderr"
    dashboard.refresh()
    assert "err 4" in panel.log.value and "out 4" not in panel.log.value
    assert "worker:1" in panel.title.value and "idle" in panel.title.value
    dashboard.stop()


def test_interrupt_reaches_only_the_chosen_task(cluster2: Any) -> None:
    import threading

    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(
        cluster2.run("import time; time.sleep(30)", on=1)))
    runner.start()
    wait_for(lambda: cluster2.status().set_index("task").loc["worker:1", "state"] == "busy", 10,
             "worker:1 busy")
    cluster2.interrupt(on=1)
    runner.join(10)
    assert not runner.is_alive()
    r = results[0].tasks["worker:1"]
    assert (r.status, r.error.ename) == ("interrupted", "KeyboardInterrupt")
    assert r.duration_s < 10


def test_loglevel_sets_python_level_and_cpp_through_an_announced_restart(cluster2: Any) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    old_pids = list(cluster2.status()["pid"])
    with capture_output() as captured:
        ip.run_line_magic("tfdist_loglevel", "WARNING --cpp 2")
    assert "log level WARNING on 2 task(s)" in captured.stdout
    assert "restarted all tasks so the C++ log settings take effect" in captured.stdout
    assert list(cluster2.status()["pid"]) != old_pids
    check = ("import os, logging\n"
             "print(os.environ['TF_CPP_MIN_LOG_LEVEL'], "
             "logging.getLevelName(logging.getLogger('tensorflow').level))")
    result = cluster2.run(check)
    assert {r.stdout.strip() for r in result.tasks.values()} == {"2 WARNING"}


INTERLEAVED = """
import os, sys, time, tensorflow as tf
for i in range(6):
    print("py", i)
    tf.print("tf", i)                        # native code, to fd 2
    os.write(2, f"fd {i}\\n".encode())      # a native write of our own
    sys.stderr.write(f"err {i}\\n")
    time.sleep(0.01)
print("last line")
"""
def ours(text: str) -> bool:  # the cell's own lines (TensorFlow's start-up lines aside)
    return text.split(" ")[0] in ("py", "tf", "fd", "err", "last")


WRITTEN = [f"{what} {i}" for i in range(6) for what in ("py", "tf", "fd", "err")] + ["last line"]


def test_interleaved_writes_keep_their_order_live_on_disk_and_in_logs(cluster2: Any) -> None:
    """print, tf.print, os.write and sys.stderr in turn: the order on the task is the order the
    user sees live, in events.jsonl and in logs(), each line stamped when it was written."""
    seen: list[Any] = []
    result = cluster2.run(INTERLEAVED, on_event=seen.append, timeout=60)
    assert result.ok, result.summary()
    for task in ("worker:0", "worker:1"):
        live = [e for e in seen if getattr(e, "task", None) == task
                and getattr(e, "stream", None) in ("stdout", "stderr") and ours(e.text)]
        assert [e.text for e in live] == WRITTEN
        times = [e.time for e in live]
        assert times == sorted(times)
        # Python's writes are stamped as made; native bytes when read (those that one read
        # takes together share its time)
        mine = [e.time for e in live if e.text.split()[0] in ("py", "err")]
        assert len(set(mine)) == len(mine), "each line has the time it was written"
        assert times[-1] - times[0] > 0.05  # six 10 ms sleeps lie between the first and last
        on_disk = [r["text"] for r in cluster2.rundir.iter_events()
                   if r.get("kind") == "output" and r.get("task") == task
                   and r.get("cell") == live[0].cell and ours(r["text"])]
        assert on_disk == WRITTEN
        log = cluster2.logs(on=task)
        log = log[log["text"].map(ours) & (log["cell"] == live[0].cell)]
        assert list(log["text"]) == WRITTEN
        assert log["time"].is_monotonic_increasing
    # the cell's result holds every line: the reply came after the native writes were in
    assert "fd 5" in result.tasks["worker:1"].stderr and "tf 5" in result.tasks["worker:1"].stderr
