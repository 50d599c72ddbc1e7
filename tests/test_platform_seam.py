"""The platform seam (tfdist_nb/host_os.py): every answer Linux's /proc gives has a fallback for a
host without it (macOS), run here by pointing ``host_os.PROC`` at a missing path; each test runs
both ways and asserts what a user sees is the same (docs/reference.md, "Platforms")."""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tests.support.processes import wait_for
from tfdist_nb import Cluster, host_os, portpick
from tfdist_nb.cluster import exposure
from tfdist_nb.cluster.inspector import _process_stopped
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers import forkserver
from tfdist_nb.launchers.local import LocalLauncher, working_directory
from tfdist_nb.worker import adopt

NO_PROC = Path("/nonexistent-proc-tfdist")


@pytest.fixture(params=["proc", "fallback"])
def seam(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Linux's /proc, or none (the fallbacks: psutil and the standard library)."""
    if request.param == "fallback":
        monkeypatch.setattr(host_os, "PROC", NO_PROC)
    assert host_os.has_proc() == (request.param == "proc")
    return str(request.param)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_a_stopped_process_and_a_zombie_are_seen(seam: str,
                                                 sleeper: subprocess.Popen[bytes]) -> None:
    task = SimpleNamespace(pid=sleeper.pid, handle=SimpleNamespace(host="localhost"))
    # running: R, S, or D while exec pages the binary in (seen under CI's load)
    assert host_os.process_state(sleeper.pid) in ("S", "R", "D")
    assert not _process_stopped(task)  # type: ignore[arg-type]  # running: nothing said
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: host_os.process_state(sleeper.pid) == "T", 10, "the stopped state")
    assert _process_stopped(task)  # type: ignore[arg-type]
    os.kill(sleeper.pid, signal.SIGCONT)
    wait_for(lambda: host_os.process_state(sleeper.pid) != "T", 10, "the process to go on")
    os.kill(sleeper.pid, signal.SIGKILL)
    wait_for(lambda: host_os.process_state(sleeper.pid) == "Z", 10, "the zombie")
    # its exit code is in /proc alone (without it the parent's wait says it)
    assert host_os.zombie_status(sleeper.pid) == (-signal.SIGKILL if seam == "proc" else None)
    sleeper.wait(timeout=10)
    assert host_os.process_state(sleeper.pid) is None
    assert host_os.zombie_status(sleeper.pid) is None


def test_a_tf_port_open_on_every_interface_is_named_and_a_loopback_one_is_not(seam: str) -> None:
    with socket.socket() as open_one, socket.socket() as loopback:
        open_one.bind(("0.0.0.0", 0))
        loopback.bind(("127.0.0.1", 0))
        open_one.listen()
        loopback.listen()
        ports = {"worker:0": open_one.getsockname()[1], "worker:1": loopback.getsockname()[1]}
        # the tasks' processes: this one holds both sockets
        tasks = [SimpleNamespace(name=name, address=f"localhost:{port}", handle=object(),
                                 pid=os.getpid()) for name, port in ports.items()]
        found = exposure.open_ports(tasks)  # type: ignore[arg-type]
    assert found == {"worker:0": ports["worker:0"]}
    assert exposure.describe(found).startswith(
        f"TensorFlow's gRPC server of worker:0 (port {ports['worker:0']}) listens on every "
        "interface of this host")
    assert exposure.open_ports(tasks) == {}  # type: ignore[arg-type]  # closed: nothing to say


def test_a_port_another_program_listens_on_is_told_from_a_free_one(seam: str) -> None:
    """What a restart asks before moving a task to fresh ports (LocalLauncher.held_by_another):
    through the seam, every process's listening sockets."""
    launcher = LocalLauncher(fork=False)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert launcher.held_by_another(f"localhost:{port}")
    assert not launcher.held_by_another(f"localhost:{port}")


def test_tf_ports_are_drawn_below_the_hosts_ephemeral_range(seam: str) -> None:
    if seam == "proc":
        linux = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        assert host_os.ephemeral_low() == int(linux)
    else:
        assert host_os.ephemeral_low() == 49152  # IANA's dynamic ports, macOS's range
    drawn = portpick.draw(20)
    assert all(portpick.LOW <= port < host_os.ephemeral_low() for port in drawn)


