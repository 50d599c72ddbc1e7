"""Fork servers: local task kernels forked from a process that imported TensorFlow once.

A TensorFlow import costs each process 3-6 s of CPU (docs/performance.md); a restart, a resize,
each of ``isolate``'s variants and every spare paid it again. The local launcher instead keeps
one server process (:mod:`.zygote`) per interpreter, preload, working directory, private network
and import-time environment (:mod:`.import_env`), made at the first start that needs it and kept
for the life of this process; every task kernel after that is a fork of it, ready in a fraction
of a second (docs/design.md, "Fork server").

jupyter_client drives a forked kernel like any other: :class:`ForkProvisioner` is a kernel
provisioner (the library's own extension point for how a kernel process is made) whose
``launch_kernel`` asks the server instead of spawning. Where the server cannot serve (it failed
to import ``preload``, or the kernel command is not the worker kernel) it spawns as jupyter_client
always does. The process it hands back answers ``poll``, ``wait`` and signals as a ``Popen`` does;
its exit code comes from the server, which is its parent.

A server lives until this process exits (its end of the socket closes, and the server with it);
at most ``MAX_SERVERS`` are kept, the oldest with no live kernel closed first. One whose imported
code outside the Python installation changed on disk (a module of the user's in ``preload``, an
editable install) is retired: the next kernel comes from a new server, as a spawned one would
import the new code, and the old server ends once its kernels have. So is one still importing
after ``HUNG_AFTER_S`` (an import that hangs): the next start does not wait on it again.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Unicode

from tfdist_nb.debuglog import swallowed
from tfdist_nb.launchers.import_env import LATE, import_time_env
from tfdist_nb.launchers.zygote import KERNEL_MODULE, MAX_MESSAGE

logger = logging.getLogger(__name__)

#: the name ``jupyter_client.kernel_provisioners`` knows :class:`ForkProvisioner` by (pyproject)
PROVISIONER = "tfdist-fork-provisioner"
MAX_SERVERS = 3
#: how long a server may take to import ``preload`` before kernels are spawned without it
READY_TIMEOUT_S = 300.0
#: a server still importing ``preload`` after this long is taken for hung (an import that waits
#: forever) and ended when a start asks for it again: the next start makes a new one, which
#: imports the code as it is now (TensorFlow takes 3-10 s)
HUNG_AFTER_S = 60.0
#: ``TFDIST_FORK=off`` starts every kernel as its own process (docs/reference.md)
ENV_SWITCH = "TFDIST_FORK"


def enabled_by_default() -> bool:
    """``$TFDIST_FORK``: on (unset too) or off; ValueError, naming the variable, for anything
    else (a misspelt "disable" must not leave forking on unsaid)."""
    raw = os.environ.get(ENV_SWITCH, "").strip().lower()
    if raw in ("off", "0", "no", "false"):
        return False
    if raw in ("", "on", "1", "yes", "true"):
        return True
    raise ValueError(f"{ENV_SWITCH}={raw}: choose on or off (off spawns every task's kernel "
                     "instead of forking it)")


class ForkServerError(RuntimeError):
    """The server could not start or serve (the message says why, with its log's end)."""


@dataclass(frozen=True)
class ServerKey:
    """What a forked kernel shares with its server: a task differing in any of it is not forked
    from that server."""

    python: str
    preload: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]  # the import-time environment, sorted
    net: int | None  # the private network holder's pid, or None on the host's network

    @classmethod
    def of(cls, python: str, preload: Sequence[str], cwd: str, env: Mapping[str, str],
           net: int | None) -> ServerKey:
        return cls(python, tuple(preload), cwd, tuple(sorted(import_time_env(env).items())), net)


