"""Tasks that a scheduler started (``python -m tfdist_nb.worker --task ...``), attached to.

The controller owns none of these processes: it finds them by the files they write into a
connection directory and cannot restart them. Those files are trusted only as far as
docs/security.md allows (this user's, writable by nobody else), and a pid is signalled only
while it is still the worker that wrote them: pids are reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from jupyter_client.asynchronous import AsyncKernelClient

from tfdist_nb.accounts import user_name
from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import ClusterStartError, SpecError
from tfdist_nb.gpu_plan import Placement
from tfdist_nb.host_os import boot_id
from tfdist_nb.launchers.base import (
    Launcher,
    LauncherOption,
    StopPath,
    StopReport,
    TaskHandle,
    TaskLaunch,
)
from tfdist_nb.topology import TaskId

if TYPE_CHECKING:
    from tfdist_nb.worker.__main__ import Sidecar

    class FoundWorker(Sidecar):
        """A worker's sidecar as read here: its path, and whether the worker is on this host."""

        sidecar: str
        here: bool

logger = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".tfdist.json"  # as written by tfdist_nb.worker.__main__
GONE = 255
HEARTBEAT_GRACE_S = 3.0

_CREATE_TIME_SLACK_S = 0.05  # psutil derives it from clock ticks; both sides compute it alike


