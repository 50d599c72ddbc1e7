"""Local task kernels forked from a fork server (docs/design.md, "Fork server"): a forked kernel
has everything a spawned one has, the preload is imported once, a restart forks again from the
same server, and what the server cannot serve is spawned as before."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers import forkserver

pytestmark = pytest.mark.cluster

PROBE = ("import json, os, numpy\n"
         "print(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), 'sid': os.getsid(0),\n"
         "    'task': os.environ['TFDIST_TASK'], 'flag': os.environ.get('MY_FLAG'),\n"
         "    'index': json.loads(os.environ['TF_CONFIG'])['task']['index'],\n"
         "    'rand': numpy.random.rand(), 'cwd': os.getcwd(),\n"
         "    'loud': getattr(sys.modules.get('loud'), 'IMPORTED_BY', None)}))")
LOUD = ("import os, sys\nIMPORTED_BY = os.getpid()\n"
        "print(f'loud was imported by {IMPORTED_BY}', file=sys.stderr, flush=True)\n")


def probe(cluster: Any) -> dict[str, dict[str, Any]]:
    result = cluster.run("import sys\n" + PROBE)
    assert result.ok, result.summary()
    return {name: json.loads(r.stdout) for name, r in result.tasks.items()}


def server_of(pid: int) -> forkserver.ForkServer:
    [server] = [s for s in forkserver.live_servers() if pid in s.children]
    return server


@pytest.fixture
def loud(tmp_path: Path) -> dict[str, str]:
    """A preload module that says who imported it (on PYTHONPATH: a server of its own)."""
    (tmp_path / "loud.py").write_text(LOUD)
    return {"PYTHONPATH": str(tmp_path), "MY_FLAG": "set late"}


def test_tasks_are_forked_kernels_with_their_own_identity(loud: dict[str, str],
                                                          tmp_path: Path) -> None:
    with Cluster(workers=2, env=loud, preload=("tensorflow", "loud"),
                 run_dir=tmp_path / "runs") as c:
        seen = probe(c)
        server = server_of(seen["worker:0"]["pid"])
        tasks = {rt.name: rt for rt in c.tasks.values()}
        for name, info in seen.items():
            assert info["ppid"] == server.pid, "not forked from the cluster's server"
            assert info["sid"] == info["pid"], "it must lead its own session (a stop ends it all)"
            assert info["task"] == name and info["index"] == int(name[-1])
            assert info["flag"] == "set late" and info["cwd"] == os.getcwd()
            assert info["loud"] == server.pid, "the preload was imported again in the task"
            words = " ".join(psutil.Process(info["pid"]).cmdline()).split()
            assert words[1:3] == ["-m", "tfdist_nb.worker.kernel"], words  # what ps shows
            assert str(tasks[name].log_path.parent / "kernel-connection.json") in words
            # what the import said is in each task's process log, as a spawned kernel's is
            log = tasks[name].log_path.read_text()
            assert log.count(f"loud was imported by {server.pid}") == 1, log[:500]
        assert seen["worker:0"]["rand"] != seen["worker:1"]["rand"], "NumPy seeds are shared"
        # TensorFlow's own log lines name the thread that logged: the task's, not the server's
        made = c.run("import tensorflow as tf\ns = tf.distribute.MultiWorkerMirroredStrategy()")
        assert made.ok, made.summary()
        started = c.logs(grep="grpc_server_lib.cc.*Started server")
        tids = {row.task: int(row.text.split()[2]) for row in started.itertuples()}
        assert tids == {name: info["pid"] for name, info in seen.items()}, started.text.tolist()

        first = {name: info["pid"] for name, info in seen.items()}
        c.restart()
        again = probe(c)
        for name, info in again.items():
            assert info["pid"] != first[name] and info["ppid"] == server.pid
        assert server.alive()


def test_fork_false_spawns_each_kernel(tmp_path: Path) -> None:
    with Cluster(workers=1, launcher_options={"fork": False}, run_dir=tmp_path) as c:
        info = probe(c)["worker:0"]
        assert info["ppid"] == os.getpid()
        assert not any(info["pid"] in s.children for s in forkserver.live_servers())


def test_a_server_that_cannot_import_the_preload_leaves_kernels_to_be_spawned(
        tmp_path: Path) -> None:
    """Its failure is not the user's error: the task is spawned and fails as a spawned one
    does, naming the module."""
    with pytest.raises(ClusterStartError, match="no_such_module_tfdist"):
        Cluster(workers=1, preload=("no_such_module_tfdist",), run_dir=tmp_path,
                start_timeout=60).start()
    key_preloads = [s.key.preload for s in forkserver.live_servers()]
    assert ("no_such_module_tfdist",) not in key_preloads


def test_a_killed_server_ends_its_kernels_and_the_next_start_makes_a_new_one(
        loud: dict[str, str], tmp_path: Path) -> None:
    with Cluster(workers=2, env=loud, preload=("tensorflow", "loud"),
                 run_dir=tmp_path / "runs") as c:
        seen = probe(c)
        server = server_of(seen["worker:0"]["pid"])
        kernels = [psutil.Process(info["pid"]) for info in seen.values()]
        os.kill(server.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(kernels, timeout=10)
        assert not alive, "kernels outlived their fork server"
        wait_for(lambda: all(rt.state == TaskState.DEAD for rt in c.tasks.values()), 20,
                 "the cluster to see its tasks end")
        c.restart()
        again = probe(c)
        assert {info["ppid"] for info in again.values()} != {server.pid}
        assert server_of(again["worker:0"]["pid"]).alive()


def test_what_decides_the_server() -> None:
    py = sys.executable
    base = {"TF_CPP_MIN_LOG_LEVEL": "1", "PATH": "/bin"}
    key = forkserver.ServerKey.of(py, ("tensorflow",), "/w", base, None)
    late = {**base, "TF_CONFIG": "{}", "TFDIST_TASK": "worker:1", "PATH": "/usr/bin"}
    assert forkserver.ServerKey.of(py, ("tensorflow",), "/w", late, None) == key
    for other in (forkserver.ServerKey.of(py, ("tensorflow",), "/w",
                                          {**base, "TF_CPP_MIN_LOG_LEVEL": "3"}, None),
                  forkserver.ServerKey.of(py, ("tensorflow",), "/elsewhere", base, None),
                  forkserver.ServerKey.of(py, ("tensorflow",), "/w", base, 1234),
                  forkserver.ServerKey.of(py, (), "/w", base, None)):
        assert other != key
    assert forkserver.kernel_args([py, "-m", "tfdist_nb.worker.kernel", "-f", "c.json"],
                                  py) == ["-f", "c.json"]
    assert forkserver.kernel_args(["/other/python", "-m", "tfdist_nb.worker.kernel"], py) is None
    assert forkserver.kernel_args([py, "-m", "ipykernel_launcher", "-f", "c.json"], py) is None


def test_a_start_that_times_out_while_the_server_imports_leaves_nothing_and_the_next_forks(
        tmp_path: Path) -> None:
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(6)\n")
    env = {"PYTHONPATH": str(tmp_path)}  # a server of its own, 6 s to import its preload
    with pytest.raises(ClusterStartError, match="start_timeout=2s"):
        Cluster(workers=1, env=env, preload=("slow_import",), run_dir=tmp_path / "a",
                start_timeout=2).start()
    [server] = [s for s in forkserver.live_servers() if s.key.preload == ("slow_import",)]
    assert not server.children, "a kernel was forked for a start given up"
    server.ready.result(timeout=30)
    with Cluster(workers=1, env=env, preload=("slow_import",), run_dir=tmp_path / "b",
                 start_timeout=30) as c:
        assert probe(c)["worker:0"]["ppid"] == server.pid


def test_a_preload_that_hangs_once_does_not_hang_every_later_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import that never returns: the start gives up at its start_timeout; once the module
    is mended, the next start does not wait on the hung server again (it is ended, a new one
    imports the module as it is now)."""
    module = tmp_path / "hangs_once.py"
    module.write_text("import time\ntime.sleep(3600)\n")
    env = {"PYTHONPATH": str(tmp_path)}
    with pytest.raises(ClusterStartError, match="start_timeout=2s"):
        Cluster(workers=1, env=env, preload=("hangs_once",), run_dir=tmp_path / "a",
                start_timeout=2).start()
    [hung] = [s for s in forkserver.live_servers() if s.key.preload == ("hangs_once",)]
    module.write_text("MENDED = True\n")
    monkeypatch.setattr(forkserver, "HUNG_AFTER_S", 1.0)  # a minute in use: not waited out here
    with Cluster(workers=1, env=env, preload=("hangs_once",), run_dir=tmp_path / "b",
                 start_timeout=60) as c:
        assert probe(c)["worker:0"]["ppid"] != hung.pid
    assert not hung.alive()


