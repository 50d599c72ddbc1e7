"""What a hostile neighbour or a careless path must not get (docs/security.md), checked for real.

- run directories: only what tfdist_nb creates is made ``0700``; a base the user points at keeps
  its mode (and /tmp its sticky bit); every file of a run, as a real run leaves it, is owner-only;
- SSH: a host that looks like an option (``-oProxyCommand=...``) is refused, from the API and
  from the magic, and its command never runs; the launcher's own ssh config option;
- attach: the connection directory must be the user's and writable by nobody else (worker and
  controller), files are never written through planted paths, a network ``--ip`` needs
  CurveZMQ, and a pid from a sidecar is never signalled unless it is still that worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.notebooks import cell_text, run_notebook
from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.launchers import ssh as ssh_launcher
from tfdist_nb.launchers.attach import AttachedTaskHandle, worker_process
from tfdist_nb.store.rundir import RunDirectory, new_cluster_id
from tfdist_nb.worker.__main__ import boot_id, is_loopback, write_private

pytestmark = pytest.mark.timeout(120)
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user "
                                                          "(chown nobody) needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def not_owner_only(top: Path) -> list[str]:
    """Every directory and file under ``top`` (itself included) that group or others can use."""
    found = [f"{top} {mode(top):04o}"] if mode(top) & 0o077 else []
    for where, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(where) / name
            if mode(path) & 0o077 or path.is_symlink():
                found.append(f"{path} {mode(path):04o}")
    return found


def nobody_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return path


# ---------------------------------------------------------------- run directory

@pytest.mark.parametrize("base_mode", [0o755, 0o1777], ids=["0755", "sticky-1777"])
def test_an_existing_base_keeps_its_mode_and_the_run_is_owner_only(
        tmp_path: Path, base_mode: int) -> None:
    base = tmp_path / "shared"
    base.mkdir()
    base.chmod(base_mode)
    rd = RunDirectory(base, new_cluster_id())
    try:
        rd.write_json("worker-0", "env.json", {"SECRET": "x"})
        rd.write_cell(1, "print(1)", ["worker:0"])
    finally:
        rd.close()
    assert mode(base) == base_mode  # was chmodded to 0700 before: /tmp lost its sticky bit
    assert mode(rd.path) == 0o700
    assert not not_owner_only(rd.path)
    assert {p.name for p in rd.path.rglob("*")} >= {"events.jsonl", "cells.jsonl", "env.json"}


def test_a_missing_base_is_made_owner_only_component_by_component(tmp_path: Path) -> None:
    base = tmp_path / "made" / "by" / "tfdist"
    rd = RunDirectory(base, new_cluster_id())
    rd.close()
    for made in (tmp_path / "made", tmp_path / "made" / "by", base, rd.path):
        assert mode(made) == 0o700, made


@NEEDS_ROOT
def test_a_cluster_dir_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    cid = new_cluster_id()
    nobody_dir(tmp_path / cid)
    with pytest.raises(PermissionError, match="not a directory of this user"):
        RunDirectory(tmp_path, cid)
    (tmp_path / "elsewhere").mkdir()
    cid2 = new_cluster_id() + "b"
    (tmp_path / cid2).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="not a directory of this user"):
        RunDirectory(tmp_path, cid2)
    assert not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.user
@pytest.mark.cluster
def test_a_real_run_leaves_only_owner_only_files_in_a_0755_run_dir(tmp_path: Path) -> None:
    base = tmp_path / "project"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    with Cluster(workers=1, preload=(), run_dir=base) as c:
        result = c.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
        assert result.ok, result.summary()
        run = Path(c.run_dir)  # type: ignore[arg-type]
        names = {p.name for p in run.rglob("*")}
        assert {"kernel.log", "env.json", "tf_config.json", "events.jsonl"} <= names, names
        assert any("connection" in n for n in names), names  # the key, while the task runs
        assert not not_owner_only(run)
    assert not not_owner_only(run)
    assert mode(base) == 0o755


# ---------------------------------------------------------------- ssh destinations and config

@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file that only a ProxyCommand smuggled in as a host would create."""
    path = tmp_path / "proxy-command-ran"
    yield path
    assert not path.exists(), "ssh ran a command given as a host name"


@pytest.mark.parametrize("host", ["-oProxyCommand=touch {marker}", "-F/dev/null",
                                  "me@-oProxyCommand=touch {marker}", "gpu1 -v", ""])
