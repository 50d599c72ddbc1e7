"""Start-up that holds at scale and fails (or recovers) in seconds: ipc kernels, blocked
endpoints, the whole start bounded by start_timeout, nothing left behind."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import worker_kernels
from tfdist_nb import Cluster
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers.local import LocalLauncher

pytestmark = pytest.mark.cluster


class BlockedEndpoint(LocalLauncher):
    """A local launcher whose first start of ``task`` finds one of its channel endpoints taken:
    a directory stands where the kernel's socket must be, so its bind fails for real."""

    def __init__(self, task: str, channel: str, times: int = 1) -> None:
        super().__init__()
        self.task, self.channel, self.times = task, channel, times
        self.blocked: list[str] = []

    def kernel_manager(self, launch: Any) -> Any:
        km, scratch = super().kernel_manager(launch)
        if str(launch.task) == self.task and len(self.blocked) < self.times:
            port = 90 + len(self.blocked)  # clear of the ports jupyter_client picks (1, 2, ...)
            setattr(km, f"{self.channel}_port", port)
            path = Path(f"{km.ip}-{port}")
            (path / "taken").mkdir(parents=True)
            self.blocked.append(str(path))
        return km, scratch


@pytest.mark.parametrize("channel", ["iopub", "hb", "shell"])
def test_a_kernel_that_cannot_bind_is_started_again_in_seconds(channel: str) -> None:
    launcher = BlockedEndpoint("worker:1", channel)
    started = time.monotonic()
    with Cluster(workers=2, preload=(), launcher=launcher, start_timeout=60) as c:
        took = time.monotonic() - started
        assert launcher.blocked, "the endpoint was not blocked"
        assert c.run("print(tw_ok := 1)").ok
        retried = [a for a in c.alerts() if a.startswith("worker:1: failed to start")]
        assert retried and "once more on fresh endpoints" in retried[0], c.alerts()
    assert took < 30, f"recovering took {took:.0f}s"


def test_a_kernel_that_never_binds_fails_the_start_with_its_log() -> None:
    launcher = BlockedEndpoint("worker:1", "iopub", times=2)
    before = worker_kernels()
    started = time.monotonic()
    with pytest.raises(ClusterStartError) as info:
        Cluster(workers=2, preload=(), launcher=launcher, start_timeout=60).start()
    took = time.monotonic() - started
    assert took < 30, f"failing took {took:.0f}s"
    text = str(info.value)
    assert text.startswith("worker:1 failed to start"), text
    assert "Address already in use" in text  # the kernel's own words, from its process log
    assert worker_kernels() - before == set()


def test_start_timeout_bounds_the_whole_start(tmp_path: Path) -> None:
    """A task whose kernel never answers: the start ends at start_timeout, not later."""
    slow = tmp_path / "sitecustomize.py"
    slow.write_text("import os, time\nif os.environ.get('TFDIST_TASK') == 'worker:1':\n"
                    "    time.sleep(120)\n")
    started = time.monotonic()
    with pytest.raises(ClusterStartError, match=r"worker:1 failed to start: not ready within "
                                                r"start_timeout=6s"):
        Cluster(workers=2, preload=(), env={"PYTHONPATH": str(tmp_path)},
                start_timeout=6).start()
    took = time.monotonic() - started
    assert took < 6 + 8, f"the start took {took:.0f}s for a 6 s start_timeout"


def test_32_tasks_start_twice_in_a_row(tmp_path: Path) -> None:
    before = worker_kernels()
    for attempt in range(2):
        with Cluster(workers=32, preload=(), start_timeout=90, run_dir=tmp_path) as c:
            result = c.run("import os; print(os.environ['TFDIST_TASK'])", timeout=60)
            assert result.ok, f"attempt {attempt}: {result.summary()}"
            assert {r.stdout.strip() for r in result.tasks.values()} == {
                f"worker:{i}" for i in range(32)}
            retried = [a for a in c.alerts() if "failed to start" in a]
            assert not retried, f"attempt {attempt}: {retried}"
            sockets = [Path(f"{info['ip']}-{info[f'{ch}_port']}") for rt in c.tasks.values()
                       if (info := rt.handle.client.get_connection_info())
                       for ch in ("shell", "iopub", "stdin", "control", "hb")]
            assert len(set(sockets)) == 32 * 5
            assert all(stat.S_ISSOCK(p.stat().st_mode) for p in sockets)
        assert not [p for p in sockets if p.exists()], "sockets left after stop"
    assert worker_kernels() - before == set()


def test_local_kernels_listen_on_no_tcp_port(cluster2: Any) -> None:
    """The five kernel channels are Unix sockets; the only TCP listener left is ipykernel's own
    loopback pipe that carries forked children's output (bound with retries, never raced)."""
    pipe = cluster2.run("from ipykernel.kernelapp import IPKernelApp\n"
                        "print(IPKernelApp.instance().iopub_thread._pipe_port)")
    for rt in cluster2.tasks.values():
        conn = rt.handle.client.get_connection_info()
        assert conn["transport"] == "ipc"
        # the task's directory of the run, or a short scratch directory when that path is long
        assert stat.S_IMODE(Path(conn["ip"]).parent.stat().st_mode) & 0o077 == 0
        assert listening_sockets(rt.pid) == {("127.0.0.1", int(pipe.tasks[rt.name].stdout))}, \
            rt.name


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """The TCP sockets ``pid`` listens on, read in its own network namespace (the private one
    of a local cluster, or the host's): its socket inodes against /proc/PID/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for fields in (line.split() for line in lines):
            if fields[3] == "0A" and fields[9] in inodes:
                address, _, port = fields[1].partition(":")
                ip = (str(ipaddress.IPv4Address(bytes.fromhex(address)[::-1])) if width == 8
                      else address)
                found.add((ip, int(port, 16)))
    return found


def test_a_long_run_directory_path_still_gets_its_sockets(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with Cluster(workers=1, preload=(), run_dir=deep) as c:
        assert c.run("x = 1").ok
        ip = c.tasks[next(iter(c.tasks))].handle.client.get_connection_info()["ip"]
        scratch = Path(ip).parent
        assert not str(scratch).startswith(str(deep))
        assert stat.S_IMODE(os.stat(scratch).st_mode) & 0o077 == 0
    assert not scratch.exists()