class ForkServer:
    """One server process and the controller's end of its socket (thread-safe)."""

    def __init__(self, key: ServerKey, env: Mapping[str, str],
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.key = key
        self.ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self.gone = False
        self.children: set[int] = set()
        self.used = self.began = time.monotonic()
        self._exits: dict[int, int] = {}
        self._pending: dict[int, concurrent.futures.Future[int]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="tfdist-fork-"))  # 0700
        self.log_path = self._dir / "server.log"
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [key.python, "-m", "tfdist_nb.launchers.zygote", str(theirs.fileno()),
                str(self.log_path), *key.preload]
        base = {k: v for k, v in env.items() if k not in LATE}
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                wrap(argv) if wrap else argv, env=base, cwd=key.cwd, stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, pass_fds=(theirs.fileno(),), start_new_session=True)
        except BaseException:
            self._sock.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        finally:
            os.close(log)
            theirs.close()
        self._reader = threading.Thread(target=self._read, name="tfdist-fork-server",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None

    def exit_code(self, pid: int) -> int | None:
        return self._exits.get(pid)

    def hung(self) -> bool:
        """Whether it has been importing ``preload`` for longer than ``HUNG_AFTER_S``."""
        return not self.ready.done() and time.monotonic() - self.began > HUNG_AFTER_S

    def stale(self) -> bool:
        """Whether a file of the code it imported (outside the Python installation: the user's
        own modules in ``preload``, an editable install) changed since: its forks would run
        the old code."""
        if not self.ready.done() or self.ready.exception() is not None:
            return False
        for path, mtime in self.ready.result().get("files", {}).items():
            try:
                if os.stat(path).st_mtime_ns != mtime:
                    return True
            except OSError:
                return True
        return False

    # ------------------------------------------------------------------ asking
    async def spawn(self, args: list[str], env: Mapping[str, str], cwd: str, title: str,
                    stdio: Sequence[int], timeout: float = READY_TIMEOUT_S) -> int:
        """Fork a worker kernel (``python -m tfdist_nb.worker.kernel ARGS``); its pid.

        Cancelled while the server forks, the child is killed as soon as it is reported."""
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.ready)), timeout)
        return await asyncio.wrap_future(self._fork(args, env, cwd, title, stdio))

    def _fork(self, args: list[str], env: Mapping[str, str], cwd: str, title: str,
              stdio: Sequence[int]) -> concurrent.futures.Future[int]:
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        number = next(self._ids)
        request = {"id": number, "args": list(args), "env": dict(env), "cwd": cwd,
                   "title": title}
        data = json.dumps(request).encode()
        if len(data) > MAX_MESSAGE:
            future.set_exception(ForkServerError(f"the request is {len(data)} bytes long"))
            return future
        with self._lock:
            if self.gone:
                future.set_exception(ForkServerError(self._why_gone()))
                return future
            self._pending[number] = future
            self.used = time.monotonic()
            try:
                socket.send_fds(self._sock, [data], list(stdio))
            except OSError as exc:
                self._pending.pop(number, None)
                future.set_exception(ForkServerError(f"the fork server is gone ({exc})"))
        return future

    # ------------------------------------------------------------------ hearing
    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            with swallowed(logger):
                self._heard(json.loads(data))
        with self._lock:
            self.gone = True
            pending, self._pending = self._pending, {}
        why = self._why_gone()
        if not self.ready.done():
            self.ready.set_exception(ForkServerError(why))
        for future in pending.values():
            if not future.done():
                future.set_exception(ForkServerError(why))

    def _heard(self, message: dict[str, Any]) -> None:
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
            self.children.discard(message["exit"])
        elif "forked" in message:
            with self._lock:
                future = self._pending.pop(message["forked"], None)
            pid = message["pid"]
            self.children.add(pid)
            if future is None or not future.set_running_or_notify_cancel():
                _kill_group(pid)  # its start was given up meanwhile
            else:
                future.set_result(pid)
        elif "ready" in message and not self.ready.done():
            logger.debug("fork server %s ready in %ss", self.pid, message.get("seconds"))
            self.ready.set_result(message)
        elif "failed" in message and not self.ready.done():
            self.ready.set_exception(ForkServerError(
                "the fork server could not import "
                f"{', '.join(self.key.preload) or 'the kernel'}: {message['failed'].strip()}"))

    def _why_gone(self) -> str:
        code = self.proc.poll()
        tail = ""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            tail = " | ".join(line.strip() for line in lines[-3:])
        return (f"the fork server (pid {self.pid}) ended"
                + (f" with exit code {code}" if code is not None else "")
                + (f"; its log ends: {tail}" if tail else ""))

    # ------------------------------------------------------------------ ending
    def close(self) -> None:
        """End the server; kernels forked from it end too (their parent watch)."""
        with self._lock:
            self.gone = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


