"""Fork servers: local task kernels forked from a process that imported TensorFlow once.

One server (:mod:`.zygote`, driven through :mod:`.fork_handle`) per :class:`ServerKey`;
:class:`ForkProvisioner` is the jupyter_client kernel provisioner that asks it for a kernel and
spawns as usual where it cannot serve. Lifetimes, retirement and the watch: docs/design.md,
"Fork server".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil
from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Unicode

from tfdist_nb.debuglog import swallowed
from tfdist_nb.host_os import seqpacket_pairs, zombie_status
from tfdist_nb.launchers.fork_handle import ForkServer, ForkServerError, ServerKey, ServerTrouble
from tfdist_nb.launchers.zygote import KERNEL_MODULE, ServerReady
from tfdist_nb.worker.memory_limits import TF_TASK_MB, available_mb

logger = logging.getLogger(__name__)

#: the name ``jupyter_client.kernel_provisioners`` knows :class:`ForkProvisioner` by (pyproject)
PROVISIONER = "tfdist-fork-provisioner"
MAX_SERVERS = 3
#: after a server was found stopped or hung, its key's kernels are spawned for this long
SPAWN_AFTER_TROUBLE_S = 60.0
#: ``TFDIST_FORK=off`` starts every kernel as its own process (docs/reference.md)
ENV_SWITCH = "TFDIST_FORK"
#: seconds a server with no kernel is kept (it holds ~570 MB: docs/performance.md)
IDLE_ENV = "TFDIST_FORK_IDLE_S"
IDLE_S = 300.0


def enabled_by_default() -> bool:
    """``$TFDIST_FORK``; ValueError for anything but on/off (a misspelt "off" must not pass)."""
    raw = os.environ.get(ENV_SWITCH, "").strip().lower()
    if raw in ("off", "0", "no", "false"):
        return False
    if raw in ("", "on", "1", "yes", "true"):
        return True
    raise ValueError(f"{ENV_SWITCH}={raw}: choose on or off (off spawns every task's kernel "
                     "instead of forking it)")


@functools.cache
def can_fork() -> bool:
    """Whether this host has ``AF_UNIX`` ``SOCK_SEQPACKET`` sockets (Linux; not macOS, where
    every kernel is spawned: docs/reference.md, "Platforms")."""
    if seqpacket_pairs():
        return True
    logger.info("no fork server on %s (no AF_UNIX SOCK_SEQPACKET sockets): every local task "
                "kernel is spawned, and each task imports TensorFlow itself: ~3-6 s of CPU per "
                "start", sys.platform)
    return False


def idle_after_s() -> float:
    """``$TFDIST_FORK_IDLE_S`` (default ``IDLE_S``); ValueError, naming it, for a bad value."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    if not raw:
        return IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{IDLE_ENV}={raw}: give the seconds an idle fork server is kept "
                         f"(default {IDLE_S:.0f}; 0 ends it as soon as its last kernel has)")
    return value


