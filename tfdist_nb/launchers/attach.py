"""Tasks that a scheduler started (``python -m tfdist_nb.worker --task ...``), attached to.

The controller does not own these processes: it finds them through the files they write into a
connection directory, waits (bounded) until every task of the spec is there, and sends each its
TF_CONFIG through the worker agent before any cell runs. Liveness comes from the process table
when a task runs on this host and from the kernel heartbeat otherwise. ``stop()`` asks each
kernel to shut down (its scheduler job then ends); an attached task cannot be restarted from
here, because only its scheduler can start it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient

from tfdist_nb.cluster.spec import TaskId
from tfdist_nb.errors import ClusterStartError
from tfdist_nb.launchers.base import Launcher, StopReport, TaskHandle, TaskLaunch, register

SIDECAR_SUFFIX = ".tfdist.json"  # as written by tfdist_nb.worker.__main__
GONE = 255
HEARTBEAT_GRACE_S = 3.0


def _zombie_or_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] == "Z"
    return False


@dataclass
class AttachedTaskHandle(TaskHandle):
    connection_file: Path = field(default=None, repr=False)  # type: ignore[assignment]
    sidecar: Path = field(default=None, repr=False)  # type: ignore[assignment]
    here: bool = True
    _silent_since: float | None = None

    async def poll(self) -> int | None:
        if self.here and self.pid:
            return GONE if _zombie_or_gone(self.pid) else None
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

    async def interrupt(self) -> None:
        if self.here and self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGINT)
            return
        with contextlib.suppress(Exception):
            self.client.control_channel.send(self.client.session.msg("interrupt_request", {}))

    async def stop(self, grace_s: float) -> StopReport:
        start = time.monotonic()
        with contextlib.suppress(Exception):
            self.client.stop_channels()
        path = "already-dead"
        if await self.poll() is None:
            path = "request"
            control = AsyncKernelClient()
            control.load_connection_info(self.client.get_connection_info())
            try:
                control.control_channel.start()
                control.control_channel.send(control.session.msg("shutdown_request",
                                                                 {"restart": False}))
                await self._wait_gone(grace_s)
            finally:
                control.stop_channels()
            if self.here and self.pid and not _zombie_or_gone(self.pid):
                path = "kill"
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, signal.SIGKILL)
                await self._wait_gone(5.0)
        if not self.here or (self.pid and _zombie_or_gone(self.pid)):
            for f in (self.sidecar, self.connection_file):
                with contextlib.suppress(OSError):
                    f.unlink()
        code = GONE if (self.here and self.pid and _zombie_or_gone(self.pid)) else None
        return StopReport(str(self.task), path, code, time.monotonic() - start)

    async def _wait_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.here and self.pid and _zombie_or_gone(self.pid):
                return
            if not self.here and not self.sidecar.exists():
                return
            await asyncio.sleep(0.05)


class AttachLauncher(Launcher):
    """Connects to workers that announced themselves in ``connection_dir``."""

    name = "attach"
    remote = True  # their interpreter is whatever the scheduler ran
    env_at_launch = False
    restartable = False

    def __init__(self, connection_dir: str | os.PathLike[str] | None = None,
                 wait_timeout: float = 120.0, **_: Any) -> None:
        if connection_dir is None:
            raise ValueError("the attach launcher needs launcher_options={'connection_dir': "
                             "DIR}, the directory the workers were started with "
                             "(python -m tfdist_nb.worker --task worker:0 --connection-dir DIR)")
        self.dir = Path(connection_dir)
        self.wait_timeout = wait_timeout
        self.found: dict[TaskId, dict[str, Any]] = {}

    def base_environment(self) -> dict[str, str]:
        return {}

    def _read(self, task: TaskId) -> dict[str, Any] | None:
        path = self.dir / f"{task.slug}{SIDECAR_SUFFIX}"
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        info["sidecar"] = str(path)
        here = info.get("hostname") == socket.gethostname()
        if here and _zombie_or_gone(int(info.get("pid", 0)) or -1):
            return None  # left behind by a worker that died
        return info

    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        if avoid:
            raise ClusterStartError(
                "attached workers announced TF ports that are taken: "
                + ", ".join(f"{t} {a}" for t, a in avoid.items())
                + "; start them again with other --tf-port values")
        deadline = time.monotonic() + self.wait_timeout
        missing = list(tasks)
        while True:
            for task in list(missing):
                if (info := self._read(task)) is not None:
                    self.found[task] = info
                    missing.remove(task)
            if not missing:
                break
            if time.monotonic() > deadline:
                names = ", ".join(map(str, missing))
                raise ClusterStartError(
                    f"no attached worker for {names} in {self.dir} after "
                    f"{self.wait_timeout:.0f}s; start each with: python -m tfdist_nb.worker "
                    f"--task {missing[0]} --connection-dir {self.dir}")
            time.sleep(0.1)
        return {t: self.found[t]["tf_address"] for t in tasks}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        info = self.found.get(launch.task) or self._read(launch.task)
        if info is None:
            raise ClusterStartError(f"{launch.task}: its attached worker is gone")
        client = AsyncKernelClient()
        client.load_connection_file(info["connection_file"])
        here = info.get("hostname") == socket.gethostname()
        return AttachedTaskHandle(task=launch.task, host=info.get("hostname", "?"),
                                  pid=info.get("pid"), client=client,
                                  connection_file=Path(info["connection_file"]),
                                  sidecar=Path(info["sidecar"]), here=here)


register("attach", AttachLauncher)
