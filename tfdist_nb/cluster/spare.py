"""One spare kernel (docs/design.md, "Spare kernels"), how it becomes a task (:func:`adopt`), and
how many ``warm=`` asks for; the pool that starts and hands them out is :mod:`.spares`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.start_steps import Setup, StartFailed, log_size
from tfdist_nb.cluster.task import TaskRuntime, end_kernel
from tfdist_nb.debuglog import swallowed
from tfdist_nb.errors import SpecError
from tfdist_nb.events import Event, OutputLine
from tfdist_nb.launchers.base import Launcher, TaskHandle
from tfdist_nb.launchers.kernel_key import KernelKey, Unfit
from tfdist_nb.store.rundir import open_private
from tfdist_nb.transport.channel import KernelChannel
from tfdist_nb.worker.replies import Adopted

logger = logging.getLogger(__name__)

T = TypeVar("T")

BACKLOG_LINES = 500


def env_delta(spare_env: Mapping[str, str],
              task_env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What to set and unset in a spare's environment so it equals ``task_env``."""
    set_env = {k: v for k, v in task_env.items() if spare_env.get(k) != v}
    unset = sorted(k for k in spare_env if k not in task_env)
    return set_env, unset


class SpareState(enum.Enum):
    """Where a spare is in its life; only the pool's loop thread changes it."""

    WARMING = "warming"  # started, importing ``preload``
    READY = "ready"  # warmed, waiting to be taken
    TAKEN = "taken"  # handed to a start or restart (maybe still warming: ``warm_s`` is None)
    STOPPED = "stopped"


class Held(enum.Enum):
    """Why the pool starts no spare now, though it is short."""

    CPU = "cpu"  # no core to spare
    MEMORY = "memory"  # one more would leave too little for a TensorFlow task


@dataclass(frozen=True)
class NotStarting:
    """Why the pool starts no spare now (``spares()["note"]`` is its ``str()``)."""

    held: Held
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class NoSpare:
    """Why the pool had no spare for a task when none it holds was unfit for it."""

    off: bool = False
    warming: int = 0
    held: NotStarting | None = None

    def __str__(self) -> str:
        if self.off:
            return "spares are off"
        if self.warming:
            return f"no spare ready yet ({self.warming} warming)"
        return str(self.held) if self.held is not None else "no spare ready yet"


#: why a task did not get a spare: one unfit for it (the first found), or none to give
WhyCold = Unfit | NoSpare


@dataclass(frozen=True)
class WarmOutcome:
    """How one start or restart used spare kernels; ``str()`` is the line said about it."""

    tasks: int  # tasks started or restarted
    adopted: int  # of them, taken from spares
    still_warming: int = 0  # of the adopted, spares still warming when taken
    cold: tuple[str, ...] = ()  # tasks started cold, by name
    why_cold: WhyCold | None = None  # why (the first task's reason)
    fresh_ports: bool = False  # every task moved to fresh TF ports
    forked: bool = False  # the cold tasks are forked from the launcher's fork server

    def __str__(self) -> str:
        if self.cold:
            who = ("every task" if not self.adopted else
                   f"{', '.join(self.cold)} ({self.adopted} of {self.tasks} from spares)")
            text = f"cold start for {who}: {self.why_cold or 'no spare'}"
            if self.forked:
                text += " (forked from the fork server: TensorFlow is imported already)"
        else:
            text = f"{self.adopted} task(s) from spare kernels"
        if self.still_warming:
            text += f" ({self.still_warming} still warming when taken)"
        return text + (" on fresh TF ports" if self.fresh_ports else "")