def check_connection_dir(path: Path) -> None:
    """ValueError unless ``path`` (once it exists) is this user's directory that nobody else
    can write: else a planted connection file would get this controller's cells."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return  # the workers make it (0700) as they start
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"connection_dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"connection_dir {path} belongs to {user_name(st.st_uid)}, not to you "
                         f"({user_name(os.geteuid())}); attach only to a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"connection_dir {path} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}), so its files cannot be trusted; "
                         "start the workers with a directory only you can write "
                         "(python -m tfdist_nb.worker makes a new one 0700)")


def _private_file(path: Path) -> str | None:
    """Why ``path`` is not a file this user wrote for itself alone (None: it is)."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"cannot read {path.name}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    if st.st_uid != os.geteuid():
        return f"{path.name} belongs to {user_name(st.st_uid)}"
    if st.st_mode & 0o077:
        return f"{path.name} is open to group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def worker_process(pid: object, create_time: object, task: str) -> tuple[bool, str]:
    """Whether ``pid`` is still the worker of ``task`` that recorded ``create_time``, and if
    not, why (pids are reused)."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(create_time, (int, float)):
        return False, "its sidecar has no pid and start time"
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False, f"pid {pid} has exited"
        if abs(proc.create_time() - create_time) > _CREATE_TIME_SLACK_S:
            return False, f"pid {pid} is now another process (started at another time)"
        cmd = proc.cmdline()
    except psutil.NoSuchProcess:
        return False, f"pid {pid} has exited"
    except psutil.AccessDenied:
        return False, f"pid {pid} belongs to another user"
    if "tfdist_nb.worker" not in cmd or not any(a in (task, f"--task={task}") for a in cmd):
        return False, f"pid {pid} runs {shlex.join(cmd)[:160]!r}, not the worker of {task}"
    return True, ""


@dataclass
class AttachedTaskHandle(TaskHandle):
    heartbeat = True  # a remote sidecar's task is watched through its heartbeats (poll)
    connection_file: Path = field(default=None, repr=False)  # type: ignore[assignment]
    sidecar: Path = field(default=None, repr=False)  # type: ignore[assignment]
    here: bool = True
    create_time: float | None = None
    _silent_since: float | None = None

    def _ours(self) -> bool:
        """The sidecar's process still runs and is still this task's worker."""
        return worker_process(self.pid, self.create_time, str(self.task))[0]

    async def poll(self) -> int | None:
        if self.here:
            return None if self._ours() else GONE
        hb = getattr(self.client, "hb_channel", None)
        if hb is None or not hb.is_alive():
            return None
        if hb.is_beating():
            self._silent_since = None
            return None
        self._silent_since = self._silent_since or time.monotonic()
        return GONE if time.monotonic() - self._silent_since > HEARTBEAT_GRACE_S else None

    def describe_exit(self, code: int) -> str:
        if self.here:
            return "is gone (an attached process: its exit status went to its scheduler)"
        return f"stopped answering its heartbeat on {self.host} for {HEARTBEAT_GRACE_S:.0f}s"

    def _signal(self, sig: int) -> bool:
        """Send ``sig`` to the worker process, only if it is still the worker (pid reuse)."""
        if not (self.here and self.pid and self._ours()):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)
        return True

    async def interrupt(self) -> None:
        if self._signal(signal.SIGINT):
            return
        with swallowed(logger):
            self.client.control_channel.send(self.client.session.msg("interrupt_request", {}))

    async def stop(self, grace_s: float) -> StopReport:
        start, path = self.close_channels(), StopPath.ALREADY_DEAD
        if await self.poll() is None:
            path = StopPath.REQUEST
            control = AsyncKernelClient()
            control.load_connection_info(self.client.get_connection_info())
            try:
                control.control_channel.start()
                control.control_channel.send(control.session.msg("shutdown_request",
                                                                 {"restart": False}))
                await self._wait_gone(grace_s)
            finally:
                control.stop_channels()
            if self._signal(signal.SIGKILL):
                path = StopPath.KILL
                await self._wait_gone(5.0)
        gone = self.here and not self._ours()
        if not self.here or gone:
            for f in (self.sidecar, self.connection_file):
                with contextlib.suppress(OSError):
                    f.unlink()
        return StopReport(str(self.task), path, GONE if gone else None,
                          time.monotonic() - start)

    async def _wait_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self._ours() if self.here
                                               else self.sidecar.exists()):
            await asyncio.sleep(0.05)


def connection_dir_of_line(text: str) -> str:
    """``--connection-dir DIR``, which must exist: a typo would stop the running cluster for
    one that waits ``wait_timeout`` for workers that never come."""
    if not Path(text).expanduser().is_dir():
        raise SpecError(f"--connection-dir {text} is not a directory: start the workers first "
                        f"(python -m tfdist_nb.worker --task worker:0 --connection-dir {text}), "
                        "then run this line; the running cluster, if any, is left as it is")
    return str(Path(text).expanduser())


class AttachLauncher(Launcher):
    """Connects to workers that announced themselves in ``connection_dir``."""

    name = "attach"
    remote = True  # their interpreter is whatever the scheduler ran
    env_at_launch = False
    gpu_placement = Placement.SCHEDULER  # whoever started the workers gave them their GPUs
    restartable = False
    line_options = (
        LauncherOption("--connection-dir", "connection_dir", metavar="DIR", required=True,
                       parse=connection_dir_of_line,
                       help="for --launcher attach: where workers started by a scheduler with "
                            "'python -m tfdist_nb.worker --task worker:0 --connection-dir DIR' "
                            "announce themselves",
                       missing="--launcher attach and --connection-dir DIR go together: DIR is "
                               "where the workers started with python -m tfdist_nb.worker "
                               "announce themselves"),
    )

    def __init__(self, connection_dir: str | os.PathLike[str] | None = None,
                 wait_timeout: float = 120.0, **_: object) -> None:
        if connection_dir is None:
            raise ValueError("the attach launcher needs launcher_options={'connection_dir': "
                             "DIR}, the directory the workers were started with "
                             "(python -m tfdist_nb.worker --task worker:0 --connection-dir DIR)")
        self.dir = Path(connection_dir).expanduser()
        check_connection_dir(self.dir)
        self.wait_timeout = wait_timeout
        self.found: dict[TaskId, FoundWorker] = {}
        self.ignored: dict[TaskId, str] = {}  # why a sidecar there was not taken

    def line_values(self) -> dict[str, object]:
        return {"connection_dir": str(self.dir)}

    def base_environment(self) -> dict[str, str]:
        return {}

    def _read(self, task: TaskId) -> FoundWorker | None:
        """The sidecar of ``task`` if trustworthy and its worker alive; else None, and why in
        ``ignored``."""
        path = self.dir / f"{task.slug}{SIDECAR_SUFFIX}"
        if not path.exists() and not path.is_symlink():
            return None
        if (why := _private_file(path)) is not None:
            self.ignored[task] = why
            return None
        try:
            info: FoundWorker = json.loads(path.read_text())
            conn = Path(info["connection_file"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being replaced, or not ours to read: look again
        if conn.parent.resolve() != self.dir.resolve():
            self.ignored[task] = f"{path.name} names a connection file outside {self.dir}"
            return None
        if (why := _private_file(conn)) is not None:
            self.ignored[task] = why
            return None
        info["sidecar"] = str(path)
        info["here"] = here = (info.get("hostname") == socket.gethostname()
                               and info.get("boot_id", boot_id()) == boot_id())
        if here:
            alive, why = worker_process(info.get("pid"), info.get("create_time"), str(task))
            if not alive:  # left behind by a worker that died, its pid perhaps reused
                self.ignored[task] = f"{path.name}: {why}"
                return None
        self.ignored.pop(task, None)
        return info

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        if avoid:
            raise ClusterStartError(
                "attached workers announced TF ports that are taken: "
                + ", ".join(f"{t} {a}" for t, a in avoid.items())
                + "; start them again with other --tf-port values")
        missing = self.wait_for(tasks, time.monotonic() + self.wait_timeout)
        if missing:
            raise ClusterStartError(
                f"no attached worker for {', '.join(map(str, missing))} in {self.dir} after "
                f"{self.wait_timeout:.0f}s; start each with: python -m tfdist_nb.worker "
                f"--task {missing[0]} --connection-dir {self.dir}" + self.ignored_note(missing))
        return {t: self.found[t]["tf_address"] for t in tasks}

    def wait_for(self, tasks: Sequence[TaskId], deadline: float,
                 between: Callable[[list[TaskId]], None] | None = None) -> list[TaskId]:
        """Read the directory until every task announced itself (``found``); the tasks still
        missing at ``deadline``. ``between(missing)`` runs between looks and may raise."""
        missing = list(tasks)
        while True:
            try:
                check_connection_dir(self.dir)
            except ValueError as exc:
                raise ClusterStartError(str(exc)) from None
            for task in list(missing):
                if (info := self._read(task)) is not None:
                    self.found[task] = info
                    missing.remove(task)
            if not missing or time.monotonic() > deadline:
                return missing
            if between is not None:
                between(missing)
            time.sleep(0.1)

    def ignored_note(self, missing: Sequence[TaskId]) -> str:
        """`` (ignored: ...)``: why files of ``missing`` tasks in the directory were not taken."""
        ignored = "; ".join(f"{t}: {self.ignored[t]}" for t in missing if t in self.ignored)
        return f" (ignored: {ignored})" if ignored else ""

    async def start(self, launch: TaskLaunch,
                    kind: type[AttachedTaskHandle] = AttachedTaskHandle) -> TaskHandle:
        info = self.found.get(launch.task) or self._read(launch.task)
        if info is None:
            raise ClusterStartError(f"{launch.task}: its attached worker is gone")
        client = AsyncKernelClient()
        client.load_connection_file(info["connection_file"])
        return kind(task=launch.task, host=info.get("hostname", "?"), pid=info.get("pid"),
                    client=client, connection_file=Path(info["connection_file"]),
                    sidecar=Path(info["sidecar"]), here=info["here"],
                    create_time=info.get("create_time"))
