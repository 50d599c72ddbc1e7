"""The controller's handle on one fork server process (:mod:`.zygote`), watched like a task;
which servers exist is :mod:`.forkserver`'s (docs/design.md, "Fork server").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tfdist_nb import host_os
from tfdist_nb.debuglog import swallowed
from tfdist_nb.diagnostics.crash import describe_exit
from tfdist_nb.launchers.kernel_key import LATE, KernelKey
from tfdist_nb.launchers.zygote import MAX_MESSAGE, ForkRequest, ServerMessage, ServerReady
from tfdist_nb.owned_files import private_temp_dir

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: how long a server may take to import ``preload`` before kernels are spawned without it
READY_TIMEOUT_S = 300.0
#: a server still importing ``preload`` after this long is taken for hung (TensorFlow takes
#: 3-10 s) and replaced at the next start
HUNG_AFTER_S = 60.0
#: a server that has not answered a fork request after this long is hung (it forks in ms)
FORK_ANSWER_S = 10.0
#: how often a start waiting on a server looks at whether it is stopped or dead
WATCH_S = 0.2
#: a stopped server by its state in /proc (``host_os.process_state``)
STOPPED = {"T": "was stopped (SIGSTOP)", "t": "is stopped by a debugger"}


class ForkServerError(RuntimeError):
    """The server could not start or serve (the message says why, with its log's end)."""


class ServerTrouble(ForkServerError):
    """The server was found stopped, dead or not answering while a start waited on it."""


@dataclass(frozen=True)
class ServerKey(KernelKey):
    """What a forked kernel shares with its server: the kernel key and the network."""

    net: int | None = None  # the private network holder's pid, or None on the host's network

    @classmethod
    def on(cls, kernel: KernelKey, net: int | None) -> ServerKey:
        return cls(kernel.python, kernel.preload, kernel.cwd, kernel.env, net)


class ForkServer:
    """One server process and the controller's end of its socket (thread-safe)."""

    def __init__(self, key: ServerKey, env: Mapping[str, str],
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.key = key
        self.ready: concurrent.futures.Future[ServerReady] = concurrent.futures.Future()
        self.gone = False
        self.children: set[int] = set()
        self.used = self.began = time.monotonic()
        self._exits: dict[int, int] = {}
        self._pending: dict[int, concurrent.futures.Future[int]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # 0700; the ones a notebook killed with SIGKILL left are removed here
        self._dir = private_temp_dir("fork")
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

    def trouble(self) -> str | None:
        """What keeps it from serving, naming it; None: nothing."""
        code = self.proc.poll()
        how = ended_how(code) if code is not None else STOPPED.get(
            host_os.process_state(self.pid) or "")
        return None if how is None else f"the fork server (pid {self.pid}) {how}"

    def prune(self) -> None:
        """Forget kernels that ended without a report (a stopped server reaps none)."""
        for pid in list(self.children):
            if host_os.process_state(pid) in (None, "Z", "X"):
                self.children.discard(pid)

    def stale(self) -> bool:
        """Whether a file it imported from outside the Python installation changed since:
        its forks would run the old code."""
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

        Cancelled meanwhile, the child is killed once reported; a server stopped, dead or not
        answering within ``FORK_ANSWER_S`` raises ServerTrouble."""
        ready = asyncio.wrap_future(self.ready)
        # looked at even when this start gave up waiting (else asyncio warns of it at exit)
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        await self._watched(asyncio.shield(ready), timeout)
        forking = self._fork(args, env, cwd, title, stdio)
        try:
            return await self._watched(asyncio.wrap_future(forking), FORK_ANSWER_S)
        except asyncio.TimeoutError:
            raise ServerTrouble(f"the fork server (pid {self.pid}) did not answer a fork "
                                f"request within {FORK_ANSWER_S:.0f} s") from None
        finally:
            forking.cancel()  # given up: the child is killed if it still comes

    async def _watched(self, waiting: Awaitable[T], timeout: float) -> T:
        """``waiting``'s result, looking every ``WATCH_S`` whether this server is stopped or
        dead (a stopped one would keep it waiting until the timeout)."""
        task = asyncio.ensure_future(waiting)
        deadline = time.monotonic() + timeout
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_S)
                if done:
                    return task.result()
                if (trouble := self.trouble()) is not None:
                    raise ServerTrouble(trouble)
                if time.monotonic() >= deadline:
                    raise asyncio.TimeoutError
        finally:
            task.cancel()

    def _fork(self, args: list[str], env: Mapping[str, str], cwd: str, title: str,
              stdio: Sequence[int]) -> concurrent.futures.Future[int]:
        """The fork request sent: its pid once the server answers; ForkServerError at once
        where it cannot be sent."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        number = next(self._ids)
        request: ForkRequest = {"id": number, "args": list(args), "env": dict(env), "cwd": cwd,
                   "title": title, "umask": host_os.umask(), "rlimits": current_rlimits()}
        data = json.dumps(request).encode()
        if len(data) > MAX_MESSAGE:
            raise ForkServerError(f"the request is {len(data)} bytes long")
        with self._lock:
            if self.gone:
                raise ForkServerError(self.why())
            self._pending[number] = future
            self.used = time.monotonic()
            try:
                socket.send_fds(self._sock, [data], list(stdio))
            except OSError as exc:
                self._pending.pop(number, None)
                raise ForkServerError(f"the fork server is gone ({exc})") from None
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
        why = self.why()
        if not self.ready.done():
            self.ready.set_exception(ForkServerError(why))
        for future in pending.values():
            if not future.done():
                future.set_exception(ForkServerError(why))

    def idle_for(self) -> float | None:
        """Seconds since its last kernel or fork request; None while it is not idle."""
        self.prune()
        if self.children or self._pending or not self.ready.done():
            return None
        return time.monotonic() - self.used

    def _heard(self, message: ServerMessage) -> None:
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
            self.children.discard(message["exit"])
            self.used = time.monotonic()
        elif "forked" in message:
            with self._lock:
                future = self._pending.pop(message["forked"], None)
            pid = message["pid"]
            self.children.add(pid)
            if future is None or not future.set_running_or_notify_cancel():
                kill_group(pid)  # its start was given up meanwhile
            else:
                future.set_result(pid)
        elif "ready" in message and not self.ready.done():
            logger.debug("fork server %s ready in %ss", self.pid, message.get("seconds"))
            self.ready.set_result(message)
        elif "failed" in message and not self.ready.done():
            self.ready.set_exception(ForkServerError(
                "the fork server could not import "
                f"{', '.join(self.key.preload) or 'the kernel'}: {message['failed'].strip()}"))

    def why(self) -> str:
        code = self.proc.poll()
        tail = ""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            tail = " | ".join(line.strip() for line in lines[-3:])
        return (f"the fork server (pid {self.pid}) "
                + (ended_how(code) if code is not None else "ended")
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
            self.proc.wait(timeout=0 if host_os.process_state(self.pid) in STOPPED else 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def ended_how(code: int) -> str:
    return ("was " if code < 0 else "") + describe_exit(code)


def current_rlimits() -> dict[str, tuple[int, int]]:
    """This process's resource limits by name, which a spawned kernel would inherit."""
    import resource

    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            with contextlib.suppress(ValueError, OSError):
                limits[name] = resource.getrlimit(getattr(resource, name))
    return limits


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pid, signal.SIGKILL)