class ForkedProcess:
    """A forked kernel as jupyter_client's local provisioner sees a ``Popen``."""

    stdin = stdout = stderr = None

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.server.exit_code(self.pid)
            if code is None and self.server.gone and not psutil.pid_exists(self.pid):
                code = 1  # its server is gone, so no one reports how it ended
            self.returncode = code
        return self.returncode

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
    """jupyter_client's local provisioner, the kernel forked from the server ``server_key``
    names (:func:`server_for`); spawned as usual where that server cannot serve it."""

    server_key = Unicode("", config=True, help="The fork server's name (tfdist_nb).")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
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
        except (ForkServerError, asyncio.TimeoutError) as exc:
            logger.debug("fork server %s not used: %s", self.server_key, exc)
            _forget(server)
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
    """The name of the live server for ``key``, started if there is none; None when one for this
    key failed before (kernels are then spawned)."""
    name = _name(key)
    with _registry_lock:
        _close_retired()
        server = _servers.get(name)
        if server is not None and server.alive() and not server.stale() and not server.hung():
            return name
        if name in _failed:
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
        return name


_failed: set[str] = set()
#: servers no longer forked from, kept until the kernels forked from them have ended
_retired: list[ForkServer] = []


def _retire(server: ForkServer) -> None:
    if server.children and server.alive():
        _retired.append(server)
    else:
        server.close()


def _close_retired() -> None:
    for server in [s for s in _retired if not s.children or not s.alive()]:
        _retired.remove(server)
        server.close()


def _note_failure(name: str, server: ForkServer,
                  ready: concurrent.futures.Future[Any]) -> None:
    """A server that could not import ``preload``: its key's kernels are spawned from now on.
    Not one this module ended itself (hung, or dropped for another reason)."""
    if not ready.cancelled() and ready.exception() is not None and _servers.get(name) is server:
        logger.debug("fork server %s failed: %s", name, ready.exception())
        _failed.add(name)


def _forget(server: ForkServer) -> None:
    with _registry_lock:
        _drop(server)


def _drop(server: ForkServer) -> None:
    """No new kernel from ``server``: out of the registry, and retired (ended now, or once its
    kernels have, and by ``close_all`` in any case). Hold the registry lock."""
    for name, known in list(_servers.items()):
        if known is server:
            _servers.pop(name)
    _retire(server)


def _make_room() -> None:
    """Close the least recently used servers with no live kernel beyond MAX_SERVERS - 1."""
    idle = sorted((s for s in _servers.values() if not s.children), key=lambda s: s.used)
    while len(_servers) >= MAX_SERVERS and idle:
        _drop(idle.pop(0))


def _name(key: ServerKey) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


def live_servers() -> list[ForkServer]:
    """The servers of this process (for tests and ``%tfdist_status``-like views)."""
    with _registry_lock:
        return list(_servers.values())


@atexit.register
def close_all() -> None:
    """End every server (each one's kernels end with it)."""
    with _registry_lock:
        servers = [*_servers.values(), *_retired]
        _servers.clear()
        _retired.clear()
    for server in servers:
        with swallowed(logger):
            server.close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pid, signal.SIGKILL)
