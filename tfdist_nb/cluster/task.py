"""One task as the controller holds it: its id, process handle, channel, state and self-report."""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.state import TaskEvent, TaskState, next_state
from tfdist_nb.debuglog import swallowed
from tfdist_nb.gpu_plan import CVD
from tfdist_nb.launchers.base import StopReport, TaskHandle
from tfdist_nb.topology import TaskId
from tfdist_nb.transport.channel import KernelChannel

logger = logging.getLogger(__name__)


async def end_kernel(handle: TaskHandle | None, channel: KernelChannel | None,
                     grace_s: float) -> StopReport | None:
    """The one way a kernel this package started ends (a task, a restart's old process, a
    spare): ``channel`` closed first, so nothing waits for a reply on a socket about to go and
    a channel that fails to close never keeps the process alive; then ``handle`` stopped
    within ``grace_s``. None without a process."""
    if channel is not None:
        with swallowed(logger):
            await channel.close()
    if handle is None:
        return None
    return await handle.stop(grace_s)


@dataclass
class TaskRuntime:
    task: TaskId
    address: str
    tf_config: str
    env: dict[str, str] = field(repr=False)
    handle: TaskHandle | None = None
    channel: KernelChannel | None = None
    state: TaskState = TaskState.STARTING
    info: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None
    log_offset: int = 0  # where this attempt's lines begin in the process log
    agent: AgentClient | None = None

    @property
    def name(self) -> str:
        return str(self.task)

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle else None

    @property
    def live_channel(self) -> KernelChannel:
        """The channel of a task that has a process (a cell, an inspection); a task without
        one is an error of the caller, said as such."""
        if self.channel is None:
            raise RuntimeError(f"{self.name} has no kernel channel (its process is not running)")
        return self.channel

    @property
    def live_handle(self) -> TaskHandle:
        """The process handle of a task that has a process (see ``live_channel``)."""
        if self.handle is None:
            raise RuntimeError(f"{self.name} has no process")
        return self.handle

    @property
    def gpus(self) -> str:
        """The GPUs the task was given (its CUDA_VISIBLE_DEVICES, as it reported it once up, or
        SLURM's); "" for none or unknown (docs/reference.md, GPUs)."""
        return self.info.get("gpus", self.env.get(CVD)) or ""

    @property
    def connection_file(self) -> str:
        """The kernel connection file a JupyterLab console on the task connects with
        (docs/reference.md, Consoles on a task); "" where there is none here (ssh)."""
        if self.handle is None:
            return ""
        path = getattr(self.handle, "connection_file", None) or getattr(
            self.handle.client, "connection_file", "")
        return str(path or "")

    @property
    def at_breakpoint(self) -> bool:
        """JupyterLab's debugger holds the task at a breakpoint from a console on it
        (docs/reference.md, Consoles on a task): a person is at it, not a hang."""
        return self.channel is not None and self.channel.debug_stopped

    @property
    def shown_state(self) -> str:
        """The state people are shown: ``prompt`` also while the task is held at a breakpoint,
        whatever its cells do."""
        live = (TaskState.IDLE, TaskState.BUSY, TaskState.STALLED)
        return (TaskState.PROMPT.value if self.at_breakpoint and self.state in live
                else self.state.value)

    @property
    def host(self) -> str:
        return self.handle.host if self.handle else self.address.rpartition(":")[0]

    async def end(self, grace_s: float) -> StopReport | None:
        """End this task's process (``end_kernel``) and forget it; None if none ran.
        A stop that raised keeps the handle, so the cluster's teardown tries again."""
        report = await end_kernel(self.handle, self.channel, grace_s)
        self.handle, self.channel, self.agent = None, None, None
        return report

    def transition(self, event: TaskEvent) -> TaskState:
        new = next_state(self.state, event)
        if new is not self.state:
            logger.debug("%s: %s -> %s (%s)", self.name, self.state, new, event.value)
        self.state = new
        return new

    def finish_run(self) -> None:
        """A cell's reply arrived; a task stopped or restarted meanwhile stays as it is."""
        if self.state in (TaskState.BUSY, TaskState.PROMPT, TaskState.STALLED, TaskState.IDLE):
            self.transition(TaskEvent.DONE)

    def kernel_log_tail(self, n: int) -> list[str]:
        """The last lines the process wrote outside ipykernel's capture (crash messages)."""
        path = self.log_path
        if path is None:
            return []
        try:  # a link is followed (the SLURM launcher's points at the job's log); a FIFO or
            # a device is not read (it could block the caller)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return []
            start = max(0, st.st_size - 16384)
            lines = os.pread(fd, st.st_size - start, start).decode("utf-8", "replace")
        finally:
            os.close(fd)
        return lines.splitlines()[-n:]