def test_a_deleted_working_directory_is_refused_in_words(seam: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    assert working_directory() == str(gone)
    gone.rmdir()
    named = str(gone) if seam == "proc" else "(unknown)"
    with pytest.raises(ClusterStartError,
                       match=rf"working directory {re.escape(named)} was deleted.*%cd ~"):
        working_directory()


def test_the_boot_id_is_alike_in_every_process_of_this_boot(seam: str) -> None:
    here = host_os.boot_id()
    assert here is not None
    if seam == "fallback":
        assert here == f"boot-{psutil.boot_time():.0f}"
    force = "" if seam == "proc" else f"host_os.PROC = Path({str(NO_PROC)!r}); "
    other = subprocess.run(
        [sys.executable, "-c", "from pathlib import Path; from tfdist_nb import host_os; "
         f"{force}print(host_os.boot_id())"], capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == here, other.stderr


def test_the_umask_is_read_without_proc_too(seam: str) -> None:
    old = os.umask(0o027)
    try:
        assert host_os.umask() == 0o027
    finally:
        os.umask(old)


@pytest.fixture
def niced_thread() -> Iterator[int]:
    """A thread of this process at nice +5 (a helper thread TensorFlow made while a spare's
    warm-up thread imported it), alive until the test ends; its native id."""
    started, done, tid = threading.Event(), threading.Event(), []

    def run() -> None:
        tid.append(threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, tid[0], os.getpriority(os.PRIO_PROCESS, 0) + 5)
        started.set()
        done.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield tid[0]
    finally:
        done.set()
        thread.join(10)


def test_adopting_a_spare_gives_thread_priorities_back_only_where_they_are_per_thread(
        seam: str, niced_thread: int) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id or 0)
    low = adopt._restore_priority()
    now = os.getpriority(os.PRIO_PROCESS, niced_thread)
    if seam == "fallback":  # a thread id is no priority target: not looked at, nothing said
        assert (low, now) == (0, base + 5)
    elif os.geteuid() == 0:  # root may lower a nice value again
        assert (low, now) == (0, base)
    else:
        assert low >= 1 and now == base + 5


def test_a_spares_warm_up_thread_is_niced_only_where_nice_is_per_thread(
        seam: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"nice_probe_{seam}"
    (tmp_path / f"{name}.py").write_text(
        "import os, threading\nNICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TFDIST_SPARE", "1")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        adopt.warm([name], nice=10)
        niced = sys.modules[name].NICE
    finally:
        sys.modules.pop(name, None)
    # without per-thread nice, nicing the thread would have niced this whole process for good
    assert niced == (base + 10 if seam == "proc" else base)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base


# --------------------------------------------------------------------- no fork server (macOS)
@pytest.fixture
def fresh_fork_answer() -> Iterator[None]:
    forkserver.can_fork.cache_clear()
    yield
    forkserver.can_fork.cache_clear()


def _no_seqpacket_pairs(family: int = socket.AF_UNIX, kind: int = socket.SOCK_STREAM,
                        *args: object) -> object:
    if kind == socket.SOCK_SEQPACKET:  # what macOS answers
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")
    return _socketpair(family, kind, *args)


_socketpair = socket.socketpair


@pytest.mark.parametrize("how", ["no SOCK_SEQPACKET", "socketpair refuses it"])
def test_without_seqpacket_sockets_kernels_are_spawned_and_that_is_said_once(
        how: str, fresh_fork_answer: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    if how == "no SOCK_SEQPACKET":
        monkeypatch.delattr(socket, "SOCK_SEQPACKET")
    else:
        monkeypatch.setattr(socket, "socketpair", _no_seqpacket_pairs)
    caplog.set_level(logging.INFO, logger="tfdist_nb")
    launchers = [LocalLauncher(), LocalLauncher(), LocalLauncher(fork=True)]
    assert not any(launcher.forks(("tensorflow",)) for launcher in launchers)
    said = [r for r in caplog.records if "no fork server" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert said[0].getMessage().endswith(
        "every local task kernel is spawned, and each task imports TensorFlow itself: ~3-6 s "
        "of CPU per start")


def test_where_seqpacket_sockets_exist_kernels_are_forked_and_nothing_is_said(
        fresh_fork_answer: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tfdist_nb")
    assert LocalLauncher().forks(("tensorflow",))
    assert not LocalLauncher(fork=False).forks(("tensorflow",))
    assert not [r for r in caplog.records if "fork server" in r.getMessage()]


def test_spawning_by_choice_says_nothing_of_the_platform(
        fresh_fork_answer: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(socket, "SOCK_SEQPACKET")
    monkeypatch.setenv("TFDIST_FORK", "off")
    caplog.set_level(logging.DEBUG, logger="tfdist_nb")
    assert not LocalLauncher().forks(("tensorflow",))
    assert not LocalLauncher(fork=False).forks(("tensorflow",))
    assert not [r for r in caplog.records if "fork server" in r.getMessage()]


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_without_seqpacket_sockets_a_cluster_starts_its_kernels_as_processes_of_their_own(
        fresh_fork_answer: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(socket, "SOCK_SEQPACKET")
    servers = set(map(id, forkserver.live_servers()))
    with Cluster(workers=1, run_dir=tmp_path) as c:
        result = c.run("import os\nprint(os.getppid())")
        assert result.ok, result.summary()
        assert int(result.tasks["worker:0"].stdout) == os.getpid()  # spawned, not forked
    assert set(map(id, forkserver.live_servers())) <= servers  # no server was made
