"""Tasks as ipykernel processes on this machine, started through jupyter_client's async API.

Kernel channels are Unix sockets (``ipc``) in the task's owner-only run directory, so no kernel
port can be raced for; ``transport="tcp"`` is for file systems without them. TF ports are
confined by a private network namespace (:mod:`.private_net`; ``net=`` in docs/reference.md,
who reaches what in docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from tfdist_nb import host_os
from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers import fork_handle, forkserver, ports, private_net
from tfdist_nb.launchers.base import (
    Launcher,
    LauncherOption,
    NetTrouble,
    StopPath,
    StopReport,
    TaskHandle,
    TaskLaunch,
)
from tfdist_nb.launchers.kernel_key import KernelKey
from tfdist_nb.owned_files import open_task_log
from tfdist_nb.topology import TaskId

logger = logging.getLogger(__name__)
KERNEL_NAME = "tfdist-worker"
TRANSPORTS = ("ipc", "tcp")
#: how long a restart waits for a TF port the old task held to be free before moving ports
TAKEN_SETTLE_S = 1.0
#: sun_path holds 108 bytes; the longest socket is "<prefix>-5" plus a NUL.
MAX_SOCKET_PREFIX = 100


def worker_kernel_spec(python: str) -> KernelSpec:
    """The worker kernel spec (also ``kernels/tfdist-worker/kernel.json``); history in memory
    (docs/design.md, "History in memory")."""
    return KernelSpec(
        argv=[python, "-m", "tfdist_nb.worker.kernel", "-f", "{connection_file}",
              "--HistoryManager.enabled=False"],
        display_name="tfdist_nb worker",
        language="python",
        interrupt_mode="signal",
        metadata={"debugger": True},  # JupyterLab's debugger on a console on a task
    )


def task_kernel_spec(python: str) -> KernelSpec:
    """The installed ``tfdist-worker`` spec where Jupyter finds one (the user's changes to it
    apply), a bare ``python`` replaced by the worker interpreter; else
    :func:`worker_kernel_spec` (kernels/README.md)."""
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        return worker_kernel_spec(python)
    if spec.argv and spec.argv[0] == "python":
        spec.argv = [python, *spec.argv[1:]]
    return spec


class _OneSpec(KernelSpecManager):
    """Hands jupyter_client our worker spec without installing it anywhere."""

    def __init__(self, spec: KernelSpec, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._spec = spec

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self._spec


@dataclass
class LocalTaskHandle(TaskHandle):
    manager: AsyncKernelManager = field(default=None, repr=False)  # type: ignore[assignment]
    scratch: Path | None = None  # a short socket directory of its own, removed at stop

    async def poll(self) -> int | None:
        prov = self.manager.provisioner
        return None if prov is None else await prov.poll()

    def describe_exit(self, code: int) -> str:
        """With the fork server's part in it, naming the server, where it had one."""
        what = super().describe_exit(code)
        cause = getattr(getattr(self.manager.provisioner, "process", None), "cause", None)
        return f"{what} ({cause})" if isinstance(cause, str) else what

    async def interrupt(self) -> None:
        if await self.poll() is None:
            await self.manager.interrupt_kernel()

    async def stop(self, grace_s: float) -> StopReport:
        start, path = self.close_channels(), StopPath.ALREADY_DEAD
        if await self.poll() is None:
            path = await self._request_then_kill(grace_s)
        code = await self.poll()
        pgid = getattr(self.manager.provisioner, "pgid", None)
        if pgid and pgid != os.getpgid(0):  # children the user's code started: its session
            fork_handle.kill_group(pgid)
        with swallowed(logger):
            await self.manager.cleanup_resources()
        with swallowed(logger):
            self.manager.context.destroy(linger=0)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return StopReport(str(self.task), path, code, time.monotonic() - start)

    async def _request_then_kill(self, grace_s: float) -> StopPath:
        with swallowed(logger):
            await self.manager.request_shutdown()
            if await self._wait_exit(grace_s):
                return StopPath.REQUEST
        with contextlib.suppress(ProcessLookupError, OSError):
            if (provisioner := self.manager.provisioner) is not None:
                await provisioner.kill()
        await self._wait_exit(5.0)
        return StopPath.KILL

    async def _wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.poll() is not None:
                return True
            await asyncio.sleep(0.05)
        return await self.poll() is not None


def working_directory() -> str:
    """This process's working directory; ClusterStartError naming it when it was deleted
    (``os.getcwd()`` says only "No such file or directory")."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise ClusterStartError(
            f"the notebook's working directory {host_os.deleted_cwd()} was deleted, and local "
            "tasks start in it: change to one that exists (%cd ~, or os.chdir) and try "
            "again") from None


def net_of_line(text: str) -> str:
    """``--net``'s value: one of ``private_net.NET_MODES`` (ValueError says which there are)."""
    if text not in private_net.NET_MODES:
        raise ValueError(f"choose {', '.join(private_net.NET_MODES)}, not {text!r}")
    return text