@dataclass
class Spare:
    """One spare kernel: started with ``env`` (no task identity), warmed, then taken."""

    number: int
    env: dict[str, str] = field(repr=False)
    python: str
    preload: tuple[str, ...]
    cwd: str
    directory: Path
    launcher: Launcher | None = field(default=None, repr=False)  # what starts it
    handle: TaskHandle | None = None
    channel: KernelChannel | None = None
    subshell: str | None = None
    state: SpareState = SpareState.WARMING
    began: float = field(default_factory=time.monotonic)
    warm_s: float | None = None
    starting: asyncio.Future[Any] | None = field(default=None, repr=False)
    warming: asyncio.Future[bool] | None = field(default=None, repr=False)
    backlog: deque[Event] = field(default_factory=lambda: deque(maxlen=BACKLOG_LINES),
                                  repr=False)
    route: Callable[[list[Event]], None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"spare-{self.number}"

    @property
    def key(self) -> KernelKey:
        """Which tasks it can become (:mod:`tfdist_nb.launchers.kernel_key`, the one rule)."""
        return KernelKey.of(self.python, self.preload, self.cwd, self.env)

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle else None

    @property
    def log_path(self) -> Path:
        return self.directory / "kernel.log"

    def sink(self, events: list[Event]) -> None:
        """The channel's sink: kept aside until the spare is a task, then the cluster's."""
        if self.route is not None:
            self.route(events)
        else:
            self.backlog.extend(e for e in events if isinstance(e, OutputLine))

    def hand_over(self, sink: Callable[[list[Event]], None], task: str) -> None:
        """From now on its events are ``task``'s; what it said while it was a spare (TensorFlow's
        import-time lines) is replayed under that name, as a cold task would have said it."""
        assert self.channel is not None
        self.channel.task = task
        backlog: list[Event] = [OutputLine(e.time, task, e.stream, e.text, None)
                                for e in self.backlog if isinstance(e, OutputLine)]
        self.backlog.clear()
        if backlog:
            sink(backlog)
        self.route = sink
        self.state = SpareState.TAKEN


async def unless_dies(spare: Spare, step: Awaitable[T]) -> T:
    """Await a warm-up step, failing within POLL_S when the spare's process exits."""
    assert spare.handle is not None
    work = asyncio.ensure_future(step)
    exited = spare.handle.exit_future()
    try:
        waiting: list[asyncio.Future[Any]] = [work, exited]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            raise RuntimeError(f"the process {spare.handle.describe_exit(exited.result())}")
        return work.result()
    finally:
        if not work.done():
            work.cancel()


async def stop_spare(spare: Spare) -> None:
    """End a spare now, also one still being spawned or warmed."""
    spare.state = SpareState.STOPPED
    if spare.warming is not None and not spare.warming.done():
        spare.warming.cancel()
        with contextlib.suppress(asyncio.CancelledError), swallowed(logger):
            await spare.warming
    if spare.handle is None and spare.starting is not None:
        with swallowed(logger):
            spare.handle = await asyncio.wait_for(asyncio.shield(spare.starting), 30)
    with swallowed(logger):
        await end_kernel(spare.handle, spare.channel, 0.0)


def copy_start_log(spare: Spare, path: Path) -> None:
    """The spare's start-up output goes into the task's process log first, so the log reads
    like a cold task's."""
    try:
        text = spare.log_path.read_bytes()
    except OSError:
        return
    with contextlib.suppress(OSError), open_private(path, "a") as f:
        f.write(f"--- tfdist_nb: process {spare.pid} started as {spare.name} ---\n")
        f.write(text.decode("utf-8", "replace"))


#: a spare still warming when taken is waited for its expected remaining warm-up times this,
#: plus WARM_SLACK_S
WARM_PATIENCE = 1.5
WARM_SLACK_S = 2.0


async def adopt(rt: TaskRuntime, spare: Spare, log_path: Path, sink: Callable[[list[Event]], None],
                preload: list[str], typical_warm_s: float, deadline: float,
                until: Callable[[Awaitable[Adopted]], Awaitable[Adopted]]) -> tuple[str, str]:
    """``spare`` becomes ``rt``'s task in one agent call, before any user code: the task's
    environment (TF_CONFIG included), ``tw.task``, the log tag, its process log, telemetry; it
    answers with a cold start's self-description. What the ready note says of it, each
    ``step`` bounded by ``until``."""
    if spare.warm_s is None:
        await await_warm(spare, typical_warm_s, deadline)
    assert spare.handle is not None and spare.channel is not None
    rt.log_path = log_path
    copy_start_log(spare, log_path)
    rt.log_offset = log_size(rt)
    spare.handle.task = rt.task
    rt.handle, rt.channel = spare.handle, spare.channel
    spare.hand_over(sink, rt.name)
    set_env, unset_env = env_delta(spare.env, rt.env)
    agent = AgentClient(rt.name, spare.channel, subshell=spare.subshell)
    info = await until(agent.adopt(task=rt.name, set_env=set_env, unset_env=unset_env,
                                   log_path=str(log_path), preload=list(preload),
                                   timeout=max(deadline - time.monotonic(), 0.1)))
    rt.info = {k: v for k, v in info.items() if k != "adopted"}  # describe's fields
    rt.agent = agent
    low = info["adopted"]["low_priority_threads"]
    return (f" from {spare.name} (warmed {spare.warm_s}s before)",
            f"; {low} idle import thread(s) keep the spare's low priority" if low else "")


async def await_warm(spare: Spare, typical: float, deadline: float) -> None:
    """Wait for a spare taken while still warming, about as long as the rest of a cold start
    would take (``typical``); one that fails or is later is ended (StartFailed: start cold)."""
    ran = time.monotonic() - spare.began
    patience = max(typical - ran, 0.0) * WARM_PATIENCE + WARM_SLACK_S
    wait = min(patience, max(deadline - time.monotonic(), 0.0))
    warming = spare.warming  # None: its warm-up failed already (and said so)
    try:
        if warming is not None:
            await asyncio.wait([warming], timeout=wait)
        if warming is not None and not warming.done():
            raise StartFailed(f"{spare.name} was still warming {ran + wait:.1f}s after it "
                              f"started; a warm-up takes about {typical:.1f}s here")
        if (warming is None or warming.cancelled() or warming.exception() is not None
                or not warming.result()):
            raise StartFailed(f"{spare.name} could not be warmed")
    except BaseException:
        await stop_spare(spare)
        raise


def spare_count(warm: bool | int | None, launcher: Launcher, setup: Setup) -> int:
    """Spare kernels for ``warm=`` (docs/reference.md): None is ``$TFDIST_WARM`` (docs/
    reference.md, Environment; unset or ``auto``: one per task) for the local launcher when
    there is something to preload, none otherwise."""
    tasks = len(setup.spec.tasks)
    if warm is None:
        raw = os.environ.get("TFDIST_WARM", "auto").strip().lower()
        if raw not in ("", "auto", "off", "false", "no") and not raw.isdigit():
            raise SpecError(f"TFDIST_WARM={raw!r}: use auto, off or a number of spares (e.g. "
                            "TFDIST_WARM=0)")
        default = tasks if raw in ("", "auto") else int(raw) if raw.isdigit() else 0
        return default if launcher.spares and setup.preload else 0
    if warm is False or (not isinstance(warm, bool) and warm == 0):
        return 0
    if isinstance(warm, bool) or (isinstance(warm, int) and warm > 0):
        if not launcher.spares:
            raise SpecError(f"warm= needs the local launcher; {launcher.name} tasks start cold "
                            "(leave warm unset or False)")
        return tasks if warm is True else int(warm)
    raise SpecError(f"warm= is True, False, None or a number of spares, not {warm!r}")