class ForkedProcess:
    """A forked kernel as jupyter_client's local provisioner sees a ``Popen``."""

    stdin = stdout = stderr = None

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        #: the server's part in how it ended, naming the server; None: the server reported it
        self.cause: str | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.server.exit_code(self.pid)
            self.returncode = self._unreported() if code is None else code
        return self.returncode

    def _unreported(self) -> int | None:
        """How it ended when its server has not said: with its dead server (its parent watch),
        or as a zombie its stopped server does not reap (status read from /proc)."""
        status = zombie_status(self.pid)
        if self.server.gone or self.server.proc.poll() is not None:
            if status is None and psutil.pid_exists(self.pid):
                return None
            self.cause = f"it ended with its parent: {self.server.trouble() or self.server.why()}"
            troubled(self.server, None)
            return 1 if status is None else status  # 1: what its parent watch exits with
        if status is not None and (trouble := self.server.trouble()) is not None:
            self.cause = (f"{trouble}: retired, the next {SPAWN_AFTER_TROUBLE_S:.0f} s of starts "
                          "spawn their kernels")
            troubled(self.server, trouble, told=True)
        return status  # a zombie of a server that is well: its report is on its way

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, forking from the server ``server_key`` names."""

    server_key = Unicode("", config=True, help="The fork server's name (tfdist_nb).")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        server = _servers.get(self.server_key)
        args = kernel_args(cmd, server.key.python) if server is not None else None
        if server is None or args is None or not server.alive():
            return await super().launch_kernel(cmd, **kwargs)
        env = dict(kwargs.get("env") or os.environ)
        env["JPY_PARENT_PID"] = str(server.pid)  # its parent: the lifeline watches the server
        cwd = str(kwargs.get("cwd") or os.getcwd())
        stdio = [fd for fd in (kwargs.get("stdout"), kwargs.get("stderr")) if fd is not None]
        try:
            pid = await server.spawn(args, env, cwd, " ".join(cmd), stdio)
        except ServerTrouble as exc:
            troubled(server, str(exc))
            return await super().launch_kernel(cmd, **kwargs)
        except (ForkServerError, asyncio.TimeoutError) as exc:
            logger.debug("fork server %s not used: %s", self.server_key, exc)
            with _registry_lock:
                _drop(server)
            return await super().launch_kernel(cmd, **kwargs)
        self.process = ForkedProcess(server, pid)  # type: ignore[assignment]  # Popen-like
        self.pid = self.pgid = pid  # it called setsid before the server answered
        self.cwd = cwd
        return self.connection_info


def kernel_args(cmd: Sequence[str], python: str) -> list[str] | None:
    """The kernel's arguments when ``cmd`` is ``python -m tfdist_nb.worker.kernel ...`` with the
    server's interpreter; None: another command, which the server cannot run."""
    if len(cmd) >= 3 and cmd[0] == python and list(cmd[1:3]) == ["-m", KERNEL_MODULE]:
        return list(cmd[3:])
    return None


# ---------------------------------------------------------------------- the servers
_servers: dict[str, ForkServer] = {}
_registry_lock = threading.Lock()


def server_for(key: ServerKey, env: Mapping[str, str],
               wrap: Callable[[list[str]], list[str]] | None = None) -> str | None:
    """The name of the live server for ``key``, started if need be; None: spawn instead."""
    name = _name(key)
    with _registry_lock:
        _close_retired()
        server = _servers.get(name)
        trouble = server.trouble() if server is not None else None
        if (server is not None and trouble is None and server.alive() and not server.stale()
                and not server.hung()):
            server.used = time.monotonic()  # not idle: the idle watch leaves it to this start
            return name
        if name in _failed:
            return None
        if server is not None and trouble is not None and server.proc.poll() is None:
            _trouble(name, server, trouble)  # stopped: this start spawns, and says why
            return None
        if _spawning.get(name, 0.0) > time.monotonic():
            return None
        if server is not None:  # dead, hung, or its code changed: a new one for the next kernels
            if server.hung():
                logger.warning("the fork server (pid %s) was still importing %s after %.0f s: "
                               "ended; a new one imports it afresh", server.pid,
                               ", ".join(key.preload), time.monotonic() - server.began)
            _drop(server)
        _make_room()
        try:
            server = ForkServer(key, env, wrap)
        except OSError as exc:
            logger.debug("no fork server: %s", exc)
            _failed.add(name)
            return None
        server.ready.add_done_callback(functools.partial(_note_failure, name, server))
        _servers[name] = server
        _watch_idle()
        return name


#: the idle watch's thread while there are servers to watch
_idle_watch: list[threading.Thread] = []
#: the longest the idle watch sleeps between two looks
IDLE_LOOK_S = 5.0


def _watch_idle() -> None:
    """Start the idle watch unless it runs. Hold the registry lock."""
    if not any(thread.is_alive() for thread in _idle_watch):
        _idle_watch[:] = [threading.Thread(target=_end_idle, name="tfdist-fork-idle",
                                           daemon=True)]
        _idle_watch[0].start()


