"""The cells a cluster runs, seen from the caller's thread. They are remembered because
``%tfdist_isolate`` re-runs and ``%tfdist_report`` describes them (docs/reference.md, Isolate);
the tasks' questions are answered in this thread (docs/reference.md, Input from the tasks).
"""

from __future__ import annotations

import concurrent.futures
import enum
import getpass
import logging
import math
import queue
from collections.abc import Callable
from typing import TypeVar

from tfdist_nb.cluster.hub import RUN_DIRECTORY, EventHub
from tfdist_nb.cluster.inspector import Inspector
from tfdist_nb.cluster.loop import Job, LoopThread
from tfdist_nb.cluster.profiler import Profiler
from tfdist_nb.cluster.runner import RunControl, RunEnd, run_cell
from tfdist_nb.cluster.state import CannotRun, TaskEvent, TaskState, next_state
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.explain import (
    explain_network,
    explain_second_strategy,
    network_gone,
)
from tfdist_nb.diagnostics.gpu_faults import failure_fault
from tfdist_nb.diagnostics.numerics import first_nan
from tfdist_nb.errors import ClusterNotRunningError
from tfdist_nb.events import Event, Finding
from tfdist_nb.launchers.base import NetTrouble
from tfdist_nb.results import RunResult, TaskResult, TaskStatus
from tfdist_nb.store.rundir import RunDirectory
from tfdist_nb.topology import task_order
from tfdist_nb.transport.channel import EOF_ANSWER, Prompt

FAILURES_KEPT = 20  # failing cells (result and code) a cluster keeps for %tfdist_isolate
#: what answers a task's question: (task, prompt, password) -> the line typed
InputHandler = Callable[[str, str, bool], str]
#: what starts the post-mortem debugger in a task (worker/postmortem.py): constant source
POST_MORTEM = "__import__('tfdist_nb.worker.postmortem', fromlist=['_']).debug()"


class _Done(enum.Enum):
    """Queued when the run's future completes, so the relay's wait wakes at once."""

    RUN_DONE = "run done"


RUN_DONE = _Done.RUN_DONE
#: what the relay's queue carries: a batch of events, a task's question, or RUN_DONE
Queued = list[Event] | Prompt | _Done
S = TypeVar("S")

logger = logging.getLogger(__name__)


def ask_here(task: str, prompt: str, password: bool) -> str:
    """Ask this process's own user, the prompt naming the task (``[worker:1] your name? ``);
    in a notebook ipykernel forwards ``input`` and ``getpass`` to the frontend."""
    text = f"[{task}] {prompt}"
    return getpass.getpass(text) if password else input(text)


def first_raised(result: RunResult) -> str | None:
    """The task that raised first in ``result`` (by the time its error was published), or
    None when no task raised (it stalled, crashed or was released instead)."""
    raised = [r for r in result.tasks.values() if r.status is TaskStatus.ERROR]
    if not raised:
        return None
    first = min(raised, key=lambda r: (r.error_at if r.error_at is not None else math.inf,
                                       task_order(r.task)))
    return first.task


