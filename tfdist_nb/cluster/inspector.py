"""What the runner (:func:`tfdist_nb.cluster.runner.run_cell`) may learn about a busy task.
Stacks and aborts go through each task's inspection subshell, which answers while the main
thread is blocked inside a TensorFlow op.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from tfdist_nb import host_os
from tfdist_nb.cluster.hub import EventHub
from tfdist_nb.cluster.state import TaskState
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.hangs import describe_row
from tfdist_nb.diagnostics.stall import Progress
from tfdist_nb.errors import AgentError
from tfdist_nb.events import HANG
from tfdist_nb.results import Hang
from tfdist_nb.store.collectives import LedgerView
from tfdist_nb.topology import TaskId, name_tasks
from tfdist_nb.worker.replies import Stacks

HEARTBEAT_GAP_S = 5.0
#: stacks and abort RPCs in flight at once: each is bounded by INSPECT_TIMEOUT_S from when it is
#: sent, which 1,023 sent together on a busy loop could pass (docs/performance.md)
RPCS_IN_FLIGHT = 64


class Inspector:
    def __init__(self, hub: EventHub, tasks: Mapping[TaskId, TaskRuntime]) -> None:
        self.hub = hub
        self.tasks = tasks
        self._gapped: set[str] = set()
        self._waiting_said: set[str] = set()  # tasks said to wait for a task at a prompt
        # an inspector lives for one run: step counts at its start make "steps this cell"
        self._marks = {rt.name: hub.live.view(rt.name).step_mark() for rt in tasks.values()}
        self._rpcs = asyncio.Semaphore(RPCS_IN_FLIGHT)

    def progress(self, rt: TaskRuntime) -> Progress:
        v = self.hub.live.view(rt.name)
        return Progress(v.step_count, v.lines_total, v.latest.get("cpu_percent"), v.last_sample)

    def cell_steps(self, rt: TaskRuntime) -> int:
        """Steps the task made in this run (its store count is over the task's life)."""
        v = self.hub.live.view(rt.name)
        mark = self._marks.get(rt.name)
        return v.steps_since(mark) if mark is not None else v.step_count

    def ledger(self, name: str) -> LedgerView:
        return self.hub.live.view(name).ledger

    def members(self) -> set[str]:
        """The tasks a MultiWorkerMirroredStrategy groups together: the chief and workers."""
        return {rt.name for rt in self.tasks.values() if rt.task.role in ("chief", "worker")}

    def heartbeat_gap(self, rt: TaskRuntime, busy: list[TaskRuntime],
                      ended: Mapping[str, str], since: float) -> None:
        """Say once per cell when a busy task's heartbeats stop (TensorFlow holding the GIL
        freezes its Python threads), naming the peers that ended or are not running the cell.
        ``since``: when the cell was sent."""
        v = self.hub.live.view(rt.name)
        last = max(v.last_sample or since, since)
        if time.time() - last < HEARTBEAT_GAP_S:
            self._gapped.discard(rt.name)
            return
        if rt.name in self._gapped:
            return
        self._gapped.add(rt.name)
        names = {b.name for b in busy}
        peers = [t for t in self.tasks.values()
                 if t.name not in names and t.task.role in ("worker", "chief")]
        done = [f"{t.name} ({ended[t.name]})" for t in peers if t.name in ended]
        others = [f"{t.name} ({t.state.value})" for t in peers if t.name not in ended]
        quiet = time.time() - last
        if stopped := self.stopped(rt):
            text = f"no heartbeat for {quiet:.0f}s: its {stopped}"
        else:
            text = (f"no heartbeat for {quiet:.0f}s: its Python threads are blocked "
                    "(TensorFlow holds the GIL, as when creating a strategy that waits for its "
                    "peers to join)")
        if done:
            text += f"; already ended this cell: {', '.join(done)}"
        if others:
            text += f"; not running this cell: {', '.join(others)}: run it on every task"
        self.hub.note(rt.name, text, "WARNING", kind="stall")

    def waits_for_prompt(self, rt: TaskRuntime, prompting: list[str]) -> None:
        """Say once per cell (INFO, not an alert) that ``rt`` waits in a collective for tasks at
        an input prompt: a wait for a person, not a hang."""
        row = self.ledger(rt.name).current()
        if row is None or rt.name in self._waiting_said:
            return
        self._waiting_said.add(rt.name)
        self.hub.note(rt.name, f"waits in {describe_row(row)} for {', '.join(prompting)}, at an "
                      "input prompt: not a hang, it goes on once the prompt is answered")

    def hang_named(self, hang: Hang) -> None:
        """The culprit and its waiters, alerted the moment the rules prove the hang: the cell
        ends once every waiter is released, seconds later at 1,024 tasks."""
        released = (f"; releasing the {len(hang.waiting)} task(s) waiting for it"
                    if hang.waiting else "")
        self.hub.note(hang.culprit, f"{hang.cause.rstrip('.')}{released}", "ERROR", topic=HANG,
                      about=tuple(hang.waiters))

    def stopped(self, rt: TaskRuntime) -> str | None:
        """When the task's process is stopped (SIGSTOP; it answers nothing until SIGCONT), that
        and what to do, in words; None when it is not (or is on another host)."""
        if not _process_stopped(rt):
            return None
        return (f"process (pid {rt.pid}) is stopped (state T: SIGSTOP, or Ctrl-Z in a terminal); "
                f"kill -CONT {rt.pid} lets it go on, %tfdist_restart --on {rt.name} replaces it")

    def last_words(self, rt: TaskRuntime) -> tuple[dict[str, Any] | None, list[str]]:
        v = self.hub.live.view(rt.name)
        return (v.latest or None), [line.text for line in list(v.lines)[-8:]]

    async def stacks(self, rt: TaskRuntime) -> Stacks | None:
        if rt.agent is None or rt.state is TaskState.DEAD:
            return None
        try:
            async with self._rpcs:
                return await rt.agent.stacks()
        except (asyncio.TimeoutError, AgentError):
            return None

    async def stacks_text(self, targets: list[TaskRuntime]) -> dict[str, str]:
        """Every target's stacks at once, as text by task name (``Cluster.stacks``)."""
        found = await asyncio.gather(*(self.stacks(rt) for rt in targets))
        text = {}
        for rt, stacks in zip(targets, found, strict=True):
            if stacks is None:
                text[rt.name] = "(no answer: the task is dead or did not answer in time)"
                continue
            main = stacks["main"]
            parts = [f"main thread: {main.get('kind')} at {main.get('at')}"]
            if main.get("line") not in (None, "?"):
                parts.append(f"  the user's line that led there: {main['line']}")
            parts += [f"--- {name} ---\n{stack}" for name, stack in stacks["threads"].items()]
            text[rt.name] = "\n".join(parts)
        return text

    async def abort_collectives(self, targets: list[TaskRuntime], reason: str) -> list[str]:
        """Abort the collectives of every target, said in one alert; returns their names."""
        async def one(rt: TaskRuntime) -> str | None:
            if rt.agent is None or rt.state is TaskState.DEAD:
                return None
            with contextlib.suppress(asyncio.TimeoutError, AgentError):
                async with self._rpcs:
                    await rt.agent.abort_collectives(reason=reason)
                return rt.name
            return None

        done = [n for n in await asyncio.gather(*(one(rt) for rt in targets)) if n is not None]
        if done:
            self.hub.note(done[0], f"aborted the collectives of {name_tasks(done)} ({reason}); "
                          "restart the tasks before the next collective", "WARNING",
                          about=tuple(done[1:]))
        return done

    async def interrupt(self, targets: list[TaskRuntime], grace_s: float) -> list[str]:
        """SIGINT; a task with a thread still inside a TensorFlow op ``grace_s`` later (SIGINT
        cannot reach it there) gets its collectives aborted. Returns those tasks' names."""
        await asyncio.gather(*(rt.handle.interrupt() for rt in targets if rt.handle))
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                rt.state in (TaskState.BUSY, TaskState.PROMPT, TaskState.STALLED)
                for rt in targets):
            await asyncio.sleep(0.1)
        found = await asyncio.gather(*(self.stacks(rt) for rt in targets))
        # the main thread, or a thread a strategy runs its all-reduce on, still inside TF
        inside = [rt for rt, s in zip(targets, found, strict=True)
                  if s and (s["main"]["kind"] == "tensorflow" or s["in_tf"])]
        return await self.abort_collectives(inside, "interrupted by the user")


def _process_stopped(rt: TaskRuntime) -> bool:
    """Whether a task on this host is a stopped process (state T)."""
    if rt.pid is None or getattr(rt.handle, "host", None) not in ("localhost", "127.0.0.1"):
        return False
    return host_os.process_state(rt.pid) == "T"

