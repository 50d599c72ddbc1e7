"""Local task kernels forked from a fork server (docs/design.md, "Fork server"): a forked kernel
has everything a spawned one has, the preload is imported once, a restart forks again from the
same server, and what the server cannot serve is spawned as before."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers import fork_handle, forkserver
from tfdist_nb.launchers.kernel_key import KernelKey

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


def server_of(pid: int) -> fork_handle.ForkServer:
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
        # each end is said with its cause: the server, named
        ends = c.logs(grep="while no cell was running").text.tolist()
        assert len(ends) == 2 and all(
            f"ended with its parent: the fork server (pid {server.pid}) was killed by SIGKILL"
            in text for text in ends), ends
        c.restart()
        again = probe(c)
        assert {info["ppid"] for info in again.values()} != {server.pid}
        assert server_of(again["worker:0"]["pid"]).alive()


@pytest.mark.timeout(240)
def test_a_stopped_server_is_named_retired_and_the_restart_spawns(
        loud: dict[str, str], tmp_path: Path) -> None:
    """A SIGSTOPped server reaps and reports nothing: a task killed meanwhile is seen dead at
    once (its zombie's status), its end names the server, and the restart spawns its kernels
    instead of waiting on the server until start_timeout (docs/design.md, "Fork server")."""
    with Cluster(workers=2, env=loud, preload=("tensorflow", "loud"), run_dir=tmp_path / "runs",
                 start_timeout=60) as c:
        seen = probe(c)
        server = server_of(seen["worker:0"]["pid"])
        os.kill(server.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: psutil.Process(server.pid).status() == psutil.STATUS_STOPPED, 10,
                     "the server to stop")
            os.kill(seen["worker:1"]["pid"], signal.SIGKILL)
            tasks = {rt.name: rt for rt in c.tasks.values()}
            wait_for(lambda: tasks["worker:1"].state == TaskState.DEAD, 10,
                     "the cluster to see worker:1 end")
            [end] = c.logs(grep="worker:1 killed by SIGKILL").text.tolist()
            assert f"the fork server (pid {server.pid}) was stopped (SIGSTOP)" in end, end
            began = time.monotonic()
            c.restart()
            assert time.monotonic() - began < 45, "the restart waited on the stopped server"
            again = probe(c)
            assert {info["ppid"] for info in again.values()} == {os.getpid()}, "not spawned"
            said = c.logs(grep="fork server").text.tolist()
            assert sum(f"the fork server (pid {server.pid}) was stopped (SIGSTOP): retired"
                       in text for text in said) == 1, said
            assert server not in forkserver.live_servers()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)
    wait_for(lambda: not server.alive(), 10, "the retired server to end")


def test_what_decides_the_server() -> None:
    py = sys.executable
    base = {"TF_CPP_MIN_LOG_LEVEL": "1", "PATH": "/bin"}

    def server(env: dict[str, str] = base, cwd: str = "/w", net: int | None = None,
               preload: tuple[str, ...] = ("tensorflow",)) -> fork_handle.ServerKey:
        return fork_handle.ServerKey.on(KernelKey.of(py, preload, cwd, env), net)

    key = server()
    late = {**base, "TF_CONFIG": "{}", "TFDIST_TASK": "worker:1", "PATH": "/usr/bin"}
    assert server(late) == key
    for other in (server({**base, "TF_CPP_MIN_LOG_LEVEL": "3"}),
                  # NumPy reads these at its import, which a forked kernel cannot redo
                  server({**base, "NUMPY_MADVISE_HUGEPAGE": "0"}),
                  server({**base, "TF2_BEHAVIOR": "0"}),
                  server(cwd="/elsewhere"), server(net=1234), server(preload=())):
        assert other != key
    assert forkserver.kernel_args([py, "-m", "tfdist_nb.worker.kernel", "-f", "c.json"],
                                  py) == ["-f", "c.json"]
    assert forkserver.kernel_args(["/other/python", "-m", "tfdist_nb.worker.kernel"], py) is None
    assert forkserver.kernel_args([py, "-m", "ipykernel_launcher", "-f", "c.json"], py) is None


def test_what_the_servers_import_set_in_its_environment_reaches_each_task() -> None:
    """As a spawned kernel's import would set it (TensorFlow's ``TF2_BEHAVIOR``), unless the
    task gives the variable a value of its own."""
    from tfdist_nb.launchers.zygote import Imported

    imported = Imported({"SET": "old", "GONE": "x", "KEPT": "k"},
                        {"SET": "new", "NEW": "1", "KEPT": "k"}, ())
    assert imported.env({"SET": "old", "GONE": "x", "KEPT": "k", "MINE": "m"}) == {
        "SET": "new", "NEW": "1", "KEPT": "k", "MINE": "m"}
    assert imported.env({"SET": "task's", "NEW": "task's", "GONE": "task's"}) == {
        "SET": "task's", "NEW": "task's", "GONE": "task's"}


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
    monkeypatch.setattr(fork_handle, "HUNG_AFTER_S", 1.0)  # a minute in use: not waited out here
    with Cluster(workers=1, env=env, preload=("hangs_once",), run_dir=tmp_path / "b",
                 start_timeout=60) as c:
        assert probe(c)["worker:0"]["ppid"] != hung.pid
    assert not hung.alive()


def test_a_fork_given_up_in_flight_is_killed_when_it_comes(tmp_path: Path) -> None:
    key = fork_handle.ServerKey.on(
        KernelKey.of(sys.executable, (), os.getcwd(), dict(os.environ)), None)
    server = fork_handle.ForkServer(key, dict(os.environ))
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


def test_a_start_waiting_on_a_server_that_stops_gives_up_at_once_naming_it(
        tmp_path: Path) -> None:
    """Not at the start's own timeout: the server is watched while a fork is asked of it."""
    import asyncio

    key = fork_handle.ServerKey.on(
        KernelKey.of(sys.executable, (), os.getcwd(), dict(os.environ)), None)
    server = fork_handle.ForkServer(key, dict(os.environ))
    try:
        server.ready.result(timeout=60)
        os.kill(server.pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(server.pid).status() == psutil.STATUS_STOPPED, 10,
                 "the server to stop")
        began = time.monotonic()
        with pytest.raises(fork_handle.ServerTrouble,
                           match=rf"the fork server \(pid {server.pid}\) was stopped"):
            asyncio.run(server.spawn(["-f", str(tmp_path / "kernel.json")], dict(os.environ),
                                     str(tmp_path), "python -m tfdist_nb.worker.kernel", []))
        assert time.monotonic() - began < 5
    finally:
        server.close()
    assert not server.alive() and not server.children, "the fork asked of it was made"


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