class Cells:
    """One cluster's cells: the runs in flight and how the finished ones ended."""

    def __init__(self, profiler: Profiler) -> None:
        self._profiler = profiler  # an armed capture starts and ends with the next cell
        #: the last cell's number (from 1, over the cluster's whole life)
        self.last = 0
        #: the runs in flight, each ended by ``stop_all``
        self.active: dict[RunControl, concurrent.futures.Future[dict[str, TaskResult]]] = {}
        #: the last run that failed and its cell's code (%tfdist_report)
        self.last_failure: tuple[RunResult, str] | None = None
        #: what %tfdist_isolate re-runs: cells ok on every task, the last failing ones
        self.passed: set[int] = set()
        self.failed: dict[int, tuple[RunResult, str]] = {}

    def run(self, targets: list[TaskRuntime], code: str, timeout: float | None,
            stall_timeout: float, on_event: Callable[[Event], None] | None, *,
            rundir: RunDirectory, hub: EventHub, loop: LoopThread, inspector: Inspector,
            alive: Callable[[], bool],
            network: Callable[[], NetTrouble | None] = lambda: None,
            on_input: InputHandler | None = None, number: int | None = None) -> RunResult:
        """Run ``code`` on ``targets`` and wait for every task; ``on_event`` gets the events in
        this thread, and an interrupt here interrupts the tasks; ``on_input`` answers the
        tasks' questions (None: their ``input()`` raises). ClusterNotRunningError if a task
        cannot take the cell (one still stalled in an earlier cell)."""
        _check_can_run(targets)
        # the notebook's In[n] when given, so tracebacks and the ledger name it the same way
        self.last = max(self.last + 1, number or 0)
        cell = self.last
        hub.new_cell([rt.name for rt in targets])
        events: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        listener = events.put  # removed by identity: the same bound method object
        hub.add_listener(listener)
        try:
            if remade := rundir.ensure():
                hub.note(RUN_DIRECTORY, remade, "WARNING")
            if disk := rundir.write_cell(cell, code, [rt.name for rt in targets]):
                hub.note(RUN_DIRECTORY, *disk)  # said in this cell's output too
        except BaseException:
            hub.remove_listener(listener)
            raise
        control = RunControl()
        on_prompt = events.put if on_input is not None else None
        tasks, profiling = self._follow(
            run_cell(targets, code, cell, timeout, control, inspector=inspector,
                     stall_timeout=stall_timeout, on_prompt=on_prompt),
            targets, control, events, listener, on_event, on_input, hub=hub, loop=loop,
            alive=alive, started=self._profiler.start_armed)
        result = RunResult(cell=cell, tasks=tasks, hang=control.hang)
        if profiling is not None:
            result.profile = self._profiler.finish(profiling)
        if origin := first_nan(result.failed):
            hub.note("cluster", origin.splitlines()[0], "WARNING")
        self._explain_network(result, network)
        self._explain_second_strategy(result, hub)
        self._explain_gpu(result, hub, targets)
        self._remember(result, code)
        return result

    def debug(self, rt: TaskRuntime, on_event: Callable[[Event], None] | None,
              on_input: InputHandler, *, hub: EventHub, loop: LoopThread,
              alive: Callable[[], bool], code: str = POST_MORTEM) -> TaskResult:
        """Run a debugger's ``code`` on ``rt`` alone, its prompts answered by ``on_input``.
        Silent (not a user's cell: never numbered, recorded, re-run or exported) and with no
        stall or hang rules, since a debugger waits for a person."""
        _check_can_run([rt])
        events: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        listener = events.put
        hub.add_listener(listener)
        control = RunControl()
        tasks, _ = self._follow(
            run_cell([rt], code, None, None, control, on_prompt=events.put, silent=True),
            [rt], control, events, listener, on_event, on_input, hub=hub, loop=loop,
            alive=alive, started=lambda: None)
        return tasks[rt.name]

    def _follow(self, run: Job[dict[str, TaskResult]], targets: list[TaskRuntime],
                control: RunControl, events: queue.SimpleQueue[Queued],
                listener: Callable[[list[Event]], None],
                on_event: Callable[[Event], None] | None, on_input: InputHandler | None, *,
                hub: EventHub, loop: LoopThread, alive: Callable[[], bool],
                started: Callable[[], S]) -> tuple[dict[str, TaskResult], S]:
        """Submit ``run`` to the loop and relay its events (and questions) to this thread
        until it ends; its results and what ``started`` returned once it was sent."""
        fut = loop.submit(run)
        fut.add_done_callback(lambda _: events.put(RUN_DONE))
        self.active[control] = fut
        extra = started()
        ask = None if on_input is None else _asker(on_input, targets, loop)
        try:
            relay(events, on_event, fut, lambda: loop.call_soon(control.stop, RunEnd.INTERRUPT),
                  alive=alive, ask=ask)
        finally:
            hub.remove_listener(listener)
            self.active.pop(control, None)
        return fut.result(timeout=10), extra

    @staticmethod
    def _explain_network(result: RunResult, network: Callable[[], NetTrouble | None]) -> None:
        """A task's download or DNS error explained where the launcher's choice of network
        (``network``, asked only then) took the tasks' outbound path."""
        lost = [r for r in result.failed if r.error is not None and r.explanation is None
                and network_gone(r.error.evalue)]
        if lost and (trouble := network()) is not None:
            for r in lost:
                r.explanation = explain_network(trouble.cause, trouble.cure)

    @staticmethod
    def _explain_second_strategy(result: RunResult, hub: EventHub) -> None:
        """A collective aborted in a task that made a second strategy is explained by it, in
        place of the generic peer-gone advice (which says to look for another task's fault)."""
        for r in result.failed:
            if (r.error is not None and Finding.SECOND_STRATEGY in hub.live.view(r.task).findings
                    and (said := explain_second_strategy(r.error.evalue))):
                r.explanation = said

    @staticmethod
    def _explain_gpu(result: RunResult, hub: EventHub, targets: list[TaskRuntime]) -> None:
        """A GPU out-of-memory, NCCL error or XID behind a failure, named with its cause from
        every task's last GPU reading (diagnostics/gpu_faults.py), first in the explanation
        and as an alert."""
        if result.ok:  # every healthy cell passes here: nothing to read
            return
        latest = {name: hub.live.view(name).latest for name in hub.live.tasks()}
        envs = {rt.name: rt.env for rt in targets}
        for r in result.failed:
            if (fault := failure_fault(r, latest, envs.get(r.task))) is not None:
                r.explanation = fault.text if r.status is TaskStatus.ERROR or not \
                    r.explanation else f"{fault.text}\n{r.explanation}"
                hub.note(r.task, fault.text, "WARNING", kind=fault.kind, about=fault.about)

    def stop_all(self, loop: LoopThread) -> None:
        """The cluster stops: a cell still running ends now, not later."""
        for control in list(self.active):
            loop.call_soon(control.stop, RunEnd.STOPPED)

    def wait(self, timeout: float) -> None:
        """Wait (bounded) for the runs still in flight to end."""
        concurrent.futures.wait(list(self.active.values()), timeout=timeout)

    def _remember(self, result: RunResult, code: str) -> None:
        if result.ok:
            self.passed.add(result.cell)
        else:
            self.last_failure = (result, code)
            self.failed[result.cell] = (result, code)
            for old in sorted(self.failed)[:-FAILURES_KEPT]:
                del self.failed[old]