def test_hosts_that_ssh_would_read_as_options_are_refused(host: str, marker: Path) -> None:
    host = host.format(marker=marker)
    with pytest.raises(SpecError, match=r"ssh host .*(starts with '-'|spaces)|non-empty"):
        Cluster(workers=2, launcher="ssh", hosts=["gpu1", host])
    with pytest.raises(ValueError, match="ssh host"):
        ssh_launcher.probe_host(host, 1, sys.executable, ["ssh"], 10)  # nothing is run either


def test_ssh_config_comes_from_the_option_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.write_text("Host gpu1\n    HostName 10.0.0.1\n")
    other.write_text("")
    monkeypatch.delenv("TFDIST_SSH_CONFIG", raising=False)
    plain = ssh_launcher.SSHLauncher(hosts=["gpu1"])
    assert "-F" not in plain.base  # ~/.ssh/config as usual
    opt = ssh_launcher.SSHLauncher(hosts=["gpu1"], ssh_config=mine)
    assert opt.base[opt.base.index("-F") + 1] == str(mine)
    monkeypatch.setenv("TFDIST_SSH_CONFIG", str(other))
    env = ssh_launcher.SSHLauncher(hosts=["gpu1"])
    assert env.base[env.base.index("-F") + 1] == str(other)
    assert "TFDIST_SSH_CONFIG" not in env.base_environment()  # a path here, not on the hosts
    both = ssh_launcher.SSHLauncher(hosts=["gpu1"], ssh_config=mine)  # the option wins
    assert both.base[both.base.index("-F") + 1] == str(mine)
    with pytest.raises(SpecError, match=r"ssh_config names '.*nowhere', which is not a file"):
        Cluster(workers=1, launcher="ssh", hosts=["gpu1"],
                launcher_options={"ssh_config": tmp_path / "nowhere"})
    monkeypatch.setenv("TFDIST_SSH_CONFIG", str(tmp_path / "gone"))
    with pytest.raises(SpecError, match=r"\$TFDIST_SSH_CONFIG names '.*gone'"):
        Cluster(workers=1, launcher="ssh", hosts=["gpu1"])


@pytest.mark.cluster
def test_the_magic_refuses_an_option_as_host(tmp_path: Path, marker: Path) -> None:
    nb = run_notebook([
        "%load_ext tfdist_nb",
        f"%%tfcluster 1 worker --hosts 'tfdhost1,-oProxyCommand=touch {marker}' "
        "--no-dashboard\nprint('never')",
    ], tmp_path)
    # IPython shows a UsageError as one message (no traceback), on stderr
    said = cell_text(nb.cells[1])
    assert "UsageError: " in said, nb.cells[1].outputs
    assert "-oProxyCommand" in said and "starts with '-'" in said
    assert "Traceback" not in said and "never" not in said


# ---------------------------------------------------------------- attach