# --------------------------------------------------------- a forked task is a spawned one
OBSERVE = """\
import faulthandler, json, logging, os, signal, sys, warnings
import absl.logging

def _logger(name):
    lg = logging.getLogger(name)
    return {"level": lg.level, "effective": lg.getEffectiveLevel(), "propagate": lg.propagate,
            "handlers": [[type(h).__name__, h.level, type(getattr(h, "stream", None)).__name__,
                          getattr(getattr(h, "stream", None), "name", None),
                          getattr(h.formatter, "_fmt", None)] for h in lg.handlers]}

def _signal(s):
    h = signal.getsignal(s)
    return getattr(h, "__qualname__", str(h))

print(json.dumps({
    "tensorflow": _logger("tensorflow"), "root": _logger(None), "absl": _logger("absl"),
    "absl_verbosity": absl.logging.get_verbosity(),
    "absl_stream": type(absl.logging.get_absl_handler().python_handler.stream).__name__,
    "logger_class": logging.getLoggerClass().__name__,
    "filters": [repr(f) for f in warnings.filters], "warnoptions": sys.warnoptions,
    "argv": [os.path.basename(a) for a in sys.argv],
    "signals": {s.name: _signal(s) for s in signal.valid_signals()
                if isinstance(s, signal.Signals)},
    "faulthandler": faulthandler.is_enabled(), "ps1": getattr(sys, "ps1", None),
    "TF2_BEHAVIOR": os.environ.get("TF2_BEHAVIOR")}))
"""
ALL_REDUCE = """\
import tensorflow as tf
s = tf.distribute.MultiWorkerMirroredStrategy()
@tf.function
def f():
    return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))
print(s.run(f))
"""


