"""The fake SSH hosts of tests/remote_hosts.py act like remote machines and leave nothing behind.

Why: SSH launcher tests trust these hosts; if one of these fails, a launcher failure means
nothing. Skipped where namespaces cannot be made (not root, no sshd; see ``available()``), and
failed instead under CI (``CI=true``), where a skip would hide a runner that lost its rights.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import remote_hosts
from tests.remote_hosts import DOWN_ALIAS, TestHosts, make_hosts
from tests.support.processes import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Two hosts shared by the module: making them costs about 0.2 s, each ssh about 0.3 s."""
    with remote_hosts.fake_hosts(2, tmp_path_factory.mktemp("remote_hosts")) as made:
        yield made


def _cmdline(pid: int) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).cmdline()
    return []


def _python(code: str) -> str:
    """A remote command running ``code`` with this interpreter (the file system is shared)."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def _processes_mentioning(text: str) -> list[int]:
    """Live (not zombie) processes whose command line mentions ``text``, e.g. a workdir."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                text in part for part in proc.info["cmdline"] or []):
            found.append(proc.info["pid"])
    return found


def _assert_gone(made: TestHosts) -> None:
    assert not set(made.namespaces.values()) & _netns_names()
    assert not ({made.bridge, *made.veths} - {""}) & _links()
    assert not _processes_mentioning(str(made.workdir))


