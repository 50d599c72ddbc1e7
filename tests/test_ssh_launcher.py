"""The SSH launcher against real sshd on two hosts made here (network namespaces on a bridge).

The hosts' aliases come from their own ssh config in a temp dir (HostName, User, Port 2222,
IdentityFile, its own known_hosts and, for ``tfdhost2-via-jump``, ProxyJump), handed to the
launcher the supported ways: ``launcher_options={"ssh_config": ...}`` or ``$TFDIST_SSH_CONFIG``
(the magic's notebook kernel inherits it). The user's ``~/.ssh`` is never read or written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import remote_hosts
from tests.notebooks import cell_text, run_notebook
from tests.support.cells import cell
from tests.support.contract import check_launcher_contract
from tests.support.processes import wait_for
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
USER_SSH = Path.home() / ".ssh"


def _user_ssh_state() -> dict[str, bytes | None]:
    """What the tests must leave alone: the user's ssh config and known hosts, byte for byte."""
    return {name: (USER_SSH / name).read_bytes() if (USER_SSH / name).exists() else None
            for name in ("config", "known_hosts")}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[remote_hosts.TestHosts]:
    remote_hosts.require_available()
    before = _user_ssh_state()
    made = remote_hosts.make_hosts(2, tmp_path_factory.mktemp("hosts"))
    try:
        yield made
    finally:
        made.remove()
    assert _user_ssh_state() == before, "the SSH tests changed the user's ~/.ssh"


