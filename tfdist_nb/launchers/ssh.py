"""Tasks on other hosts, reached with the system ``ssh`` so ``~/.ssh/config`` rules as usual.

One SSH connection per task runs ``python -m tfdist_nb.worker.remote serve`` there (its stdin
is the kernel's lifeline), forwards the kernel's channels between owner-only Unix socket
directories at both ends (no kernel port on any network) and brings its output back. Each host
is probed first for its address and free TF ports (docs/remote.md; docs/security.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jupyter_client.asynchronous import AsyncKernelClient

from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.gpu_plan import CVD, Placement
from tfdist_nb.launchers.base import (
    Launcher,
    LauncherOption,
    StopPath,
    StopReport,
    TaskHandle,
    TaskLaunch,
)
from tfdist_nb.owned_files import open_task_log
from tfdist_nb.topology import TaskId
from tfdist_nb.worker.remote import CHANNEL_PORTS, SOCKET_PREFIX, KernelSetup

if TYPE_CHECKING:
    from jupyter_client.connect import KernelConnectionInfo

logger = logging.getLogger(__name__)

#: Variables of the controller's environment that travel to remote tasks (the rest of a remote
#: task's environment is its host's own login environment).
FORWARDED_PREFIXES = ("TF_", "TFDIST_", "CUDA_", "NCCL_", "KERAS_", "XLA_", "OMP_",
                      "PYTHONHASHSEED", "PYTHONUNBUFFERED")
SSH_LOST = 255  # what ssh exits with when the connection fails or is lost
#: The controller's own ssh config file (``ssh -F``), when the launcher option is not given.
SSH_CONFIG_ENV = "TFDIST_SSH_CONFIG"
#: a path on this machine, and this machine's GPUs (--gpus places them per host): meaningless
#: on a host
_NOT_FORWARDED = frozenset({SSH_CONFIG_ENV, CVD})


def forwarded_environment() -> dict[str, str]:
    """What of this environment a task on another host starts with (the Ray launcher's too)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(FORWARDED_PREFIXES) and k not in _NOT_FORWARDED}


def check_destination(host: str) -> str:
    """``host`` if ssh can only read it as a destination, else ValueError saying why: a leading
    ``-`` would be an option (``-oProxyCommand=`` runs a command here; docs/security.md)."""
    if not isinstance(host, str) or not host:
        raise ValueError(f"ssh host must be a non-empty string, got {host!r}")
    if host.startswith("-") or host.rpartition("@")[2].startswith("-"):
        raise ValueError(f"ssh host {host!r} starts with '-', which ssh would read as an "
                         "option; give a host name, alias or user@host")
    if any(c.isspace() or not c.isprintable() for c in host):
        raise ValueError(f"ssh host {host!r} has spaces or control characters; give a host "
                         "name, alias or user@host")
    return host


def resolve_ssh_config(option: str | os.PathLike[str] | None) -> str | None:
    """The ``-F`` file: the launcher option, else ``$TFDIST_SSH_CONFIG``, else None."""
    chosen = option if option not in (None, "") else os.environ.get(SSH_CONFIG_ENV) or None
    if chosen is None:
        return None
    where = "ssh_config" if option not in (None, "") else f"${SSH_CONFIG_ENV}"
    path = Path(chosen).expanduser()
    if not path.is_file():
        raise ValueError(f"{where} names {str(chosen)!r}, which is not a file "
                         "(an OpenSSH client config, passed as ssh -F)")
    return str(path.resolve())


def probe_host(destination: str, n_ports: int, python: str, base: list[str],
               timeout: float, avoid: Sequence[int] = ()) -> list[str]:
    """Ask ``destination`` where it is and for free TF ports (``address:port`` each);
    ClusterStartError naming the host (unreachable, no such interpreter, tfdist_nb not
    installed there) otherwise."""
    remote = shlex.join([python, "-m", "tfdist_nb.worker.remote", "probe", "--ports",
                         str(n_ports), "--avoid", ",".join(map(str, avoid))])
    try:
        done = subprocess.run([*base, "--", check_destination(destination), remote],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterStartError(f"host {destination!r} did not answer over SSH within "
                                f"{timeout:.0f}s") from None
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode == SSH_LOST:
        raise ClusterStartError(f"cannot reach host {destination!r} over SSH: "
                                f"{last or 'ssh exited with 255'}")
    if done.returncode == 127 or "No such file" in last:
        raise ClusterStartError(f"worker interpreter {python!r} not found on host "
                                f"{destination!r} (pass python= / --python): {last}")
    if "No module named" in done.stderr:
        raise ClusterStartError(f"tfdist_nb is not installed for {python} on host "
                                f"{destination!r}: {last}")
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ClusterStartError(f"host {destination!r}: unexpected answer to the probe "
                                f"(exit {done.returncode}): {last or done.stdout[-200:]}") from None
    return [f"{info['address']}:{port}" for port in info["ports"]]


@dataclass
class SSHTaskHandle(TaskHandle):
    """One task's SSH connection: its stdin is the lifeline, its stdout the protocol lines."""

    proc: asyncio.subprocess.Process = field(default=None, repr=False)  # type: ignore[assignment]
    sockets: list[Path] = field(default_factory=list, repr=False)
    remote_exit: int | None = None
    remote_how: str | None = None
    _reader: asyncio.Task[None] | None = field(default=None, repr=False)

    async def read_protocol(self, ready: asyncio.Future[int]) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            word, _, rest = raw.decode(errors="replace").strip().partition(" ")
            if word == "ready" and not ready.done():
                ready.set_result(int(rest or 0))
            elif word == "exit":
                code, _, how = rest.partition(" ")
                self.remote_exit, self.remote_how = int(code), how or None
            elif word == "failed" and not ready.done():
                ready.set_exception(ClusterStartError(f"{self.task} on {self.host}: {rest}"))
        if not ready.done():
            ready.set_exception(ClusterStartError(
                f"{self.task}: the SSH session to {self.host} ended before the kernel was ready"))

    async def poll(self) -> int | None:
        if self.proc.returncode is None:
            return None
        if self._reader is not None:
            with swallowed(logger):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
        return self.remote_exit if self.remote_exit is not None else SSH_LOST

    def describe_exit(self, code: int) -> str:
        if self.proc.returncode is not None and self.remote_exit is None:
            return f"lost its SSH connection to {self.host} (ssh exited {self.proc.returncode})"
        return super().describe_exit(code)

    def _send(self, line: str) -> bool:
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing() or self.proc.returncode is not None:
            return False
        try:
            stdin.write(line.encode() + b"\n")
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def interrupt(self) -> None:
        self._send("interrupt")

    async def stop(self, grace_s: float) -> StopReport:
        start, path = self.close_channels(), StopPath.ALREADY_DEAD
        if self.proc.returncode is None:
            if self._send(f"stop {grace_s}"):
                await self._wait_exit(grace_s + 5.0)
            if self.proc.returncode is None:
                self._send("kill")
                with swallowed(logger):
                    self.proc.stdin.close()  # type: ignore[union-attr]
                await self._wait_exit(5.0)
            if self.proc.returncode is None:  # ssh itself is stuck: cut the connection
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self._wait_exit(5.0)
            path = StopPath.REQUEST if self.remote_how == "request" else StopPath.KILL
        code = await self.poll()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.unlink()
        return StopReport(str(self.task), path, code, time.monotonic() - start)

    async def _wait_exit(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout)


def hosts_of_line(text: str) -> list[str]:
    """``--hosts gpu1,me@gpu2`` as ssh destinations (checked when the launcher is made)."""
    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts:
        raise SpecError("--hosts needs at least one host, e.g. --hosts gpu1,gpu2")
    return hosts


class SSHLauncher(Launcher):
    """Tasks placed round-robin on ``hosts`` (ssh destinations), one SSH connection each."""

    name = "ssh"
    remote = True
    gpu_placement = Placement.PER_HOST
    line_options = (
        LauncherOption("--hosts", "hosts", metavar="H1,H2", required=True, parse=hosts_of_line,
                       help="ssh destinations as in ~/.ssh/config, tasks placed round-robin "
                            "(implies --launcher ssh)",
                       missing="--launcher ssh needs --hosts, e.g. --hosts gpu1,gpu2"),
    )

    @classmethod
    def cluster_options(cls, hosts: list[str] | None, python: str | None,
                        options: dict[str, object]) -> dict[str, object]:
        if not hosts and not options.get("hosts"):
            raise SpecError("launcher='ssh' needs hosts=[...], e.g. hosts=['gpu1', 'me@gpu2']")
        if hosts:
            options.setdefault("hosts", hosts)
        options.setdefault("python", python or sys.executable)  # the notebook's, found there
        return options

    def __init__(self, hosts: Sequence[str] | None = None, python: str | None = None,
                 ssh_config: str | os.PathLike[str] | None = None,
                 ssh_options: Sequence[str] = (), connect_timeout: float = 10.0,
                 ready_timeout: float = 120.0) -> None:
        if not hosts:
            raise ValueError("the ssh launcher needs hosts=[...] (ssh destinations)")
        if isinstance(hosts, str):
            raise ValueError(f"hosts must be a list of ssh destinations, got the string {hosts!r}")
        self.hosts = [check_destination(h) for h in hosts]
        if shutil.which("ssh") is None:
            raise ValueError("the ssh launcher needs OpenSSH's ssh client on PATH")
        self.python = python
        self.ssh_config = resolve_ssh_config(ssh_config)
        # every ssh call starts so (never prompts, gives up on dead peers), then "--" and host
        self.base = ["ssh", "-T", "-o", "BatchMode=yes", "-o",
                     f"ConnectTimeout={int(connect_timeout)}", "-o", "ServerAliveInterval=5",
                     "-o", "ServerAliveCountMax=3",
                     *(["-F", self.ssh_config] if self.ssh_config else []), *ssh_options]
        self.connect_timeout = connect_timeout
        self.ready_timeout = ready_timeout
        self.placement: dict[TaskId, str] = {}
        self._sockdir: Path | None = None
        self._token = secrets.token_hex(6)

    def line_values(self) -> dict[str, object]:
        return {"hosts": list(self.hosts)}

    def base_environment(self) -> dict[str, str]:
        return forwarded_environment()

    def task_hosts(self, tasks: Sequence[TaskId]) -> dict[TaskId, str]:
        return {t: self.hosts[i % len(self.hosts)] for i, t in enumerate(tasks)}

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        self.placement = self.task_hosts(tasks)
        wanted: dict[str, list[TaskId]] = {}
        for task, host in self.placement.items():
            wanted.setdefault(host, []).append(task)
        taken = [int(a.rpartition(":")[2]) for a in (avoid or {}).values()]
        python = self.python or sys.executable
        timeout = self.connect_timeout + 30.0
        with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
            futures = {h: pool.submit(probe_host, h, len(ts), python, self.base, timeout, taken)
                       for h, ts in wanted.items()}
        out: dict[TaskId, str] = {}
        errors = []
        for host, fut in futures.items():
            try:
                out.update(zip(wanted[host], fut.result(), strict=True))
            except ClusterStartError as exc:
                errors.append(str(exc))
        if errors:
            raise ClusterStartError("; ".join(errors))
        return out

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        host = self.placement.get(launch.task) or self.hosts[0]
        if self._sockdir is None:  # short on purpose: a Unix socket path is at most 107 bytes
            self._sockdir = Path(tempfile.mkdtemp(prefix="tfd-"))
        local = self._sockdir / f"{launch.task.slug}-{secrets.token_hex(3)}"
        remote_dir = f"/tmp/tfdist-{self._token}-{launch.task.slug}-{secrets.token_hex(3)}"
        forwards = [word for port in CHANNEL_PORTS.values()
                    for word in ("-L", f"{local}-{port}:{remote_dir}/{SOCKET_PREFIX}-{port}")]
        remote = shlex.join([launch.python, "-m", "tfdist_nb.worker.remote", "serve", "--dir",
                             remote_dir])
        cmd = [*self.base, "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
               "-o", "StreamLocalBindMask=0177", *forwards, "--", check_destination(host),
               remote]
        key = secrets.token_hex(32)
        fd = open_task_log(launch.log_path)  # never through a link, never blocked by a FIFO
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=fd,
                start_new_session=True)
        finally:
            os.close(fd)
        setup: KernelSetup = {"key": key, "env": dict(launch.env), "cwd": launch.cwd}
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(setup).encode() + b"\n")
        client = AsyncKernelClient()
        info: KernelConnectionInfo = {"transport": "ipc", "ip": str(local), **CHANNEL_PORTS,
                                      "key": key, "signature_scheme": "hmac-sha256"}
        client.load_connection_info(info)
        handle = SSHTaskHandle(task=launch.task, host=host, pid=None, client=client, proc=proc,
                               sockets=[Path(f"{local}-{p}") for p in CHANNEL_PORTS.values()])
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        handle._reader = asyncio.ensure_future(handle.read_protocol(ready))
        try:
            handle.pid = await asyncio.wait_for(ready, self.ready_timeout)
        except BaseException as exc:
            await handle.stop(0.5)
            if isinstance(exc, asyncio.TimeoutError):
                raise ClusterStartError(f"{launch.task} on {host}: no kernel after "
                                        f"{self.ready_timeout:.0f}s") from None
            raise
        # ssh binds the local ends as it connects; they exist before 'ready' in practice
        deadline = time.monotonic() + 10.0
        while not all(s.exists() for s in handle.sockets) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return handle

    def release(self) -> None:
        if self._sockdir is not None:
            shutil.rmtree(self._sockdir, ignore_errors=True)
            self._sockdir = None