def _end_idle() -> None:
    """End servers idle for ``TFDIST_FORK_IDLE_S``, at once while memory is short (an idle
    server's ~570 MB are what the next start wants), and retired ones whose kernels ended."""
    while True:
        try:
            limit = idle_after_s()
        except ValueError:  # said by the launcher that read it first
            limit = IDLE_S
        with _registry_lock:
            _close_retired()
            idle_ones = [(s, idle) for s in _servers.values()
                         if (idle := s.idle_for()) is not None]
            short = bool(idle_ones) and available_mb() < TF_TASK_MB
            for server, idle in idle_ones:
                if idle >= limit or short:
                    logger.debug("fork server %s idle for %.0f s%s: ended", server.pid, idle,
                                 " with memory short" if short else "")
                    _drop(server)
            if not _servers and not _retired:
                _idle_watch.clear()
                return
        time.sleep(min(max(limit / 4, 0.1), IDLE_LOOK_S))


_failed: set[str] = set()
#: servers no longer forked from, kept until the kernels forked from them have ended
_retired: list[ForkServer] = []
#: keys whose kernels are spawned until then (monotonic time): their server was found stopped
#: or hung (SPAWN_AFTER_TROUBLE_S)
_spawning: dict[str, float] = {}
#: what a server's trouble was, by key, until a start says it (:func:`take_note`)
_untold: dict[str, str] = {}


def troubled(server: ForkServer, trouble: str | None, told: bool = False) -> None:
    """Retire ``server``, found stopped, dead (``trouble`` None) or not answering; ``told``:
    the message that found it named it already."""
    with _registry_lock:
        if _servers.get(name := _name(server.key)) is server:
            _trouble(name, server, trouble, told)


def _trouble(name: str, server: ForkServer, trouble: str | None, told: bool = False) -> None:
    """Hold the registry lock."""
    if trouble is not None and server.proc.poll() is None:
        _spawning[name] = time.monotonic() + SPAWN_AFTER_TROUBLE_S
        if not told:
            _untold[name] = (f"{trouble}: retired; this kernel is spawned instead, and the "
                             f"next starts within {SPAWN_AFTER_TROUBLE_S:.0f} s too")
        logger.debug("%s", trouble)
    _drop(server)


def take_note(key: ServerKey) -> str | None:
    """Why the server of ``key`` was retired at a start, once, to say with the task."""
    with _registry_lock:
        return _untold.pop(_name(key), None)


def _close_retired() -> None:
    for server in _retired:
        server.prune()
    for server in [s for s in _retired if not s.children or not s.alive()]:
        _retired.remove(server)
        server.close()


def _note_failure(name: str, server: ForkServer,
                  ready: concurrent.futures.Future[ServerReady]) -> None:
    """A server that could not import ``preload`` (not one ended here): spawn from now on."""
    if not ready.cancelled() and ready.exception() is not None and _servers.get(name) is server:
        logger.debug("fork server %s failed: %s", name, ready.exception())
        _failed.add(name)


def _drop(server: ForkServer) -> None:
    """No new kernel from ``server``: retired, ended once its kernels have. Hold the lock."""
    if _servers.get(name := _name(server.key)) is server:
        del _servers[name]
    if server.children and server.alive():
        _retired.append(server)
    else:
        server.close()


def _make_room() -> None:
    """Close the least recently used servers with no live kernel beyond MAX_SERVERS - 1."""
    idle = sorted((s for s in _servers.values() if not s.children), key=lambda s: s.used)
    while len(_servers) >= MAX_SERVERS and idle:
        _drop(idle.pop(0))


def _name(key: ServerKey) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


def live_servers() -> list[ForkServer]:
    """The servers of this process."""
    with _registry_lock:
        return list(_servers.values())


def close_all() -> None:
    """End every server and so its kernels (the session's close, after its clusters)."""
    with _registry_lock:
        servers = [*_servers.values(), *_retired]
        _servers.clear()
        _retired.clear()
    for server in servers:
        with swallowed(logger):
            server.close()
