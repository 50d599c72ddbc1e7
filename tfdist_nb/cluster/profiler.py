"""``%tfdist_profile``: one TensorFlow profiler capture of every task at once into one logdir.
One task runs the capture client on a thread of its own, so every kernel stays free. A capture
armed to start with the next cell is how a notebook profiles a training cell.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tfdist_nb.cluster.agent_client import AgentClient
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.errors import AgentError, SpecError, TfdistError
from tfdist_nb.topology import TaskId
from tfdist_nb.worker.replies import CaptureState, ProfileSummary

CALL_TIMEOUT_S = 60.0


@dataclass
class Capture:
    logdir: Path
    duration_ms: int
    delay_ms: int
    traced: dict[str, str] = field(default_factory=dict)
    """Task name by the trace file TensorFlow writes for it (``<host>_<port>.xplane.pb``)."""


def directory_to_write(path: Path, option: str) -> None:
    """Make ``path``, a directory the user names for the tasks to write into (``--logdir``,
    ``--dump``), owner-only; or a SpecError naming ``option`` and why it cannot be written (a
    file in the way, a read-only mount, no permission), before any task is asked to."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot make this directory "
                        f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError(f"{option} {path}: not writable by this user")


async def start_capture(targets: list[TaskRuntime], capture: Capture) -> TaskRuntime:
    """Start every task's server, then the capture on the first task; returns the capturing
    task."""
    ports = await asyncio.gather(*(_agent(rt).profiler_server(timeout=CALL_TIMEOUT_S)
                                   for rt in targets))
    addrs = [f"grpc://{rt.address.rpartition(':')[0]}:{port}"
             for rt, port in zip(targets, ports, strict=True)]
    capture.traced = {f"{addr.removeprefix('grpc://').replace(':', '_')}.xplane.pb": rt.name
                      for rt, addr in zip(targets, addrs, strict=True)}
    capture.logdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lead = targets[0]
    said = await _agent(lead).profile_capture(
        service_addrs=addrs, logdir=str(capture.logdir), duration_ms=capture.duration_ms,
        delay_ms=capture.delay_ms, timeout=CALL_TIMEOUT_S)
    if said != "started":
        raise TfdistError(f"{lead.name}: a profile capture is still running")
    return lead


async def finish_capture(lead: TaskRuntime, capture: Capture) -> ProfileSummary:
    """Wait for the capture to end (bounded), then read the per-task summary."""
    deadline = time.monotonic() + (capture.delay_ms + capture.duration_ms) / 1000 + 60
    state: CaptureState = {}
    while time.monotonic() < deadline:
        state = await _agent(lead).profile_state(timeout=CALL_TIMEOUT_S)
        if not state.get("running"):
            break
        await asyncio.sleep(0.2)
    if state.get("running"):
        raise TfdistError("the profile capture did not end in time")
    if state.get("error"):
        raise TfdistError(f"the profile capture failed: {state['error']}")
    try:
        return await _agent(lead).profile_summary(logdir=str(capture.logdir),
                                                     timeout=CALL_TIMEOUT_S)
    except (AgentError, asyncio.TimeoutError) as exc:
        return {"run": None, "files": {}, "unreadable": str(exc)}


def describe(summary: ProfileSummary, capture: Capture) -> str:
    """Where the trace is, how to open it, and per task what it holds; a task whose trace is
    missing is named, so "1 of 2" is never silent."""
    files = summary.get("files") or {}
    expected = len(capture.traced) or len(files)
    lines = [f"profile of {len(files)} task(s), {capture.duration_ms} ms, in {capture.logdir}"
             if len(files) == expected else
             f"profile of {len(files)} of {expected} task(s), {capture.duration_ms} ms, in "
             f"{capture.logdir}",
             f"open it with:  %load_ext tensorboard  then  %tensorboard --logdir {capture.logdir}"]
    for name, info in files.items():
        top = ", ".join(f"{op} {ms:.0f} ms" for op, ms in info.get("top_ms", [])[:3])
        who = f"{capture.traced[name]} ({name})" if name in capture.traced else name
        lines.append(f"  {who}: {info.get('events', 0)} events" + (f"; busiest: {top}"
                                                                   if top else ""))
    if summary.get("run") is not None or files:
        for name, task in capture.traced.items():
            if name not in files:
                lines.append(f"  {task}: no trace (it ended or its profiler failed during the "
                             "capture; its output says which)")
    if summary.get("unreadable"):
        lines.append(f"  (the trace could not be summarised: {summary['unreadable']})")
    return "\n".join(lines)


@dataclass
class Started:
    """A capture as its cell started: the task running the capture client, or why none does."""

    capture: Capture
    lead: TaskRuntime | None
    failed: str | None = None


class Profiler:
    """A cluster's profile captures (``Cluster.profile``): taken now, or armed and started with
    the next cell (``start_armed``) and read when that cell ends (``finish``)."""

    def __init__(self, tasks: Mapping[TaskId, TaskRuntime],
                 loop: Callable[[], LoopThread]) -> None:
        self._tasks, self._loop = tasks, loop
        #: the capture the next cell starts; it does not outlive the tasks (set None at stop)
        self.armed: Capture | None = None

    def profile(self, logdir: Path, duration_ms: int, delay_ms: int, now: bool) -> str:
        """Arm a capture into ``logdir`` (or take it ``now``); returns what to tell the user."""
        directory_to_write(logdir, "--logdir")
        capture = Capture(logdir, int(duration_ms), 0 if now else int(delay_ms))
        if not now:
            self.armed = capture
            return (f"profile of {duration_ms} ms armed: it starts with the next cell and is "
                    f"written to {logdir}")
        started = self._start(capture)
        if started.lead is None:
            raise TfdistError(str(started.failed))
        return self.finish(started)

    def start_armed(self) -> Started | None:
        """The armed capture (disarmed now), started as its cell starts; None if none."""
        capture, self.armed = self.armed, None
        return self._start(capture) if capture is not None else None

    def finish(self, started: Started) -> str:
        """Wait for the capture and describe it; a failure is said, not raised."""
        if started.lead is None:
            return str(started.failed)
        capture = started.capture
        try:
            summary = self._loop().run(finish_capture(started.lead, capture),
                                       (capture.delay_ms + capture.duration_ms) / 1000 + 120)
        except (TfdistError, TimeoutError, asyncio.TimeoutError) as exc:
            return f"the profile capture failed: {exc}"
        return describe(summary, capture)

    def _start(self, capture: Capture) -> Started:
        """A failure to start is said in the cell's result, not raised."""
        targets = [rt for rt in self._tasks.values() if rt.agent]
        try:
            return Started(capture, self._loop().run(start_capture(targets, capture), 120))
        except (TfdistError, TimeoutError, asyncio.TimeoutError) as exc:
            return Started(capture, None, f"the profile capture did not start: {exc}")


def _agent(rt: TaskRuntime) -> AgentClient:
    if rt.agent is None:
        raise TfdistError(f"{rt.name} is not running")
    return rt.agent