def test_a_fork_given_up_in_flight_is_killed_when_it_comes(tmp_path: Path) -> None:
    key = forkserver.ServerKey.of(sys.executable, (), os.getcwd(), dict(os.environ), None)
    server = forkserver.ForkServer(key, dict(os.environ))
    try:
        server.ready.result(timeout=60)
        request = server._fork(["-f", str(tmp_path / "kernel.json")], dict(os.environ),
                               str(tmp_path), "python -m tfdist_nb.worker.kernel", [])
        assert request.cancel(), "answered before it could be given up"
        wait_for(lambda: server._exits, 30, "the given-up kernel's exit to be reported")
        assert list(server._exits.values()) == [-signal.SIGKILL] and not server.children
    finally:
        server.close()
    assert not server.alive()


def test_a_preloaded_module_edited_on_disk_is_imported_afresh_at_the_next_restart(
        loud: dict[str, str], tmp_path: Path) -> None:
    """As a spawned kernel would: the server that imported the old code is retired."""
    with Cluster(workers=1, env=loud, preload=("tensorflow", "loud"),
                 run_dir=tmp_path / "runs") as c:
        before = probe(c)["worker:0"]
        old = server_of(before["pid"])
        module = Path(loud["PYTHONPATH"]) / "loud.py"
        module.write_text(LOUD + "EDITED = True\n")
        os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 10**9))
        c.restart()
        after = probe(c)["worker:0"]
        assert after["ppid"] != old.pid and after["loud"] == after["ppid"]
        edited = c.run("import loud; print(getattr(loud, 'EDITED', False))")
        assert edited.tasks["worker:0"].stdout.strip() == "True"
        wait_for(lambda: not old.alive() or not old.children, 10,
                 "the retired server's kernel to end")
        Cluster(workers=1, env=loud, preload=("tensorflow", "loud"),
                run_dir=tmp_path / "again").start().stop()  # the next start sweeps it
        assert not old.alive(), "a retired server with no kernel left was kept"