def run_worker(directory: Path, *args: str, code: str | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """``python -m tfdist_nb.worker`` (or ``code`` calling its main) for a refusal: it exits."""
    head = ["-c", code] if code else ["-m", "tfdist_nb.worker"]
    return subprocess.run([sys.executable, *head, "--task", "worker:0", "--connection-dir",
                           str(directory), *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.cluster
def test_a_group_writable_connection_dir_is_refused_by_worker_and_controller(
        tmp_path: Path) -> None:
    shared = tmp_path / "connect"
    shared.mkdir()
    shared.chmod(0o770)
    done = run_worker(shared)
    assert done.returncode == 2, done.stderr
    assert "writable by group or others (mode 0770)" in done.stderr
    assert not list(shared.iterdir())
    with pytest.raises(SpecError, match="writable by group or others"):
        Cluster(workers=1, launcher="attach", launcher_options={"connection_dir": shared})
    # and when it turns so only after the Cluster was made, at start
    shared.chmod(0o700)
    c = Cluster(workers=1, launcher="attach", preload=(),
                launcher_options={"connection_dir": shared, "wait_timeout": 30})
    shared.chmod(0o775)
    with pytest.raises(ClusterStartError, match="writable by group or others"):
        c.start()
    assert not c.running


@pytest.mark.cluster
@NEEDS_ROOT
def test_a_connection_dir_of_another_user_is_refused_by_worker_and_controller(
        tmp_path: Path) -> None:
    theirs = nobody_dir(tmp_path / "theirs")
    done = run_worker(theirs)
    assert done.returncode == 2, done.stderr
    assert "belongs to nobody" in done.stderr
    assert not list(theirs.iterdir())
    with pytest.raises(SpecError, match="belongs to nobody"):
        Cluster(workers=1, launcher="attach", launcher_options={"connection_dir": theirs})


@pytest.mark.cluster
def test_a_network_ip_without_curvezmq_is_refused(tmp_path: Path) -> None:
    """Where zmq has CurveZMQ (as here, asserted), its absence is simulated at the module
    boundary: ``zmq.has('curve')`` answers False inside the worker process, nothing else."""
    import zmq

    code = "import sys\nfrom tfdist_nb.worker.__main__ import main\nmain(sys.argv[1:])"
    if zmq.has("curve"):
        code = ("import zmq\nreal = zmq.has\nzmq.has = lambda f: f != 'curve' and real(f)\n"
                + code)
    directory = tmp_path / "connect"
    for ip in ("0.0.0.0", "10.1.2.3", "node7.cluster"):
        done = run_worker(directory, "--ip", ip, code=code)
        assert done.returncode == 2, done.stderr
        assert f"--ip {ip} would open the kernel's channels to the network" in done.stderr
        assert "has no CurveZMQ" in done.stderr
        assert not directory.exists()  # refused before anything was made
    assert [is_loopback(a) for a in ("127.0.0.1", "127.9.9.9", "::1", "localhost")] == [True] * 4
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "10.1.2.3", "node7"))


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Attached workers a test starts; ended (and waited for) whatever the test did."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.cluster
def test_the_worker_tightens_its_own_dir_and_writes_through_no_planted_path(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    directory = tmp_path / "connect"
    directory.mkdir()
    directory.chmod(0o755)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    # The names a worker used to write through, planted (as by someone who could write here
    # before the directory was made private): the old predictable temp names and the finals.
    for name in ("worker-0.tfdist.json.tmp", "worker-0.json.tmp", "worker-0.json"):
        (directory / name).symlink_to(victim)
    worker.append(subprocess.Popen(
        [sys.executable, "-m", "tfdist_nb.worker", "--task", "worker:0", "--connection-dir",
         str(directory)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL))
    sidecar = directory / "worker-0.tfdist.json"
    wait_for(sidecar.exists, 60, "the worker's sidecar")
    assert mode(directory) == 0o700
    assert victim.read_text() == "untouched"
    for name in ("worker-0.json", "worker-0.tfdist.json"):
        assert stat.S_ISREG((directory / name).lstat().st_mode) and mode(directory / name) == 0o600
    info = json.loads(sidecar.read_text())
    assert info["pid"] == worker[0].pid
    assert info["create_time"] == pytest.approx(psutil.Process(worker[0].pid).create_time())
    with Cluster(workers=1, launcher="attach", preload=(),
                 launcher_options={"connection_dir": directory}) as c:
        assert c.run("print('attached')").tasks["worker:0"].stdout.strip() == "attached"
    assert worker[0].wait(30) is not None
    assert victim.read_text() == "untouched"


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process of this user (``sleep 300``, exec'd already), ended afterwards."""
    proc = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: psutil.Process(proc.pid).cmdline() == ["sleep", "300"], 10,
                 "the bystander to exec sleep")
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def _forged_sidecar(directory: Path, pid: int, create_time: float) -> Path:
    """A sidecar and connection file for worker:0 as a worker would write them, but naming
    ``pid`` (a worker that died and whose pid now belongs to someone else, say)."""
    directory.mkdir(mode=0o700)
    conn = directory / "worker-0.json"
    write_private(conn, {"ip": "127.0.0.1", "transport": "tcp", "key": "k" * 32,
                         "signature_scheme": "hmac-sha256", "shell_port": 1, "iopub_port": 2,
                         "stdin_port": 3, "control_port": 4, "hb_port": 5})
    sidecar = directory / "worker-0.tfdist.json"
    write_private(sidecar, {"task": "worker:0", "connection_file": str(conn),
                            "tf_address": "localhost:1", "pid": pid, "create_time": create_time,
                            "hostname": socket.gethostname(), "boot_id": boot_id()})
    return sidecar


@pytest.mark.parametrize("shift", [0.0, -100.0], ids=["its-start-time", "another-start-time"])
def test_a_sidecar_pid_of_an_unrelated_process_is_never_signalled(
        tmp_path: Path, shift: float, bystander: subprocess.Popen[bytes]) -> None:
    started = psutil.Process(bystander.pid).create_time()
    directory = tmp_path / "connect"
    sidecar = _forged_sidecar(directory, bystander.pid, started + shift)
    ours, why = worker_process(bystander.pid, started + shift, "worker:0")
    assert not ours
    assert ("runs 'sleep 300', not the worker of worker:0" if shift == 0
            else "is now another process") in why
    c = Cluster(workers=1, launcher="attach", preload=(),
                launcher_options={"connection_dir": directory, "wait_timeout": 1})
    with pytest.raises(ClusterStartError, match=rf"no attached worker for worker:0 .*"
                                                rf"ignored: worker:0: .*pid {bystander.pid}"):
        c.start()
    assert bystander.poll() is None

    # Past the attach check too (the pid reused after the worker was attached): stop and
    # interrupt leave it alone.
    from jupyter_client.asynchronous import AsyncKernelClient

    from tfdist_nb.topology import TaskId

    client = AsyncKernelClient()
    client.load_connection_file(str(directory / "worker-0.json"))
    handle = AttachedTaskHandle(task=TaskId("worker", 0), host=socket.gethostname(),
                                pid=bystander.pid, client=client,
                                connection_file=directory / "worker-0.json",
                                sidecar=sidecar, here=True, create_time=started + shift)

    async def interrupt_then_stop() -> Any:
        await handle.interrupt()
        return await handle.stop(0.5)

    report = asyncio.run(interrupt_then_stop())
    assert report.path == "already-dead"
    assert bystander.poll() is None, "an unrelated process was signalled"
    assert psutil.Process(bystander.pid).status() != psutil.STATUS_STOPPED


def test_attached_files_open_to_others_are_not_trusted(
        tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    directory = tmp_path / "connect"
    sidecar = _forged_sidecar(directory, bystander.pid,
                              psutil.Process(bystander.pid).create_time())
    sidecar.chmod(0o644)
    c = Cluster(workers=1, launcher="attach", preload=(),
                launcher_options={"connection_dir": directory, "wait_timeout": 1})
    with pytest.raises(ClusterStartError, match=r"worker-0.tfdist.json is open to group or "
                                                r"others \(mode 0644\)"):
        c.start()
    assert bystander.poll() is None


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_a_link_or_fifo_planted_in_the_run_directory_is_replaced_not_followed_or_waited_on(
        tmp_path: Path, planted: str) -> None:
    """events.jsonl and a task's kernel.log replaced by a link (to a file of someone else's
    choosing) or a FIFO while the cluster runs: the next cell runs and is logged, nothing is
    written through the link, no open waits on the FIFO, the logs are the cluster's own
    (what was written before included), and an alert says what was replaced."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("not the cluster's\n")

    def plant(path: Path) -> None:
        path.unlink()
        if planted == "symlink":
            path.symlink_to(target)
        else:
            os.mkfifo(path)

    with Cluster(workers=1, preload=(), warm=False, run_dir=tmp_path / "runs",
                 start_timeout=60) as c:
        assert c.run("print('before', flush=True)").ok
        assert c.run_dir is not None
        plant(c.run_dir / "events.jsonl")
        after = c.run("print('after', flush=True)")
        assert after.ok, after.summary()
        said = [a for a in c.alerts() if "events.jsonl in the run directory" in a]
        assert said and "made a new one with everything written before" in said[0], c.alerts()
        texts = list(c.logs()["text"])
        assert "before" in texts and "after" in texts and "not the cluster's" not in texts
        assert stat.S_ISREG(os.lstat(c.run_dir / "events.jsonl").st_mode)
        log = c.tasks[next(iter(c.tasks))].log_path
        assert log is not None
        plant(log)
        c.restart()  # the task's process log is opened again: never through the link or FIFO
        assert c.run("print('restarted', flush=True)").ok
        assert stat.S_ISREG(os.lstat(log).st_mode)
    assert target.read_text() == "not the cluster's\n"


def test_scratch_left_by_a_killed_notebook_is_removed_by_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook kernel killed with SIGKILL leaves its tfdist-net-* scratch in $TMPDIR: the
    next one of this user removes it, and leaves a live process's and another user's alone."""
    import tempfile

    from tfdist_nb.owned_files import private_temp_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"tfdist-net-{gone.pid}-abc"
    live = tmp_path / f"tfdist-net-{os.getpid()}-def"
    for d in (dead, live):
        d.mkdir(mode=0o700)
        (d / "resolv.conf").write_text("nameserver 10.0.2.3\n")
    other = tmp_path / f"tfdist-net-{gone.pid}-ghi"
    other.mkdir()
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)
    made = private_temp_dir("net")
    assert made.name.startswith(f"tfdist-net-{os.getpid()}-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert not dead.exists() and live.exists()
    assert other.exists() == (os.geteuid() == 0)  # as root: another uid's, kept