@pytest.mark.timeout(300)
def test_a_forked_task_sets_up_logging_warnings_argv_and_signals_as_a_spawned_one(
        tmp_path: Path) -> None:
    """docs/design.md, "Fork server": TensorFlow's import ran in the server, before any kernel
    existed; what it set up (its Python logger: INFO, on the kernel's stdout where IPython
    made a prompt) is made again in the kernel, so its INFO lines reach the merged log
    (``%tfdist_logs --level INFO``) as a spawned task's do."""
    seen: dict[bool, dict[str, Any]] = {}
    for fork in (True, False):
        with Cluster(workers=2, launcher_options={"fork": fork},
                     run_dir=tmp_path / f"fork-{fork}") as c:
            observed = c.run(OBSERVE)
            assert observed.ok, observed.summary()
            [seen[fork]] = {r.stdout for r in observed.tasks.values()}  # the same on each task
            pids = {rt.pid for rt in c.tasks.values()}
            forked = {pid for s in forkserver.live_servers() for pid in s.children}
            assert (pids <= forked) if fork else not (pids & forked)
            reduced = c.run(ALL_REDUCE)
            assert reduced.ok, reduced.summary()
            lines = c.logs(level="INFO", grep="INFO:tensorflow:Collective all_reduce")
            assert set(lines.task) == {"worker:0", "worker:1"}, (fork, c.logs(level="INFO"))
    forked_sees, spawned_sees = (json.loads(seen[fork]) for fork in (True, False))
    assert forked_sees["TF2_BEHAVIOR"] == "1", "the import's own variable was dropped"
    assert forked_sees["tensorflow"]["effective"] == logging.INFO
    for key, value in spawned_sees.items():
        assert forked_sees[key] == value, key


# --------------------------------------------------------- a forked task is a fresh process
LIMITS = ("import os, resource, sys\nmask = os.umask(0)\nos.umask(mask)\n"
          "print(mask, *resource.getrlimit(resource.RLIMIT_NOFILE), hash('tfdist'),"
          " os.getppid())")


def limits(cluster: Any) -> tuple[int, ...]:
    result = cluster.run(LIMITS)
    assert result.ok, result.summary()
    return tuple(int(word) for word in result.tasks["worker:0"].stdout.split())


@pytest.mark.timeout(240)
def test_a_forked_task_takes_the_controllers_umask_and_limits_when_it_starts(
        loud: dict[str, str], tmp_path: Path) -> None:
    """As a spawned kernel inherits them at its start, not as the server had them at its own;
    with PYTHONHASHSEED set, its string hashes are a spawned kernel's (docs/design.md, "Fork
    server": without it, every task of one server shares the server's seed)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    mask = os.umask(0o022)
    env = {**loud, "PYTHONHASHSEED": "123"}
    spawned_hash = int(subprocess.run(
        [sys.executable, "-c", "print(hash('tfdist'))"], env={**os.environ, **env}, check=True,
        capture_output=True, text=True).stdout)
    try:
        with Cluster(workers=1, env=env, preload=("tensorflow", "loud"),
                     run_dir=tmp_path / "runs") as c:
            first = limits(c)
            assert first[:4] == (0o022, soft, hard, spawned_hash)
            [task] = c.tasks.values()
            server = server_of(task.pid)
            assert first[4] == server.pid
            os.umask(0o027)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 7, hard))
            c.restart()
            again = limits(c)
            assert again[4] == server.pid, "not forked from the same server"
            assert again[:4] == (0o027, soft - 7, hard, spawned_hash)
    finally:
        os.umask(mask)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_a_stop_lets_a_tasks_threads_and_exit_handlers_finish(fork: bool,
                                                              tmp_path: Path) -> None:
    """A kernel's normal end (the stop's shutdown request) is an interpreter's: its non-daemon
    threads are waited for, then its exit handlers run, forked or spawned."""
    thread_file, exit_file = tmp_path / "thread", tmp_path / "atexit"
    code = (f"import atexit, os, threading, time\n"
            f"def late():\n    time.sleep(0.5)\n    open({str(thread_file)!r}, 'w').write('done')\n"
            f"threading.Thread(target=late).start()\n"
            f"atexit.register(lambda: open({str(exit_file)!r}, 'w').write("
            f"str(os.path.exists({str(thread_file)!r}))))\n")
    with Cluster(workers=1, launcher_options={"fork": fork}, run_dir=tmp_path / "runs") as c:
        [task] = c.tasks.values()
        pid = task.pid
        assert c.run(code).ok
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert thread_file.read_text() == "done", "the thread was cut at stop"
    assert exit_file.read_text() == "True", "exit handlers ran before the threads ended"


# --------------------------------------------------------- idle servers end
def fork_servers() -> list[psutil.Process]:
    """This process's fork server processes (a zombie being reaped is none)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "tfdist_nb.launchers.zygote" in " ".join(proc.cmdline()):
                found.append(proc)
    return found