def _check_can_run(targets: list[TaskRuntime]) -> None:
    """ClusterNotRunningError naming each task that cannot take a cell now, and why."""
    refused = []
    for rt in targets:
        try:
            next_state(rt.state, TaskEvent.RUN)
        except CannotRun as exc:
            refused.append(f"{rt.name}: {exc}")
    if refused:
        raise ClusterNotRunningError("cannot run this cell: " + "; ".join(refused))


def relay(events: queue.SimpleQueue[Queued], on_event: Callable[[Event], None] | None,
          fut: concurrent.futures.Future[dict[str, TaskResult]], interrupt: Callable[[], None],
          alive: Callable[[], bool], ask: Callable[[Prompt], None] | None = None) -> None:
    """Hand a running cell's events, and the tasks' questions in order with them, from the loop
    thread to this one (the notebook shows output only from the thread running the cell); the
    user's interrupt here ends the run for every task instead of leaving them behind."""
    while True:
        try:
            batch = events.get(timeout=0.5)
        except queue.Empty:
            if fut.done() or not alive():
                return
            continue
        except KeyboardInterrupt:
            interrupt()
            continue
        if batch is RUN_DONE:
            return
        if isinstance(batch, Prompt):
            if ask is not None and batch.open:
                try:
                    ask(batch)
                except KeyboardInterrupt:  # at the question: the cell is interrupted
                    interrupt()
            continue
        if on_event is not None:
            for one in batch:
                on_event(one)


def _asker(on_input: InputHandler, targets: list[TaskRuntime],
           loop: LoopThread) -> Callable[[Prompt], None]:
    """Answer one question in this thread with ``on_input`` and send the answer from the loop.
    EOFError (or a handler that fails) answers end-of-file: the task's ``input()`` raises
    EOFError instead of waiting for ever; a KeyboardInterrupt goes on to the relay."""
    by_name = {rt.name: rt for rt in targets}

    def ask(prompt: Prompt) -> None:
        try:
            value = str(on_input(prompt.task, prompt.text, prompt.password))
        except EOFError:
            value = EOF_ANSWER
        except Exception:
            logger.warning("tfdist_nb: on_input failed for %s; its input() gets end-of-file",
                           prompt.task, exc_info=True)
            value = EOF_ANSWER
        loop.call_soon(_answer, by_name[prompt.task], prompt, value)

    return ask


def _answer(rt: TaskRuntime, prompt: Prompt, value: str) -> None:
    if rt.channel is not None:  # on the loop thread; a task stopped meanwhile has none
        rt.channel.answer(prompt, value)
        if rt.state is TaskState.PROMPT and rt.channel.prompting is None:
            rt.transition(TaskEvent.ANSWERED)