def test_without_namespaces_ci_fails_and_elsewhere_skips_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No real way to lose root here, so ``available()`` is what is replaced."""
    monkeypatch.setattr(remote_hosts, "available", lambda: "fake hosts need root")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI: SSH test hosts cannot be made here: "
                                                    "fake hosts need root"):
        remote_hosts.require_available()
    for outside in ("", "false", "0"):
        monkeypatch.setenv("CI", outside)
        with pytest.raises(pytest.skip.Exception, match="fake hosts need root"):
            remote_hosts.require_available()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        remote_hosts.require_available()


def test_hosts_are_listed_for_the_leak_check_until_removed(hosts: TestHosts) -> None:
    ids = remote_hosts.namespace_ids()
    for netns in hosts.namespaces.values():
        st = os.stat(f"/run/netns/{netns}")
        assert (st.st_dev, st.st_ino) in ids
    # a process started "on" a host has that namespace, the test process has not
    probe = subprocess.run(["ip", "netns", "exec", hosts.namespaces[hosts.aliases[0]],
                            "stat", "-L", "-c", "%d %i", "/proc/self/ns/net"],
                           capture_output=True, text=True, check=True, timeout=10)
    dev, ino = map(int, probe.stdout.split())
    assert (dev, ino) in ids
    here = os.stat("/proc/self/ns/net")
    assert (here.st_dev, here.st_ino) not in ids


def test_commands_run_on_the_namespace_address(hosts: TestHosts) -> None:
    for alias in hosts.aliases:
        result = hosts.ssh(alias, "hostname -I")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [hosts.addresses[alias]]


def test_hosts_reach_each_other_on_port_2222(hosts: TestHosts) -> None:
    first, second = hosts.aliases
    code = f"import socket; socket.create_connection(({hosts.addresses[second]!r}, 2222), 3)"
    result = hosts.ssh(first, _python(code))
    assert result.returncode == 0, result.stderr


def test_proxyjump_goes_through_the_first_host(hosts: TestHosts) -> None:
    last = hosts.aliases[-1]
    direct = hosts.ssh(last, "echo $SSH_CONNECTION")
    jumped = hosts.ssh(hosts.jump_alias, "echo $SSH_CONNECTION")
    assert direct.returncode == 0 and jumped.returncode == 0, (direct.stderr, jumped.stderr)
    client_ip, _, server_ip, _ = jumped.stdout.split()
    assert server_ip == hosts.addresses[last]
    assert client_ip == hosts.addresses[hosts.aliases[0]]  # sshd of the last saw the first
    assert direct.stdout.split()[0] != client_ip


def test_a_down_host_fails_within_seconds(hosts: TestHosts) -> None:
    start = time.monotonic()
    result = hosts.ssh(DOWN_ALIAS, "true", timeout=30)
    assert result.returncode == 255, result.stderr
    assert time.monotonic() - start < 10


def test_session_environment_passes_variables_only_on_the_command_line(
        hosts: TestHosts) -> None:
    """As on a stock Debian sshd: SendEnv of TF_CONFIG is dropped, ``env K=V cmd`` works."""
    code = "import os; print(os.environ.get('TF_CONFIG', 'unset'), os.environ['HOME'])"
    alias = hosts.aliases[0]
    sent = subprocess.run(hosts.ssh_argv(alias, _python(code), "-o", "SendEnv=TF_CONFIG"),
                          env={**os.environ, "TF_CONFIG": '{"task": 1}'}, capture_output=True,
                          text=True, timeout=20, stdin=subprocess.DEVNULL, check=False)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.split() == ["unset", "/root"]
    tf_config = shlex.quote('{"task": 1}')
    inline = hosts.ssh(alias, f"env TF_CONFIG={tf_config} {_python(code)}")
    assert inline.returncode == 0, inline.stderr
    assert inline.stdout.split() == ['{"task":', '1}', "/root"]


def test_remote_process_shows_in_pids_and_outlives_a_dropped_connection(
        hosts: TestHosts) -> None:
    alias = hosts.aliases[-1]
    listener = hosts.sshd_pid(alias)
    index = hosts.aliases.index(alias) + 1
    assert int((hosts.workdir / f"sshd-{index}.pid").read_text()) == listener
    client = subprocess.Popen(hosts.ssh_argv(alias, "exec sleep 300"), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    remote: list[int] = []
    try:
        remote = wait_for(lambda: [p for p in hosts.pids(alias)
                                   if _cmdline(p) == ["sleep", "300"]],
                          20, "the remote sleep in pids()")
        assert listener not in hosts.pids(alias)
        killed = hosts.drop_connections(alias)
        assert killed and listener not in killed
        assert client.wait(timeout=10) == 255
        # Like a real host: the command has no pty, so nothing tells it the client is gone.
        assert set(remote) <= set(hosts.pids(alias))
        assert hosts.sshd_pid(alias) == listener
        assert hosts.ssh(alias, "true").returncode == 0  # the listener takes new connections
    finally:
        client.kill()
        client.wait()
        for pid in remote:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not set(remote) & set(hosts.pids(alias)), 10, "the remote sleep to end")


def test_remove_leaves_nothing_and_can_run_twice(tmp_path: Path) -> None:
    remote_hosts.require_available()
    made = make_hosts(1, tmp_path / "work", home=tmp_path / "home")
    try:
        alias = made.aliases[0]
        result = made.ssh(alias, "echo $HOME; echo $PATH")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [
            str(tmp_path / "home"), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        assert _processes_mentioning(str(made.workdir)) == [made.sshd_pid(alias)]
    finally:
        made.remove()
    assert made.removed
    assert made not in remote_hosts._LIVE
    _assert_gone(made)
    made.remove()
    _assert_gone(made)
    assert (made.workdir / "sshd-1.log").exists()  # files in workdir stay for debugging


def test_a_failed_make_hosts_removes_what_it_made(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    remote_hosts.require_available()
    seen: list[TestHosts] = []
    start_sshd = remote_hosts._start_sshd

    def fail_on_the_last(made: TestHosts, alias: str) -> None:
        seen.append(made)
        if alias == made.aliases[-1]:
            raise RuntimeError("injected sshd failure")
        start_sshd(made, alias)

    monkeypatch.setattr(remote_hosts, "_start_sshd", fail_on_the_last)
    with pytest.raises(RuntimeError, match="injected"):
        make_hosts(2, tmp_path)
    made = seen[0]
    assert len(made.namespaces) == 2 and made.bridge
    assert made.removed
    _assert_gone(made)
