"""No leftovers: stop() ends busy tasks fast, and workers die with their controller."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.support.processes import wait_for
from tfdist_nb import Cluster, current
from tfdist_nb.launchers import ports

pytestmark = pytest.mark.cluster

CONTROLLER = textwrap.dedent("""
    import json, sys, time
    from tfdist_nb import Cluster
    c = Cluster(workers=2).start()
    print(json.dumps([rt.pid for rt in c.tasks.values()]), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
""")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_controller(mode: str, tmp_path: Any) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "TFDIST_RUNS_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, mode], stdout=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    assert line, "the controller printed no pids"
    return proc, json.loads(line)


def test_stop_ends_busy_mwms_tasks_fast_and_releases_everything() -> None:
    c = Cluster(workers=2).start()
    pids = [rt.pid for rt in c.tasks.values()]
    run_dir = c.run_dir
    # With the coordination service on, TF only logs SIGTERM: the stop must not rely on it.
    assert c.run("import tensorflow as tf\n"
                 "strategy = tf.distribute.MultiWorkerMirroredStrategy()", timeout=60).ok
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(
        c.run("import time\nwhile True: time.sleep(0.05)")))
    runner.start()
    wait_for(lambda: set(c.status()["state"]) == {"busy"}, 10, "both tasks busy")
    reports = c.stop()
    runner.join(10)
    assert not runner.is_alive(), "the running cell did not end when the cluster stopped"
    assert {r.status for r in results[0].tasks.values()} <= {"interrupted", "crashed"}
    assert len(reports) == 2 and all(r.duration_s < 10 for r in reports)
    assert {r.path for r in reports} <= {"request", "kill"}
    assert all(gone(p) for p in pids)
    assert not list(run_dir.rglob("kernel-connection.json"))  # connection files removed
    assert not ports._held  # TF ports given back
    assert set(c.status()["state"]) == {"stopped"}
    assert current() is None


def test_workers_exit_when_the_controller_is_sigkilled(tmp_path: Any) -> None:
    proc, pids = start_controller("hang", tmp_path)
    assert all(not gone(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: all(gone(p) for p in pids), 15, "orphaned workers to exit")


def test_interpreter_exit_stops_the_cluster(tmp_path: Any) -> None:
    proc, pids = start_controller("exit", tmp_path)
    assert proc.wait(30) == 0
    wait_for(lambda: all(gone(p) for p in pids), 5, "workers to be stopped at exit")


def test_unloading_the_extension_stops_the_cluster() -> None:
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("tfdist_nb")
    try:
        ip.run_line_magic("tfcluster", "1 worker")
        cluster = current()
        assert cluster is not None and str(cluster.spec) == "1 worker"
        pid = cluster.tasks[next(iter(cluster.tasks))].pid
    finally:
        ip.extension_manager.unload_extension("tfdist_nb")
    assert current() is None
    assert gone(pid)


WATCHED = textwrap.dedent("""
    import os, sys, time
    from tfdist_nb.worker.lifeline import ParentWatch
    parent = int(sys.argv[1])
    while os.getppid() == parent:  # the parent ends before the watch starts
        time.sleep(0.01)
    ParentWatch(parent, sys.argv[2], interval=0.05).start()
    time.sleep(60)
""")
STARTS_WATCHED_AND_ENDS = ("import os, subprocess, sys\n"
                           "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
                           "str(os.getpid()), sys.argv[2]])\nprint(child.pid, flush=True)\n")


def test_a_kernel_whose_controller_ended_while_it_started_still_leaves(tmp_path: Any) -> None:
    """The controller SIGKILLed while a spare was still starting: its parent watch, started
    after the controller was gone, ends it (it used to take the kernel for someone else's)."""
    out = subprocess.run([sys.executable, "-c", STARTS_WATCHED_AND_ENDS, WATCHED,
                          str(tmp_path / "kernel-connection.json")],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    pid = int(out)
    try:
        wait_for(lambda: not psutil.pid_exists(pid)
                 or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 15,
                 "the orphaned kernel to leave")
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