@pytest.mark.timeout(180)
def test_a_server_left_without_kernels_ends_after_tfdist_fork_idle_s(
        loud: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle server holds some 570 MB of its own (docs/performance.md): kept for the next
    start for ``TFDIST_FORK_IDLE_S``, then ended; never while it has a kernel."""
    monkeypatch.setenv("TFDIST_FORK_IDLE_S", "1")
    with Cluster(workers=1, env=loud, preload=("tensorflow", "loud"),
                 run_dir=tmp_path / "runs") as c:
        server = server_of(probe(c)["worker:0"]["pid"])
        time.sleep(2.5)  # the idle time, twice over: a server with a kernel stays
        assert server.alive() and probe(c)["worker:0"]["ppid"] == server.pid
    wait_for(lambda: not fork_servers(), 20, "every idle fork server to end")
    assert not server.alive() and server not in forkserver.live_servers()


def test_with_memory_short_an_idle_server_ends_at_once_never_one_with_a_kernel(
        loud: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a container's limit with less left than one TensorFlow task needs, the idle
    server's own ~570 MB are what the next start wants: it is ended as soon as it has no kernel,
    not after TFDIST_FORK_IDLE_S (the memory reading is the one thing faked: a real limit would
    starve the test's own kernels)."""
    monkeypatch.setenv("TFDIST_FORK_IDLE_S", "300")
    monkeypatch.setattr(forkserver, "IDLE_LOOK_S", 0.2)  # the watch's longest sleep
    with Cluster(workers=1, env=loud, preload=("tensorflow", "loud"),
                 run_dir=tmp_path / "runs") as c:
        server = server_of(probe(c)["worker:0"]["pid"])
        monkeypatch.setattr(forkserver, "available_mb", lambda: 100.0)
        time.sleep(1.0)  # several looks of the idle watch while the server has a kernel
        assert server.alive() and probe(c)["worker:0"]["ppid"] == server.pid
    wait_for(lambda: not server.alive(), 15, "the idle server to end with memory short")
    assert server not in forkserver.live_servers()


def test_a_misspelt_idle_time_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist_nb.launchers.local import LocalLauncher

    monkeypatch.setenv("TFDIST_FORK_IDLE_S", "5min")
    with pytest.raises(ValueError, match="TFDIST_FORK_IDLE_S=5min"):
        LocalLauncher(fork=True)
    LocalLauncher(fork=False)  # not read when nothing is forked
    monkeypatch.setenv("TFDIST_FORK_IDLE_S", "0")
    assert forkserver.idle_after_s() == 0.0
    monkeypatch.delenv("TFDIST_FORK_IDLE_S")
    assert forkserver.idle_after_s() == forkserver.IDLE_S


AUTOGRAPH = """
import tempfile, tensorflow as tf
@tf.function
def f(x):
    if x > 0:  # converted by autograph: its code is written to a temporary file
        return x
    return -x
f(tf.constant(1.0))
import glob, os
print(tempfile.gettempdir(), len(glob.glob(os.path.join(tempfile.gettempdir(), '__autograph*'))))
"""


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_a_tasks_temporary_files_go_with_it_also_after_a_restart_kills_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: bool) -> None:
    """TensorFlow's autograph writes the user's converted code to temporary files it removes
    at exit; a restart SIGKILLs the task, so they piled up in /tmp (0600, the user's code).
    Each task's are in a directory of its own, gone once the next task starts."""
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    with Cluster(workers=1, warm=False, launcher_options={"fork": fork}) as c:
        out = c.run(AUTOGRAPH).tasks["worker:0"].stdout.split()
        own, files = Path(out[0]), int(out[1])
        assert own.parent == system_tmp and own.name.startswith("tfdist-task-") and files >= 1
        assert oct(own.stat().st_mode & 0o777) == "0o700"
        c.restart()
        again = Path(c.run(AUTOGRAPH).tasks["worker:0"].stdout.split()[0])
        assert again != own and not own.exists()  # the killed task's went
    assert not again.exists()  # and a stopped one's at its exit
    assert not list(system_tmp.glob("__autograph*"))


