"""The cells a cluster runs, seen from the caller's thread: each is checked against the tasks'
states, numbered, written to the run directory, run on the loop thread (:mod:`.runner`) while its
events reach the caller (:mod:`.relay`), and remembered: the cells that ended ok on every task and
the last FAILURES_KEPT that did not, with their code, are what ``%tfdist_isolate`` re-runs and
``%tfdist_report`` describes (docs/reference.md, Isolate).
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from typing import Any

from tfdist_nb.cluster.hub import RUN_DIRECTORY, EventHub
from tfdist_nb.cluster.inspector import Inspector
from tfdist_nb.cluster.loop import LoopThread
from tfdist_nb.cluster.profiler import Profiler
from tfdist_nb.cluster.relay import RUN_DONE, relay
from tfdist_nb.cluster.runner import RunControl, RunEnd, run_cell
from tfdist_nb.cluster.state import CannotRun, TaskEvent, next_state
from tfdist_nb.cluster.task import TaskRuntime
from tfdist_nb.diagnostics.explain import (
    explain_network,
    explain_second_strategy,
    network_gone,
)
from tfdist_nb.diagnostics.numerics import first_nan
from tfdist_nb.errors import ClusterNotRunningError
from tfdist_nb.events import Event, Finding
from tfdist_nb.launchers.base import NetTrouble
from tfdist_nb.results import RunResult
from tfdist_nb.store.rundir import RunDirectory

FAILURES_KEPT = 20  # failing cells (result and code) a cluster keeps for %tfdist_isolate


class Cells:
    """One cluster's cells: the runs in flight and how the finished ones ended."""

    def __init__(self, profiler: Profiler) -> None:
        self._profiler = profiler  # an armed capture starts and ends with the next cell
        #: the last cell's number (from 1, over the cluster's whole life)
        self.last = 0
        #: the runs in flight, each ended by ``stop_all``
        self.active: dict[RunControl, concurrent.futures.Future[Any]] = {}
        #: the last run that failed and its cell's code (%tfdist_report)
        self.last_failure: tuple[RunResult, str] | None = None
        #: cells that ended ok on every task, and the last FAILURES_KEPT that did not (with
        #: their code): what %tfdist_isolate re-runs
        self.passed: set[int] = set()
        self.failed: dict[int, tuple[RunResult, str]] = {}

    def run(self, targets: list[TaskRuntime], code: str, timeout: float | None,
            stall_timeout: float, on_event: Callable[[Event], None] | None, *,
            rundir: RunDirectory, hub: EventHub, loop: LoopThread, inspector: Inspector,
            alive: Callable[[], bool],
            network: Callable[[], NetTrouble | None] = lambda: None) -> RunResult:
        """Run ``code`` on ``targets`` and wait for every task; ``on_event`` gets the events in
        this thread, and an interrupt here interrupts the tasks. ClusterNotRunningError if a
        task cannot take the cell (one still stalled in an earlier cell)."""
        refused = []
        for rt in targets:
            try:
                next_state(rt.state, TaskEvent.RUN)
            except CannotRun as exc:
                refused.append(f"{rt.name}: {exc}")
        if refused:
            raise ClusterNotRunningError("cannot run this cell: " + "; ".join(refused))
        self.last += 1
        cell = self.last
        hub.new_cell([rt.name for rt in targets])
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        listener = events.put  # removed by identity: the same bound method object
        hub.add_listener(listener)
        if remade := rundir.ensure():
            hub.note(RUN_DIRECTORY, remade, "WARNING")
        if disk := rundir.write_cell(cell, code, [rt.name for rt in targets]):
            hub.note(RUN_DIRECTORY, *disk)  # said in this cell's output too
        control = RunControl()
        fut = loop.submit(run_cell(targets, code, cell, timeout, control, inspector=inspector,
                                   stall_timeout=stall_timeout))
        fut.add_done_callback(lambda _: events.put(RUN_DONE))
        self.active[control] = fut
        profiling = self._profiler.start_armed()
        try:
            relay(events, on_event, fut, lambda: loop.call_soon(control.stop, RunEnd.INTERRUPT),
                  alive=alive)
        finally:
            hub.remove_listener(listener)
            self.active.pop(control, None)
        result = RunResult(cell=cell, tasks=fut.result(timeout=10), hang=control.hang)
        if profiling is not None:
            result.profile = self._profiler.finish(profiling)
        if origin := first_nan(result.failed):
            hub.note("cluster", origin.splitlines()[0], "WARNING")
        self._explain_network(result, network)
        self._explain_second_strategy(result, hub)
        self._remember(result, code)
        return result

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
