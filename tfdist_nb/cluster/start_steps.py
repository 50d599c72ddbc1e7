"""What every task is started with (``Setup``, its GPUs placed by :func:`place`), and one task's
start-up steps, each bounded and watched so that a dead or broken kernel fails the step at once,
not at the deadline.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.errors import AgentError, SpecError
from tfdist_nb.gpu_plan import CVD, GpuPlan, GpuRequest, Placement, gpu_request, plan_gpus
from tfdist_nb.launchers.base import Launcher
from tfdist_nb.topology import ClusterSpec
from tfdist_nb.worker.gpu import host_devices

POLL_S = 0.2
#: What a kernel writes to its process log when it cannot bind a channel (it may not exit).
_FATAL_IN_LOG = re.compile(r"ZMQError|Address already in use")
T = TypeVar("T")


@dataclass
class Setup:
    """What every task of the cluster is started with."""

    spec: ClusterSpec
    launcher: Launcher
    python: str
    preload: tuple[str, ...]
    extra_env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 120.0
    #: each task's GPUs (``place``), under ``extra_env``: a user's variable wins
    gpus: GpuPlan = field(default_factory=GpuPlan)


def place(gpus: str | Sequence[str | int], per_task: int | None, spec: ClusterSpec,
          launcher: Launcher, env: Mapping[str, str]) -> tuple[GpuRequest, GpuPlan]:
    """Where a cluster's GPUs go (docs/reference.md, GPU placement): the request ``gpus=`` /
    ``gpus_per_task=`` make, and the plan for ``spec``'s tasks. The launcher says who places
    them, NVML here says which there are, :mod:`tfdist_nb.gpu_plan` decides; made with the
    ``Cluster``, so a request that cannot be met is a SpecError before anything starts."""
    request = gpu_request(gpus, per_task)
    where = launcher.gpu_placement
    env_cvd = env.get(CVD)
    if (where is Placement.SCHEDULER and request.per_task and env_cvd is None
            and not launcher.ask_gpus(request.per_task)):
        raise SpecError(f"--gpus-per-task {request.per_task}: the {launcher.name} launcher's "
                        "tasks get their GPUs from whoever started them; ask there (e.g. "
                        "srun --gpus-per-task=1)")
    asks_nvml = where is Placement.HERE and env_cvd is None and request.choice != "none"
    base = launcher.base_environment()
    return request, plan_gpus(
        request, spec.tasks, where=where, seen=host_devices() if asks_nvml else None,
        notebook_cvd=(os.environ if base is None else base).get(CVD), env_cvd=env_cvd,
        hosts=launcher.task_hosts(spec.tasks))


class StartFailed(Exception):
    """One task's start failed; ``retry``: worth one more try (the deadline is not past)."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


def late(start_timeout: float) -> str:
    return (f"not ready within start_timeout={start_timeout:.0f}s (the whole start, retries "
            "included)")


async def unless_it_dies(rt: TaskRuntime, step: Awaitable[T], deadline: float,
                         start_timeout: float, silent_iopub_after: float | None = None) -> T:
    """Await a start-up step, but fail within POLL_S when the process exits or its log says a
    channel could not bind, and at the deadline."""
    assert rt.handle is not None
    work = asyncio.ensure_future(step)
    exited = rt.handle.exit_future()
    started = time.monotonic()
    size_seen = log_size(rt)
    try:
        while not work.done():
            waiting: list[asyncio.Future[Any]] = [work, exited]
            await asyncio.wait(waiting, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                break
            if exited.done():
                raise StartFailed(f"the process {rt.handle.describe_exit(exited.result())} "
                                  "while starting")
            if (size := log_size(rt)) != size_seen:
                size_seen = size
                if fatal := fatal_log_line(rt, rt.log_offset):
                    raise StartFailed(f"its kernel could not set up a channel: {fatal}")
            if silent_iopub_after is not None and time.monotonic() - started > silent_iopub_after:
                raise StartFailed("its iopub channel sent nothing: output and telemetry would "
                                  "be lost")
            if time.monotonic() > deadline:
                raise StartFailed(late(start_timeout), retry=False)
        # a step quicker than a poll: the channel that could not bind (a heartbeat's, on a
        # thread of its own) is still read from the log before the task counts as started
        if fatal := fatal_log_line(rt, rt.log_offset):
            raise StartFailed(f"its kernel could not set up a channel: {fatal}")
        try:
            return work.result()
        except (AgentError, RuntimeError, OSError) as exc:
            if time.monotonic() >= deadline - POLL_S:  # it ran out of the time it was given
                raise StartFailed(late(start_timeout), retry=False) from exc
            raise StartFailed(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if not work.done():
            work.cancel()


def fatal_log_line(rt: TaskRuntime, offset: int) -> str | None:
    """A line written to the task's process log after ``offset`` saying that a channel could
    not bind (the log is appended to by every attempt; earlier ones do not count)."""
    if rt.log_path is None:
        return None
    try:
        with open(rt.log_path, "rb") as f:
            f.seek(offset)
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None
    return next((line.strip() for line in reversed(text.splitlines())
                 if _FATAL_IN_LOG.search(line)), None)


def log_size(rt: TaskRuntime) -> int:
    try:
        return rt.log_path.stat().st_size if rt.log_path is not None else 0
    except OSError:
        return 0