@pytest.fixture
def ssh_env(hosts: remote_hosts.TestHosts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts' config through ``$TFDIST_SSH_CONFIG``, as a user would export it."""
    monkeypatch.setenv("TFDIST_SSH_CONFIG", str(hosts.ssh_config))


def no_task_left(hosts: remote_hosts.TestHosts, *aliases: str) -> None:
    wait_for(lambda: not any(hosts.pids(a) for a in aliases), 15,
             f"no process left on {aliases}: {[hosts.pids(a) for a in aliases]}")


def listening_tcp_ports(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_mwms_training_across_two_ssh_hosts(hosts: remote_hosts.TestHosts) -> None:
    h1, h2 = "tfdhost1", "tfdhost2-via-jump"
    with Cluster(workers=2, launcher="ssh", hosts=[h1, h2],
                 launcher_options={"ssh_config": hosts.ssh_config}) as c:
        table = c.status()
        assert list(table["host"]) == [h1, h2]
        addresses = {str(t): rt.address for t, rt in c.tasks.items()}
        assert addresses["worker:0"].startswith(hosts.addresses["tfdhost1"] + ":")
        assert addresses["worker:1"].startswith(hosts.addresses["tfdhost2"] + ":")
        kernels = {str(t): rt.pid for t, rt in c.tasks.items()}
        assert kernels["worker:0"] in hosts.pids(h1)
        assert kernels["worker:1"] in hosts.pids("tfdhost2")

        assert c.exposure_note() is None  # no TF server yet: nothing to say
        result = c.run(cell("mwms_loop"), timeout=150)
        assert result.ok, result.summary()
        # the strategy opened each task's TF server on its host: said once, host and port named,
        # and true: reachable from another host (this one, over the tests' bridge)
        said = c.exposure_note()
        assert said is not None and c.exposure_note() is None, said
        for name, address in addresses.items():
            assert f"{name} ({address})" in said, said
            host, _, port = address.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=5):
                pass
        assert "every interface of its host, without authentication" in said
        losses = {n: re.search(r"final loss ([0-9.]+)", r.stdout).group(1)  # type: ignore[union-attr]
                  for n, r in result.tasks.items()}
        assert losses["worker:0"] == losses["worker:1"]  # one model, synchronised across hosts
        for r in result.tasks.values():
            assert "replicas in sync: 2" in r.stdout, r.stdout
            assert len([x for x in r.stderr.splitlines() if x.startswith("loss ")]) == 20

        who = c.run("import os, socket\nprint(os.environ['TFDIST_TASK'], "
                    "os.environ['SSH_CONNECTION'].split()[2])")
        for name, r in who.tasks.items():
            host = "tfdhost1" if name == "worker:0" else "tfdhost2"
            assert r.stdout.split() == [name, hosts.addresses[host]]  # attributed, and remote
        log = c.logs(grep=r"^worker:\d \d")
        assert set(log["task"]) == {"worker:0", "worker:1"}

        table = c.status()  # telemetry came back through the tunnel
        assert (table["rss_mb"] > 100).all() and table["cpu_percent"].notna().all()
        assert (table["step"] == 20).all()

        stacks = c.stacks()
        assert set(stacks) == {"worker:0", "worker:1"}
        assert all("MainThread" in s for s in stacks.values())

        # No kernel port on any network: the kernel's only TCP listener is TF's own server.
        for name, pid in kernels.items():
            tf_port = int(addresses[name].rpartition(":")[2])
            assert listening_tcp_ports(pid) <= {tf_port}
        sockdir = c.launcher._sockdir  # type: ignore[attr-defined]
        assert sockdir is not None and stat.S_IMODE(sockdir.stat().st_mode) == 0o700
        reports = c.stop()
    # A kernel with TensorFlow loaded takes over the 1 s grace to exit, here as locally.
    assert {r.path for r in reports} <= {"request", "kill"} and len(reports) == 2
    no_task_left(hosts, h1, "tfdhost2")
    assert not sockdir.exists()
    assert not list(Path("/tmp").glob(f"tfdist-{c.launcher._token}-*"))  # type: ignore[attr-defined]


def test_unreachable_host_fails_naming_it(hosts: remote_hosts.TestHosts, ssh_env: None) -> None:
    started = time.monotonic()
    c = Cluster(workers=2, launcher="ssh", hosts=["tfdhost1", remote_hosts.DOWN_ALIAS],
                preload=())
    with pytest.raises(ClusterStartError, match=r"cannot reach host 'tfdhost-down' over SSH"):
        c.start()
    assert time.monotonic() - started < 20
    assert not c.running
    no_task_left(hosts, "tfdhost1")


def test_a_failed_start_on_one_host_stops_the_others(
        hosts: remote_hosts.TestHosts, ssh_env: None, tmp_path: Path) -> None:
    """The worker interpreter exists on both hosts, but starting a kernel fails on tfdhost2."""
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$SSH_CONNECTION $*" in *" {hosts.addresses["tfdhost2"]} "*serve*)\n'
        '  echo "tfdhost2: no CUDA driver found" >&2; exit 3;;\nesac\n'
        f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    c = Cluster(workers=2, launcher="ssh", hosts=["tfdhost1", "tfdhost2"], python=str(wrapper),
                preload=())
    with pytest.raises(ClusterStartError) as err:
        c.start()
    text = str(err.value)
    assert "worker:1" in text and "tfdhost2" in text
    assert "no CUDA driver found" in text  # the host's own words, from the task's process log
    no_task_left(hosts, "tfdhost1", "tfdhost2")


def test_missing_interpreter_on_the_host_is_named(hosts: remote_hosts.TestHosts,
                                                  ssh_env: None) -> None:
    c = Cluster(workers=1, launcher="ssh", hosts=["tfdhost1"], python="/opt/nowhere/python3")
    with pytest.raises(ClusterStartError, match=r"'/opt/nowhere/python3' not found on host "
                                                r"'tfdhost1'"):
        c.start()


def sleeping_cell(c: Cluster, marker: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Run a 120 s sleep on the cluster in the background; return once it has begun."""
    box: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: box.update(
        r=c.run(f"import time\nprint({marker!r}, flush=True)\ntime.sleep(120)")))
    runner.start()
    wait_for(lambda: marker in " ".join(c.logs()["text"]), 30, "the cell to start")
    return runner, box


def test_a_lost_ssh_connection_is_reported_and_restart_recovers(
        hosts: remote_hosts.TestHosts, ssh_env: None) -> None:
    with Cluster(workers=1, launcher="ssh", hosts=["tfdhost1"], preload=()) as c:
        runner, box = sleeping_cell(c, "sleeping")
        dropped_at = time.monotonic()
        assert hosts.drop_connections("tfdhost1")
        runner.join(30)
        assert not runner.is_alive()
        took = time.monotonic() - dropped_at
        res = box["r"].tasks["worker:0"]
        assert res.status == "crashed"
        assert "lost its SSH connection to tfdhost1" in res.error.evalue
        assert took < 10
        no_task_left(hosts, "tfdhost1")  # the remote lifeline saw its stdin end and cleaned up
        assert c.status()["state"].tolist() == ["dead"]

        c.restart()
        again = c.run("print('back')")
        assert again.ok and again.tasks["worker:0"].stdout.strip() == "back"
    no_task_left(hosts, "tfdhost1")


def test_interrupt_and_crash_of_a_remote_task(hosts: remote_hosts.TestHosts, ssh_env: None) -> None:
    with Cluster(workers=1, launcher="ssh", hosts=["tfdhost2"], preload=()) as c:
        runner, box = sleeping_cell(c, "waiting")
        c.interrupt()
        runner.join(20)
        assert box["r"].tasks["worker:0"].status == "interrupted"
        assert box["r"].tasks["worker:0"].error.ename == "KeyboardInterrupt"

        crashed = c.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        r = crashed.tasks["worker:0"]
        assert r.status == "crashed" and "killed by SIGKILL" in r.error.evalue  # not "lost"
    no_task_left(hosts, "tfdhost2")


def test_magic_with_hosts_in_a_notebook(hosts: remote_hosts.TestHosts, ssh_env: None,
                                        tmp_path: Path) -> None:
    nb = run_notebook([
        "%load_ext tfdist_nb",
        "%%tfcluster 2 workers --hosts tfdhost1,tfdhost2 --no-dashboard\n"
        "import os\nprint('on', os.environ['SSH_CONNECTION'].split()[2])",
        "%tfdist_status --table",
        "%tfdist_stop",
    ], tmp_path)
    out = cell_text(nb.cells[1])
    for name, host in (("worker:0", "tfdhost1"), ("worker:1", "tfdhost2")):
        assert re.search(rf"{name}.*on {re.escape(hosts.addresses[host])}", out), out
    table = cell_text(nb.cells[2])
    assert "tfdhost1" in table and "tfdhost2" in table
    no_task_left(hosts, "tfdhost1", "tfdhost2")


def test_every_ssh_call_ends_its_options_before_the_host(
        hosts: remote_hosts.TestHosts, ssh_env: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--`` before the destination in the probe and in each task's connection, and the
    config from ``$TFDIST_SSH_CONFIG`` as ``-F``: seen by an ``ssh`` on PATH that logs its argv
    and then runs the real one."""
    real, log, bindir = shutil.which("ssh"), tmp_path / "argv.jsonl", tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n")
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with Cluster(workers=1, launcher="ssh", hosts=["tfdhost1"], preload=()) as c:
        assert c.run("print('ok')").tasks["worker:0"].stdout.strip() == "ok"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert any("probe" in " ".join(a) for a in calls) and any("serve" in " ".join(a)
                                                               for a in calls), calls
    for argv in calls:
        assert argv[argv.index("--") + 1] == "tfdhost1", argv
        assert argv[argv.index("-F") + 1] == str(hosts.ssh_config), argv
    no_task_left(hosts, "tfdhost1")


def test_the_ssh_launcher_keeps_the_launcher_contract(hosts: remote_hosts.TestHosts) -> None:
    with Cluster(workers=2, launcher="ssh", hosts=["tfdhost1", "tfdhost2"], preload=(),
                 launcher_options={"ssh_config": hosts.ssh_config}) as c:
        check_launcher_contract(c)