class LocalLauncher(Launcher):
    """Every task on this machine; TensorFlow servers on ``localhost:<free port>``."""

    name = "local"
    line_options = (
        LauncherOption("--net", "net", metavar="auto|private|host", parse=net_of_line,
                       help="where the tasks' TF ports listen: auto (default) a private "
                            "network where slirp4netns keeps the tasks' outbound network, "
                            "else the host's; private: always (no outbound network without "
                            "slirp4netns); host: the host's network"),
    )

    def __init__(self, host: str = "localhost", transport: str = "ipc",
                 net: str | None = None, fork: bool | None = None) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not "
                             f"{transport!r}")
        from_env = not net and bool(os.environ.get("TFDIST_NET"))
        net = net or os.environ.get("TFDIST_NET") or "auto"
        if net not in private_net.NET_MODES:
            said = f"TFDIST_NET={net}" if from_env else f"net={net!r}"
            raise ValueError(f"{said}: choose one of {', '.join(private_net.NET_MODES)} (e.g. "
                             "%%tfcluster 2 workers --net host, or launcher_options={'net': "
                             "'host'})")
        why_not = (f"transport={transport!r}: kernel channels over TCP would be inside it"
                   if transport != "ipc" else
                   f"host={host!r}: TF_CONFIG names an address of the host's network"
                   if host not in ("localhost", "127.0.0.1") else None)
        if net == "private" and why_not:
            raise ValueError(f"net='private' cannot be used with {why_not}")
        if fork is not None and not isinstance(fork, bool):
            raise ValueError(f"fork must be True or False, not {fork!r} (e.g. "
                             "launcher_options={'fork': False})")
        self.host = host
        self.transport = transport
        self.net_mode = net
        #: kernels forked from a fork server (docs/design.md, "Fork server"); env TFDIST_FORK
        self.fork = ((forkserver.enabled_by_default() if fork is None else fork)
                     and forkserver.can_fork())  # no fork server on macOS: said once
        if self.fork:
            forkserver.idle_after_s()  # a misspelt TFDIST_FORK_IDLE_S is said before any start
        self._ports: list[int] = []
        self._net: private_net.PrivateNetwork | None = None
        #: why the tasks are on the host's network although they could be confined, if so
        self.net_note: str | None = why_not if net == "auto" else None
        self._net_decided = net == "host" or why_not is not None

    def line_values(self) -> dict[str, object]:
        return {"net": self.net_mode}

    @property
    def spares(self) -> bool:
        return self.env_at_launch and self.restartable

    def forks(self, preload: tuple[str, ...]) -> bool:
        return self.fork and bool(preload)

    @property
    def confined(self) -> bool:
        """Whether the tasks run in the private network."""
        return self._net is not None

    @property
    def why_not_confined(self) -> str | None:
        """Why the tasks are on the host's network (None when they are not)."""
        return None if self._net is not None else self.net_note or "net='host'"

    def network(self) -> str:
        if self._net is not None:
            return (f"private network: the TF ports are reachable by these tasks alone (a "
                    f"network namespace of their own; {self._net.outbound})")
        why = self.why_not_confined
        return (f"host network ({why}): the TF ports listen on every interface of this host, "
                "open to whoever reaches it")

    def network_trouble(self) -> NetTrouble | None:
        net = self._net
        if net is None or not net.alive():
            return None
        if ended := net.slirp_ended():
            return NetTrouble(f"{ended}: it was the tasks' path out of their private network",
                              "%tfdist_restart (or cluster.restart()) starts a new one", True)
        if net.slirp is None:
            return NetTrouble(
                "the tasks run in a private network without a path out (net='private' and "
                "slirp4netns not found)", "start the cluster with --net auto (the host's "
                "network here) or install slirp4netns (apt install slirp4netns, dnf install "
                "slirp4netns)")
        return None

    def prepare(self) -> None:
        working_directory()
        if not self._net_decided or self._net is not None:
            self.private_network()

    def private_network(self) -> private_net.PrivateNetwork | None:
        """The private network tasks start in, decided at the first start (blocking: made in a
        thread by :meth:`start`)."""
        if not self._net_decided:
            try:
                self._net = private_net.shared(outbound=self.net_mode == "auto")
            except private_net.PrivateNetUnavailable as exc:
                if self.net_mode == "private":
                    raise ClusterStartError(f"net='private': {exc}") from None
                self.net_note = str(exc)
            self._net_decided = True
        elif self._net is not None and not self._net.alive():
            # a new namespace would part the new tasks from the running ones
            raise ClusterStartError(
                f"the private network's holder (pid {self._net.pid}) ended, so no new task can "
                "join this cluster's network: stop the cluster and start it again")
        elif self._net is not None:
            try:  # a slirp4netns that ended is replaced at the next start (NetTrouble's cure)
                self._net.revive_outbound()
            except private_net.PrivateNetUnavailable as exc:
                logger.warning("tfdist_nb: the tasks' outbound network stays gone: %s", exc)
        return self._net

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        taken = {int(a.rpartition(":")[2]) for a in (avoid or {}).values()}
        self.release()
        self._ports = ports.reserve(len(tasks), avoid=taken)
        return {t: f"{self.host}:{p}" for t, p in zip(tasks, self._ports, strict=False)}

    def taken(self, addresses: Mapping[TaskId, str]) -> dict[TaskId, str]:
        if self._net is not None:  # the tasks' own namespace: no one else binds there
            return {}
        # a port the old process held may need a moment after its exit is seen (its sockets
        # go with the last of its threads): asked again for up to TAKEN_SETTLE_S
        deadline = time.monotonic() + TAKEN_SETTLE_S
        while True:
            taken = {t: a for t, a in addresses.items()
                     if not ports.bindable(int(a.rpartition(":")[2]))}
            if not taken or time.monotonic() >= deadline:
                return taken
            addresses = taken
            time.sleep(0.1)

    def held_by_another(self, address: str) -> bool:
        import psutil

        port = int(address.rpartition(":")[2])
        try:
            return any(p == port for _, p in host_os.tcp_listeners(None))
        except (psutil.Error, OSError):
            return True

    def release(self) -> None:
        ports.release(self._ports)
        self._ports = []

    def kernel_manager(self, launch: TaskLaunch) -> tuple[AsyncKernelManager, Path | None]:
        """The task's kernel manager and the scratch directory it owns (None unless the run
        directory's path is too long for a socket)."""
        spec, env, net = task_kernel_spec(launch.python), self.task_env(launch), self._net
        # forked where a fork server can serve (not off, something to preload, our own command)
        key = self.fork_key(spec, launch, env)
        server = (forkserver.server_for(key, env, net.enter if net is not None else None)
                  if key is not None else None)
        if server is not None:
            spec.metadata = {**(spec.metadata or {}), "kernel_provisioner": {
                "provisioner_name": forkserver.PROVISIONER, "config": {"server_key": server}}}
        elif net is not None:
            spec.argv = net.enter(list(spec.argv))
        km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_OneSpec(spec))
        km.connection_file = str(launch.connection_file)
        km.shutdown_wait_time = 1.0
        scratch = None
        if self.transport == "ipc":
            km.transport = "ipc"
            km.ip, scratch = _socket_prefix(launch.connection_file.parent)
        return km, scratch

    def task_env(self, launch: TaskLaunch) -> dict[str, str]:
        """The environment the task's kernel gets (in the private network, it says so)."""
        return ({**launch.env, "TFDIST_NETNS": "cluster"} if self._net is not None
                else dict(launch.env))

    def fork_key(self, spec: KernelSpec, launch: TaskLaunch,
                 env: Mapping[str, str]) -> fork_handle.ServerKey | None:
        if (not self.forks(launch.preload) or spec.env
                or forkserver.kernel_args(spec.argv, launch.python) is None):
            return None
        kernel = KernelKey.of(launch.python, launch.preload, launch.cwd or working_directory(),
                              env)
        return fork_handle.ServerKey.on(kernel, self._net.pid if self._net is not None else None)

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        await asyncio.to_thread(self.prepare)
        km, scratch = self.kernel_manager(launch)
        env = self.task_env(launch)
        fd = open_task_log(launch.log_path)  # never through a link, never blocked by a FIFO
        try:
            await km.start_kernel(env=env, stdout=fd, stderr=fd,
                                  cwd=launch.cwd or working_directory())
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            os.close(fd)
        process = getattr(km.provisioner, "process", None)
        handle = LocalTaskHandle(task=launch.task, host=self.host, client=km.client(),
                                 pid=getattr(process, "pid", None), manager=km, scratch=scratch)
        handle.forked = isinstance(process, forkserver.ForkedProcess)
        key = self.fork_key(task_kernel_spec(launch.python), launch, env)
        if key is not None and (note := forkserver.take_note(key)) is not None:
            handle.notes.append(note)  # its fork server was found stopped or hung: said once
        return handle


def _socket_prefix(task_dir: Path) -> tuple[str, Path | None]:
    """Where the kernel's five sockets go: ``<task dir>/kernel-N``, or an owner-only temp
    directory when that path is too long for a Unix socket."""
    prefix = str(task_dir / "kernel")
    if len(os.fsencode(prefix)) <= MAX_SOCKET_PREFIX:
        return prefix, None
    scratch = Path(tempfile.mkdtemp(prefix="tfdist-"))  # mkdtemp makes it 0700
    return str(scratch / "k"), scratch