@pytest.mark.timeout(180)
def test_at_interpreter_exit_forked_tasks_end_through_the_stop_path_before_their_server(
        tmp_path: Path) -> None:
    """A script that never stops its cluster: at exit the session stops the cluster first
    (each task told, its atexit handlers run), then ends the fork server (the one close owns
    the order: a server ended first would take its kernels with it, their handlers unrun)."""
    import subprocess
    import sys

    marker = tmp_path / "said-goodbye"
    cell = f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').write('bye'))"
    script = (
        "from tfdist_nb import Cluster\n"
        "c = Cluster(workers=1, warm=False, launcher_options={'fork': True}).start()\n"
        f"r = c.run({cell!r})\n"
        "assert r.ok, r.summary()\n"
        "from tfdist_nb.launchers import forkserver\n"
        "assert forkserver.live_servers()\n")
    env = {**os.environ, "TFDIST_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert marker.read_text() == "bye"


def test_the_servers_idle_warm_up_finds_every_file_and_starts_no_tensorflow_runtime() -> None:
    """The warm-up before later forks (IPython's traceback machinery, TensorFlow's error paths
    parsed) runs no op and no thread: a fork after it is still a fork before any runtime. Every
    listed module exists in this TensorFlow, so a release that moves one fails here, not as a
    slower first traceback nobody sees."""
    code = ("import json, threading, tensorflow\n"
            "from tensorflow.python.eager import context\n"
            "from tfdist_nb.launchers import zygote\n"
            "steps, threads = zygote.traceback_warm_up(), threading.active_count()\n"
            "for step in steps:\n"
            "    step()\n"
            "print(json.dumps({'steps': len(steps), 'context': context.context()._initialized,\n"
            "    'threads': threading.active_count() - threads}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    from tfdist_nb.launchers.zygote import TRACEBACK_MODULES

    assert json.loads(done.stdout.splitlines()[-1]) == {
        "steps": 1 + len(TRACEBACK_MODULES), "threads": 0, "context": False}


def test_a_forked_tasks_garbage_collection_leaves_the_servers_pages_shared() -> None:
    """A full collection in a task walks what the task holds, not TensorFlow's import in the
    server: the task's own memory (USS) stays as it was, where it took 80 MB before."""
    with Cluster(workers=1, warm=False) as c:
        result = c.run("import gc, psutil\n"
                       "me = psutil.Process()\n"
                       "before = me.memory_full_info().uss\n"
                       "gc.collect()\n"
                       "print('grew', (me.memory_full_info().uss - before) / 2**20)")
        assert result.ok, result.summary()
        grew = float(result.tasks["worker:0"].stdout.split()[-1])
        assert grew < 16, f"a collection made {grew:.0f} MB of the server's pages the task's own"
